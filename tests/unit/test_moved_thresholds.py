"""The constants that decide a figure are in the one `Thresholds` tree: the verdict's step
count and costed share, how near events are read as one waiting on the other (`slack`), a
skinny GEMM tile. Setting one moves the result where it is used, as the verdict's do."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_critpath import queue_full

from tracegen import TraceBuilder
from wallfinder import Options, analyze
from wallfinder.analysis import SlackThresholds, Thresholds, diagnose
from wallfinder.trace import Trace, load_trace

GEMM = "volta_sgemm_128x64_nn"
"""A cuBLAS GEMM whose name gives its 128x64 tile."""


@pytest.fixture
def queued(tmp_path: Path) -> Trace:
    """Five steps of 1 ms, each two GEMMs: the second launched 110 µs before the first ends,
    starting 90 µs after it (the GPU idle between them with the work already queued)."""
    b = TraceBuilder()
    t0 = 0.0
    for i in range(5):
        b.step(i + 1, t0, 1000.0)
        b.cpu_op("aten::mm", t0, 8.0)
        b.kernel(GEMM, t0 + 10.0, 400.0, launch_at=t0 + 2.0)
        b.cpu_op("aten::mm", t0 + 300.0, 8.0)
        b.kernel(GEMM, t0 + 500.0, 400.0, launch_at=t0 + 302.0)
        t0 += 1000.0
    return load_trace(b.write(tmp_path / "t.json"))


def test_the_stability_answer_needs_the_thresholds_step_count(queued: Trace) -> None:
    d = diagnose(queued)
    assert d.steps.count == 5
    assert d.verdict.questions[0].answer == "yes"
    assert not any("steady-state steps" in t for t in d.verdict.thin_evidence)
    more = diagnose(queued, Thresholds(min_steps=d.steps.count + 1))
    assert more.verdict.questions[0].answer == "unknown"
    assert f"(at least {d.steps.count + 1})" in more.verdict.questions[0].detail
    assert any(t.startswith("5 steady-state steps") for t in more.verdict.thin_evidence)


def test_queued_work_is_a_dependency_wait_by_the_thresholds_slack(queued: Trace) -> None:
    # Launched 110 µs before the gap: queued by the default 50 µs slack, so the gap is a
    # dependency wait; with a 200 µs slack the launch path covers it: launch latency.
    causes = diagnose(queued).breakdown.idle_causes
    assert causes["dependency_wait"] > 0
    wide = Thresholds(slack=SlackThresholds(queued_ns=200_000))
    moved = diagnose(queued, wide).breakdown.idle_causes
    assert moved["dependency_wait"] == 0
    assert moved["launch_latency"] == pytest.approx(
        causes["launch_latency"] + causes["dependency_wait"]
    )


def test_a_skinny_tile_is_the_thresholds_width(queued: Trace) -> None:
    # No shapes, so no cost: the 128x64 tile's GEMM is bandwidth-bound only once 64 is skinny.
    (row,) = diagnose(queued).kernels
    assert row.bound != "bandwidth"
    (wide,) = diagnose(queued, Thresholds(skinny_tile=64)).kernels
    assert (wide.bound, wide.bound_basis) == ("bandwidth", "class")


def test_the_costed_share_that_is_thin_evidence_is_the_thresholds(queued: Trace) -> None:
    def costed_note(t: Thresholds) -> bool:
        return any("has a cost model" in e for e in diagnose(queued, t).verdict.thin_evidence)

    assert costed_note(Thresholds())
    assert not costed_note(Thresholds(min_costed_share=0.0))


def test_the_critical_path_reads_its_edges_by_the_thresholds_slack(tmp_path: Path) -> None:
    # The third and fourth launch calls (104 and 99 µs) block on a full queue: longer than the
    # default 50 µs slack, so the path runs through the GEMMs that free a slot. With a 200 µs
    # slack they are ordinary launch calls, and the path runs through them instead.
    trace = queue_full().write(tmp_path / "t.json")
    path = analyze(trace).critical_path
    assert path is not None
    assert path.shares["launch"] < 0.1 < path.shares["compute"]
    wide = Thresholds(slack=SlackThresholds(queued_ns=200_000))
    moved = analyze(trace, Options(thresholds=wide)).critical_path
    assert moved is not None
    assert moved.shares["compute"] < 0.1 < moved.shares["launch"]
