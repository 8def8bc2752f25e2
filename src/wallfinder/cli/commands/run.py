"""`wallfinder run -- python train.py ARGS`: profile an unmodified program, then diagnose it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from wallfinder.analysis import timed_steps
from wallfinder.api import analyze
from wallfinder.capture import require_torch
from wallfinder.capture.run import RunSettings, prepare_trace_dir, program_command, run_program
from wallfinder.cli.commands.analyze import (
    add_device_options,
    add_model_options,
    add_record_options,
    check_record_options,
    options_from,
    positive_int,
    record_if_asked,
    write_report,
)
from wallfinder.errors import WallfinderError
from wallfinder.report import FORMATS, render, render_steps

HELP = "run a training script unmodified, profile its steps, and diagnose them"

EPILOG = """\
examples:
  wallfinder run -- python train.py --lr 3e-4
  wallfinder run --steps 10 --warmup 5 --stop-after -- torchrun --nproc_per_node 8 train.py
  wallfinder run -m mypackage.train -- --epochs 1
  wallfinder run --timer-only -- python train.py

Steps are counted by optimizer.step() (the first optimizer's, when there are several); the
first step is always a warm-up step. The program's exit code is passed on."""


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "--steps", type=positive_int, default=5, help="steps to measure (default 5)"
    )
    parser.add_argument(
        "--warmup",
        type=positive_int,
        default=3,
        help="warm-up steps before them, not kept (default 3)",
    )
    parser.add_argument("--memory", action="store_true", help="record memory events")
    parser.add_argument("--stacks", action="store_true", help="record Python stacks")
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
    parser.add_argument("--format", choices=FORMATS, default="text", help="output format")
    parser.add_argument("-o", "--output", type=Path, help="write the report to this file")
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
        stop_after=args.stop_after,
        timer_only=args.timer_only,
    )
    command = program_command(args.program, args.module)
    trace_dir = prepare_trace_dir(args.trace_dir)
    outcome = run_program(command, settings, trace_dir)
    for note in outcome.notes:
        print(f"wallfinder: {note}", file=sys.stderr)
    if settings.timer_only:
        timed = [s for s in outcome.processes if len(s.durations) > 0]
        if not timed:
            return _nothing(outcome.exit_code, "no step was timed")
        # The lowest rank's steps (every rank runs the same steps in data-parallel jobs).
        steps = timed_steps(timed[0].durations, "step timer", None)
        write_report(render_steps(steps, args.format), args.output)
        return outcome.exit_code
    if not outcome.traces:
        return _nothing(outcome.exit_code, f"no trace was written to {trace_dir}")
    target = outcome.traces[0] if len(outcome.traces) == 1 else trace_dir
    diagnosis = analyze(target, options_from(args))
    write_report(render(diagnosis, args.format), args.output)
    record_if_asked(args, diagnosis)
    where = ", ".join(str(t) for t in outcome.traces[:4])
    more = f" and {len(outcome.traces) - 4} more" if len(outcome.traces) > 4 else ""
    print(f"wallfinder: traces kept in {where}{more}", file=sys.stderr)
    return outcome.exit_code


def _nothing(exit_code: int, what: str) -> int:
    """Nothing to analyse: the program's own failure code when it failed, else ours."""
    if exit_code:
        print(f"wallfinder: {what}", file=sys.stderr)
        return exit_code
    raise WallfinderError(what)
