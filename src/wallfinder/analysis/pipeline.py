"""A rank's analyses as a declared list of stages, run once each, in order.

A stage is `run(scope, upstream) -> part`: what it makes from the rank's `Scope` and the
parts of the stages before it, which it reads as `upstream[STAGE]`. An optional view
(`View`: phases, fusion, the critical path, ...) is contained by the runner: an internal
error inside it leaves its part None and is said in the diagnosis's `not_computed`
(`analysis.views`), and the stages after it go on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Generic, TypeVar, overload

from wallfinder.analysis.scope import Scope
from wallfinder.trace import release_free_memory

T = TypeVar("T")
U = TypeVar("U", bound="Upstream")


@dataclass(frozen=True, eq=False)
class Stage(Generic[U, T]):
    """One analysis whose part the verdict needs: an error inside it is the diagnosis's."""

    name: str
    run: Callable[[Scope, U], T]
    frees: bool = False
    """Its temporaries are given back to the system after it (the large analyses: the C
    heap keeps freed pages, and each stage's peak would stack on the last one's)."""


@dataclass(frozen=True, eq=False)
class View(Generic[U, T]):
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
        upstream._made[stage] = (
            scope.views.compute(stage.name, make) if isinstance(stage, View) else make()
        )
        if stage.frees:
            release_free_memory()
