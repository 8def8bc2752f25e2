"""The one error type wallfinder raises for problems the user can cause, and what an
unexpected error (a bug) carries to the one line the command line prints for it."""

from __future__ import annotations

import os
import traceback

DEBUG_ENV = "WALLFINDER_DEBUG"
"""Set (to anything but "" or "0") by `--debug` or by the user: internal errors are not
contained, and the command line prints their traceback."""


class WallfinderError(Exception):
    """Bad input or an impossible request: a missing file, a file that is not a trace,
    a truncated download, an empty trace, an unknown device.

    The message is one line a person can act on; the CLI prints it and exits with code 2.
    """


def debugging() -> bool:
    """Whether internal errors should surface with their traceback (`--debug`)."""
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def describe(exc: BaseException, limit: int = 160) -> str:
    """An exception as one short line: its type and message (`KeyError 'x.forward'`)."""
    text = " ".join(str(exc).split())
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return f"{type(exc).__name__} {text}".strip()


def stage_of(exc: BaseException) -> str | None:
    """The innermost wallfinder function the exception passed through
    (`analysis.phases._collapsed`): where a bug report should start."""
    stage = None
    for frame in traceback.extract_tb(exc.__traceback__):
        module = _module_of(frame.filename)
        if module is not None:
            stage = f"{module}.{frame.name}"
    return stage


def _module_of(filename: str) -> str | None:
    parts = filename.replace("\\", "/").split("/")
    if "wallfinder" not in parts:
        return None
    tail = parts[len(parts) - 1 - parts[::-1].index("wallfinder") + 1 :]
    if not tail:
        return None
    tail[-1] = tail[-1].removesuffix(".py")
    if tail[-1] == "__init__":
        tail.pop()
    return ".".join(tail) or None


def blame(exc: BaseException, file: str) -> None:
    """Record on an unexpected exception which input file it happened on, and where in
    wallfinder (kept on the exception, so it survives a worker process's pickling, which
    drops the traceback)."""
    if getattr(exc, "wallfinder_file", None) is None:
        exc.wallfinder_file = file  # type: ignore[attr-defined]
        exc.wallfinder_stage = stage_of(exc)  # type: ignore[attr-defined]
