"""The one registry of findings.

Every finding — a rank's time findings, the memory findings of a trace's memory events or of
an allocator snapshot, a job's findings — is made by a rule, `rule(facts) -> Finding | None`,
registered here with `@rule(Scope)`. The scope is the type of the facts the rule reads: one
context per scope, built once, each carrying the `Thresholds`:

- `Facts` (analysis/findings.py): one rank's `Scope` (analysis/scope.py: its trace, device
  ops, step windows, peaks and thresholds, what every analysis takes) and its analyses;
- `MemoryFacts` (analysis/memory_profile.py): a trace's memory events on the analysed device;
- `SnapshotFacts` (analysis/memory.py): an allocator snapshot's report;
- `JobFacts` (analysis/collectives.py): a job's ranks and their matched collectives.

A rule lives in the module of its topic, whatever its scope. Adding a finding is one function
in one file::

    @rule(Facts)
    def my_finding(f: Facts) -> Finding | None: ...

Rules run in the order they were registered: their modules' import order, then their order in
the module. That order breaks ties where findings are ranked, and it is the order of the
memory findings, which are not ranked.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, TypeVar

from wallfinder.analysis.views import Views
from wallfinder.diagnosis import Finding

__all__ = ["RULES", "TOPICS", "Rule", "evaluate", "rule", "rules_for"]

S = TypeVar("S")
Check = Callable[[S], Finding | None]


@dataclass(frozen=True)
class Rule(Generic[S]):
    """A registered rule: the facts it reads and the function that makes its finding."""

    scope: type[S]
    check: Check[S]

    @property
    def name(self) -> str:
        return self.check.__name__


RULES: list[Rule[Any]] = []
"""Every registered rule, in registration order."""

TOPICS = (
    "wallfinder.analysis.findings",
    "wallfinder.analysis.memory_profile",
    "wallfinder.analysis.memory",
    "wallfinder.analysis.collectives",
)
"""The modules that hold rules. A rule registers when its module is imported; `rules_for`
imports them all first, so that a scope's rules are complete whichever module asks."""


def rule(scope: type[S]) -> Callable[[Check[S]], Check[S]]:
    """Register the decorated function as a rule over facts of type `scope`."""

    def register(check: Check[S]) -> Check[S]:
        RULES.append(Rule(scope, check))
        return check

    return register


def rules_for(scope: type[S]) -> list[Rule[S]]:
    """The rules over facts of type `scope`, in registration order."""
    for module in TOPICS:
        importlib.import_module(module)
    return [r for r in RULES if r.scope is scope]


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
