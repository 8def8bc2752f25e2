"""`Diagnosis.self_check`: a diagnosis says which of its invariants it breaks."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from tracegen import training_trace
from wallfinder import Diagnosis, analyze
from wallfinder.diagnosis import Finding, FusionCandidate


@pytest.fixture
def good(tmp_path: Path) -> Diagnosis:
    return analyze(training_trace(5, loader_us=1000.0).write(tmp_path / "t.json"))


def test_a_diagnosis_of_a_real_analysis_keeps_its_invariants(good: Diagnosis) -> None:
    assert good.violations() == []
    good.self_check()


def test_parts_that_do_not_sum_to_the_step_are_named(good: Diagnosis) -> None:
    b = msgspec.structs.replace(good.breakdown, compute=good.breakdown.compute + 0.2)
    broken = msgspec.structs.replace(good, breakdown=b)
    assert any("breakdown parts sum to" in v for v in broken.violations())
    with pytest.raises(AssertionError, match="breakdown parts sum to"):
        broken.self_check()


def test_a_bound_under_1x_or_over_amdahl_is_named(good: Diagnosis) -> None:
    slower = Finding(
        id="x", wall="overhead", title="t", share=0.1, max_speedup=0.75, evidence="e", fix="f"
    )
    beyond = msgspec.structs.replace(slower, id="y", max_speedup=2.0)  # 10% gives 1.11x
    broken = msgspec.structs.replace(good, findings=[slower, beyond])
    problems = broken.violations()
    assert any(v.startswith("finding x: bound 0.75x") for v in problems)
    assert any(v.startswith("finding y: bound 2.0x") for v in problems)


def test_a_kernel_outside_every_class_is_named(good: Diagnosis) -> None:
    row = msgspec.structs.replace(good.kernels[0], cls="no-such-class")
    broken = msgspec.structs.replace(good, kernels=[row, *good.kernels[1:]])
    assert any("none of the classes" in v for v in broken.violations())


def test_holds_on_the_busy_time_that_do_not_sum_to_1_are_named(good: Diagnosis) -> None:
    assert sum(c.busy or 0.0 for c in good.classes) == pytest.approx(1.0)
    first = msgspec.structs.replace(good.classes[0], busy=0.0, streaming=0.1, beside=2.0)
    problems = msgspec.structs.replace(good, classes=[first, *good.classes[1:]]).violations()
    assert "the classes' holds on the busy time do not sum to 1" in problems
    assert any(v.startswith(f"class {first.cls}: busy 0.0, streaming 0.1") for v in problems)
    assert any(v.startswith(f"class {first.cls}: beside 2.0") for v in problems)


def test_steps_out_of_order_are_named(good: Diagnosis) -> None:
    steps = msgspec.structs.replace(good.steps, min_s=good.steps.max_s * 2)
    broken = msgspec.structs.replace(good, steps=steps)
    assert any(v.startswith("steps: min") for v in broken.violations())


def test_a_communication_bound_beyond_the_compute_it_could_hide_behind_is_named(
    good: Diagnosis,
) -> None:
    # 30% of the step in exposed communication, but only 10% of compute to hide it behind
    # (5% of it already beside a collective): hiding can take 5% of the step, 1.05x.
    b = msgspec.structs.replace(
        good.breakdown, compute=0.1, comm_exposed=0.3, comm_hidden=0.05, idle=0.6
    )
    claims = Finding(
        id="exposed-comm",
        wall="overhead",
        title="t",
        share=0.3,
        max_speedup=1 / 0.7,
        evidence="e",
        fix="f",
    )
    reachable = msgspec.structs.replace(claims, max_speedup=1 / 0.95, reach=0.05)
    broken = msgspec.structs.replace(good, breakdown=b, findings=[claims])
    assert any(
        v.startswith("finding exposed-comm: bound") and "could hide behind" in v
        for v in broken.violations()
    )
    kept = msgspec.structs.replace(good, breakdown=b, findings=[reachable])
    assert not any(v.startswith("finding exposed-comm") for v in kept.violations())


def test_a_bound_beyond_its_findings_reach_is_named(good: Diagnosis) -> None:
    f = Finding(
        id="x",
        wall="overhead",
        title="t",
        share=0.3,
        max_speedup=1 / 0.7,
        evidence="e",
        fix="f",
        reach=0.1,
    )
    beyond = msgspec.structs.replace(f, id="y", reach=0.4)
    problems = msgspec.structs.replace(good, findings=[f, beyond]).violations()
    assert any(v.startswith("finding x: bound") and "its reach" in v for v in problems)
    assert any(v.startswith("finding y: reach 0.4 outside") for v in problems)


def test_a_fused_chain_faster_than_its_roofline_time_is_named(good: Diagnosis) -> None:
    bandwidth = good.device.mem_bandwidth
    assert bandwidth
    # Its fused bytes take 1 ms at the device's bandwidth; the saving leaves it 0.5 ms.
    chain = FusionCandidate(
        kernels=["a", "b"],
        ops=[],
        occurrences_per_step=1.0,
        time_s=1.5e-3,
        bytes_unfused=2 * bandwidth * 1e-3,
        bytes_fused_at_least=bandwidth * 1e-3,
        max_saving_s=1e-3,
        basis="bytes",
    )
    problems = msgspec.structs.replace(good, fusion=[chain]).violations()
    assert any("under its roofline time" in v for v in problems)
    at_roof = msgspec.structs.replace(chain, max_saving_s=0.5e-3)
    assert not any(
        "roofline" in v for v in msgspec.structs.replace(good, fusion=[at_roof]).violations()
    )
