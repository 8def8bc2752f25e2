"""The boundary of an optional view: a bug inside one costs that view, never the verdict.

The verdict (steps, breakdown, the four questions, the findings) never depends on an
optional view (phases, modules, critical path and what-if, fusion, timeline, memory,
counters). Each view is computed through `Views.compute`: an unexpected exception inside
it leaves the view out and is said in the diagnosis's `not_computed` ("modules: internal
error: KeyError …"), and the rest of the diagnosis goes on. The user's bad input
(`WallfinderError`) is not a bug and passes through; with `--debug` nothing is contained,
so the traceback shows where the bug is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import msgspec

from wallfinder.errors import WallfinderError, debugging, describe

T = TypeVar("T")

VIEWS = (
    "phases",
    "modules",
    "fusion",
    "timeline",
    "critical path",
    "memory",
    "counters",
    "compiled",
)
"""The optional views of a rank, by the names `not_computed` gives them; a rule that fails
is said as `finding RULE`, a job's cross-rank view as `collectives`."""


class Views(msgspec.Struct):
    """The optional views of one diagnosis that an internal error left out, with why."""

    failed: dict[str, str] = msgspec.field(default_factory=dict)

    def compute(self, view: str, make: Callable[[], T]) -> T | None:
        """`make()`, or None when it raised anything but the user's bad input (the view is
        then said as not computed)."""
        try:
            return make()
        except WallfinderError:
            raise
        except Exception as exc:
            if debugging():
                raise
            self.fail(view, exc)
            return None

    def fail(self, view: str, exc: BaseException) -> None:
        reason = f"internal error: {describe(exc)}; rerun with --debug"
        self.failed.setdefault(view, reason)
