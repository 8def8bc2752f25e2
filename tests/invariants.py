"""What holds of every diagnosis, whatever the trace and however fast the machine that made it:
the checks the real-trace and real-workload tests make of each result they get."""

from __future__ import annotations

from wallfinder import Diagnosis
from wallfinder.analysis.classify import KernelClass

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
        "sync-in-step": b.idle_causes.get("synchronization", 0.0),
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
    for f in d.memory.findings if d.memory is not None else []:
        assert (f.saves, f.wall, f.share, f.max_speedup) == ("memory", None, 0.0, 1.0), f.id
