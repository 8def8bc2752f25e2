"""`wallfinder run -- python train.py ARGS`: profile an unmodified program, then diagnose it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from wallfinder.api import analyze_memory
from wallfinder.capture import require_torch
from wallfinder.capture.run import (
    RunOutcome,
    RunSettings,
    prepare_trace_dir,
    program_command,
    run_program,
)
from wallfinder.cli.commands.analyze import (
    add_device_options,
    add_model_options,
    add_record_options,
    add_report_options,
    check_record_options,
    options_from,
    positive_int,
    record_if_asked,
    report_width,
    write_report,
)
from wallfinder.errors import WallfinderError
from wallfinder.measure import diagnose_run, run_steps
from wallfinder.report import FORMATS, render, render_memory, render_steps

EPILOG = """\
examples:
  wallfinder run -- python train.py --lr 3e-4
  wallfinder run --steps 10 --warmup 5 --stop-after -- torchrun --nproc_per_node 8 train.py
  wallfinder run -m mypackage.train -- --epochs 1
  wallfinder run --timer-only -- python train.py

Steps are counted by optimizer.step() (the first optimizer's, when there are several); the
first step is always a warm-up step. The program's exit code is passed on.

What is recorded, and what it costs (README, "What `wallfinder run` records"): input shapes
always (the roofline needs them); a range around each nn.Module forward for the module view,
in one extra step after the timed ones (--no-modules leaves it out: the ranges cost tens of
µs per module call, kept out of the steps the verdict measures); Python stacks only
with --stacks or --memory (the profiler's Python tracer: often tens of percent of host time,
which would inflate the host overhead the verdict measures).

--memory records the profiler's memory events with Python stacks (--no-stacks leaves them
out) and, on CUDA, the allocator's history from the start: if the program runs out of device
memory, the allocator's snapshot at that moment is kept and explained after the report (as
wallfinder memory SNAPSHOT does)."""


DEFAULTS = RunSettings()
"""What `wallfinder run` measures when no flag says otherwise."""


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "--steps",
        type=positive_int,
        default=DEFAULTS.steps,
        help=f"steps to measure (default {DEFAULTS.steps})",
    )
    parser.add_argument(
        "--warmup",
        type=positive_int,
        default=DEFAULTS.warmup,
        help=f"warm-up steps before them, not kept (default {DEFAULTS.warmup})",
    )
    parser.add_argument(
        "--memory",
        action="store_true",
        help="record memory events, and on CUDA the allocator's history for a snapshot if the "
        "program runs out of memory",
    )
    parser.add_argument(
        "--stacks",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="record Python stacks, for call sites in findings; costly in host time "
        "(default: with --memory)",
    )
    parser.add_argument(
        "--modules",
        action=argparse.BooleanOptionalAction,
        default=DEFAULTS.modules,
        help="one extra step after the timed ones with a range around each nn.Module "
        "forward, for the module view (the timed steps run without them; default: on)",
    )
    parser.add_argument(
        "--stop-after",
        action="store_true",
        help="stop the program (exit code 0) once the measured steps are done",
    )
    parser.add_argument(
        "--timer-only",
        action="store_true",
        help="time the steps with no profiler (CUDA events or the host clock): ~zero overhead",
    )
    parser.add_argument(
        "--trace-dir",
        type=Path,
        help="keep the traces here (default: a new folder under ./wallfinder-traces)",
    )
    parser.add_argument("-m", dest="module", help="run this module on this Python (like python -m)")
    add_report_options(parser, FORMATS)
    add_device_options(parser)
    add_model_options(parser)
    add_record_options(parser)
    parser.add_argument(
        "program",
        nargs=argparse.REMAINDER,
        help="the program and its arguments, after --",
    )


def run(args: argparse.Namespace) -> int:
    if args.timer_only and args.format not in ("text", "json"):
        raise WallfinderError("--timer-only gives step times only: --format text or json")
    if args.timer_only and args.record:
        raise WallfinderError("--timer-only gives step times only: nothing to --record")
    check_record_options(args)
    require_torch("wallfinder run")
    settings = RunSettings(
        steps=args.steps,
        warmup=args.warmup,
        memory=args.memory,
        stacks=args.stacks,
        modules=args.modules,
        stop_after=args.stop_after,
        timer_only=args.timer_only,
    )
    command = program_command(args.program, args.module)
    trace_dir = prepare_trace_dir(args.trace_dir)
    outcome = run_program(command, settings, trace_dir)
    for note in outcome.notes:
        print(f"wallfinder: {note}", file=sys.stderr)
    try:
        return _report(args, settings, outcome)
    finally:
        _say_snapshots_kept(outcome, args.format)


def _report(args: argparse.Namespace, settings: RunSettings, outcome: RunOutcome) -> int:
    width = report_width(args.output)
    memory = _explain_snapshot(outcome, args.format, width)
    if settings.timer_only:
        steps = run_steps(outcome)
        if steps is None:
            return _nothing(outcome.exit_code, "no step was timed", memory, args.output)
        write_report(_followed(render_steps(steps, args.format, width=width), memory), args.output)
        return outcome.exit_code
    diagnosis = diagnose_run(outcome, options_from(args))
    if diagnosis is None:
        what = f"no trace was written to {outcome.trace_dir}"
        return _nothing(outcome.exit_code, what, memory, args.output)
    write_report(_followed(render(diagnosis, args.format, width=width), memory), args.output)
    record_if_asked(args, diagnosis)
    where = ", ".join(str(t) for t in outcome.traces[:4])
    more = f" and {len(outcome.traces) - 4} more" if len(outcome.traces) > 4 else ""
    print(f"wallfinder: traces kept in {where}{more}", file=sys.stderr)
    return outcome.exit_code


def _explain_snapshot(outcome: RunOutcome, fmt: str, width: int | None) -> str:
    """What `wallfinder memory` says of the snapshot taken when the program ran out of memory
    (the lowest rank's), to follow the report; "" when there is none, or when the report's
    format (JSON, HTML) is one document that nothing can follow."""
    if not outcome.snapshots or fmt not in ("text", "md"):
        return ""
    try:
        report = analyze_memory(outcome.snapshots[0])
    except WallfinderError as exc:  # the program's own failure stays the news
        print(f"wallfinder: cannot explain the memory snapshot: {exc}", file=sys.stderr)
        return ""
    return render_memory(report, fmt, width=width)


def _followed(report: str, memory: str) -> str:
    return f"{report}\n{memory}" if memory else report


def _say_snapshots_kept(outcome: RunOutcome, fmt: str) -> None:
    if not outcome.snapshots:
        return
    where = ", ".join(str(p) for p in outcome.snapshots)
    how = "" if fmt in ("text", "md") else f": wallfinder memory {outcome.snapshots[0]} explains it"
    print(f"wallfinder: memory snapshot kept in {where}{how}", file=sys.stderr)


def _nothing(exit_code: int, what: str, memory: str, output: Path | None) -> int:
    """Nothing to analyse: the program's own failure code when it failed, else ours. The
    memory snapshot, if any, is still explained."""
    if memory:
        write_report(memory, output)
    if exit_code:
        print(f"wallfinder: {what}", file=sys.stderr)
        return exit_code
    raise WallfinderError(what)
