"""`wallfinder demo --compare`'s judgement of a pair of runs, on traces whose timings the tests
set: what the pair was made to show, what the diff found, and whether they agree."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tracegen import TraceBuilder
from wallfinder import Options, analyze
from wallfinder.capture.workloads import CPU_THREADS, TINY_BATCH, get
from wallfinder.cli.commands.demo import pair_summary
from wallfinder.measure import DemoPair, DemoResult

STEP_US, COMPUTE_US = 1000.0, 300.0


def loader_bound() -> TraceBuilder:
    """Each step waits 700 µs for its batch, then computes for 300 µs."""
    b = TraceBuilder(device_name=None)
    for s in range(4):
        t0 = s * STEP_US
        b.step(s + 1, t0, STEP_US)
        b.dataloader(t0, STEP_US - COMPUTE_US)
        b.cpu_op("aten::mm", t0 + STEP_US - COMPUTE_US, COMPUTE_US)
    return b


def compute_bound() -> TraceBuilder:
    """The same compute with the batch already there: 300 µs steps, all matmul."""
    b = TraceBuilder(device_name=None)
    for s in range(4):
        t0 = s * COMPUTE_US
        b.step(s + 1, t0, COMPUTE_US)
        b.cpu_op("aten::mm", t0, COMPUTE_US)
    return b


def per_sample(ops: int, op_us: float, python_us: float, steps: int = 4) -> TraceBuilder:
    """Steps of `ops` tiny ops (`op_us` each, all fixed cost) with `python_us` of Python after
    each, then one 100 µs matmul: the tiny-ops workload as written, on the CPU."""
    b = TraceBuilder(device_name=None)
    step_us = ops * (op_us + python_us) + 100.0
    for s in range(steps):
        t0 = s * step_us
        b.step(s + 1, t0, step_us)
        for i in range(ops):
            b.cpu_op("aten::add", t0 + i * (op_us + python_us), op_us)
        b.cpu_op("aten::mm", t0 + ops * (op_us + python_us), 100.0)
    return b


def result(tmp_path: Path, name: str, fixed: bool, trace: TraceBuilder) -> DemoResult:
    path = trace.write(tmp_path / f"{name}{'-fixed' if fixed else ''}.json")
    w = get(name)
    # As `run_demo` does: the as-written run's what-if table replays the workload's fix.
    what_if = None if fixed else w.what_if_for("cpu")
    return DemoResult(
        workload=w,
        fixed=fixed,
        device="cpu",
        diagnosis=analyze(path, Options(what_if=what_if) if what_if else None),
        trace_path=path,
        expected=w.expected("cpu", fixed),
    )


def rows(pair: DemoPair) -> dict[str, str]:
    return dict(pair_summary(pair))


def test_a_pair_that_moves_its_wall_as_made_to_show_agrees(tmp_path: Path) -> None:
    pair = DemoPair.of(
        result(tmp_path, "dataloader", False, loader_bound()),
        result(tmp_path, "dataloader", True, compute_bound()),
    )
    v = pair.diff.verdict
    assert (v.before_wall, v.before_cause, v.after_wall) == ("overhead", "data_loading", "compute")
    assert pair.faster
    assert pair.differences == []
    summary = rows(pair)
    assert summary["step"] == "1.0 ms → 0.3 ms, 3.33x faster (beyond the noise)"
    assert summary["wall"].startswith("the wall moved from overhead (data loading")
    assert summary["result"] == (
        "as made to show: the wall moved from overhead to compute, and the step is 3.33x faster"
    )
    assert list(summary)[-1] == "result"


def test_a_fix_that_moved_nothing_is_reported_as_differing(tmp_path: Path) -> None:
    pair = DemoPair.of(
        result(tmp_path, "dataloader", False, loader_bound()),
        result(tmp_path, "dataloader", True, loader_bound()),
    )
    assert not pair.faster
    assert pair.differences[0] == "fixed: wall overhead (expected compute)"
    assert pair.differences[-1].startswith("the fixed step is not faster beyond the noise")
    summary = rows(pair)
    assert summary["wall"].startswith("the wall did not move: overhead")
    assert summary["result"].startswith(
        "differs from what the job was made to show: fixed: wall overhead (expected compute)"
    )


def test_a_wall_the_device_cannot_have_is_said_plainly_not_claimed(tmp_path: Path) -> None:
    # The sync workload's .item() wall needs an asynchronous device: on the CPU both runs are
    # the same compute-bound job, and no speed-up is expected of the fix.
    pair = DemoPair.of(
        result(tmp_path, "sync", False, compute_bound()),
        result(tmp_path, "sync", True, compute_bound()),
    )
    assert pair.cannot_show.startswith("the CPU runs ops synchronously")
    assert pair.differences == []
    summary = rows(pair)
    assert summary["step"].endswith("unchanged (within the noise)")
    assert summary["result"].startswith("the cpu cannot show this job's wall: the CPU runs ops")
    assert "as made to show" not in summary["result"]


def test_only_a_fix_that_speeds_this_device_up_expects_a_faster_step() -> None:
    assert get("dataloader").expected("cpu", True).faster is True
    assert get("dataloader").expected("cpu", False).faster is None
    # .item() costs the CPU nothing: its fix is not expected to speed the CPU's step up.
    assert get("sync").expected("cpu", True).faster is None
    assert get("sync").expected("cuda", True).faster is True


def test_a_note_the_fixed_run_extends_is_said_once(tmp_path: Path) -> None:
    pair = DemoPair.of(
        result(tmp_path, "matmul", False, compute_bound()),
        result(tmp_path, "matmul", True, compute_bound()),
    )
    notes = [text for label, text in pair_summary(pair) if label == "on the cpu"]
    assert notes == [get("matmul").expected("cpu", True).note]


def test_a_workload_runs_on_one_cpu_thread_and_leaves_the_setting_as_it_was() -> None:
    torch = pytest.importorskip("torch")
    seen: list[int] = []
    w = dataclasses.replace(get("matmul"), loop=lambda *_: seen.append(torch.get_num_threads()))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        w.run(1, device="cpu")
        assert seen == [CPU_THREADS]
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_the_pair_sets_the_replayed_fix_beside_the_measured_fixed_step(tmp_path: Path) -> None:
    pair = DemoPair.of(
        result(tmp_path, "dataloader", False, loader_bound()),
        result(tmp_path, "dataloader", True, compute_bound()),
    )
    p = pair.prediction
    assert p is not None
    # The as-written step waits 700 µs of its 1000 for the batch: without the wait, 300 µs,
    # which is what the fixed run measures.
    assert p.what_if == "data"
    assert (p.replayed_s, p.predicted_s, p.measured_s) == pytest.approx((1e-3, 3e-4, 3e-4))
    assert p.error == pytest.approx(0.0, abs=1e-9)
    assert rows(pair)["prediction"].startswith(
        "predicted 0.3 ms by replay (what-if data on the as-written run, replayed unchanged at "
        "1.0 ms), measured 0.3 ms after the fix (+0%"
    )


def test_tiny_ops_are_predicted_with_the_per_op_overhead_cut_by_the_batch(
    tmp_path: Path,
) -> None:
    # 256 dispatch-sized ops of 4 µs and 4 µs of Python after each, then a 100 µs matmul:
    # cutting the per-op overhead and the Python TINY_BATCH-fold leaves the matmul (less its
    # one op's fixed cost) and 2048 / TINY_BATCH µs of the rest.
    pair = DemoPair.of(
        result(tmp_path, "tiny-ops", False, per_sample(256, 4.0, 4.0)),
        result(tmp_path, "tiny-ops", True, per_sample(2, 4.0, 4.0)),
    )
    p = pair.prediction
    assert p is not None
    assert p.what_if == f"host:{TINY_BATCH}"
    expected_us = 100.0 - 4.0 + 4.0 / TINY_BATCH + 256 * 8.0 / TINY_BATCH
    assert p.predicted_s == pytest.approx(expected_us * 1e-6, rel=1e-2)  # ns rounding
    assert p.measured_s == pytest.approx(116e-6)


def test_a_fix_no_what_if_stands_for_has_no_prediction(tmp_path: Path) -> None:
    pair = DemoPair.of(
        result(tmp_path, "matmul", False, compute_bound()),
        result(tmp_path, "matmul", True, compute_bound()),
    )
    assert get("matmul").what_if_for("cpu") is None
    assert pair.prediction is None
    assert "prediction" not in rows(pair)
