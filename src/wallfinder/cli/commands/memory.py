"""`wallfinder memory SNAPSHOT`: what fills GPU memory, from a CUDA allocator snapshot."""

from __future__ import annotations

import argparse
from pathlib import Path

from wallfinder.api import analyze_memory
from wallfinder.cli.commands.analyze import add_report_options, report_width, write_report
from wallfinder.report import MEMORY_FORMATS, render_memory


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "snapshot",
        type=Path,
        help="a pickle from torch.cuda.memory._dump_snapshot(path), plain or gzip (loaded "
        "without running code)",
    )
    add_report_options(parser, MEMORY_FORMATS)


def run(args: argparse.Namespace) -> int:
    report = analyze_memory(args.snapshot)
    write_report(render_memory(report, args.format, width=report_width(args.output)), args.output)
    return 0
