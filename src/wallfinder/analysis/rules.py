"""The one registry of findings.

Every finding — a rank's time findings, the memory findings of a trace's memory events or of
an allocator snapshot, a job's findings — is made by a rule, `rule(facts) -> Finding | None`,
registered here with `@rule(Scope, ...)`. The scope is the type of the facts the rule reads: one
context per scope, built once, each carrying the `Thresholds`:

- `Facts` (analysis/findings.py): one rank's `Scope` (analysis/scope.py: its trace, device
  ops, step windows, peaks and thresholds, what every analysis takes) and its analyses;
- `MemoryFacts` (analysis/memory_profile.py): a trace's memory events on the analysed device;
- `SnapshotFacts` (analysis/memory.py): an allocator snapshot's report;
- `JobFacts` (analysis/collectives.py): a job's ranks and their matched collectives.

A rule lives in the module of its topic, whatever its scope, and declares there everything
about itself: the ids of the findings it makes, how the what-if replays its fix (`replay`, a
`critpath.Change`: its gain is then the replayed step, else its Amdahl bound), and which work
is its evidence on the timeline (`work`: the host calls, or a mask over the device ops, that
`analyze --annotate` marks), and, for a parallel strategy's own loss, the exposed communication
its finding explains (`claims`: taken out of the generic `exposed-comm`, and named by the
verdict when it is most of it). Adding a finding is one function in one file::

    @rule(Facts, id="my-finding", replay=Change(sync=True), work=my_calls)
    def my_finding(f: Facts) -> Finding | None: ...

Rules run in the order they were registered: their modules' order in `TOPICS`, then their
order in the module. That order breaks ties where findings are ranked, and it is the order of
the memory findings, which are not ranked.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import msgspec
import numpy as np
import numpy.typing as npt

from wallfinder.analysis.views import Views
from wallfinder.diagnosis import Finding
from wallfinder.trace import Events

if TYPE_CHECKING:
    # Only its type: the topic modules make the changes, and critpath reads them back here.
    from wallfinder.analysis.critpath import Change

__all__ = [
    "RULES",
    "TOPICS",
    "Claim",
    "Rule",
    "claimed",
    "declared",
    "evaluate",
    "rule",
    "rules_for",
]

S = TypeVar("S")
Check = Callable[[S], Finding | None]
Work = Callable[[S], Events | npt.NDArray[np.bool_]]
"""A finding's evidence on the timeline: its host calls (`Events`), or a mask over the
device's ops (`DeviceOps.ops`; empty where the trace has none)."""


class Claim(msgspec.Struct, frozen=True):
    """The exposed communication a strategy's finding explains: a share of the measured step
    (as `Breakdown.comm_exposed` is), and its mechanism in words, for the verdict."""

    share: float
    words: str


Claims = Callable[[S], Claim | None]


class Rule(msgspec.Struct, Generic[S], frozen=True):
    """A registered rule: the facts it reads, the function that makes its finding, and what
    it declares about that finding."""

    scope: type[S]
    check: Check[S]
    ids: tuple[str, ...] = ()
    """The ids of the findings it makes (one, or one per face: launch-bound or host-work)."""
    replay: Change | None = None
    """The what-if change its fix stands for (the change its Amdahl bound assumes: its share
    gone), which replays its gain on the step's dependency graph; None: the bound stands."""
    bounds: Change | None = None
    """A what-if of its fix that it does not replay (it keeps its bound, what the fix can
    reach in principle), and whose what-if row is no faster than that bound."""
    work: Work[S] | None = None
    """Its evidence on the timeline; None: it names no particular work."""
    claims: Claims[S] | None = None
    """The exposed communication its finding explains (a parallel strategy's own loss: the
    pipeline's bubble, FSDP's all-gathers, TP's all-reduces), which `exposed-comm` leaves to
    it rather than count twice; None: it claims none."""

    @property
    def name(self) -> str:
        return self.check.__name__


RULES: list[Rule[Any]] = []
"""Every registered rule, in registration order."""

TOPICS = (
    "wallfinder.analysis.topics.data",
    "wallfinder.analysis.topics.sync",
    "wallfinder.analysis.topics.host",
    # A parallel strategy's own losses before the generic exposed communication they claim
    # their share of: at an equal bound, the finding with the strategy's fix leads.
    "wallfinder.analysis.topics.pipeline",
    "wallfinder.analysis.topics.sharding",
    "wallfinder.analysis.topics.experts",
    "wallfinder.analysis.topics.comm",
    "wallfinder.analysis.topics.copies",
    "wallfinder.analysis.topics.matmul",
    "wallfinder.analysis.topics.fusion",
    "wallfinder.analysis.topics.steps",
    "wallfinder.analysis.topics.phases",
    "wallfinder.analysis.topics.compiled",
    "wallfinder.analysis.topics.serving",
    "wallfinder.analysis.memory_profile",
    "wallfinder.analysis.memory",
    "wallfinder.analysis.collectives",
)
"""The modules that hold rules, in the order their rules run. A rule registers when its
module is imported; `rules_for` imports them all first, so that a scope's rules are complete
whichever module asks."""


def rule(
    scope: type[S],
    *,
    id: str | tuple[str, ...] = (),
    replay: Change | None = None,
    bounds: Change | None = None,
    work: Work[S] | None = None,
    claims: Claims[S] | None = None,
) -> Callable[[Check[S]], Check[S]]:
    """Register the decorated function as a rule over facts of type `scope`, making the
    findings `id`, replayed by `replay` (or bounded by the what-if `bounds`), with `work` as
    their evidence on the timeline and `claims` the exposed communication they explain."""

    def register(check: Check[S]) -> Check[S]:
        ids = (id,) if isinstance(id, str) else id
        RULES.append(Rule(scope, check, ids, replay, bounds, work, claims))
        return check

    return register


def _imported() -> None:
    for module in TOPICS:
        importlib.import_module(module)


def rules_for(scope: type[S]) -> list[Rule[S]]:
    """The rules over facts of type `scope`, in registration order."""
    _imported()
    return [r for r in RULES if r.scope is scope]


def declared(finding: str) -> Rule[Any] | None:
    """The rule that makes the findings of id `finding` (None: no rule declares it)."""
    _imported()
    return next((r for r in RULES if finding in r.ids), None)


def evaluate(facts: S, views: Views | None = None) -> list[Finding]:
    """The finding of every rule of `facts`' scope that finds one, in registration order.
    With `views`, a rule that fails with an internal error is left out and said there
    (`finding NAME`), and the other rules still run."""
    found = []
    for r in rules_for(type(facts)):
        x = (
            r.check(facts)
            if views is None
            else views.compute(f"finding {r.name}", partial(r.check, facts))
        )
        if x is not None:
            found.append(x)
    return found


def claimed(facts: S) -> list[Claim]:
    """What the rules of `facts`' scope that claim exposed communication claim of it, in
    registration order (claims of nothing left out)."""
    found = (r.claims(facts) for r in rules_for(type(facts)) if r.claims is not None)
    return [c for c in found if c is not None and c.share > 0]
