"""The step's dependency graph: its critical path, the unchanged replay (which reproduces the
measured step) and what-if replays, on synthetic traces whose critical path is known."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec.structs import replace
from test_collectives import rank_trace, write_job
from test_findings import cpu_step_with_gloo_beside, ddp_accumulation

from tracegen import TraceBuilder, training_trace
from wallfinder import Options, analyze
from wallfinder.analysis import critpath
from wallfinder.analysis.critpath import (
    CATEGORIES,
    Change,
    Timing,
    consistent_rows,
    parse_what_if,
    with_replay,
)
from wallfinder.analysis.critpath import path as critpath_path
from wallfinder.analysis.critpath import rank as critpath_rank
from wallfinder.analysis.critpath import timing as critpath_timing
from wallfinder.analysis.critpath import whatif as critpath_whatif
from wallfinder.analysis.critpath.drawn import fewest
from wallfinder.analysis.pipeline import timings
from wallfinder.analysis.thresholds import Thresholds, TimeThresholds
from wallfinder.diagnosis import CriticalPath, Diagnosis, Finding, WhatIfRow
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


def comm_exposed(steps: int = 5) -> TraceBuilder:
    """Each step: three 100 µs backward GEMMs, then a 150 µs all-reduce on its own stream that
    waited for the last of them, then a 30 µs optimizer kernel that waited for the all-reduce;
    the host launches it all in its first 10 µs and blocks in a sync until the device drains,
    then 28 µs of host work. The step is 520 µs, 150 of them the exposed all-reduce."""
    b = TraceBuilder()
    for s in range(steps):
        t0 = s * 520.0
        b.step(s + 1, t0, 520.0)
        for i in range(3):
            b.kernel(
                "sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n",
                t0 + 10.0 + 100.0 * i,
                100.0,
                launch_at=t0 + 1.0 + 2.0 * i,
                launch_dur=1.0,
            )
        b.nccl(t0 + 310.0, 150.0, launch_at=t0 + 7.0)
        b.kernel("vectorized_elementwise_kernel", t0 + 460.0, 30.0, launch_at=t0 + 9.0)
        b.sync(t0 + 11.0, 481.0)
    return b


def test_on_the_cpu_without_dispatch_sized_ops_a_host_cut_divides_only_the_python(
    tmp_path: Path,
) -> None:
    b = TraceBuilder(device_name=None)
    for s in range(4):
        b.step(s + 1, s * 100.0, 100.0)
        b.cpu_op("aten::mm", s * 100.0 + 20.0, 60.0)  # 20 µs of Python before and after
    d = analyze(b.write(tmp_path / "t.json"), Options(what_if="host:4"))
    path = _path(d)
    assert _row(path, "host:4") == pytest.approx((60 + 40 / 4) * US, rel=1e-3)
    assert "so a host cut (host:F) divides only the Python between ops" in path.notes[0]


def test_overlapping_a_collective_with_the_backward_hides_it_behind_the_last_gemm(
    tmp_path: Path,
) -> None:
    d = analyze(comm_exposed().write(tmp_path / "t.json"), Options(what_if="overlap"))
    path = _path(d)
    assert path.event_waits >= 2 * 5  # the all-reduce's and the optimizer kernel's
    # The all-reduce starts with the last GEMM: 100 of its 150 µs run beside it.
    assert path.replayed_step_s == pytest.approx(path.measured_step_s, rel=1e-3)
    saved = path.measured_step_s - _row(path, "overlap")
    assert saved == pytest.approx(100 * US, rel=0.01)
    # The finding keeps its Amdahl bound: the overlap replay is an opt-in estimate, not the
    # finding's figure (on real traces it cannot see the peers a collective waits for).
    finding = next(f for f in d.findings if f.id == "exposed-comm")
    assert finding.gain_basis == "bound"
    assert finding.replay_speedup is None


def test_a_host_bound_step_has_the_host_on_its_path(tmp_path: Path) -> None:
    d = analyze(host_bound().write(tmp_path / "t.json"))
    path = _path(d)
    assert path.replayed_step_s == pytest.approx(path.measured_step_s, rel=1e-9)
    assert path.replay_error == pytest.approx(0.0, abs=1e-9)
    assert path.shares["host"] > 0.8
    assert path.wall == "overhead"
    # Halving the host's work halves the step: the kernels are short.
    assert _row(path, "host:2") == pytest.approx(path.measured_step_s / 2, rel=0.05)


def test_a_whole_trace_window_replays_the_host_work_after_its_last_kernel(
    tmp_path: Path,
) -> None:
    # No step markers: one window over the trace, which keeps the host's work after the last
    # kernel (here 10 frees of 30 µs, from 200 to 500 µs). The replay ends there too; it ended
    # with the last kernel, 41% short on a real AlexNet trace (whose window ends in frees).
    b = TraceBuilder()
    for i in range(4):
        b.cpu_op("aten::add", 50.0 * i, 50.0)
        b.kernel("vectorized_elementwise_kernel", 50.0 * i + 46.0, 4.0, launch_at=50.0 * i + 40.0)
    for i in range(10):
        b.runtime("cudaFree", 200.0 + 30.0 * i, 30.0)
    d = analyze(b.write(tmp_path / "t.json"))
    assert d.steps.source.startswith("whole trace")
    path = _path(d)
    assert path.measured_step_s == pytest.approx(500 * US, rel=1e-9)
    assert path.replayed_step_s == pytest.approx(500 * US, rel=1e-9)
    assert path.replay_error == pytest.approx(0.0, abs=1e-9)
    # The frees are on the path (runtime calls: their own time is "launch"), the kernels off
    # it; a host cut shortens the step (it ended with the last kernel, at 200 µs, whatever
    # the host did).
    assert path.shares["host"] + path.shares["launch"] == pytest.approx(1.0)
    assert _row(path, "host:2") < 0.7 * path.measured_step_s


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


def test_a_four_rank_job_is_replayed_across_ranks_through_its_straggler(tmp_path: Path) -> None:
    # Each step ends in an all-reduce that ends at the same moment on every rank; rank 2
    # arrives 300 µs late, rank 3 100 µs late, so the transfer (the fastest rank's time in
    # it) is 100 µs and rank 2's work sets 1900 µs of every 2000 µs step.
    late = {2: 300.0, 3: 100.0}
    for rank in range(4):
        trace = rank_trace(rank, world=4, late_us=late.get(rank, 0.0), skew_us=1000 * rank)
        trace.write(tmp_path / f"rank{rank}.json")
    d = analyze(tmp_path, workers=1)
    path = _path(d)
    assert path.rank == 2
    assert path.rank_shares == pytest.approx({"0": 0.0, "1": 0.0, "2": 0.95, "3": 0.0})
    assert "the job's path runs 95% through rank 2's work" in path.notes[-1]
    # Rank 2 at the median of the others (on time): rank 3, 100 µs late, then sets the step.
    straggler = next(r for r in path.what_if if r.change == "straggler")
    assert path.measured_step_s - straggler.step_s == pytest.approx(200 * US, rel=1e-3)
    finding = next(f for f in d.findings if f.id == "straggler")
    assert finding.gain_basis == "replay"
    assert finding.replay_speedup == pytest.approx(straggler.speedup)


def test_collectives_of_ranks_not_here_are_not_replayed_across_ranks(tmp_path: Path) -> None:
    # Two ranks of a four-rank job: their all-reduces end when the missing ranks arrive too.
    for rank in (0, 1):
        rank_trace(rank, world=4, late_us=300.0 * rank).write(tmp_path / f"rank{rank}.json")
    path = _path(analyze(tmp_path, workers=1))
    assert path.rank_shares == {}
    assert "the straggler row is an estimate from the collectives' waits" in path.notes[-1]


def test_a_balanced_job_gains_nothing_from_the_straggler_what_if(tmp_path: Path) -> None:
    d = analyze(write_job(tmp_path), workers=1)
    path = _path(d)
    straggler = next(r for r in path.what_if if r.change == "straggler")
    assert straggler.speedup == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("data", [Change(data=True)]),
        ("host:4", [Change(host=4.0)]),
        ("overlap,data", [Change(overlap=True), Change(data=True), Change(True, overlap=True)]),
        ("matmul:90%", [Change(matmul=0.9)]),
        ("sync,fuse", [Change(sync=True), Change(fuse=True), Change(sync=True, fuse=True)]),
        ("accum", [Change(accum=True)]),
        ("accum,sync", [Change(accum=True), Change(sync=True), Change(sync=True, accum=True)]),
    ],
)
def test_what_if_text_is_parsed(text: str, expected: list[Change]) -> None:
    assert parse_what_if(text) == expected


@pytest.mark.parametrize(
    "text", ["", "warp", "host:0.5", "matmul:2", "data:3", "host:x", "accum:2"]
)
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


def cpu_loader_bound() -> TraceBuilder:
    """CPU-only steps of 1000 µs: 500 µs waiting for the batch, 50 µs of Python, a 200 µs
    matmul, then 20 dispatch-sized adds of 4 µs with 6 µs of Python after each (50 µs of
    Python closes the step)."""
    b = TraceBuilder(device_name=None)
    for s in range(4):
        t0 = s * 1000.0
        b.step(s + 1, t0, 1000.0)
        b.dataloader(t0, 500.0)
        b.cpu_op("aten::mm", t0 + 550.0, 200.0)
        for i in range(20):
            b.cpu_op("aten::add", t0 + 750.0 + 10.0 * i, 4.0)
    return b


def test_a_cpu_only_trace_gets_a_path_of_its_main_threads_ops(tmp_path: Path) -> None:
    d = analyze(cpu_loader_bound().write(tmp_path / "t.json"))
    path = _path(d)
    assert path.device_ops == 0
    assert path.host_calls == 4 * 21
    assert path.replayed_step_s == pytest.approx(path.measured_step_s) == pytest.approx(1000 * US)
    shares = path.shares
    assert shares["data"] == pytest.approx(0.5)
    assert shares["compute"] == pytest.approx(0.2)  # the matmul
    # The adds (dispatch-sized: all fixed cost) and the Python between the ops.
    assert shares["host"] == pytest.approx(0.3)
    assert path.wall == "overhead"
    assert [r.change for r in path.what_if] == ["data", "host:2"]
    assert path.notes[0].startswith("CPU-only trace: the main thread's ops are the device")


def test_on_the_cpu_removing_the_data_wait_gains_the_loader_time(tmp_path: Path) -> None:
    d = analyze(cpu_loader_bound().write(tmp_path / "t.json"))
    assert _row(_path(d), "data") == pytest.approx(500 * US)
    loading = next(f for f in d.findings if f.id == "data-loading")
    assert loading.gain_basis == "replay"
    assert loading.replay_speedup == pytest.approx(2.0)


def test_on_the_cpu_a_host_cut_divides_the_per_op_overhead_not_the_arithmetic(
    tmp_path: Path,
) -> None:
    d = analyze(cpu_loader_bound().write(tmp_path / "t.json"), Options(what_if="host:4"))
    # The Python (50 + 120 + 50 µs) and the adds (80 µs) are cut 4-fold; of the matmul only
    # its one op's fixed cost (4 µs, as the adds measure it) is.
    expected = 500 + (220 + 80 + 4) / 4 + 196
    assert _row(_path(d), "host:4") == pytest.approx(expected * US, rel=1e-3)


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


def test_a_window_whose_only_device_work_takes_no_time_replays_without_error(
    tmp_path: Path,
) -> None:
    # Found by the loader fuzz test: a zero-length copy is the only device op, so the step's
    # graph has no timed device work; the replay must still run (and match the window).
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 0, "pid": 100, "tid": 100}
        for _ in range(5)
    ]
    events += [
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "ts": 0,
            "dur": 0,
            "pid": 100,
            "tid": 100,
            "args": {},
        },
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "ts": 1,
            "dur": 0,
            "pid": 100,
            "tid": 100,
            "args": {"correlation": 0},
        },
        {
            "ph": "X",
            "cat": "gpu_memcpy",
            "name": "Memcpy HtoD (Pageable -> Device)",
            "ts": 0,
            "dur": 0,
            "pid": 0,
            "tid": 7,
            "args": {"correlation": 0},
        },
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    d = analyze(path)
    assert d.critical_path is not None
    assert d.violations() == []


def late_collective(steps: int = 5) -> TraceBuilder:
    """Each 300 µs step: 100 µs of host work launches a 100 µs GEMM; 105 µs more launch a
    90 µs collective on its own stream, which starts at its launch, after the GEMM ended.
    Kineto does not say that the collective waited for the GEMM's stream; the device is busy
    190 µs of each step."""
    b = TraceBuilder()
    for s in range(steps):
        t0 = s * 300.0
        b.step(s + 1, t0, 300.0)
        b.cpu_op("aten::mm", t0, 100.0)
        b.kernel("sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", t0 + 100.0, 100.0, launch_at=t0 + 95.0)
        b.cpu_op("aten::add", t0 + 100.0, 105.0)
        b.nccl(t0 + 205.0, 90.0, launch_at=t0 + 200.0)
    return b


def test_a_faster_host_cannot_run_the_device_more_concurrently_than_it_did(
    tmp_path: Path,
) -> None:
    d = analyze(late_collective().write(tmp_path / "t.json"), Options(what_if="host:8,data"))
    path = _path(d)
    busy = d.breakdown.per_step_ms["step"] * (1 - d.breakdown.idle) * 1e-3
    assert busy == pytest.approx(190 * US, rel=0.02)
    # The host's 205 µs become 26 µs, but the collective still follows the GEMM, as it did:
    # the step is the device's busy time, not the two kernels run side by side (~110 µs).
    for row in path.what_if:
        assert row.step_s >= busy * 0.999
    assert _row(path, "host:8") == pytest.approx(busy, rel=0.05)


def queue_full(steps: int = 5) -> TraceBuilder:
    """Each 420 µs step: four 100 µs GEMMs back to back on one stream. The launch queue holds
    two: the third and fourth launch calls block until a GEMM ends (the host runs far ahead).
    Right after, the host launches a 200 µs collective on its own stream and waits for it
    (`cudaStreamSynchronize`), which ends the step."""
    b = TraceBuilder()
    for s in range(steps):
        t0 = s * 420.0
        b.step(s + 1, t0, 420.0)
        calls = [(t0 + 1.0, 3.0), (t0 + 5.0, 3.0), (t0 + 9.0, 104.0), (t0 + 114.0, 99.0)]
        for i, (at, dur) in enumerate(calls):
            b.kernel(
                "sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n",
                t0 + 10.0 + 100.0 * i,
                100.0,
                launch_at=at,
                launch_dur=dur,
            )
        b.nccl(t0 + 217.0, 200.0, launch_at=t0 + 214.0)
        b.sync(t0 + 218.0, 201.0)
    return b


def test_a_launch_blocked_on_a_full_queue_waits_for_the_device_not_the_host(
    tmp_path: Path,
) -> None:
    d = analyze(queue_full().write(tmp_path / "t.json"))
    path = _path(d)
    assert path.replay_error == pytest.approx(0.0, abs=0.01)
    # The blocked calls are the device's time (a GEMM freeing a slot), so the path runs
    # through the GEMMs, not through 200 µs of "launch" calls on the host.
    assert path.shares["launch"] + path.shares["host"] < 0.1
    assert path.shares["compute"] > 0.4


def _finding(id: str, share: float, replayed: float) -> Finding:
    return Finding(
        wall_after="bandwidth",
        id=id,
        wall="overhead",
        title="t",
        share=share,
        max_speedup=1 / (1 - share),
        evidence="e",
        fix="f",
        gain_basis="replay",
        replay_speedup=replayed,
    )


def test_a_what_if_row_never_gains_more_than_the_finding_for_the_same_or_a_larger_fix() -> None:
    rows = [
        WhatIfRow(change="host:2", step_s=60e-3, speedup=1.28, wall_after="overhead"),
        WhatIfRow(change="sync", step_s=66e-3, speedup=1.17, wall_after="overhead"),
        WhatIfRow(change="data,host:2", step_s=59e-3, speedup=1.30, wall_after="overhead"),
        WhatIfRow(change="straggler", step_s=70e-3, speedup=1.1, wall_after="overhead"),
    ]
    # The launch-bound finding removes all host work and says 1.14x: halving it cannot say
    # more. The sync row has no finding and stays; a combined or job row is not capped by one.
    host, sync, both, straggler = consistent_rows(rows, [_finding("launch-bound", 0.12, 1.14)])
    assert (host.speedup, host.capped_by, host.wall_after) == (1.14, "launch-bound", "bandwidth")
    assert host.step_s == pytest.approx(60e-3 * 1.28 / 1.14)
    assert (sync, both, straggler) == (rows[1], rows[2], rows[3])
    # A row below the finding's figure stays as replayed.
    assert consistent_rows(rows[:1], [_finding("launch-bound", 0.3, 1.4)]) == rows[:1]


class _Replay:
    """A replay whose unchanged graph misses the measured step by `error`."""

    def __init__(self, error: float) -> None:
        self.error = error
        self.graph = SimpleNamespace(cost_fixed=None)  # a device graph, not the CPU's

    def speedup(self, change: Change) -> tuple[float, str]:
        return 3.0, "compute"


@pytest.mark.parametrize(("error", "basis"), [(0.02, "replay"), (0.4, "bound")])
def test_a_replay_that_misses_the_measured_step_leaves_the_finding_its_bound(
    error: float, basis: str
) -> None:
    finding = msgspec.structs.replace(
        _finding("launch-bound", 0.5, 1.0), gain_basis=None, replay_speedup=None
    )
    out = with_replay(_Replay(error), finding, 0.1)  # type: ignore[arg-type]
    assert out.gain_basis == basis
    assert out.replay_speedup == (2.0 if basis == "replay" else None)


def test_a_sync_that_keeps_the_host_from_running_ahead_is_a_finding_bounded_by_the_blocked_time(
    tmp_path: Path,
) -> None:
    # sync_bound: the GPU is busy while the host waits 205 µs, then idles while the host
    # works. The idle the breakdown gives the sync is under the blocked time; without the sync
    # the host's work hides under the next kernel: the replay gains 260/200 per step.
    d = analyze(sync_bound().write(tmp_path / "t.json"))
    assert d.breakdown.idle_causes["synchronization"] < 205 / 260
    f = next(x for x in d.findings if x.id == "sync-in-step")
    step_s = d.breakdown.per_step_ms["step"] * 1e-3
    causes = d.breakdown.idle_causes
    host_idle = causes["synchronization"] + causes["host_overhead"] + causes["launch_latency"]
    assert f.share == pytest.approx(min(205 * US / step_s, host_idle), rel=0.02)
    assert f.share > causes["synchronization"]
    assert f.replay_speedup == pytest.approx(step_s / (200 * US), rel=0.05)
    assert f.replay_speedup <= f.max_speedup
    assert "blocked 0.21 ms per step" in f.evidence  # 205 µs
    row = next(r for r in _path(d).what_if if r.change == "sync")
    assert row.speedup == pytest.approx(f.replay_speedup, rel=1e-6)


def _fewest_by_scanning(segments: list[list[Any]], most: int) -> list[list[Any]]:
    """The timeline's rule stated plainly: merge the first of the shortest segments (never
    the first) into the one before it until `most` are left."""
    merged = [list(s) for s in segments]
    while len(merged) > most:
        i = min(range(1, len(merged)), key=lambda j: merged[j][1] - merged[j][0])
        merged[i - 1][1] = merged[i][1]
        del merged[i]
    return merged


def _fewest(segments: list[list[Any]], most: int) -> list[list[Any]]:
    """`fewest` on segments given as [start, end, label] lists."""
    kept, ends = fewest(
        np.array([s[0] for s in segments], np.int64),
        np.array([s[1] for s in segments], np.int64),
        most,
    )
    return [[segments[i][0], e, segments[i][2]] for i, e in zip(kept, ends.tolist(), strict=True)]


def test_fewest_merges_the_shortest_segment_into_the_one_before_it() -> None:
    segments = [[0, 10, "a"], [10, 11, "b"], [11, 20, "a"], [20, 22, "c"], [22, 23, "b"]]
    assert _fewest(segments, 3) == [[0, 11, "a"], [11, 20, "a"], [20, 23, "c"]]
    assert _fewest(segments, 5) == segments


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(1, 4)), min_size=1, max_size=40),
    st.integers(1, 12),
    st.sampled_from([1, 1000, 1 << 54]),
)
def test_fewest_agrees_with_merging_by_scanning(
    steps: list[tuple[int, int]], most: int, scale: int
) -> None:
    # In time order, as the path's segments are (at scales past what int64 holds with an
    # index, too): merged in one pass from the last.
    segments, at = [], 0
    for i, (gap, length) in enumerate(steps):
        at += gap
        segments.append([at * scale, (at + length) * scale, "ab"[i % 2]])
        at += length
    assert _fewest(segments, most) == _fewest_by_scanning(segments, most)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 30), st.integers(1, 6)), min_size=1, max_size=30),
    st.integers(1, 12),
)
def test_fewest_agrees_with_merging_by_scanning_out_of_order(
    spans: list[tuple[int, int]], most: int
) -> None:
    # Out of time order (overlapping, starts going back): merged one at a time.
    segments = [[a, a + n, str(i)] for i, (a, n) in enumerate(spans)]
    assert _fewest(segments, most) == _fewest_by_scanning(segments, most)


@pytest.mark.parametrize(
    "builder", [host_bound, gpu_bound, sync_bound, comm_exposed, late_collective, queue_full]
)
def test_the_one_pass_replay_gives_the_iterations_timing_and_rounds(
    builder: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every replay (the unchanged graph and each what-if) taken in one pass in dependency
    order times every call and op as the rounds iterated to the fixed point do, and says how
    many rounds those take."""
    path = builder().write(tmp_path / "t.json")
    timings: dict[int, list[critpath.Timing]] = {}
    for after in (critpath.MAX_ROUNDS + 1, 1):  # iterate only; one pass after the first round
        made: list[critpath.Timing] = []

        def recording(**fields: Any) -> critpath.Timing:
            made.append(Timing(**fields))  # noqa: B023
            return made[-1]  # noqa: B023

        for module in (critpath_timing, critpath_whatif):
            monkeypatch.setattr(module, "one_pass_pays", lambda nodes, at=after: at)
        monkeypatch.setattr(critpath_timing, "Timing", recording)
        analyze(path, Options(what_if="data,host:3,sync,fuse,matmul,overlap"))
        timings[after] = made
    iterated, one_pass = timings[critpath.MAX_ROUNDS + 1], timings[1]
    # (The unchanged graph, and each what-if that moves something on it: at least host:3.)
    assert len(iterated) == len(one_pass) >= 2
    if builder not in (host_bound, gpu_bound):  # syncs or waits settle over several rounds
        assert max(t.rounds for t in iterated) > 2
    for a, b in zip(iterated, one_pass, strict=True):
        assert a.rounds == b.rounds
        assert a.end == b.end
        assert a.step_s == b.step_s
        for name in ("call_start", "call_end", "drain", "op_start", "op_end"):
            assert np.array_equal(getattr(a, name), getattr(b, name)), name
        for name in ("ready", "dep_end", "released"):
            assert np.array_equal(getattr(a, name), getattr(b, name)), name


@pytest.mark.parametrize("builder", [training_trace, sync_bound, comm_exposed])
def test_the_walk_summed_in_windows_gives_the_whole_walks_path(
    builder: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The walk sums its segments every FOLD_STEPS steps and keeps only the timeline's step:
    folding after every step gives the same shares, what-ifs and drawn segments as never
    folding (the whole path held at once)."""
    path = (builder(6) if builder is training_trace else builder()).write(tmp_path / "t.json")
    paths = []
    for every in (10**9, 1):
        monkeypatch.setattr(critpath_path, "FOLD_STEPS", every)
        paths.append(msgspec.to_builtins(_path(analyze(path, Options(what_if="data,sync,fuse")))))
    whole, folded = paths
    assert whole["timeline"]  # a step is drawn, with segments
    assert folded == whole


@pytest.mark.parametrize(("budget", "steps"), [(10**9, None), (30, 3), (5, 1)])
def test_steady_steps_over_the_node_budget_are_replayed_on_consecutive_steps_around_the_timelines(
    budget: int, steps: int | None, tmp_path: Path
) -> None:
    """Each gpu_bound step holds 4 launch calls and 4 kernels: a budget of 30 host calls and
    device ops replays 3 consecutive steps, one under a step's 8 that step alone, and the
    step drawn on the timeline is among them, with its path."""
    thresholds = Thresholds(time=TimeThresholds(replay_nodes=budget))
    d = analyze(gpu_bound(20).write(tmp_path / "t.json"), Options(thresholds=thresholds))
    path = _path(d)
    assert d.timeline is not None
    assert path.timeline
    assert path.replayed_step_s == pytest.approx(path.measured_step_s, rel=1e-9)
    if steps is None:
        assert path.steps == d.steps.count
        assert path.device_ops == 4 * path.steps
        assert not any("consecutive steady step" in n for n in path.notes)
        return
    assert path.steps == steps
    assert path.device_ops == 4 * steps
    (note,) = [n for n in path.notes if "consecutive steady step" in n]
    assert f"replayed on {steps} consecutive steady step(s) of {d.steps.count}" in note
    # Around the timeline's step (the drawn step is one of those replayed), and measured over
    # them alone: step 1 takes 410 µs (from its CPU start), the others 400 µs.
    first, last = (int(x) for x in re.findall(r"\(\D*(\d+) to \D*(\d+)\)", note)[0])
    assert last - first + 1 == steps
    assert first <= int(re.findall(r"\d+", d.timeline.step)[-1]) <= last
    took = [410 if i == 1 else 400 for i in range(first, last + 1)]
    assert path.measured_step_s == pytest.approx(sum(took) / steps * US, rel=1e-9)


def test_the_default_what_ifs_replay_overlap_when_exposed_communication_is_the_wall(
    tmp_path: Path,
) -> None:
    d = analyze(comm_exposed().write(tmp_path / "t.json"))
    assert d.verdict.cause == "comm_exposed"
    rows = _path(d).what_if
    assert [r.change for r in rows][-1] == "overlap"
    overlap = rows[-1]
    # The replay moves the all-reduce beside the last GEMM (100 of its 150 µs); the bound
    # hides all of it that compute can cover. The finding says both, and why they differ.
    finding = next(f for f in d.findings if f.id == "exposed-comm")
    assert 1.0 < overlap.speedup < finding.max_speedup
    assert (
        f"the `overlap` what-if replays {overlap.speedup:.2f}x: it starts each collective "
        "beside the op it waited for and keeps the rest of the order the trace recorded, "
        "where the bound hides all of the exposed communication that compute could cover"
        in finding.evidence
    )


def test_the_default_what_ifs_leave_overlap_out_for_another_wall(tmp_path: Path) -> None:
    d = analyze(training_trace(6, loader_us=1000.0).write(tmp_path / "t.json"))
    assert d.verdict.cause == "data_loading"
    assert "overlap" not in [r.change for r in _path(d).what_if]


def test_an_overlap_row_is_no_faster_than_the_communication_bound() -> None:
    row = WhatIfRow(change="overlap", step_s=1.0, speedup=2.0, wall_after="compute")
    bound = Finding(
        id="exposed-comm",
        wall="overhead",
        title="t",
        share=0.5,
        max_speedup=1.25,
        evidence="e",
        fix="f",
        reach=0.2,
    )
    [capped] = consistent_rows([row], [bound])
    assert (capped.speedup, capped.capped_by) == (1.25, "exposed-comm")
    assert capped.step_s == pytest.approx(1.6)


def test_on_the_cpu_a_host_cut_leaves_the_wait_for_collectives_on_other_threads(
    tmp_path: Path,
) -> None:
    # Each 1000 µs step has 700 µs between the main thread's ops, 550 of them while gloo runs
    # on another thread: a host cut halves the other 150 µs only.
    d = analyze(cpu_step_with_gloo_beside(4).write(tmp_path / "t.json"), Options(what_if="host:2"))
    path = _path(d)
    assert path.measured_step_s - _row(path, "host:2") == pytest.approx(75 * US, rel=1e-3)
    assert path.shares["communication"] == pytest.approx(0.55, abs=1e-3)


def test_the_paths_wall_is_where_most_of_its_time_is_a_tie_going_to_the_wall_named_first() -> None:
    """The critical path's wall is the verdict's rule over its categories' walls: the walls'
    shares summed, the largest, a tie going to the wall of the category listed first."""
    shares = dict.fromkeys(CATEGORIES, 0.0) | {
        "host": 0.25,
        "wait": 0.125,
        "compute": 0.375,
        "bandwidth": 0.25,
    }
    assert critpath_path.wall_of(shares) == "overhead"  # 0.375 each: overhead is listed first
    assert critpath_path.wall_of(shares | {"bandwidth": 0.5}) == "bandwidth"


@pytest.mark.parametrize(
    "module",
    [
        *sorted((Path(critpath.__file__).parent).glob("*.py")),
        *(
            Path(critpath.__file__).parents[1] / f"{m}.py"
            for m in ("verdict", "collectives", "job")
        ),
    ],
    ids=lambda p: p.stem,
)
def test_the_critical_path_and_the_walls_import_no_other_modules_private_name(module: Path) -> None:
    """What the critical path's stages share is public: none imports a `_private` name of
    another module (it once read `gpu._host_categories`)."""
    private = [
        f"{node.module}.{alias.name}"
        for node in ast.walk(ast.parse(module.read_text()))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("wallfinder")
        for alias in node.names
        if alias.name.startswith("_") and alias.name != "__future__"
    ]
    assert private == []


def test_the_accum_what_if_removes_the_all_reduces_of_the_micro_steps_that_accumulate(
    tmp_path: Path,
) -> None:
    path = tmp_path / "t.json"
    ddp_accumulation(no_sync=False, queued=True).write(path)
    d = analyze(path, Options(what_if="accum"))
    p = _path(d)
    assert [r.change for r in p.what_if] == ["accum"]
    # Each step's first all-reduce (150 µs, on the device's path) no longer runs: a mean step
    # of 992.5 µs (three 1000 µs steps, the last ending with its kernel at 970 µs) becomes
    # 842.5 µs (the GEMMs of the second micro-step start where the first's backward ends).
    assert p.replayed_step_s == pytest.approx(992.5 * US)
    assert _row(p, "accum") == pytest.approx(842.5 * US)
    # In the default table where the graph holds such all-reduces, after the wall's rows.
    rows = _path(analyze(path)).what_if
    assert [r.change for r in rows][-2:] == ["overlap", "accum"]


def test_without_accumulation_the_accum_what_if_changes_nothing(tmp_path: Path) -> None:
    # Under no_sync() (one all-reduce per optimizer step), and with no DDP micro-steps at all.
    for trace in (ddp_accumulation(no_sync=True, queued=True), comm_exposed()):
        path = trace.write(tmp_path / "t.json")
        p = _path(analyze(path, Options(what_if="accum")))
        assert _row(p, "accum") == p.replayed_step_s
        assert "accum" not in [r.change for r in _path(analyze(path)).what_if]


def test_under_overlap_the_accum_what_if_leaves_the_compute_floor_where_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[critpath.StepGraph] = []

    def keep(*args: Any, **kwargs: Any) -> critpath.StepGraph | None:
        g = build_graph(*args, **kwargs)
        if g is not None:
            built.append(g)
        return g

    build_graph = critpath_rank.build_graph
    monkeypatch.setattr(critpath_rank, "build_graph", keep)
    analyze(ddp_accumulation(no_sync=False, queued=True).write(tmp_path / "t.json"))
    [g] = built
    # A floor above every replay: the step is the floor. Overlapped, the collectives are off
    # it already (the device's busy time but theirs); removing some of them moves it no lower.
    floor = 10 * g.measured_s
    g = replace(g, busy_other_s=floor)
    step = critpath_timing.replay(g, Change(overlap=True, accum=True)).step_s
    assert step == pytest.approx(floor)


def test_a_what_if_that_touches_nothing_on_the_graph_is_not_replayed(tmp_path: Path) -> None:
    """host_bound has no DataLoader, no sync, no collective: its data, sync and overlap
    what-ifs keep the unchanged replay's step (a 1.00x gain) without a replay of their own
    (counted by the timing hook, which records each replay by its change); the host cut and
    the combination (which holds it) are replayed."""
    path = host_bound().write(tmp_path / "t.json")
    with timings() as made:
        p = _path(analyze(path, Options(what_if="data,sync,overlap,host:2")))
    replayed = [t.name for t in made if t.kind == "replay"]
    # (Then the findings' own changes: the whole host cut, the fusion of the chain.)
    assert replayed[:2] == ["host:2", "data,host:2,sync,overlap"]
    assert not {"data", "sync", "overlap"} & set(replayed)
    for change in ("data", "sync", "overlap"):
        row = next(r for r in p.what_if if r.change == change)
        assert row.step_s == p.replayed_step_s
        assert row.speedup == 1.0
        assert row.wall_after == p.wall
    assert _row(p, "host:2") < p.replayed_step_s


def test_a_what_if_moves_the_graph_only_where_it_has_what_the_change_removes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`moves`: a sync what-if moves a graph with a sync and not one without; overlap one
    with a collective; data one whose host waited for the DataLoader; a host cut any."""
    built: list[critpath.StepGraph] = []
    build_graph = critpath_rank.build_graph

    def keep(*args: Any, **kwargs: Any) -> critpath.StepGraph | None:
        g = build_graph(*args, **kwargs)
        assert g is not None
        built.append(g)
        return g

    monkeypatch.setattr(critpath_rank, "build_graph", keep)
    for builder in (host_bound, sync_bound, comm_exposed):
        analyze(builder().write(tmp_path / "t.json"))
    host, sync, comm = built
    moves = critpath_timing.moves
    assert not moves(host, Change(sync=True))
    assert moves(sync, Change(sync=True))
    assert not moves(host, Change(overlap=True))
    assert moves(comm, Change(overlap=True))
    assert not moves(host, Change(data=True))
    assert not moves(comm, Change(data=True))
    assert moves(host, Change(host=2.0))
