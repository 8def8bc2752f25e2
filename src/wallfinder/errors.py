"""The one error type wallfinder raises for problems the user can cause."""

from __future__ import annotations


class WallfinderError(Exception):
    """Bad input or an impossible request: a missing file, a file that is not a trace,
    a truncated download, an empty trace, an unknown device.

    The message is one line a person can act on; the CLI prints it and exits with code 2.
    """
