"""What holds of every diagnosis, whatever the trace and however fast the machine that made it:
the checks the real-trace and real-workload tests make of each result they get."""

from __future__ import annotations

import pytest

from wallfinder import Diagnosis
from wallfinder.analysis.classify import KernelClass
from wallfinder.analysis.critpath import covers, parse_what_if
from wallfinder.analysis.rules import declared

CLASSES = {c.value for c in KernelClass}


def assert_diagnosis_invariants(d: Diagnosis) -> None:
    """The diagnosis keeps its own invariants (`Diagnosis.self_check`) and survives JSON."""
    d.self_check()
    assert Diagnosis.from_json(d.to_json()) == d


def assert_findings_bounded(d: Diagnosis) -> None:
    """Each finding claims a share of the step no larger than the time it explains, a gain of
    at least 1x, evidence and a fix; the verdict's wall's findings come first, by gain. Memory
    findings claim no step time and move no wall. Time findings' shares are of the step
    without its one-off start-up (idle cause `startup`)."""
    b = d.breakdown
    recurring = 1.0 - b.idle_causes.get("startup", 0.0)
    explained = {
        "data-loading": b.idle_causes.get("data_loading", 0.0),
        # A sync that keeps the host from running ahead also costs the idle while the host
        # catches up after it: the host's overhead and launches.
        "sync-in-step": b.idle_causes.get("synchronization", 0.0)
        + b.idle_causes.get("host_overhead", 0.0)
        + b.idle_causes.get("launch_latency", 0.0),
        "launch-bound": b.idle_causes.get("host_overhead", 0.0)
        + b.idle_causes.get("launch_latency", 0.0),
        "exposed-comm": b.comm_exposed,
        "exposed-copies": b.copy_exposed,
        "host-collective-wait": b.idle_causes.get("communication_wait", 0.0),
    }
    for f in d.findings:
        assert f.saves in ("time", "once"), f.id
        assert 0.0 < f.share <= 1.0, f.id
        assert f.max_speedup >= 1.0, f.id
        if f.id in explained:
            assert f.share <= explained[f.id] / recurring + 1e-9, f.id
        assert f.evidence
        assert f.fix
    order = [(f.wall != d.verdict.wall, -f.max_speedup) for f in d.findings]
    assert order == sorted(order)
    assert_one_figure_per_fix(d)


def assert_one_figure_per_fix(d: Diagnosis) -> None:
    """No what-if row gains more than a replayed finding shown for the same fix or a larger
    one of its kind, nor than the bound of a finding that keeps its bound for that fix."""
    cp = d.critical_path
    if cp is None:
        return
    for row in cp.what_if:
        if row.change == "straggler":
            continue
        change = parse_what_if(row.change)[-1]
        for f in d.findings:
            rule = declared(f.id)
            covering = rule.replay if rule is not None else None
            if f.replay_speedup is not None and covering is not None and covers(covering, change):
                assert row.speedup <= f.replay_speedup + 1e-9, (row.change, f.id)
            bound = rule.bounds if rule is not None else None
            if bound is not None and covers(bound, change):
                assert row.speedup <= f.max_speedup + 1e-9, (row.change, f.id)
    for f in d.memory.findings if d.memory is not None else []:
        assert (f.saves, f.wall, f.share, f.max_speedup) == ("memory", None, 0.0, 1.0), f.id


def assert_phases_and_modules(d: Diagnosis) -> None:
    """Phases tile every step (exposed times sum to it), no phase's device time exceeds the
    step, and every module's time holds its children's."""
    p = d.phases
    if p is not None:
        assert sum(p.exposed.values()) == pytest.approx(1.0, abs=1e-9)
        for step in p.steps:
            assert sum(step.exposed_s.values()) == pytest.approx(step.duration_s, abs=2e-9)
            assert all(v >= 0 for v in step.exposed_s.values())
            assert all(0 <= v <= step.duration_s + 2e-9 for v in step.gpu_s.values())
    m = d.modules
    if m is not None:
        rows = {r.path: r for r in m.rows}
        children: dict[str, float] = {}
        for r in m.rows:
            assert 0.0 <= r.share <= 1.0
            if r.parent is not None:
                assert r.parent in rows, r.path
                children[r.parent] = children.get(r.parent, 0.0) + r.forward_s + r.backward_s
        for path, total in children.items():
            own = rows[path].forward_s + rows[path].backward_s
            assert total <= own * (1 + 1e-9) + 2e-9, path
