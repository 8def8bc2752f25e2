"""`wallfinder history [NAME]`: the trend of a job's recorded runs, or the recorded names."""

from __future__ import annotations

import argparse

from wallfinder.cli.commands.analyze import (
    add_db_option,
    add_report_options,
    positive_int,
    report_width,
    write_report,
)
from wallfinder.errors import WallfinderError
from wallfinder.history import History
from wallfinder.report.history import HISTORY_FORMATS, render_history, render_names


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "name",
        nargs="?",
        help="the name runs were recorded under (analyze/run --record NAME); without it, "
        "the recorded names and their run counts",
    )
    add_db_option(parser)
    add_report_options(parser, HISTORY_FORMATS)
    parser.add_argument("--last", type=positive_int, metavar="N", help="only the last N runs")


def run(args: argparse.Namespace) -> int:
    width = report_width(args.output)
    with History(args.db) as history:
        if args.name is None:
            if args.format == "html":
                raise WallfinderError("the list of names is text, md or json: give a NAME for html")
            text = render_names(history.names(), args.format, width=width)
        else:
            trend = history.trend(args.name, last=args.last)
            text = render_history(trend, args.format, width=width)
    write_report(text, args.output)
    return 0
