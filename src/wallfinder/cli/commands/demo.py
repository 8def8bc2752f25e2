"""`wallfinder demo`: profile a built-in training job on this machine and diagnose it."""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path
from typing import TextIO

from wallfinder.api import MIN_STEPS_FOR_STABILITY
from wallfinder.capture import require_torch
from wallfinder.capture.workloads import DEFAULT, DEVICES, WORKLOADS, get
from wallfinder.cli.commands.analyze import positive_int
from wallfinder.errors import WallfinderError
from wallfinder.measure import DemoResult, run_demo
from wallfinder.report import FORMATS, render

OUT = Path("wallfinder-demo")
ATTEMPTS = 2
"""Measure once more when the steps vary: the workloads are steady by design, so varying steps
mean another program took the machine for a moment (the report says so when it happens twice)."""
WIDTH, LABEL = 100, 12
"""The summary after the report: lines of at most WIDTH characters, labels LABEL wide."""


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workload",
        default=DEFAULT,
        metavar="NAME",
        help=f"which job to run (default: {DEFAULT}); --list shows them",
    )
    parser.add_argument("--fixed", action="store_true", help="run the job with its fix applied")
    parser.add_argument("--list", action="store_true", help="list the workloads and exit")
    parser.add_argument(
        "--steps", type=positive_int, default=8, help="profiled steps kept (default: 8)"
    )
    parser.add_argument(
        "--device", choices=DEVICES, help="where to run it (default: the GPU if there is one)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        help=f"folder for the trace and reports (default: {OUT}/WORKLOAD[-fixed])",
    )
    parser.add_argument("--format", choices=FORMATS, default="text", help="output format")
    parser.add_argument("-o", "--output", type=Path, help="write the report to this file")


def run(args: argparse.Namespace) -> int:
    if args.list:
        sys.stdout.write(_listing())
        return 0
    workload = get(args.workload)
    require_torch("wallfinder demo")
    out = args.out or OUT / (workload.name + ("-fixed" if args.fixed else ""))
    variant = "fixed" if args.fixed else "as written"
    print(
        f"wallfinder demo: profiling {workload.name} ({variant}), {args.steps} steps…",
        file=sys.stderr,
    )
    for attempt in range(1, ATTEMPTS + 1):
        result = run_demo(
            workload.name,
            fixed=args.fixed,
            device=args.device,
            steps=args.steps,
            trace_dir=out,
        )
        steps = result.diagnosis.steps
        if steps.stable or steps.count < MIN_STEPS_FOR_STABILITY or attempt == ATTEMPTS:
            break
        # A shared or busy machine can preempt a step; the job itself is steady by design.
        print(
            f"wallfinder demo: the steps varied (CV {steps.cv:.0%}, slowest "
            f"{steps.max_s * 1e3:.1f} ms against a median of {steps.median_s * 1e3:.1f} ms): "
            "something else is probably using this machine; measuring again",
            file=sys.stderr,
        )
    d = result.diagnosis
    report = out / "report.html"
    diagnosis = out / "diagnosis.json"
    _write(diagnosis, d.to_json() + "\n")
    _write(report, render(d, "html"))
    text = render(d, args.format)
    if args.output:
        _write(args.output, text)
    else:
        sys.stdout.write(text)
    # A JSON, Markdown or HTML report on stdout stays whole there: the rest to stderr.
    tail = sys.stdout if args.output or args.format == "text" else sys.stderr
    _epilogue(result, [result.trace_path, diagnosis, report], tail)
    return 0


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise WallfinderError(f"{path}: cannot write ({exc.strerror})") from None


def _epilogue(result: DemoResult, files: list[Path], stream: TextIO) -> None:
    """The files written, then the workload: what was expected and what was found."""
    w, d = result.workload, result.diagnosis
    found = [d.verdict.wall, f"cause {d.verdict.cause}"]
    if d.findings:
        found.append(f"top finding {d.findings[0].id}")
    differences = result.differences
    rows = [
        ("workload", f"{w.name}, {'fixed' if result.fixed else 'as written'}, on {result.device}"),
        ("the fix" if result.fixed else "the job", w.fix if result.fixed else w.wall),
        ("median step", f"{d.steps.median_s * 1e3:.1f} ms over {d.steps.count} steps"),
        ("expected", result.expected.describe()),
        ("found", ", ".join(found) + (" (differs)" if differences else " (as expected)")),
    ]
    if result.expected.note:
        rows.append((f"on the {result.device}", result.expected.note))
    if differences:
        why = (
            f"the step times varied (CV {d.steps.cv:.0%}): something else was probably using "
            "the machine; run it again"
            if d.verdict.cause == "unstable"
            else w.notes
        )
        rows.append(
            ("differs", "; ".join(differences) + ". This is what this machine measured: " + why)
        )
    if result.fixed:
        rows.append(("compare", f"wallfinder demo --workload {w.name}"))
    else:
        rows.append(("the fix", w.fix))
        rows.append(("next", f"wallfinder demo --workload {w.name} --fixed"))
    lines = ["", "Files:", *(f"  {path}" for path in files), ""]
    for label, text in rows:
        lines += textwrap.wrap(
            text,
            width=WIDTH,
            initial_indent=f"  {label:<{LABEL}} ",
            subsequent_indent=" " * (LABEL + 3),
            break_on_hyphens=False,
        )
    stream.write("\n".join(lines) + "\n")


def _listing() -> str:
    rows = [f"Workloads (wallfinder demo --workload NAME [--fixed]; default {DEFAULT}):", ""]
    width = max(len(name) for name in WORKLOADS)
    for name, w in WORKLOADS.items():
        rows.append(f"  {name:<{width}}  {w.wall}")
        rows.append(f"  {'':<{width}}  fix: {w.fix}")
    return "\n".join(rows) + "\n"
