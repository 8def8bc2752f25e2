"""One registry of findings: every rule over one scope's facts, each scope's facts carrying
the one thresholds tree, and a new finding added as one function."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from tracegen import training_trace
from wallfinder import Thresholds, analysis, analyze
from wallfinder.analysis import rules
from wallfinder.analysis.collectives import JobFacts
from wallfinder.analysis.critpath import OVERLAP, Change
from wallfinder.analysis.findings import Facts
from wallfinder.analysis.memory import SnapshotFacts
from wallfinder.analysis.memory_profile import MemoryFacts
from wallfinder.analysis.rules import RULES, TOPICS, declared, evaluate, rule, rules_for
from wallfinder.analysis.scope import Scope
from wallfinder.analysis.verdict import headline
from wallfinder.diagnosis import Finding, Verdict


def test_every_rule_reads_one_of_the_four_scopes_from_a_topic_module() -> None:
    rules_for(Facts)  # imports every topic module, so that every rule is registered
    assert {r.scope for r in RULES} == {Facts, MemoryFacts, SnapshotFacts, JobFacts}
    assert {r.check.__module__ for r in RULES} == set(TOPICS)
    names = [(r.scope, r.name) for r in RULES]
    assert len(names) == len(set(names))
    # Every scope's facts carry the thresholds (a rank's facts through its analysis scope).
    for scope in (MemoryFacts, SnapshotFacts, JobFacts, Scope):
        assert scope.__annotations__["thresholds"] in ("Thresholds", Thresholds)
    assert Facts.__annotations__["scope"] in ("Scope", Scope)
    assert isinstance(Facts.thresholds, property)


def test_a_new_finding_is_one_registered_function(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rules, "RULES", list(RULES))  # the registration is undone after

    @rule(Facts)
    def step_count(f: Facts) -> Finding | None:
        return Finding(
            id="step-count",
            wall="overhead",
            title="Steps counted",
            share=0.5,
            max_speedup=2.0,
            evidence=f"{f.steps.count} steps",
            fix="none",
        )

    assert rules_for(Facts)[-1].check is step_count
    d = analyze(training_trace(4).write(tmp_path / "t.json"))
    found = next(f for f in d.findings if f.id == "step-count")
    assert (found.evidence, found.saves) == ("4 steps", "time")


def test_facts_of_a_scope_with_no_rules_find_nothing() -> None:
    assert evaluate(object()) == []


def test_rules_run_once_when_the_headline_changes_the_wall(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A headline whose wall differs from the typical step's (as when slow steps head it): the
    # findings are ranked again for that wall, not found again.
    monkeypatch.setattr(rules, "RULES", list(RULES))
    calls: list[int] = []

    @rule(Facts, id="counted")
    def counted(f: Facts) -> Finding | None:
        calls.append(f.steps.count)
        return Finding(
            id="counted",
            wall="compute",
            title="Counted",
            share=0.01,
            max_speedup=1.01,
            evidence="",
            fix="",
        )

    def compute_headline(typical: Verdict, *args: object) -> tuple[Verdict, list[Finding]]:
        verdict, findings = headline(typical, *args)  # type: ignore[arg-type]
        return msgspec.structs.replace(verdict, wall="compute"), findings

    monkeypatch.setattr(analysis, "headline", compute_headline)
    d = analyze(training_trace(4).write(tmp_path / "t.json"))
    assert d.verdict.wall == "compute"
    assert len(calls) == 1
    assert d.findings[0].wall == "compute"  # the compute wall's findings first


def test_a_rule_declares_how_its_finding_replays_and_what_it_marks() -> None:
    launch = declared("host-work")
    assert launch is not None
    assert launch is declared("launch-bound")
    assert launch.replay == Change(host=float("inf"))
    comm = declared("exposed-comm")
    assert comm is not None
    assert (comm.replay, comm.bounds) == (None, OVERLAP)
    assert comm.work is not None
    assert declared("no-such-finding") is None
    # Every time rule names its findings.
    assert all(r.ids for r in rules_for(Facts))
