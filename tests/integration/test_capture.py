"""wallfinder.profile around a real (tiny) training loop on the CPU, with real torch."""

from __future__ import annotations

from pathlib import Path

import pytest

import wallfinder
from wallfinder import WallfinderError

torch = pytest.importorskip("torch")


def train(steps: int, p: wallfinder.Profile | None = None) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 64), torch.randn(32, 8)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        if p is not None:
            p.step()


def test_profile_with_explicit_steps_writes_a_rank_trace_and_diagnoses_it(
    tmp_path: Path,
) -> None:
    with wallfinder.profile(wait=1, warmup=1, active=3, trace_dir=tmp_path) as p:
        train(6, p)
    assert p.trace_path == tmp_path / "trace_rank0.json"
    assert p.trace_path.exists()
    d = p.diagnosis
    assert d is not None
    assert d.steps.total == 3
    assert d.steps.source == "ProfilerStep"
    assert d.device.kind == "cpu"
    # Shapes are recorded: the CPU roofline costs the linear layers' matmuls.
    assert d.roofline is not None
    assert any("mm" in o.name for o in d.roofline.ops)


def test_optimizer_steps_mark_the_steps_of_an_unmodified_loop(tmp_path: Path) -> None:
    with wallfinder.profile(wait=0, warmup=1, active=2, trace_dir=tmp_path) as p:
        train(5)
    assert p.diagnosis is not None
    assert p.diagnosis.steps.total == 2


def test_a_loop_too_short_for_the_schedule_is_a_clear_error(tmp_path: Path) -> None:
    with (
        pytest.raises(WallfinderError, match="ended before any profiled step"),
        wallfinder.profile(wait=5, warmup=5, active=2, trace_dir=tmp_path),
    ):
        train(2)


def test_profile_as_a_decorator(tmp_path: Path) -> None:
    p = wallfinder.profile(wait=0, warmup=1, active=2, trace_dir=tmp_path)
    p(train)(4)
    assert p.diagnosis is not None
    assert p.diagnosis.steps.total == 2


def test_importing_wallfinder_does_not_import_torch() -> None:
    import subprocess
    import sys

    code = "import sys, wallfinder; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_step_timer_times_each_optimizer_step_with_the_host_clock_on_the_cpu() -> None:
    import time

    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with wallfinder.StepTimer() as t:
        for i in range(8):
            time.sleep(0.1 if i == 0 else 0.02)  # a slow first step, then steady ones
            opt.zero_grad()
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
    s = t.steps
    assert s is not None
    assert s.total == 8
    assert [d.step for d in s.dropped] == ["step 0"]  # the slow first step is warm-up
    assert s.count == 7
    assert 0.02 <= s.median_s < 0.05
    assert s.stable


def test_step_timer_with_explicit_steps_and_no_step_is_a_clear_error() -> None:
    with wallfinder.StepTimer(auto_step=False) as t:
        for _ in range(4):
            t.step()
    assert t.steps is not None
    assert t.steps.total == 4
    with pytest.raises(WallfinderError, match="no step was timed"), wallfinder.StepTimer():
        pass
