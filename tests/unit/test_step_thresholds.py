"""The thresholds that decide the steps (warm-up, start-up, iterations, spikes) are in the one
`Thresholds` tree (`Thresholds.steps`): setting them moves the result, as the verdict's do."""

from __future__ import annotations

from pathlib import Path

from tracegen import TraceBuilder
from wallfinder.analysis import StepThresholds, Thresholds, diagnose, timed_steps
from wallfinder.trace import load_trace

GEMM = "volta_sgemm_128x64_nn"


def stepped(periods: list[float]) -> TraceBuilder:
    """Steps of these lengths (µs), each a GEMM launched at its start running to its end."""
    b = TraceBuilder()
    t0 = 0.0
    for i, period in enumerate(periods):
        b.step(i + 1, t0, period)
        b.cpu_op("aten::mm", t0, 8.0)
        b.kernel(GEMM, t0 + 10.0, period - 20.0, launch_at=t0 + 2.0)
        t0 += period
    return b


def test_warm_up_is_decided_by_the_step_thresholds() -> None:
    durations = [3.0, 1.0, 1.0, 1.0, 1.0]
    assert [d.step for d in timed_steps(durations, "timer").dropped] == ["step 0"]
    patient = Thresholds(steps=StepThresholds(warmup_factor=4.0))
    assert timed_steps(durations, "timer", patient).dropped == []


def test_spikes_are_decided_by_the_step_thresholds(tmp_path: Path) -> None:
    trace = load_trace(stepped([1000.0, 1000.0, 1300.0, 1000.0, 1000.0]).write(tmp_path / "t.json"))
    assert [s.step for s in diagnose(trace).steps.spikes] == ["step 3"]
    calm = Thresholds(steps=StepThresholds(spike_factor=1.5))
    assert diagnose(trace, calm).steps.spikes == []


def test_iterations_without_markers_need_the_step_thresholds_count(tmp_path: Path) -> None:
    b = TraceBuilder()
    for i in range(2):
        t = 5000.0 + 1000.0 * i
        b.kernel(GEMM, t + 10.0, 900.0, launch_at=t + 2.0)
        b.host("Optimizer.step#SGD.step", t + 920.0, 30.0, cat="user_annotation")
    trace = load_trace(b.write(tmp_path / "t.json"))
    assert diagnose(trace).steps.total == 1  # two optimizer steps: one window
    two = Thresholds(steps=StepThresholds(min_iterations=2))
    assert diagnose(trace, two).steps.total == 2
