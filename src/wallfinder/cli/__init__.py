"""The command line: a thin layer over the library. `main(argv) -> int` maps the library's
error to exit code 2 and one line on stderr, and any other exception (a bug) to exit code 3 and
one line; `--debug` (or WALLFINDER_DEBUG=1) shows the traceback."""

from __future__ import annotations

import argparse
import gc
import os
import re
import sys
import traceback
from collections.abc import Sequence
from importlib import import_module
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

from wallfinder import __version__
from wallfinder.errors import DEBUG_ENV, WallfinderError, debugging, describe, stage_of

COMMANDS = {
    "analyze": "say where a trace's step time goes and which wall it hits",
    "run": "run a training script unmodified, profile its steps, and diagnose them",
    "demo": "profile a built-in training job made to hit one wall, and diagnose it",
    "roofline": "AI, ridge, bound, attainable FLOP/s and time floor for an op on a device",
    "calibrate": "measure this device's matmul FLOP/s, copy bandwidth and launch latency; "
    "save a profile",
    "diff": "show what moved between two runs: step time, breakdown, wall, findings, kernels",
    "check": "check a run against bounds (step time, MFU, idle, exposed comm, regression, "
    "peak memory, memory leak); exit 1 if broken",
    "history": "show how a job's recorded runs moved: step time, MFU, idle and the wall over runs",
    "memory": "what fills GPU memory: peak, call sites, categories, leaks, from an allocator "
    "snapshot",
    "counters": "each kernel's bound from Nsight Compute counters (ncu --csv), checked against "
    "a trace",
    "serve": "browse a folder of runs in a local web app: verdicts, each run's views, compare, "
    "history; new traces picked up as they are written",
}
"""Each subcommand's one-line help. Its module, `wallfinder.cli.commands.<name>` with
`prepare_parser(parser)` and `run(args)`, is imported only when that command is asked for:
`--help` and one command's run never import the others (the HTML report, calibration)."""


def command(name: str) -> ModuleType:
    """The module of subcommand `name`."""
    return import_module(f"wallfinder.cli.commands.{name}")


_NEGATIVE_NUMBER = re.compile(r"-\.?\d")
"""A command-line word that begins like a negative number (`-3`, `-1e12`, `-.5`,
`-32,2048`): a value, not an option, as Python 3.13's argparse reads it."""


class _Parser(argparse.ArgumentParser):
    """Usage errors (a bad flag, a missing value) get one line and exit code 2, like every
    other error; `--help` shows the usage."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # A negative number is a value, not an option: argparse before 3.13 knows only `-1`
        # and `-1.5`, so `--flops -1e12` said "expected one argument" instead of reaching the
        # check that refuses a negative count. No option of ours starts with a digit.
        self._negative_number_matcher = _NEGATIVE_NUMBER

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"wallfinder: error: {message} (see {self.prog} --help)\n")


DEBUG_HELP = (
    "show the traceback of an error, and let a bug in an optional view stop the run "
    "(as WALLFINDER_DEBUG=1 does)"
)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The whole parser; with `argv`, only the command it names gets its options (the others
    are listed with their help, unprepared, so that their modules are not imported)."""
    parser = _Parser(
        prog="wallfinder",
        description="Find the wall a slow PyTorch job is hitting: compute, memory bandwidth, "
        "or communication/overhead.",
    )
    parser.add_argument("--version", action="version", version=f"wallfinder {__version__}")
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = None if argv is None else _chosen(argv)
    for name, text in COMMANDS.items():
        parser_of = sub.add_parser(name, help=text, description=text)
        # (Also after the command, where people type it; the top level's value stands when
        # it is not given here.)
        parser_of.add_argument(
            "--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP
        )
        if chosen is None or name == chosen:
            command(name).prepare_parser(parser_of)
    return parser


def _chosen(argv: Sequence[str]) -> str:
    """The command `argv` names ("" for none)."""
    return next((a for a in argv if a in COMMANDS), "")


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    parser = build_parser(argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error (already printed)
        return exc.code if isinstance(exc.code, int) else 0
    debug = args.debug or debugging()
    before = os.environ.get(DEBUG_ENV)
    if args.debug:
        os.environ[DEBUG_ENV] = "1"  # the library's view boundaries let errors through
    try:
        return _run(args, debug)
    finally:
        if before is None:
            os.environ.pop(DEBUG_ENV, None)
        else:
            os.environ[DEBUG_ENV] = before


def _run(args: argparse.Namespace, debug: bool) -> int:
    try:
        return int(command(args.command).run(args))
    except WallfinderError as exc:
        if debug:
            traceback.print_exc()
        print(f"wallfinder: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("wallfinder: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:
        if debug:
            traceback.print_exc()
        print(internal_error_line(args, exc), file=sys.stderr)
        return INTERNAL_ERROR


INTERNAL_ERROR = 3
"""The exit code of a bug in wallfinder (2 is the user's bad input, 1 a broken `check`)."""


def internal_error_line(args: argparse.Namespace, exc: BaseException) -> str:
    """One line for an unexpected error: what failed, on which file, where, that it is a
    bug, and how to see the details."""
    file = getattr(exc, "wallfinder_file", None) or _named_input(args)
    stage = getattr(exc, "wallfinder_stage", None) or stage_of(exc)
    where = (f" on {file}" if file else "") + (f" in {stage}" if stage else "")
    return (
        f"wallfinder: internal error: {args.command}{where} failed with {describe(exc)}. This is a "
        "bug in wallfinder, not in your input: rerun with --debug (or WALLFINDER_DEBUG=1) "
        "for the traceback, and please report it"
    )


def entry_point() -> None:
    """The `wallfinder` program. The command's modules are imported with the cyclic garbage
    collector paused and then frozen (`gc.freeze`): they live as long as the process, and a
    command makes millions of objects, whose collections would otherwise rescan them all
    (~0.05 s of a 0.4 s `analyze`). Only here, never in `main`, which a caller's long-lived
    process may run many times."""
    name = _chosen(sys.argv[1:])
    if name:
        gc.disable()
        try:
            command(name)
        finally:
            gc.enable()
        gc.freeze()
    sys.exit(main())


_INPUTS = ("path", "before", "after", "export", "snapshot")
"""The positional arguments that name a command's input, in the order to name them."""


def _named_input(args: argparse.Namespace) -> str | None:
    """The input the command was given (its file's or folder's name, not its whole path)."""
    named = [getattr(args, k) for k in _INPUTS if getattr(args, k, None) is not None]
    return " and ".join(Path(str(p)).name for p in named) or None
