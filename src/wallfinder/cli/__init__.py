"""The command line: a thin layer over the library. `main(argv) -> int` maps the library's
error to exit code 2 and one line on stderr (`--debug` shows the traceback)."""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Sequence
from typing import NoReturn

from wallfinder import __version__
from wallfinder.cli.commands import analyze as analyze_command
from wallfinder.cli.commands import calibrate as calibrate_command
from wallfinder.cli.commands import check as check_command
from wallfinder.cli.commands import counters as counters_command
from wallfinder.cli.commands import demo as demo_command
from wallfinder.cli.commands import diff as diff_command
from wallfinder.cli.commands import history as history_command
from wallfinder.cli.commands import memory as memory_command
from wallfinder.cli.commands import roofline as roofline_command
from wallfinder.cli.commands import run as run_command
from wallfinder.errors import WallfinderError

COMMANDS = {
    "analyze": analyze_command,
    "run": run_command,
    "demo": demo_command,
    "roofline": roofline_command,
    "calibrate": calibrate_command,
    "diff": diff_command,
    "check": check_command,
    "history": history_command,
    "memory": memory_command,
    "counters": counters_command,
}


class _Parser(argparse.ArgumentParser):
    """Usage errors (a bad flag, a missing value) get one line and exit code 2, like every
    other error; `--help` shows the usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"wallfinder: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="wallfinder",
        description="Find the wall a slow PyTorch job is hitting: compute, memory bandwidth, "
        "or communication/overhead.",
    )
    parser.add_argument("--version", action="version", version=f"wallfinder {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module in COMMANDS.items():
        module.prepare_parser(sub.add_parser(name, help=module.HELP, description=module.HELP))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error (already printed)
        return exc.code if isinstance(exc.code, int) else 0
    try:
        return int(COMMANDS[args.command].run(args))
    except WallfinderError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"wallfinder: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("wallfinder: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


def entry_point() -> None:
    sys.exit(main())
