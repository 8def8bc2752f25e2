"""`wallfinder counters NCU`: what an Nsight Compute export's hardware counters say per kernel,
and beside a trace (`--trace`), which of the roofline's bounds they confirm or refute."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from wallfinder.api import analyze, analyze_counters, ncu_commands
from wallfinder.cli.commands.analyze import (
    add_device_options,
    add_report_options,
    add_trace_options,
    options_from,
    report_width,
    write_report,
)
from wallfinder.errors import WallfinderError
from wallfinder.report import COUNTER_FORMATS, render_counters


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "export",
        type=Path,
        nargs="?",
        help="an `ncu --csv` export (details or raw page, plain or gzip), an .ncu-rep report "
        "(with ncu on PATH), or a folder of them",
    )
    parser.add_argument(
        "--trace",
        type=Path,
        help="a trace of the same program: join its top kernels to the profiled launches and "
        "confirm or refute each roofline bound",
    )
    parser.add_argument(
        "--collect",
        action="store_true",
        help="print the ncu command lines that collect what this needs (for --trace: one per "
        "top kernel) and exit",
    )
    add_report_options(parser, COUNTER_FORMATS)
    add_device_options(parser)
    add_trace_options(parser)


def run(args: argparse.Namespace) -> int:
    options = options_from(args)
    if args.collect:
        diagnosis = analyze(args.trace, options) if args.trace is not None else None
        sys.stdout.write("".join(f"{c}\n" for c in ncu_commands(diagnosis, options)))
        return 0
    if args.export is None:
        raise WallfinderError("counters needs an Nsight Compute export (or --collect)")
    if args.trace is not None:
        # Joined launch by launch to the trace's kernels, as `analyze --counters` does.
        diagnosis = analyze(args.trace, dataclasses.replace(options, counters=args.export))
        report = diagnosis.counters or analyze_counters(args.export, options, diagnosis=diagnosis)
    else:
        report = analyze_counters(args.export, options)
    write_report(render_counters(report, args.format, width=report_width(args.output)), args.output)
    return 0
