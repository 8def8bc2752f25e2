"""The step's dependency graph: its critical path, the unchanged replay (which reproduces the
measured step) and what-if replays, on synthetic traces whose critical path is known."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_collectives import write_job

from tracegen import TraceBuilder, training_trace
from wallfinder import Options, analyze
from wallfinder.analysis.critpath import Change, _fewest, parse_what_if
from wallfinder.diagnosis import CriticalPath, Diagnosis
from wallfinder.errors import WallfinderError
from wallfinder.report import render

US = 1e-6


def _path(d: Diagnosis) -> CriticalPath:
    assert d.critical_path is not None
    return d.critical_path


def _row(path: CriticalPath, change: str) -> float:
    return next(r.step_s for r in path.what_if if r.change == change)


def host_bound(steps: int = 5) -> TraceBuilder:
    """Each step: 4 ops of 40 µs of host work, each launching a 5 µs kernel at its end. The
    host chain sets the step (160 µs)."""
    b = TraceBuilder()
    for s in range(steps):
        t0 = s * 160.0
        b.step(s + 1, t0, 160.0)
        for i in range(4):
            t = t0 + 40.0 * i
            b.cpu_op("aten::add", t, 40.0)
            b.kernel("vectorized_elementwise_kernel", t + 40.0 - 2.0, 5.0, launch_at=t + 34.0)
    return b


def gpu_bound(steps: int = 5) -> TraceBuilder:
    """Each step: the host launches 4 GEMMs in its first 20 µs; they run back to back, 100 µs
    each. The stream sets the step (400 µs)."""
    b = TraceBuilder()
    for s in range(steps):
        t0 = s * 400.0
        b.step(s + 1, t0, 400.0)
        for i in range(4):
            b.cpu_op("aten::mm", t0 + 5.0 * i, 5.0)
            b.kernel(
                "sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n",
                t0 + 10.0 + 100.0 * i,
                100.0,
                launch_at=t0 + 5.0 * i + 1.0,
                launch_dur=3.0,
            )
    return b


def sync_bound(steps: int = 5) -> TraceBuilder:
    """Each step: a 200 µs kernel, then the host blocks in cudaStreamSynchronize until it ends,
    then 50 µs of host work launches the next step's kernel. The sync joins host and device:
    the step is 200 + 50 µs; without the sync the host runs ahead and the kernels run back
    to back."""
    b = TraceBuilder()
    period = 260.0
    for s in range(steps):
        t0 = s * period
        b.step(s + 1, t0, period)
        b.cpu_op("aten::mm", t0, 6.0)
        b.kernel("sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", t0 + 10.0, 200.0, launch_at=t0 + 1.0)
        b.sync(t0 + 6.0, 205.0)
        b.cpu_op("optimizer_host_work", t0 + 211.0, 49.0)
    return b


def test_a_host_bound_step_has_the_host_on_its_path(tmp_path: Path) -> None:
    d = analyze(host_bound().write(tmp_path / "t.json"))
    path = _path(d)
    assert path.replayed_step_s == pytest.approx(path.measured_step_s, rel=1e-9)
    assert path.replay_error == pytest.approx(0.0, abs=1e-9)
    assert path.shares["host"] > 0.8
    assert path.wall == "overhead"
    # Halving the host's work halves the step: the kernels are short.
    assert _row(path, "host:2") == pytest.approx(path.measured_step_s / 2, rel=0.05)


def test_a_gpu_bound_step_has_its_kernels_on_the_path(tmp_path: Path) -> None:
    d = analyze(gpu_bound().write(tmp_path / "t.json"))
    path = _path(d)
    # The first step's window begins at its CPU start, 10 µs before its first kernel.
    assert path.measured_step_s == pytest.approx((410 + 4 * 400) / 5 * US, rel=1e-9)
    assert path.replayed_step_s == pytest.approx(path.measured_step_s, rel=1e-9)
    assert path.shares["compute"] > 0.9
    assert path.wall == "compute"
    # Less host work does not move a step the GPU sets (but the first launch's latency).
    assert _row(path, "host:2") == pytest.approx(path.measured_step_s, rel=0.01)


def test_a_sync_joins_host_and_device_and_removing_it_lets_the_host_run_ahead(
    tmp_path: Path,
) -> None:
    d = analyze(sync_bound().write(tmp_path / "t.json"))
    path = _path(d)
    assert path.replayed_step_s == pytest.approx(path.measured_step_s, rel=1e-9)
    assert path.sync_edges > 0
    assert path.shares["compute"] > 0.6
    # Without the sync the host's 56 µs per step hide under the 200 µs kernels.
    assert _row(path, "sync") == pytest.approx(200 * US, rel=0.05)
    assert path.measured_step_s > _row(path, "sync")


def test_removing_the_data_wait_gains_exactly_the_loader_time(tmp_path: Path) -> None:
    # training_trace: 100 µs of DataLoader, then two (10 µs + 150 µs kernel) launches.
    d = analyze(training_trace(6).write(tmp_path / "t.json"))
    path = _path(d)
    assert path.replayed_step_s == pytest.approx(420 * US, rel=1e-9)
    assert path.shares["data"] == pytest.approx(100 / 420, rel=0.01)
    assert _row(path, "data") == pytest.approx(320 * US, rel=1e-6)
    finding = next(f for f in d.findings if f.id == "data-loading")
    assert finding.gain_basis == "replay"
    assert finding.replay_speedup == pytest.approx(420 / 320, rel=1e-3)
    assert finding.replay_speedup <= finding.max_speedup
    assert finding.wall_after is not None


def test_findings_the_graph_cannot_replay_say_bound(tmp_path: Path) -> None:
    # Kernels with fewer blocks than SMs: the graph has no change for the grid size.
    d = analyze(gpu_bound().write(tmp_path / "t.json"))
    finding = next(f for f in d.findings if f.id == "tiny-grids")
    assert (finding.gain_basis, finding.replay_speedup, finding.wall_after) == ("bound", None, None)
    assert "(bound;" in render(d, "text")


def test_what_if_combines_the_fixes_asked_for(tmp_path: Path) -> None:
    d = analyze(training_trace(6).write(tmp_path / "t.json"), Options(what_if="data,host:4"))
    path = _path(d)
    assert [r.change for r in path.what_if] == ["data", "host:4", "data,host:4"]
    data, host, both = (r.step_s for r in path.what_if)
    assert both < min(data, host)
    assert Diagnosis.from_json(d.to_json()) == d


def test_the_job_path_runs_through_the_straggler(tmp_path: Path) -> None:
    d = analyze(write_job(tmp_path, r1=300.0), workers=1)
    path = _path(d)
    assert path.rank == 1
    straggler = next(r for r in path.what_if if r.change == "straggler")
    # Rank 0 waits 300 µs per step for rank 1: at the median, that wait leaves the step.
    assert path.measured_step_s - straggler.step_s == pytest.approx(300 * US, rel=0.02)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("data", [Change(data=True)]),
        ("host:4", [Change(host=4.0)]),
        ("matmul:90%", [Change(matmul=0.9)]),
        ("sync,fuse", [Change(sync=True), Change(fuse=True), Change(sync=True, fuse=True)]),
    ],
)
def test_what_if_text_is_parsed(text: str, expected: list[Change]) -> None:
    assert parse_what_if(text) == expected


@pytest.mark.parametrize("text", ["", "warp", "host:0.5", "matmul:2", "data:3", "host:x"])
def test_bad_what_if_text_is_one_clear_error(text: str) -> None:
    with pytest.raises(WallfinderError, match="--what-if"):
        parse_what_if(text)


@pytest.mark.parametrize("fmt", ["text", "md", "html"])
def test_every_format_shows_the_what_if_table_and_the_replayed_gain(
    tmp_path: Path, fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "160")
    d = analyze(training_trace(6).write(tmp_path / "t.json"))
    out = render(d, fmt)
    assert "What if" in out
    assert "by replay" in out
    assert "critical path" in out
    assert "data,host" not in out  # the default table: each fix alone


def test_a_cpu_only_trace_has_no_critical_path(tmp_path: Path) -> None:
    b = TraceBuilder(device_name=None)
    for s in range(4):
        b.step(s + 1, s * 100.0, 100.0)
        b.cpu_op("aten::add", s * 100.0 + 10, 50.0)
    d = analyze(b.write(tmp_path / "t.json"))
    assert d.critical_path is None
    assert all(f.replay_speedup is None for f in d.findings)


def test_the_path_through_the_timelines_step_is_in_order_and_drawn(tmp_path: Path) -> None:
    d = analyze(training_trace(6).write(tmp_path / "t.json"))
    assert d.timeline is not None
    segments = _path(d).timeline
    # The step begins with its DataLoader wait, on the path.
    assert (segments[0].category, segments[0].start_s) == ("data", 0.0)
    assert segments[0].end_s == pytest.approx(100 * US)
    ends = [s.start_s for s in segments[1:]]
    assert ends == [s.end_s for s in segments[:-1]]  # contiguous, in time order
    assert segments[-1].end_s <= d.timeline.duration_s + 1e-12
    assert '"critical path"' in render(d, "html")


def test_the_sync_finding_gets_its_gain_by_replay(tmp_path: Path) -> None:
    d = analyze(sync_bound().write(tmp_path / "t.json"))
    finding = next(f for f in d.findings if f.id == "sync-in-step")
    assert finding.gain_basis == "replay"
    assert finding.replay_speedup is not None
    # Without the sync the step is the kernels' 200 µs: the replay, capped at the bound.
    replayed = _path(d).measured_step_s / (200 * US)
    assert finding.replay_speedup == pytest.approx(min(replayed, finding.max_speedup), rel=0.02)
    assert finding.wall_after == "compute"


def test_fusing_kernels_off_the_path_gains_less_than_its_bound(tmp_path: Path) -> None:
    """Fusing pointwise kernels of a host-bound step: Amdahl's bound over their time is
    10%, but they are not on the critical path, so the replay gains next to nothing."""
    d = analyze(host_bound().write(tmp_path / "t.json"))
    finding = next(f for f in d.findings if f.id == "fusable-pointwise")
    assert finding.gain_basis == "replay"
    assert finding.max_speedup > 1.05
    assert finding.replay_speedup is not None
    assert finding.replay_speedup < 1.01
    assert finding.wall_after == "overhead"


def _fewest_by_scanning(segments: list[list[Any]], most: int) -> list[list[Any]]:
    """The timeline's rule stated plainly: merge the first of the shortest segments (never
    the first) into the one before it until `most` are left."""
    merged = [list(s) for s in segments]
    while len(merged) > most:
        i = min(range(1, len(merged)), key=lambda j: merged[j][1] - merged[j][0])
        merged[i - 1][1] = merged[i][1]
        del merged[i]
    return merged


def test_fewest_merges_the_shortest_segment_into_the_one_before_it() -> None:
    segments = [[0, 10, "a"], [10, 11, "b"], [11, 20, "a"], [20, 22, "c"], [22, 23, "b"]]
    assert _fewest([list(s) for s in segments], 3) == [
        [0, 11, "a"],
        [11, 20, "a"],
        [20, 23, "c"],
    ]
    assert _fewest([list(s) for s in segments], 5) == segments


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(1, 4)), min_size=1, max_size=40),
    st.integers(1, 12),
)
def test_fewest_agrees_with_merging_by_scanning(steps: list[tuple[int, int]], most: int) -> None:
    segments, at = [], 0
    for i, (gap, length) in enumerate(steps):
        at += gap
        segments.append([at, at + length, "ab"[i % 2]])
        at += length
    assert _fewest([list(s) for s in segments], most) == _fewest_by_scanning(segments, most)
