"""`wallfinder analyze PATH`: the verdict for a trace file or a folder of rank traces."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import msgspec

from wallfinder.api import (
    Diagnosis,
    ModelFlops,
    Options,
    Progress,
    analyze,
    analyze_counters,
    analyze_marked,
)
from wallfinder.errors import WallfinderError
from wallfinder.report import FORMATS, export_tables, render, write_marks

PROGRESS_FROM_BYTES = 8 << 20
"""Inputs larger than this show a progress bar (on a terminal only)."""


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "path",
        type=Path,
        help="a .json/.json.gz trace, a folder of them, or an Nsight Systems capture "
        "(.sqlite export, or .nsys-rep with nsys on PATH)",
    )
    add_report_options(parser, FORMATS)
    parser.add_argument(
        "--export",
        type=Path,
        metavar="DIR",
        help="also write the kernel, op, module, phase and roofline tables into DIR as CSV "
        "(and Parquet, with pyarrow installed: wallfinder[parquet])",
    )
    parser.add_argument(
        "--workers", type=int, default=None, help="processes for parsing (default: one per core)"
    )
    parser.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="analyse the ranks on a running dask.distributed cluster (e.g. tcp://host:8786; "
        "needs wallfinder[dask]); its workers must see PATH at the same absolute path",
    )
    parser.add_argument(
        "--counters",
        type=Path,
        metavar="NCU",
        help="an Nsight Compute export (ncu --csv, .ncu-rep with ncu on PATH, or a folder): "
        "confirm or refute each top kernel's roofline bound with its hardware counters",
    )
    parser.add_argument(
        "--annotate",
        type=Path,
        metavar="FILE",
        help="also write a small trace of wallfinder's marks for Perfetto or chrome://tracing "
        "(gzip when FILE ends in .gz), to open beside the trace or merged with it: the "
        "steady-state steps, the longest idle gaps and their causes, each finding's kernels, "
        "the critical path (one trace file only)",
    )
    add_device_options(parser)
    add_trace_options(parser)
    add_model_options(parser)
    parser.add_argument(
        "--what-if",
        metavar="FIXES",
        help="replay each step's dependency graph with these fixes, comma-separated, each "
        "alone then combined: data (data-loading gaps removed), host[:F] (host work and "
        "launch calls / F, default 2), sync (sync points removed), fuse (memory-bound chains "
        "fused), matmul[:P] (matmuls at P of their roof, default 0.8), overlap (collectives "
        "start beside the compute they waited for), accum (no all-reduce in the micro-steps "
        "of gradient accumulation but the last, as under no_sync())",
    )
    add_record_options(parser)


def add_record_options(parser: argparse.ArgumentParser) -> None:
    """`--record NAME` and `--db PATH` (analyze and run)."""
    record = parser.add_argument_group("history (see `wallfinder history`)")
    record.add_argument(
        "--record",
        metavar="NAME",
        help="record this run's figures and diagnosis under NAME (with the git commit of the "
        "current directory and the host name)",
    )
    add_db_option(record)


def add_db_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    parser.add_argument(
        "--db",
        type=Path,
        metavar="PATH",
        help="the history database (default: $WALLFINDER_DB, else history.sqlite3 in the "
        "user's data folder)",
    )


def record_if_asked(args: argparse.Namespace, diagnosis: Diagnosis) -> None:
    """Record `diagnosis` when --record was given (a note on stderr says where)."""
    if args.record is None:
        return
    from wallfinder.history import History, git_commit, this_host  # sqlite3: only to record

    with History(args.db) as history:
        run = history.record(args.record, diagnosis, commit=git_commit(), host=this_host())
        where = history.path
    print(f"wallfinder: recorded as {run.name!r} run {run.id} in {where}", file=sys.stderr)


def check_record_options(args: argparse.Namespace) -> None:
    """Refuse --db without --record before any work is done."""
    if args.db is not None and args.record is None:
        raise WallfinderError("--db is for --record NAME (or `wallfinder history`)")
    if args.record is not None and not args.record.strip():
        raise WallfinderError("--record needs a non-empty name")


def add_model_options(parser: argparse.ArgumentParser) -> None:
    model = parser.add_argument_group(
        "model (for true MFU; without these, MFU counts the trace's matmul FLOPs)"
    )
    model.add_argument("--model-flops", type=_positive, help="model FLOPs per training step")
    model.add_argument("--params", type=_positive, help="parameter count N (MFU from 6·N·T)")
    model.add_argument("--tokens-per-step", type=_positive, help="tokens per step T")
    model.add_argument("--seq-len", type=_positive, help="sequence length (attention FLOPs)")
    model.add_argument("--layers", type=_positive, help="number of layers (attention FLOPs)")
    model.add_argument("--hidden", type=_positive, help="hidden size (attention FLOPs)")


def add_trace_options(parser: argparse.ArgumentParser) -> None:
    """`--step-range NAME` and `--no-cache` (analyze, diff, check: the commands that read
    traces)."""
    parser.add_argument(
        "--no-cache",
        action="store_true",
        help="parse and analyse the trace again, neither reading nor writing wallfinder's "
        "cache (large traces' parses and diagnoses are kept in $WALLFINDER_CACHE, else "
        "~/.cache/wallfinder)",
    )
    parser.add_argument(
        "--step-range",
        metavar="NAME",
        help="the range that marks each step (an NVTX range or a record_function name; "
        "numbered instances such as 'step 3' match 'step'); default: ProfilerStep, or in an "
        "Nsight Systems capture the range named like a step",
    )


def add_report_options(parser: argparse.ArgumentParser, formats: Sequence[str]) -> None:
    """The options of a command that writes a report: its format, and a file to write it to."""
    parser.add_argument("--format", choices=formats, default="text", help="output format")
    parser.add_argument("-o", "--output", type=Path, help="write the report to this file")


def add_device_options(parser: argparse.ArgumentParser) -> None:
    device = parser.add_argument_group("device")
    device.add_argument(
        "--device",
        help="the device's name, spec key or family (A100, H100: the common variant, said "
        "so), when the trace's is unknown or wrong",
    )
    device.add_argument(
        "--spec", type=Path, help="a TOML file with the device's peaks and bandwidth"
    )
    device.add_argument(
        "--device-profile",
        type=Path,
        metavar="FILE",
        help="roofs measured by `wallfinder calibrate` on this device: they replace the "
        "datasheet's for the dtypes measured",
    )


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number: {text!r}")
    return value


def positive_int(text: str) -> int:
    """An argparse type: a whole number ≥ 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value


def options_from(args: argparse.Namespace) -> Options:
    """The analysis options the flags describe."""
    # Commands without the model flags (`counters`) describe no model.
    model = ModelFlops(
        flops_per_step=getattr(args, "model_flops", None),
        params=getattr(args, "params", None),
        tokens_per_step=getattr(args, "tokens_per_step", None),
        seq_len=getattr(args, "seq_len", None),
        layers=getattr(args, "layers", None),
        hidden=getattr(args, "hidden", None),
    )
    return Options(
        device=args.device,
        spec_file=args.spec,
        model=model,
        device_profile=args.device_profile,
        # `run` has no --step-range: its steps are the ones its own profiler marks.
        step_range=getattr(args, "step_range", None),
        what_if=getattr(args, "what_if", None),
        counters=getattr(args, "counters", None),
        cache=not getattr(args, "no_cache", True),
    )


def run(args: argparse.Namespace) -> int:
    check_record_options(args)
    if args.annotate is not None and args.scheduler:
        raise WallfinderError("--annotate reads one trace file here; it takes no --scheduler")
    marks = None
    with _progress(args.path) as progress:
        if args.annotate is not None:
            diagnosis, marks = analyze_marked(
                args.path, options_from(args), progress=progress, workers=args.workers
            )
        else:
            diagnosis = analyze(
                # Absolute, so that the cluster's workers open the same files.
                args.path.absolute() if args.scheduler else args.path,
                options_from(args),
                progress=progress,
                workers=args.workers,
                scheduler=args.scheduler,
            )
    if args.counters is not None and diagnosis.counters is None:
        # A job of several ranks: the counters are said beside it, joined by name.
        report = analyze_counters(args.counters, options_from(args), diagnosis=diagnosis)
        diagnosis = msgspec.structs.replace(diagnosis, counters=report)
    write_report(render(diagnosis, args.format, width=report_width(args.output)), args.output)
    if args.export is not None:
        exported = export_tables(diagnosis, args.export)
        # One line on stderr: the report itself may be on stdout.
        print(
            f"wallfinder: wrote {len(exported.files)} files to {args.export}"
            + (f" (CSV only: {exported.note})" if exported.note else " (CSV and Parquet)"),
            file=sys.stderr,
        )
    if marks is not None:
        write_marks(marks, args.annotate)
        print(
            f"wallfinder: wrote {len(marks.marks)} marks to {args.annotate} (open it in "
            "ui.perfetto.dev or chrome://tracing, beside the trace or merged with it)",
            file=sys.stderr,
        )
    record_if_asked(args, diagnosis)
    return 0


def report_width(output: Path | None) -> int | None:
    """The width to lay a text report out at: $COLUMNS when set (as in every terminal
    program), else the terminal's when the report goes to one, else None: the report's
    default (100 columns)."""
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    if output is None and sys.stdout.isatty():
        try:
            return os.get_terminal_size(sys.stdout.fileno()).columns
        except (OSError, ValueError):
            pass
    return None


def write_report(text: str, output: Path | None) -> None:
    """The report to `output` (-o), or to standard output."""
    if output:
        try:
            output.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise WallfinderError(f"{output}: cannot write ({exc.strerror})") from None
    else:
        sys.stdout.write(text)


@contextmanager
def _progress(path: Path) -> Iterator[Progress | None]:
    """A progress bar on stderr for big inputs on a terminal; nothing when piped."""
    try:
        size = (
            sum(p.stat().st_size for p in path.iterdir() if p.is_file())
            if path.is_dir()
            else path.stat().st_size
        )
    except OSError:
        size = 0
    if size < PROGRESS_FROM_BYTES or not sys.stderr.isatty() or os.environ.get("CI"):
        yield None
        return
    from rich.progress import BarColumn, DownloadColumn, TimeElapsedColumn
    from rich.progress import Progress as Bar

    with Bar(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TimeElapsedColumn(),
        transient=True,
        console=None,
    ) as bar:
        task = bar.add_task("reading trace", total=size)
        yield lambda done, total: bar.update(task, completed=done, total=total)
