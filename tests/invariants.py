"""What holds of every diagnosis, whatever the trace and however fast the machine that made it:
the checks the real-trace and real-workload tests make of each result they get."""

from __future__ import annotations

import pytest

from wallfinder import Diagnosis
from wallfinder.analysis.classify import KernelClass

CLASSES = {c.value for c in KernelClass}


def assert_diagnosis_invariants(d: Diagnosis) -> None:
    """The breakdown's parts sum to the step, every fraction is one, every kernel has a
    class, the verdict answers the four questions, and the result survives JSON."""
    b = d.breakdown
    parts = [b.compute, b.comm_exposed, b.copy_exposed, b.idle]
    assert all(0.0 <= x <= 1.0 for x in parts), parts
    assert sum(parts) == pytest.approx(1.0, abs=1e-6)
    assert all(0.0 <= x <= 1.0 for x in b.idle_causes.values())
    assert sum(b.idle_causes.values()) == pytest.approx(b.idle, abs=1e-6)
    assert d.steps.count >= 1
    assert d.steps.total >= d.steps.count
    assert d.steps.median_s > 0
    assert d.steps.min_s <= d.steps.median_s <= d.steps.max_s
    for step in b.steps:
        total = step.compute_s + step.comm_exposed_s + step.copy_exposed_s + step.idle_s
        assert total == pytest.approx(step.duration_s, abs=2e-9)
        assert sum(step.idle_causes_s.values()) == pytest.approx(step.idle_s, abs=2e-9)
    for row in d.kernels:
        assert row.cls in CLASSES
        assert row.time_s >= 0
        assert 0.0 <= row.share <= 1.0
    if d.classes:
        assert {c.cls for c in d.classes} <= CLASSES
        assert sum(c.share for c in d.classes) == pytest.approx(1.0, abs=1e-6)
    assert d.verdict.wall in ("compute", "bandwidth", "overhead")
    assert len(d.verdict.questions) == 4
    assert Diagnosis.from_json(d.to_json()) == d
    for m in d.memory.devices if d.memory else []:
        # What is live at the peak, by category, adds up to the allocator's peak.
        assert sum(m.categories.values()) == m.peak_allocated
        assert all(v >= 0 for v in m.categories.values())
        assert max(p.allocated for p in m.timeline) == m.peak_allocated


def assert_findings_bounded(d: Diagnosis) -> None:
    """Each finding claims a share of the step no larger than the time it explains, a gain of
    at least 1x, evidence and a fix; the verdict's wall's findings come first, by gain. Memory
    findings claim no step time and move no wall."""
    b = d.breakdown
    explained = {
        "data-loading": b.idle_causes.get("data_loading", 0.0),
        "sync-in-step": b.idle_causes.get("synchronization", 0.0),
        "launch-bound": b.idle_causes.get("host_overhead", 0.0)
        + b.idle_causes.get("launch_latency", 0.0),
        "exposed-comm": b.comm_exposed,
        "exposed-copies": b.copy_exposed,
        "host-collective-wait": b.idle_causes.get("communication_wait", 0.0),
    }
    for f in d.findings:
        assert f.saves == "time", f.id
        assert 0.0 < f.share <= 1.0, f.id
        assert f.max_speedup >= 1.0, f.id
        if f.id in explained:
            assert f.share <= explained[f.id] + 1e-9, f.id
        assert f.evidence
        assert f.fix
    order = [(f.wall != d.verdict.wall, -f.max_speedup) for f in d.findings]
    assert order == sorted(order)
    for f in d.memory.findings if d.memory is not None else []:
        assert (f.saves, f.wall, f.share, f.max_speedup) == ("memory", None, 0.0, 1.0), f.id
