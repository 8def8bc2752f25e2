"""wallfinder.profile around a real (tiny) training loop on the CPU, with real torch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import wallfinder
from invariants import assert_phases_and_modules
from wallfinder import WallfinderError
from wallfinder.capture._hook import ModuleRanges

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


class FakeClock:
    """Clock readings the test controls: each read returns the next of `readings`."""

    def __init__(self, readings: list[float]) -> None:
        self.readings = iter(readings)

    def __call__(self) -> float:
        return next(self.readings)


def test_step_timer_marks_each_optimizer_step_and_drops_the_slow_first_one() -> None:
    # The clock is read on entering and at each of 8 optimizer steps: a 100 ms first step,
    # then steps of 20, 21, 19, 20, 22, 20 and 18 ms.
    steps_ms = [100, 20, 21, 19, 20, 22, 20, 18]
    readings = [0.0]
    for ms in steps_ms:
        readings.append(readings[-1] + ms / 1e3)
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with wallfinder.StepTimer(clock=FakeClock(readings)) as t:
        for _ in steps_ms:
            opt.zero_grad()
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
    s = t.steps
    assert s is not None
    assert s.total == 8
    assert [d.step for d in s.dropped] == ["step 0"]  # the slow first step is warm-up
    assert s.count == 7
    assert s.median_s == pytest.approx(0.020)
    assert s.min_s == pytest.approx(0.018)
    kept = [ms / 1e3 for ms in steps_ms[1:]]
    mean = sum(kept) / len(kept)
    sd = (sum((k - mean) ** 2 for k in kept) / len(kept)) ** 0.5
    assert s.cv == pytest.approx(sd / mean)
    assert s.stable  # a CV of 6% is under the 10% bound


def test_step_timer_calls_steps_that_vary_by_half_unstable() -> None:
    durations = [0.02, 0.03, 0.02, 0.03, 0.02, 0.03]
    readings = [0.0]
    for d in durations:
        readings.append(readings[-1] + d)
    with wallfinder.StepTimer(auto_step=False, clock=FakeClock(readings)) as t:
        for _ in durations:
            t.step()
    assert t.steps is not None
    assert t.steps.count == 6
    assert t.steps.cv == pytest.approx(0.2)
    assert not t.steps.stable


def test_step_timer_with_explicit_steps_and_no_step_is_a_clear_error() -> None:
    with wallfinder.StepTimer(auto_step=False) as t:
        for _ in range(4):
            t.step()
    assert t.steps is not None
    assert t.steps.total == 4
    with pytest.raises(WallfinderError, match="no step was timed"), wallfinder.StepTimer():
        pass


def test_profile_records_the_module_tree_without_stacks_when_asked(tmp_path: Path) -> None:
    with wallfinder.profile(wait=0, warmup=1, active=3, trace_dir=tmp_path, modules=True) as p:
        train(5)
    d = p.diagnosis
    assert d is not None
    assert_phases_and_modules(d)
    assert p.trace_path is not None
    assert '"cat": "python_function"' not in p.trace_path.read_text()  # no Python tracer
    assert d.modules is not None
    assert d.modules.source == "modules"
    rows = {m.path: m for m in d.modules.rows}
    assert rows["Sequential_0"].forward_s > 0
    assert rows["Sequential_0"].backward_s > 0  # tied to the forward by sequence numbers
    assert {m.parent for m in d.modules.rows} >= {None, "Sequential_0"}
    assert d.phases is not None
    assert d.phases.exposed["forward"] > 0
    assert d.phases.exposed["backward"] > 0
    # The hooks are gone once the profiled steps are written.
    assert not torch.nn.modules.module._global_forward_pre_hooks
    assert not torch.nn.modules.module._global_forward_hooks


def test_profile_records_no_module_ranges_by_default(tmp_path: Path) -> None:
    with wallfinder.profile(wait=0, warmup=1, active=2, trace_dir=tmp_path) as p:
        train(4)
    assert p.trace_path is not None
    assert "nn.Module: " not in p.trace_path.read_text()
    assert p.diagnosis is not None
    assert p.diagnosis.modules is None or p.diagnosis.modules.source != "modules"


def test_module_ranges_close_when_a_forward_raises() -> None:
    class Fails(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            raise ValueError("bad batch")

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), Fails())
    ranges = ModuleRanges()
    ranges.install()
    try:
        with torch.profiler.profile() as prof:
            with pytest.raises(ValueError, match="bad batch"):
                model(torch.randn(2, 4))
            torch.nn.Linear(4, 4)(torch.randn(2, 4))
    finally:
        ranges.remove()
    ranges_ = {e.name: e.time_range for e in prof.events() if e.name.startswith("nn.Module: ")}
    # The root by its class, the modules under it by their qualified names.
    assert set(ranges_) == {
        "nn.Module: Sequential_0",
        "nn.Module: 0",
        "nn.Module: 1",
        "nn.Module: Linear_0",
    }
    # The failed forward's ranges were closed: the next module's range is outside them.
    assert ranges_["nn.Module: Linear_0"].start >= ranges_["nn.Module: Sequential_0"].end
    assert ranges_["nn.Module: Linear_0"].start >= ranges_["nn.Module: 1"].end
    assert not torch.nn.modules.module._global_forward_hooks


def test_module_ranges_name_modules_by_their_qualified_names() -> None:
    # Before: `Block_0`, `Linear_3`: names the user's code never holds.
    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = torch.nn.Linear(4, 4)

        def forward(self, x: Any) -> Any:
            return self.attn(x)

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList([Block(), Block()])

        def forward(self, x: Any) -> Any:
            for b in self.blocks:
                x = b(x)
            return x

    ranges = ModuleRanges()
    ranges.install()
    try:
        with torch.profiler.profile() as prof:
            Net()(torch.randn(2, 4))
    finally:
        ranges.remove()
    names = {e.name for e in prof.events() if e.name.startswith("nn.Module: ")}
    assert names == {
        "nn.Module: Net_0",
        "nn.Module: blocks.0",
        "nn.Module: blocks.0.attn",
        "nn.Module: blocks.1",
        "nn.Module: blocks.1.attn",
    }
