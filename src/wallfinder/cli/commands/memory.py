"""`wallfinder memory SNAPSHOT`: what fills GPU memory, from a CUDA allocator snapshot."""

from __future__ import annotations

import argparse
from pathlib import Path

from wallfinder.api import analyze_memory
from wallfinder.cli.commands.analyze import write_report
from wallfinder.report import MEMORY_FORMATS, render_memory


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "snapshot",
        type=Path,
        help="a pickle from torch.cuda.memory._dump_snapshot(path), plain or gzip (loaded "
        "without running code)",
    )
    parser.add_argument("--format", choices=MEMORY_FORMATS, default="text", help="output format")
    parser.add_argument("-o", "--output", type=Path, help="write the report to this file")


def run(args: argparse.Namespace) -> int:
    write_report(render_memory(analyze_memory(args.snapshot), args.format), args.output)
    return 0
