"""A rank's analyses as a declared list of stages, run once each, in order.

A stage is `run(scope, upstream) -> part`: what it makes from the rank's `Scope` and the
parts of the stages before it, which it reads as `upstream[STAGE]`. An optional view
(`View`: phases, fusion, the critical path, ...) is contained by the runner: an internal
error inside it leaves its part None and is said in the diagnosis's `not_computed`
(`analysis.views`), and the stages after it go on.

What each stage costs is recorded only when asked (`timings()`, which the benchmark opens):
otherwise the runner reads no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import partial
from time import perf_counter
from typing import Any, Generic, Literal, TypeVar, overload

import msgspec

from wallfinder.analysis.scope import Scope
from wallfinder.trace import release_free_memory

T = TypeVar("T")
U = TypeVar("U", bound="Upstream")


class Stage(msgspec.Struct, Generic[U, T], frozen=True, eq=False):
    """One analysis whose part the verdict needs: an error inside it is the diagnosis's."""

    name: str
    run: Callable[[Scope, U], T]
    frees: bool = False
    """Its temporaries are given back to the system after it (the large analyses: the C
    heap keeps freed pages, and each stage's peak would stack on the last one's)."""


class View(msgspec.Struct, Generic[U, T], frozen=True, eq=False):
    """An optional view: an internal error inside it costs its part (None), said under
    `name` in `not_computed`, and never the verdict."""

    name: str
    """The view's name in `not_computed` (`views.VIEWS`)."""
    run: Callable[[Scope, U], T]
    frees: bool = False


@dataclass
class Upstream:
    """The parts the stages have made, by stage."""

    _made: dict[Stage[Any, Any] | View[Any, Any], object] = field(
        default_factory=dict, init=False, repr=False
    )

    @overload
    def __getitem__(self, stage: View[Any, T]) -> T | None: ...

    @overload
    def __getitem__(self, stage: Stage[Any, T]) -> T: ...

    def __getitem__(self, stage: Stage[Any, Any] | View[Any, Any]) -> Any:
        """The part `stage` made (a KeyError for a stage not run yet: the list's order is
        wrong)."""
        return self._made[stage]


def run(stages: Sequence[Stage[U, Any] | View[U, Any]], scope: Scope, upstream: U) -> None:
    """Run each stage once, in order, into `upstream`; each view contained
    (`scope.views`)."""
    for stage in stages:
        make = partial(stage.run, scope, upstream)
        if _TIMINGS.get() is not None:
            make = partial(_timed_call, stage.name, make)
        upstream._made[stage] = (
            scope.views.compute(stage.name, make) if isinstance(stage, View) else make()
        )
        if stage.frees:
            release_free_memory()


Kind = Literal["stage", "part", "replay"]
"""What a timing is of: a stage of the analysis (or a step around them: the scope, the
findings), a part inside a stage (the critical path's graph, its unchanged replay and
walk), or one what-if's replay and walk."""


class Timing(msgspec.Struct, frozen=True):
    """One recorded cost: what (`kind`, `name`) and its wall time (s)."""

    kind: Kind
    name: str
    seconds: float


_TIMINGS: ContextVar[list[Timing] | None] = ContextVar("wallfinder_timings", default=None)
"""Where the costs are recorded (None: nowhere, and no clock is read)."""


@contextmanager
def timings() -> Iterator[list[Timing]]:
    """Record what each stage and each what-if replay costs inside the block, in the order
    they ran, into the list it yields (for the benchmark: the analysis itself never reads
    it)."""
    out: list[Timing] = []
    token = _TIMINGS.set(out)
    try:
        yield out
    finally:
        _TIMINGS.reset(token)


def timed(name: str, make: Callable[[], T], kind: Kind = "stage") -> T:
    """`make()`, its cost recorded under `name` when `timings()` records."""
    if _TIMINGS.get() is None:
        return make()
    return _timed_call(name, make, kind)


def _timed_call(name: str, make: Callable[[], T], kind: Kind = "stage") -> T:
    start = perf_counter()
    try:
        return make()
    finally:
        out = _TIMINGS.get()
        if out is not None:
            out.append(Timing(kind, name, perf_counter() - start))
