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
from wallfinder.cli.commands.analyze import add_report_options, positive_int
from wallfinder.errors import WallfinderError
from wallfinder.measure import DemoPair, DemoResult, run_demo
from wallfinder.report import FORMATS, render, render_diff
from wallfinder.report.diff import speed_text, verdict_line

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
    variant = parser.add_mutually_exclusive_group()
    variant.add_argument("--fixed", action="store_true", help="run the job with its fix applied")
    variant.add_argument(
        "--compare",
        action="store_true",
        help="run the job as written, then with its fix, and show what moved (wallfinder diff "
        "of the pair)",
    )
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
        help=f"folder for the trace and reports (default: {OUT}/WORKLOAD[-fixed]; with "
        f"--compare, the folder that holds both: default {OUT})",
    )
    add_report_options(parser, FORMATS)


def run(args: argparse.Namespace) -> int:
    if args.list:
        sys.stdout.write(_listing())
        return 0
    workload = get(args.workload)
    require_torch("wallfinder demo")
    if args.compare:
        return _compare(args, workload.name)
    out = args.out or OUT / _folder(workload.name, args.fixed)
    result = _measure(workload.name, args.fixed, args, out)
    d = result.diagnosis
    files = _save(result, out)
    text = render(d, args.format)
    if args.output:
        _write(args.output, text)
    else:
        sys.stdout.write(text)
    # A JSON, Markdown or HTML report on stdout stays whole there: the rest to stderr.
    tail = sys.stdout if args.output or args.format == "text" else sys.stderr
    _epilogue(result, files, tail)
    return 0


def _compare(args: argparse.Namespace, name: str) -> int:
    """Both variants, each saved as a single run is, then their diff and what it shows."""
    root = args.out or OUT
    runs = []
    files: list[Path] = []
    for fixed in (False, True):
        out = root / _folder(name, fixed)
        runs.append(_measure(name, fixed, args, out))
        files += _save(runs[-1], out)
    pair = DemoPair.of(*runs)
    page = root / f"{name}-diff.html"
    _write(page, render_diff(pair.diff, "html"))
    files.append(page)
    text = render_diff(pair.diff, args.format)
    if args.output:
        _write(args.output, text)
    else:
        sys.stdout.write(text)
    tail = sys.stdout if args.output or args.format == "text" else sys.stderr
    _write_rows(files, pair_summary(pair), tail)
    return 0


def _folder(name: str, fixed: bool) -> str:
    return name + ("-fixed" if fixed else "")


def _measure(name: str, fixed: bool, args: argparse.Namespace, out: Path) -> DemoResult:
    """One profiled run, measured once more when its steps varied."""
    print(
        f"wallfinder demo: profiling {name} ({'fixed' if fixed else 'as written'}), "
        f"{args.steps} steps…",
        file=sys.stderr,
    )
    for attempt in range(1, ATTEMPTS + 1):
        result = run_demo(name, fixed=fixed, device=args.device, steps=args.steps, trace_dir=out)
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
    return result


def _save(result: DemoResult, out: Path) -> list[Path]:
    """The diagnosis (JSON) and the HTML report beside the trace: the files, trace first."""
    diagnosis, report = out / "diagnosis.json", out / "report.html"
    _write(diagnosis, result.diagnosis.to_json() + "\n")
    _write(report, render(result.diagnosis, "html"))
    return [result.trace_path, diagnosis, report]


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise WallfinderError(f"{path}: cannot write ({exc.strerror})") from None


def _found(result: DemoResult) -> str:
    d = result.diagnosis
    found = [d.verdict.wall, f"cause {d.verdict.cause}"]
    if d.findings:
        found.append(f"top finding {d.findings[0].id}")
    return ", ".join(found)


def _epilogue(result: DemoResult, files: list[Path], stream: TextIO) -> None:
    """The files written, then the workload: what was expected and what was found."""
    w, d = result.workload, result.diagnosis
    differences = result.differences
    unshown = w.cannot_show(result.device)
    if differences:
        judgement = " (differs)"
    elif unshown:
        judgement = f" (as expected of the {result.device}, which cannot show this wall)"
    else:
        judgement = " (as expected)"
    rows = [
        ("workload", f"{w.name}, {'fixed' if result.fixed else 'as written'}, on {result.device}"),
        ("the fix" if result.fixed else "the job", w.fix if result.fixed else w.wall),
        ("median step", f"{d.steps.median_s * 1e3:.1f} ms over {d.steps.count} steps"),
        ("expected", result.expected.describe()),
        ("found", _found(result) + judgement),
    ]
    if unshown:
        rows.append((f"on the {result.device}", f"this job cannot show its wall here: {unshown}"))
    if result.expected.note:
        rows.append((f"on the {result.device}", result.expected.note))
    if differences:
        rows.append(
            (
                "differs",
                "; ".join(differences) + ". This is what this machine measured: " + _why(result),
            )
        )
    if not result.fixed:
        rows.append(("the fix", w.fix))
        rows.append(("next", f"wallfinder demo --workload {w.name} --fixed"))
    rows.append(("compare", f"wallfinder demo --workload {w.name} --compare"))
    _write_rows(files, rows, stream)


def _why(result: DemoResult) -> str:
    """Why a run may differ from its expectation: a busy machine, or the workload's notes."""
    d = result.diagnosis
    if d.verdict.cause == "unstable":
        return (
            f"the step times varied (CV {d.steps.cv:.0%}): something else was probably using "
            "the machine; run it again"
        )
    return result.workload.notes


def pair_summary(pair: DemoPair) -> list[tuple[str, str]]:
    """What the pair was made to show, what it showed, and whether they agree: the rows after
    `wallfinder demo --compare`'s diff, the verdict last."""
    before, after, steps = pair.before, pair.after, pair.diff.steps
    w, device = before.workload, before.device
    noise = "within the noise" if steps.within_noise else "beyond the noise"
    rows = [
        ("workload", f"{w.name} as written, then fixed, on {device}"),
        ("the job", w.wall),
        ("the fix", w.fix),
        (
            "expected",
            f"as written {before.expected.describe()}; fixed {after.expected.describe()}",
        ),
        ("found", f"as written {_found(before)}; fixed {_found(after)}"),
        (
            "step",
            f"{steps.before_s * 1e3:.1f} ms → {steps.after_s * 1e3:.1f} ms, "
            f"{speed_text(steps)} ({noise})",
        ),
        ("wall", verdict_line(pair.diff)),
    ]
    p = pair.prediction
    if p is not None:
        rows.append(
            (
                "prediction",
                f"predicted {p.predicted_s * 1e3:.1f} ms by replay (what-if {p.what_if} on the "
                f"as-written run, replayed unchanged at {p.replayed_s * 1e3:.1f} ms), measured "
                f"{p.measured_s * 1e3:.1f} ms after the fix ({p.error:+.0%}; mean steps, "
                "estimates)",
            )
        )
    notes = [n for n in (before.expected.note, after.expected.note) if n]
    # A note the other one contains (the fixed run's often extends the first) is said once.
    notes = [n for i, n in enumerate(notes) if not any(n in m for m in notes[i + 1 :])]
    rows += [(f"on the {device}", note) for note in notes]
    differences = pair.differences
    unshown = pair.cannot_show
    if unshown:
        shown = (
            "the runs differ from what it does: " + "; ".join(differences)
            if differences
            else "the runs show what it does instead, as expected"
        )
        rows.append(("result", f"the {device} cannot show this job's wall: {unshown}; {shown}"))
    elif differences:
        rows.append(
            (
                "result",
                "differs from what the job was made to show: "
                + "; ".join(differences)
                + ". This is what this machine measured: "
                + _why(after if after.differences else before),
            )
        )
    else:
        v = pair.diff.verdict
        wall = (
            f"the wall moved from {v.before_wall} to {v.after_wall}"
            if v.before_wall != v.after_wall
            else f"the wall stayed {v.after_wall}"
        )
        rows.append(("result", f"as made to show: {wall}, and the step is {speed_text(steps)}"))
    return rows


def _write_rows(files: list[Path], rows: list[tuple[str, str]], stream: TextIO) -> None:
    """The files written, then labelled rows wrapped to WIDTH."""
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
    rows = [
        f"Workloads (wallfinder demo --workload NAME [--fixed | --compare]; default {DEFAULT}):",
        "",
    ]
    width = max(len(name) for name in WORKLOADS)
    for name, w in WORKLOADS.items():
        rows.append(f"  {name:<{width}}  {w.wall}")
        rows.append(f"  {'':<{width}}  fix: {w.fix}")
    return "\n".join(rows) + "\n"
