"""The analyses on built traces whose answers are known exactly: step windows, the breakdown,
idle causes, warm-up, the verdict, CPU-only traces and folders of ranks."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from invariants import assert_diagnosis_invariants
from tracegen import TraceBuilder, moe_trace, training_trace
from wallfinder import Diagnosis, Options, Thresholds, WallfinderError, analyze
from wallfinder.analysis import diagnose
from wallfinder.analysis.gpu import IDLE_CAUSES, WindowBreakdown, breakdown, device_ops
from wallfinder.analysis.steps import cpu_steps, gpu_windows
from wallfinder.analysis.verdict import gpu_note
from wallfinder.trace import load_trace

US = 1000  # ns per µs
GEMM = "volta_sgemm_128x64_nn"
ELEMENTWISE = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>"


def load(b: TraceBuilder, tmp_path: Path, name: str = "t.json") -> Diagnosis:
    return diagnose(load_trace(b.write(tmp_path / name)))


def windows(b: TraceBuilder, tmp_path: Path) -> WindowBreakdown:
    """The breakdown per step window, in integer nanoseconds."""
    trace = load_trace(b.write(tmp_path / "t.json"))
    spans = cpu_steps(trace)
    dev = device_ops(trace)
    assert dev is not None
    start, end = gpu_windows(spans, dev.ops, dev.launch_ts)
    return breakdown(trace, dev, start, end, Thresholds().slack)


def causes_ns(wb: WindowBreakdown, step: int = 0) -> dict[str, int]:
    """The non-zero idle causes of one step, in ns."""
    found = {k: float(v[step]) for k, v in wb.idle_causes.items()}
    assert all(v == int(v) for v in found.values())
    return {k: int(v) for k, v in found.items() if v}


def assert_consistent(d: Diagnosis) -> None:
    """The invariants every diagnosis keeps, and every idle cause named."""
    assert_diagnosis_invariants(d)
    assert set(d.breakdown.idle_causes) == set(IDLE_CAUSES)


# (a) data loading before each step's kernel ------------------------------------------------------


def loader_bound(steps: int = 3) -> TraceBuilder:
    """Each 356 µs step: 100 µs in the DataLoader, the launch, 6 µs launch latency, then a
    250 µs GEMM."""
    b = TraceBuilder()
    for s in range(steps):
        t0 = s * 356.0
        b.step(s + 1, t0, 356.0)
        b.dataloader(t0, 100.0)
        b.kernel(GEMM, t0 + 106.0, 250.0, launch_at=t0 + 100.0)
    return b


def test_step_windows_tile_the_timeline_from_the_first_step_start(tmp_path: Path) -> None:
    wb = windows(loader_bound(), tmp_path)
    assert wb.start.tolist() == [0, 356 * US, 712 * US]
    assert wb.end.tolist() == [356 * US, 712 * US, 1068 * US]


def test_gap_while_host_is_in_the_dataloader_is_data_loading_exactly(tmp_path: Path) -> None:
    wb = windows(loader_bound(), tmp_path)
    assert wb.compute.tolist() == [250 * US] * 3
    assert wb.idle.tolist() == [106 * US] * 3
    assert wb.comm_exposed.tolist() == [0, 0, 0]
    assert wb.copy_exposed.tolist() == [0, 0, 0]
    for step in range(3):
        assert causes_ns(wb, step) == {"data_loading": 100 * US, "launch_latency": 6 * US}


def test_diagnosis_reports_the_data_loading_breakdown_in_fractions(tmp_path: Path) -> None:
    d = load(loader_bound(), tmp_path)
    assert d.steps.count == 3
    assert d.steps.median_s == pytest.approx(356e-6, rel=1e-12)
    assert d.steps.cv == 0.0
    assert d.steps.stable
    assert d.breakdown.compute == pytest.approx(250 / 356, rel=1e-12)
    assert d.breakdown.idle == pytest.approx(106 / 356, rel=1e-12)
    assert d.breakdown.idle_causes["data_loading"] == pytest.approx(100 / 356, rel=1e-12)
    assert d.breakdown.per_step_ms["step"] == pytest.approx(0.356, rel=1e-12)
    assert d.breakdown.per_step_ms["compute"] == pytest.approx(0.250, rel=1e-12)
    assert [s.step for s in d.breakdown.steps] == ["step 1", "step 2", "step 3"]
    assert_consistent(d)


# (b) synchronisation ----------------------------------------------------------------------------


def synchronising(sync_end: float) -> TraceBuilder:
    """A GEMM [10, 110), the host in cudaStreamSynchronize [5, sync_end), CPU work until the
    next launch at 150, and the next GEMM [156, 256)."""
    b = TraceBuilder()
    b.step(1, 0.0, 256.0)
    b.kernel(GEMM, 10.0, 100.0, launch_at=0.0)
    b.sync(5.0, sync_end - 5.0)
    b.cpu_op("aten::add", 112.0, 38.0)
    b.kernel(GEMM, 156.0, 100.0, launch_at=150.0)
    return b


def test_gap_after_a_sync_that_drained_the_queue_is_synchronization(tmp_path: Path) -> None:
    wb = windows(synchronising(sync_end=112.0), tmp_path)
    assert wb.idle.tolist() == [56 * US]
    assert causes_ns(wb) == {"synchronization": 40 * US, "launch_latency": 16 * US}


def test_sync_that_ended_long_before_the_gap_is_not_synchronization(tmp_path: Path) -> None:
    # The sync ended 30 µs before the GPU went idle (more than the 20 µs drain slack).
    wb = windows(synchronising(sync_end=80.0), tmp_path)
    assert causes_ns(wb) == {"host_overhead": 38 * US, "other": 2 * US, "launch_latency": 16 * US}


def test_a_sync_costs_the_gpu_at_most_the_time_the_host_was_blocked(tmp_path: Path) -> None:
    # The sync [105, 112) waited 5 µs for the GEMM to end at 110: without it the host would
    # have run 5 µs ahead. The 35 µs of host work after that would have left the GPU idle
    # anyway: host overhead, not the sync's.
    b = TraceBuilder()
    b.step(1, 0.0, 256.0)
    b.kernel(GEMM, 10.0, 100.0, launch_at=0.0)
    b.sync(105.0, 7.0)
    b.cpu_op("aten::add", 112.0, 38.0)
    b.kernel(GEMM, 156.0, 100.0, launch_at=150.0)
    wb = windows(b, tmp_path)
    assert causes_ns(wb) == {
        "synchronization": 5 * US,
        "host_overhead": 35 * US,
        "launch_latency": 16 * US,
    }


# (c) launch latency -----------------------------------------------------------------------------


def test_work_launched_during_a_gap_splits_it_into_host_time_and_launch_latency(
    tmp_path: Path,
) -> None:
    b = TraceBuilder()
    b.step(1, 0.0, 300.0)
    b.kernel(GEMM, 5.0, 95.0, launch_at=0.0)
    b.cpu_op("aten::add", 100.0, 70.0)
    b.kernel(GEMM, 200.0, 100.0, launch_at=170.0)
    wb = windows(b, tmp_path)
    assert wb.idle.tolist() == [105 * US]
    assert causes_ns(wb) == {"host_overhead": 70 * US, "launch_latency": 35 * US}


# (d) dependency wait ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("launch_at", "expected"),
    [
        (10.0, {"dependency_wait": 150 * US}),  # queued 90 µs before the gap: waiting
        (49.0, {"dependency_wait": 150 * US}),  # 51 µs before
        # Exactly 50 µs before: not yet "queued", but it starts 196 µs after its launch call
        # returned: 4 µs of the gap are the call, the rest the work waiting after it.
        (50.0, {"launch_latency": 4 * US, "dependency_wait": 146 * US}),
    ],
)
def test_work_queued_well_before_the_gap_is_a_dependency_wait(
    tmp_path: Path, launch_at: float, expected: dict[str, int]
) -> None:
    b = TraceBuilder()
    b.step(1, 0.0, 300.0)
    b.kernel(GEMM, 0.0, 100.0, launch_at=0.0)
    b.kernel(GEMM, 250.0, 50.0, launch_at=launch_at, stream=8)
    wb = windows(b, tmp_path)
    assert wb.idle.tolist() == [150 * US]
    assert causes_ns(wb) == expected


@pytest.mark.parametrize(
    ("start", "expected"),
    [
        # Starts 30 µs after its launch call returned: all launch path.
        (234.0, {"host_overhead": 100 * US, "launch_latency": 34 * US}),
        # Starts 2 ms after: 50 µs of launch path, then the work waited for something else.
        (
            2204.0,
            {"host_overhead": 100 * US, "launch_latency": 54 * US, "dependency_wait": 1950 * US},
        ),
    ],
)
def test_work_that_starts_long_after_its_late_launch_waited_for_something_else(
    tmp_path: Path, start: float, expected: dict[str, int]
) -> None:
    # The host runs an op for 100 µs after the GPU goes idle, then launches (a 4 µs call).
    b = TraceBuilder()
    b.step(1, 0.0, start + 100.0)
    b.kernel(GEMM, 0.0, 100.0, launch_at=0.0)
    b.cpu_op("aten::add", 100.0, 100.0)
    b.kernel(GEMM, start, 100.0, launch_at=200.0)
    assert causes_ns(windows(b, tmp_path)) == expected


def test_gap_before_work_with_no_launch_record_is_unexplained(tmp_path: Path) -> None:
    b = TraceBuilder()
    b.step(1, 0.0, 300.0)
    b.kernel(GEMM, 0.0, 100.0, launch_at=0.0)
    b.kernel(GEMM, 250.0, 50.0)  # no runtime call
    assert causes_ns(windows(b, tmp_path)) == {"other": 150 * US}


# (e) exposed communication and copies -----------------------------------------------------------


def test_only_the_part_of_a_collective_outside_compute_is_exposed(tmp_path: Path) -> None:
    b = TraceBuilder()
    b.step(1, 0.0, 200.0)
    b.kernel(GEMM, 10.0, 100.0, launch_at=0.0)
    b.nccl(60.0, 100.0, launch_at=1.0)
    b.memcpy(20.0, 50.0, 1 << 20, launch_at=2.0, stream=9)
    wb = windows(b, tmp_path)
    assert wb.end.tolist() == [160 * US]  # the window ends with the last launched work
    assert wb.compute.tolist() == [100 * US]
    assert wb.comm_exposed.tolist() == [50 * US]
    assert wb.copy_exposed.tolist() == [0]
    assert wb.idle.tolist() == [10 * US]


def test_a_copy_outside_compute_and_communication_is_exposed(tmp_path: Path) -> None:
    b = TraceBuilder()
    b.step(1, 0.0, 200.0)
    b.kernel(GEMM, 0.0, 100.0, launch_at=0.0)
    b.nccl(50.0, 70.0, launch_at=1.0)  # [50, 120): 20 µs exposed
    b.memcpy(110.0, 30.0, 1 << 20, launch_at=2.0, stream=9)  # [110, 140): 20 µs exposed
    wb = windows(b, tmp_path)
    assert (wb.compute.tolist(), wb.comm_exposed.tolist()) == ([100 * US], [20 * US])
    assert (wb.copy_exposed.tolist(), wb.idle.tolist()) == ([20 * US], [0])


def test_memset_counts_as_a_copy(tmp_path: Path) -> None:
    b = TraceBuilder()
    b.step(1, 0.0, 100.0)
    b.memset(0.0, 40.0, 4096, launch_at=0.0)
    b.kernel(GEMM, 40.0, 60.0, launch_at=1.0)
    wb = windows(b, tmp_path)
    assert (wb.copy_exposed.tolist(), wb.compute.tolist()) == ([40 * US], [60 * US])


# (f) warm-up -------------------------------------------------------------------------------------


def with_warmup() -> TraceBuilder:
    """Four back-to-back steps of 930, 300, 310 and 320 µs; the first idles 600 µs, the
    others are fully busy."""
    b = TraceBuilder()
    t0 = 0.0
    for s, length in enumerate([930.0, 300.0, 310.0, 320.0]):
        b.step(s + 1, t0, length)
        busy_from = t0 + (600.0 if s == 0 else 0.0)
        b.kernel(GEMM, busy_from, t0 + length - busy_from, launch_at=busy_from)
        t0 += length
    return b


def test_a_first_step_three_times_longer_is_dropped_as_warmup(tmp_path: Path) -> None:
    d = load(with_warmup(), tmp_path)
    assert d.steps.total == 4
    assert d.steps.count == 3
    assert [drop.step for drop in d.steps.dropped] == ["step 1"]
    assert d.steps.dropped[0].duration_s == pytest.approx(930e-6, rel=1e-12)
    assert "3.0x" in d.steps.dropped[0].reason
    assert "warm-up" in d.steps.dropped[0].reason
    assert [s.warmup for s in d.breakdown.steps] == [True, False, False, False]


def test_step_statistics_leave_the_warmup_step_out(tmp_path: Path) -> None:
    d = load(with_warmup(), tmp_path)
    rest = np.array([300.0, 310.0, 320.0]) * 1e-6
    assert d.steps.median_s == pytest.approx(310e-6, rel=1e-12)
    assert d.steps.mean_s == pytest.approx(310e-6, rel=1e-12)
    assert (d.steps.min_s, d.steps.max_s) == pytest.approx((300e-6, 320e-6), rel=1e-12)
    assert d.steps.cv == pytest.approx(float(rest.std() / rest.mean()), rel=1e-9)
    assert d.steps.stable
    # The idle warm-up step is not in the breakdown either.
    assert d.breakdown.compute == pytest.approx(1.0, abs=1e-12)
    assert d.breakdown.idle == pytest.approx(0.0, abs=1e-12)


def test_steps_of_similar_length_are_all_kept(tmp_path: Path) -> None:
    d = load(training_trace(5), tmp_path)
    assert (d.steps.total, d.steps.count, d.steps.dropped) == (5, 5, [])


def test_two_steps_are_never_dropped_as_warmup(tmp_path: Path) -> None:
    b = TraceBuilder()
    b.step(1, 0.0, 900.0)
    b.kernel(GEMM, 0.0, 900.0, launch_at=0.0)
    b.step(2, 900.0, 100.0)
    b.kernel(GEMM, 900.0, 100.0, launch_at=900.0)
    assert load(b, tmp_path).steps.dropped == []


def test_a_step_range_of_zero_length_is_not_a_step(tmp_path: Path) -> None:
    # Found by the structure fuzzer: a zero-length ProfilerStep was the trace's one step,
    # 0 s long, and broke the invariants (parts summing to 0, a step of 0 s).
    b = TraceBuilder()
    b.step(1, 0.0, 0.0)
    b.cpu_op("aten::mm", 0.0, 10.0)
    d = load(b, tmp_path)
    assert_diagnosis_invariants(d)
    assert d.steps.source == "whole trace (no ProfilerStep)"
    assert d.steps.median_s == pytest.approx(10e-6, rel=1e-12)


def test_a_step_whose_window_is_empty_is_set_aside(tmp_path: Path) -> None:
    # Step 2's kernel (on another stream) ends before step 1's long kernel: the windows tile
    # the timeline, so step 2's is empty; it is set aside, not kept as a 0 s step.
    b = TraceBuilder()
    b.step(1, 0.0, 100.0)
    b.kernel(GEMM, 10.0, 490.0, launch_at=5.0)
    b.step(2, 100.0, 100.0)
    b.kernel(GEMM, 120.0, 30.0, launch_at=105.0, stream=8)
    b.step(3, 200.0, 100.0)
    b.kernel(GEMM, 500.0, 900.0, launch_at=205.0)
    d = load(b, tmp_path)
    assert_diagnosis_invariants(d)
    assert [(s.step, s.duration_s) for s in d.steps.dropped] == [("step 2", 0.0)]
    assert "lasts no time" in d.steps.dropped[0].reason
    assert (d.steps.total, d.steps.count) == (3, 2)


def test_a_trace_where_nothing_lasts_any_time_is_refused(tmp_path: Path) -> None:
    b = TraceBuilder()
    b.step(1, 0.0, 0.0)
    b.cpu_op("aten::mm", 0.0, 0.0)
    with pytest.raises(WallfinderError, match="no step lasts any time"):
        load(b, tmp_path)


def test_a_kernel_recorded_as_0_us_has_its_class_row(tmp_path: Path) -> None:
    # Found by the structure fuzzer: a 0 µs elementwise kernel was in the kernel table with a
    # class the class table left out (it listed only classes with time).
    b = TraceBuilder()
    b.step(1, 0.0, 100.0)
    b.kernel(GEMM, 10.0, 60.0, launch_at=1.0)
    b.kernel(ELEMENTWISE, 30.0, 0.0, launch_at=2.0, stream=8)
    d = load(b, tmp_path)
    assert_diagnosis_invariants(d)
    shares = {c.cls: (c.time_s, c.share) for c in d.classes}
    assert shares["elementwise"] == (0.0, 0.0)
    assert shares["gemm"][1] == pytest.approx(1.0)


def test_a_trace_whose_kernels_all_took_0_us_has_no_class_shares(tmp_path: Path) -> None:
    # Found by the structure fuzzer once 0 µs classes had rows: with no kernel time at all,
    # the one class's share was 0, not 1. There is nothing to split: no class table.
    b = TraceBuilder()
    b.cpu_op("aten::mm", 0.0, 90.0)
    b.kernel(ELEMENTWISE, 30.0, 0.0, launch_at=2.0)
    d = load(b, tmp_path)
    assert_diagnosis_invariants(d)
    assert d.classes == []
    assert [k.time_s for k in d.kernels] == [0.0]


def test_a_cpu_trace_whose_ops_all_took_0_us_has_no_class_shares(tmp_path: Path) -> None:
    # Found by the structure fuzzer: a CPU-only trace whose one top-level op in the step was
    # recorded as 0 µs got a class row of share 0 (the shares summed to 0, not 1).
    b = TraceBuilder()
    b.annotation("outer", 0.0, 100.0)
    b.cpu_op("aten::mm", 10.0, 0.0)
    d = load(b, tmp_path)
    assert_diagnosis_invariants(d)
    assert d.classes == []


# (g) invariants ---------------------------------------------------------------------------------


def busy_mix() -> TraceBuilder:
    """Every cause at once: DataLoader waits, launches, a sync, NCCL, copies, memsets."""
    b = training_trace(4, kernels=(GEMM, ELEMENTWISE, "triton_red_fused_sum_1"))
    period = 100.0 + 3 * 160.0
    for s in range(4):
        t0 = s * period
        b.nccl(t0 + 150.0, 200.0, launch_at=t0 + 105.0)
        b.memcpy(t0 + 120.0, 30.0, 1 << 16, launch_at=t0 + 101.0, stream=9)
        b.memset(t0 + 300.0, 5.0, 256, launch_at=t0 + 103.0)
        b.sync(t0 + 420.0, 150.0)
    return b


@pytest.mark.parametrize(
    "make",
    [loader_bound, with_warmup, busy_mix, lambda: training_trace(6)],
    ids=["loader-bound", "warmup", "busy-mix", "training"],
)
def test_breakdown_invariants_hold(tmp_path: Path, make: Callable[[], TraceBuilder]) -> None:
    assert_consistent(load(make(), tmp_path))


def test_per_step_parts_sum_to_each_step_exactly_in_ns(tmp_path: Path) -> None:
    wb = windows(busy_mix(), tmp_path)
    parts = wb.compute + wb.comm_exposed + wb.copy_exposed + wb.idle
    np.testing.assert_array_equal(parts, wb.end - wb.start)
    causes = np.sum(list(wb.idle_causes.values()), axis=0)
    np.testing.assert_array_equal(causes, wb.idle.astype(np.float64))


def test_kernel_rows_cover_the_steady_state_kernels(tmp_path: Path) -> None:
    d = load(training_trace(4), tmp_path)
    rows = {k.name: k for k in d.kernels}
    assert set(rows) == {"volta_sgemm_128x64_nn", "vectorized_elementwise_kernel"}
    assert rows["volta_sgemm_128x64_nn"].cls == "gemm"
    assert rows["vectorized_elementwise_kernel"].cls == "elementwise"
    assert rows["volta_sgemm_128x64_nn"].count == 4
    assert rows["volta_sgemm_128x64_nn"].time_s == pytest.approx(600e-6, rel=1e-12)
    assert sum(k.share for k in d.kernels) == pytest.approx(1.0)


# (h) verdicts ------------------------------------------------------------------------------------


def busy_with(name: str, steps: int = 3) -> TraceBuilder:
    """Steps fully covered by back-to-back 100 µs kernels, launched well ahead."""
    b = TraceBuilder()
    for s in range(steps):
        t0 = s * 400.0
        b.step(s + 1, t0, 400.0)
        for k in range(4):
            b.kernel(name, t0 + 100.0 * k, 100.0, launch_at=t0)
    return b


def test_idle_heavy_steps_hit_the_overhead_wall_with_their_largest_cause(tmp_path: Path) -> None:
    v = load(loader_bound(), tmp_path).verdict
    assert (v.wall, v.cause) == ("overhead", "data_loading")
    assert [q.answer for q in v.questions] == ["yes", "no", "yes", "unknown"]
    assert v.questions[1].value == pytest.approx(250 / 356)


def test_exposed_communication_can_be_the_overhead_cause(tmp_path: Path) -> None:
    b = TraceBuilder()
    for s in range(3):
        t0 = s * 300.0
        b.step(s + 1, t0, 300.0)
        b.kernel(GEMM, t0, 100.0, launch_at=t0)
        b.nccl(t0 + 100.0, 200.0, launch_at=t0)
    v = load(b, tmp_path).verdict
    assert (v.wall, v.cause) == ("overhead", "comm_exposed")


def test_busy_steps_in_elementwise_kernels_hit_the_bandwidth_wall(tmp_path: Path) -> None:
    d = load(busy_with(ELEMENTWISE), tmp_path)
    assert d.breakdown.compute == pytest.approx(1.0)
    assert (d.verdict.wall, d.verdict.cause) == ("bandwidth", "elementwise")
    assert [q.answer for q in d.verdict.questions] == ["yes", "yes", "no", "unknown"]


def test_busy_steps_in_gemm_kernels_hit_the_compute_wall(tmp_path: Path) -> None:
    d = load(busy_with("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n"), tmp_path)
    assert d.verdict.wall == "compute"
    assert [q.answer for q in d.verdict.questions] == ["yes", "yes", "yes", "unknown"]
    assert d.classes[0].cls == "gemm"


def test_communication_hidden_beside_the_matmuls_is_not_a_bandwidth_wall(tmp_path: Path) -> None:
    # 46% of the summed kernel time is dispatch/combine, all but 3% of the step beside compute:
    # the third question weighs the timeline, where a GEMM runs 780 of the 960 µs of compute.
    d = analyze(moe_trace().write(tmp_path / "moe.json"))
    assert_consistent(d)
    shares = {c.cls: c for c in d.classes}
    assert shares["communication"].share == pytest.approx(820 / 1780)
    assert (d.breakdown.compute, d.breakdown.comm_exposed) == (
        pytest.approx(0.96),
        pytest.approx(0.03),
    )
    assert (d.verdict.wall, d.verdict.questions[2].answer) == ("compute", "yes")
    assert d.verdict.questions[2].value == pytest.approx(780 / 960)
    assert {c: s.busy for c, s in shares.items()} == {
        "gemm": pytest.approx(780 / 960),
        "elementwise": pytest.approx(180 / 960),
        "communication": 0.0,
    }
    # What hidden communication costs is said as evidence: the SMs it shares with compute.
    assert shares["communication"].beside == pytest.approx(790 / 1780)
    assert "beside compute for 44% of the summed kernel time" in d.verdict.questions[2].detail
    # The roofline's shares are of the summed kernel time, and say so beside the timeline's.
    assert "44% of the kernel time is in GEMMs whose bound" in d.verdict.questions[3].detail


def test_communication_not_hidden_is_still_exposed_communication(tmp_path: Path) -> None:
    d = analyze(moe_trace(hidden=False).write(tmp_path / "moe.json"))
    assert_consistent(d)
    assert (d.verdict.wall, d.verdict.cause) == ("overhead", "comm_exposed")
    assert d.verdict.questions[1].value == pytest.approx(960 / 1790)
    assert next(c for c in d.classes if c.cls == "communication").beside == 0.0


def test_work_beside_a_matmul_holds_none_of_the_busy_time(tmp_path: Path) -> None:
    # A GEMM with two pointwise kernels beside it on other streams: 40% of the summed kernel
    # time, all of the timeline.
    b = TraceBuilder()
    for s in range(3):
        t0 = s * 400.0
        b.step(s + 1, t0, 400.0)
        b.kernel(GEMM, t0, 400.0, launch_at=t0)
        b.kernel(ELEMENTWISE, t0 + 50.0, 300.0, launch_at=t0, stream=9)
        b.kernel(ELEMENTWISE, t0 + 50.0, 300.0, launch_at=t0, stream=11)
    d = load(b, tmp_path)
    assert_consistent(d)
    assert next(c for c in d.classes if c.cls == "gemm").share == pytest.approx(0.4)
    assert d.verdict.questions[2].value == pytest.approx(1.0)
    assert d.verdict.wall == "compute"


def test_without_a_matmul_the_class_with_the_most_kernel_time_holds_the_overlap(
    tmp_path: Path,
) -> None:
    # Pointwise kernels cover each step; a reduction runs beside them for 100 of its 150 µs.
    b = TraceBuilder()
    for s in range(3):
        t0 = s * 400.0
        b.step(s + 1, t0, 400.0)
        b.kernel(ELEMENTWISE, t0, 300.0, launch_at=t0)
        b.kernel("triton_red_fused_sum_1", t0 + 200.0, 150.0, launch_at=t0, stream=9)
    d = load(b, tmp_path)
    assert_consistent(d)
    busy = {c.cls: c.busy for c in d.classes}
    assert busy == {"elementwise": pytest.approx(300 / 350), "reduction": pytest.approx(50 / 350)}
    assert (d.verdict.wall, d.verdict.cause) == ("bandwidth", "elementwise")


def test_pointwise_work_alone_on_the_timeline_is_the_bandwidth_wall(tmp_path: Path) -> None:
    # The same kernels one after another: the pointwise ones hold 60% of the timeline.
    b = TraceBuilder()
    for s in range(3):
        t0 = s * 1000.0
        b.step(s + 1, t0, 1000.0)
        b.kernel(GEMM, t0, 400.0, launch_at=t0)
        b.kernel(ELEMENTWISE, t0 + 400.0, 300.0, launch_at=t0)
        b.kernel(ELEMENTWISE, t0 + 700.0, 300.0, launch_at=t0)
    d = load(b, tmp_path)
    assert (d.verdict.wall, d.verdict.cause) == ("bandwidth", "elementwise")
    assert d.verdict.questions[2].value == pytest.approx(0.4)


def test_thresholds_change_the_verdict(tmp_path: Path) -> None:
    path = loader_bound().write(tmp_path / "t.json")
    assert analyze(path).verdict.wall == "overhead"
    assert analyze(path, Options(thresholds=Thresholds(min_busy=0.5))).verdict.wall == "compute"


def unstable() -> TraceBuilder:
    """Fully busy steps of 300, 400 and 500 µs: a CV of 20%."""
    b = TraceBuilder()
    t0 = 0.0
    for s, length in enumerate([300.0, 400.0, 500.0]):
        b.step(s + 1, t0, length)
        b.kernel(GEMM, t0, length, launch_at=t0)
        t0 += length
    return b


def test_unstable_steps_say_so_in_the_verdict(tmp_path: Path) -> None:
    d = load(unstable(), tmp_path)
    assert d.steps.cv == pytest.approx(np.std([3, 4, 5]) / 4)
    assert not d.steps.stable
    assert d.verdict.questions[0].answer == "no"
    assert "unstable" in d.verdict.reason


def test_steps_stable_follows_the_given_thresholds(tmp_path: Path) -> None:
    d = analyze(unstable().write(tmp_path / "t.json"), Options(thresholds=Thresholds(max_cv=0.5)))
    assert d.verdict.questions[0].answer == "yes"
    assert d.steps.stable


# (i) CPU-only traces -----------------------------------------------------------------------------


def cpu_loader_bound() -> TraceBuilder:
    """1 ms steps on the CPU: 700 µs in the DataLoader, a 200 µs op, 100 µs untraced."""
    b = TraceBuilder(device_name=None)
    for s in range(3):
        t0 = s * 1000.0
        b.step(s + 1, t0, 1000.0)
        b.dataloader(t0, 700.0)
        b.cpu_op("aten::mm", t0 + 700.0, 200.0)
    return b


def test_cpu_only_trace_is_analysed_on_the_cpu(tmp_path: Path) -> None:
    d = load(cpu_loader_bound(), tmp_path)
    assert d.breakdown.basis == "cpu"
    assert d.device.kind == "cpu"
    assert d.kernels == []
    assert d.steps.count == 3
    assert d.breakdown.compute == pytest.approx(0.2)
    assert d.breakdown.idle == pytest.approx(0.8)
    assert d.breakdown.idle_causes["data_loading"] == pytest.approx(0.7)
    assert d.breakdown.idle_causes["other"] == pytest.approx(0.1)
    assert d.cpu is not None
    assert (d.cpu.data_loading, d.cpu.ops, d.cpu.untraced) == pytest.approx((0.7, 0.2, 0.1))
    assert [o.name for o in d.cpu.top_ops] == ["aten::mm"]
    assert_consistent(d)


def test_dataloader_dominated_cpu_steps_hit_the_overhead_wall(tmp_path: Path) -> None:
    v = load(cpu_loader_bound(), tmp_path).verdict
    assert (v.wall, v.cause) == ("overhead", "data_loading")
    assert v.questions[1].question == "Is the CPU busy?"


def test_cpu_collective_counts_as_communication(tmp_path: Path) -> None:
    b = TraceBuilder(device_name=None)
    for s in range(3):
        t0 = s * 1000.0
        b.step(s + 1, t0, 1000.0)
        b.annotation("gloo:all_reduce", t0, 600.0)
        b.cpu_op("aten::add", t0 + 600.0, 400.0)
    d = load(b, tmp_path)
    assert d.breakdown.comm_exposed == pytest.approx(0.6)
    assert d.breakdown.compute == pytest.approx(0.4)
    assert (d.verdict.wall, d.verdict.cause) == ("overhead", "comm_exposed")


def test_trace_with_only_runtime_calls_gives_a_diagnosis_or_a_clear_error(
    tmp_path: Path,
) -> None:
    b = TraceBuilder()
    b.runtime("cudaMemcpyAsync", 0.0, 5.0, correlation=1)
    path = b.write(tmp_path / "t.json")
    with contextlib.suppress(WallfinderError):
        analyze(path)


# (j) folders of ranks ---------------------------------------------------------------------------


def rank(r: int, steps: int) -> TraceBuilder:
    return training_trace(steps, builder=TraceBuilder(rank=r, world_size=2))


def test_folder_of_ranks_gives_rank_0_with_a_row_per_rank(tmp_path: Path) -> None:
    rank(1, 3).write(tmp_path / "a_rank1.json")
    rank(0, 4).write(tmp_path / "b_rank0.json.gz")
    d = analyze(tmp_path)
    assert (d.rank, d.world_size, d.source) == (0, 2, "b_rank0.json.gz")
    assert d.steps.total == 4
    assert [(r.rank, r.source, r.steps) for r in d.ranks] == [
        (0, "b_rank0.json.gz", 4),
        (1, "a_rank1.json", 3),
    ]
    assert all(r.wall in ("compute", "bandwidth", "overhead") for r in d.ranks)
    assert not any("skipped" in w for w in d.warnings)


def test_corrupt_rank_file_is_skipped_with_a_warning(tmp_path: Path) -> None:
    rank(0, 3).write(tmp_path / "rank-0.json")
    rank(1, 3).write(tmp_path / "rank-1.json")
    (tmp_path / "rank-2.json").write_bytes(b"hello")
    d = analyze(tmp_path)
    assert d.rank == 0
    assert [r.rank for r in d.ranks] == [0, 1]
    skipped = [w for w in d.warnings if "skipped" in w]
    assert len(skipped) == 1
    assert "rank-2.json" in skipped[0]


def test_truncated_rank_file_is_named_in_the_skip_warning(tmp_path: Path) -> None:
    rank(0, 3).write(tmp_path / "rank-0.json")
    (tmp_path / "rank-1.json").write_bytes(rank(1, 3).to_bytes()[:500])
    d = analyze(tmp_path)
    assert [r.rank for r in d.ranks] == [0]
    skipped = [w for w in d.warnings if "skipped" in w]
    assert len(skipped) == 1
    assert "rank-1.json" in skipped[0]


def test_analyze_of_one_file_has_no_rank_rows(tmp_path: Path) -> None:
    d = analyze(rank(0, 3).write(tmp_path / "t.json"))
    assert d.ranks == []
    assert (d.rank, d.world_size) == (0, 2)


def test_repeated_step_markers_count_once(tmp_path: Path) -> None:
    b = loader_bound()
    for s in range(3):  # some runners record each step twice, as an op and an annotation
        b.cpu_op(f"ProfilerStep#{s + 1}", s * 356.0, 356.0)
    d = load(b, tmp_path)
    assert d.steps.total == 3
    assert d.breakdown.compute == pytest.approx(250 / 356, rel=1e-12)


def test_missing_launch_records_are_warned_about(tmp_path: Path) -> None:
    some = TraceBuilder()
    some.step(1, 0.0, 300.0)
    some.kernel(GEMM, 0.0, 100.0, launch_at=0.0)
    some.kernel(GEMM, 250.0, 50.0)
    assert any(
        "1 of 2 device ops have no launch record" in w for w in load(some, tmp_path).warnings
    )
    none = TraceBuilder()
    none.step(1, 0.0, 300.0)
    none.kernel(GEMM, 0.0, 100.0)
    warnings = load(none, tmp_path, "none.json").warnings
    assert any("no launch records" in w for w in warnings)


# (h) steps without ProfilerStep markers ---------------------------------------------------------


def _loop(
    iterations: int, first_us: float, body: Callable[[TraceBuilder, int, float], None]
) -> TraceBuilder:
    """`iterations` of 1000 µs, each's work added by `body(builder, index, start)`; the first
    starts with `first_us` of start-up on the host (an `aten::to`)."""
    b = TraceBuilder()
    t0 = 0.0
    for i in range(iterations):
        if i == 0 and first_us:
            b.cpu_op("aten::to", t0, first_us)
            t0 += first_us
        body(b, i, t0)
        t0 += 1000.0
    return b


def optimizer_loop(iterations: int, *, first_us: float = 5000.0, names: int = 1) -> TraceBuilder:
    """A loop without step markers: each 1000 µs iteration runs a 900 µs GEMM, then its
    optimizer step(s) (`Optimizer.step#SGD.step`; with `names=2` also a second optimizer's);
    the first iteration starts with `first_us` of start-up on the host."""

    def body(b: TraceBuilder, _: int, t: float) -> None:
        b.kernel(GEMM, t + 10.0, 900.0, launch_at=t + 2.0)
        b.host("Optimizer.step#SGD.step", t + 920.0, 30.0, cat="user_annotation")
        if names == 2:
            b.host("Optimizer.step#Adam.step", t + 955.0, 30.0, cat="user_annotation")

    return _loop(iterations, first_us, body)


def test_only_the_first_optimizers_steps_mark_iterations(tmp_path: Path) -> None:
    d = load(optimizer_loop(5, names=2), tmp_path)
    assert d.steps.total == 5


def test_too_few_optimizer_steps_leave_one_window(tmp_path: Path) -> None:
    d = load(optimizer_loop(2), tmp_path)
    assert d.steps.source == "whole trace (no ProfilerStep)"
    assert d.steps.total == 1


def annotated_loop(
    iterations: int, *, first_us: float = 5000.0, shuffle: bool = False
) -> TraceBuilder:
    """No markers, no optimizer: each 1000 µs iteration runs two annotated ranges ("embed",
    "mlp": 100 µs each, a GEMM in each) then 700 µs of unannotated work (a backward GEMM);
    the first starts with `first_us` of start-up. With `shuffle`, the second iteration's ranges
    come in the other order: no sequence repeats."""

    def body(b: TraceBuilder, i: int, t: float) -> None:
        names = ("mlp", "embed") if shuffle and i == 1 else ("embed", "mlp")
        for k, name in enumerate(names):
            b.annotation(name, t + 100.0 * k, 100.0)
            b.kernel(GEMM, t + 100.0 * k + 10.0, 80.0, launch_at=t + 100.0 * k + 2.0)
        b.kernel(GEMM, t + 210.0, 780.0, launch_at=t + 205.0)

    return _loop(iterations, first_us, body)


@pytest.mark.parametrize(
    ("loop", "source", "first", "said"),
    [
        (optimizer_loop, "optimizer steps", "iteration 1", "iterations between optimizer steps"),
        # Each iteration runs from one "embed" to the next: its unannotated work is its own.
        (
            annotated_loop,
            "repeated annotations",
            "iteration 1 (embed)",
            "repetitions of the annotated sequence",
        ),
    ],
)
def test_iterations_are_the_steps_of_a_trace_without_markers(
    tmp_path: Path, loop: Callable[[int], TraceBuilder], source: str, first: str, said: str
) -> None:
    d = load(loop(6), tmp_path)
    assert d.steps.source == f"{source} (no ProfilerStep)"
    assert d.steps.total == 6
    # The first iteration carries the 5 ms start-up: set aside as warm-up, and said.
    assert [x.step for x in d.steps.dropped] == [first]
    assert d.steps.median_s == pytest.approx(1000e-6, rel=0.02)
    assert any(said in w for w in d.warnings)
    assert d.verdict.wall == "compute"
    d.self_check()


def test_annotations_that_do_not_repeat_one_sequence_mark_nothing(tmp_path: Path) -> None:
    d = load(annotated_loop(5, shuffle=True), tmp_path)
    assert d.steps.source == "whole trace (no ProfilerStep)"


def startup_then_work(first_us: float = 500_000.0, blocking: bool = False) -> TraceBuilder:
    """No markers, no optimizer: a first `aten::to` of `first_us` (with `blocking`, spent in a
    cudaMemcpy waiting for the GPU), then 20 rounds of a 20 µs `aten::to` and a 400 µs GEMM."""
    b = TraceBuilder()
    b.cpu_op("aten::to", 0.0, first_us)
    if blocking:
        b.runtime("cudaMemcpy", 10.0, first_us - 20.0, correlation=b.new_id())
    t = first_us + 10.0
    for _ in range(20):
        b.cpu_op("aten::to", t, 20.0)
        b.kernel(GEMM, t + 30.0, 400.0, launch_at=t + 22.0)
        t += 440.0
    return b


def test_start_up_in_a_trace_without_steps_is_set_aside_and_said(tmp_path: Path) -> None:
    d = load(startup_then_work(), tmp_path)
    assert d.steps.total == 2
    [startup] = d.steps.dropped
    assert startup.step == "start-up"
    assert "the first aten::to took 0.50 s" in startup.reason
    # What is left is the work: the GPU busy with GEMMs, not a host that "cannot launch".
    assert d.verdict.wall == "compute"
    assert d.breakdown.compute > 0.85


def test_a_first_call_that_waits_for_the_gpu_is_not_start_up(tmp_path: Path) -> None:
    d = load(startup_then_work(blocking=True), tmp_path)
    assert d.steps.total == 1
    assert d.steps.dropped == []


def test_what_a_cpu_side_analysis_says_of_the_gpu() -> None:
    cpu_only = np.array([0, 0, 0], dtype=np.int64)
    some_on_gpu = np.array([0, 1], dtype=np.int64)
    none = np.array([], dtype=np.int64)
    # No GPU in sight: nothing to say.
    assert gpu_note(False, 0, none) is None
    # Runtime calls without kernels: the GPU's work was not recorded.
    assert "no kernel was recorded" in (gpu_note(True, 3, cpu_only) or "")
    # A GPU present, no runtime call, every allocation on the CPU: the job never used it.
    assert "never used it" in (gpu_note(True, 0, cpu_only) or "")
    # Without memory events (or with some on a GPU) the two readings stay open, and are said.
    for types in (none, some_on_gpu):
        note = gpu_note(True, 0, types) or ""
        assert "either the job ran on the CPU" in note
        assert "ProfilerActivity.CUDA" in note
