"""`wallfinder diff BEFORE AFTER`: what moved between two runs of a job."""

from __future__ import annotations

import argparse
from pathlib import Path

from wallfinder.api import Options, diff, load_diagnosis, run_names
from wallfinder.cli.commands.analyze import (
    add_device_options,
    add_report_options,
    add_trace_options,
    report_width,
    write_report,
)
from wallfinder.report import DIFF_FORMATS, render_diff

_INPUT = "a trace file, a folder of rank traces, or a saved diagnosis (analyze --format json)"


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("before", type=Path, help=f"the run before: {_INPUT}")
    parser.add_argument("after", type=Path, help=f"the run after: {_INPUT}")
    add_report_options(parser, DIFF_FORMATS)
    add_device_options(parser)
    add_trace_options(parser)


def options_from(args: argparse.Namespace) -> Options:
    """The device flags as analysis options (they apply to traces, not saved diagnoses)."""
    return Options(
        device=args.device,
        spec_file=args.spec,
        device_profile=args.device_profile,
        step_range=args.step_range,
        cache=not args.no_cache,
    )


def run(args: argparse.Namespace) -> int:
    options = options_from(args)
    before, after = load_diagnosis(args.before, options), load_diagnosis(args.after, options)
    result = diff(before, after, names=run_names(str(args.before), str(args.after)))
    write_report(render_diff(result, args.format, width=report_width(args.output)), args.output)
    return 0
