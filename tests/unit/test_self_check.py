"""`Diagnosis.self_check`: a diagnosis says which of its invariants it breaks."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from tracegen import training_trace
from wallfinder import Diagnosis, analyze
from wallfinder.diagnosis import Finding


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


def test_steps_out_of_order_are_named(good: Diagnosis) -> None:
    steps = msgspec.structs.replace(good.steps, min_s=good.steps.max_s * 2)
    broken = msgspec.structs.replace(good, steps=steps)
    assert any(v.startswith("steps: min") for v in broken.violations())
