"""Memory from real CPU training loops profiled with memory events: what peaks, a leak that
keeps losses with their graphs, and the fixed variants."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import wallfinder
from wallfinder.diagnosis import DeviceMemoryProfile, Diagnosis

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow
nn = torch.nn

WIDTH, HIDDEN, BATCH = 128, 1024, 256


class Block(nn.Module):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(WIDTH, HIDDEN)
        self.down = nn.Linear(HIDDEN, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


class Net(nn.Module):  # type: ignore[misc]
    """Wide hidden layers on a large batch: the saved activations dwarf the weights."""

    def __init__(self, checkpointed: bool = False) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(4))
        self.checkpointed = checkpointed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            if self.checkpointed:
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return x


def validation_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Evaluated without torch.no_grad(): the loss holds its graph and every activation."""
    return nn.functional.mse_loss(model(x), y)


def profile_loop(
    tmp_path: Path,
    *,
    checkpointed: bool = False,
    keep: Callable[[torch.Tensor], object] | None = None,
) -> Diagnosis:
    torch.manual_seed(0)
    model = Net(checkpointed)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(BATCH, WIDTH), torch.randn(BATCH, WIDTH)
    logged: list[object] = []
    with wallfinder.profile(wait=1, warmup=1, active=5, trace_dir=tmp_path, memory=True) as p:
        for _ in range(7):
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            if keep is not None:
                logged.append(keep(validation_loss(model, x[:64], y[:64])))
            p.step()
    assert p.diagnosis is not None
    return p.diagnosis


def cpu_memory(d: Diagnosis) -> DeviceMemoryProfile:
    assert d.memory is not None
    device = d.memory.devices[0]
    assert device.device == "cpu"
    return device


def finding_ids(d: Diagnosis) -> set[str]:
    assert d.memory is not None
    return {f.id for f in d.memory.findings}


def test_activations_dominate_the_peak_and_checkpointing_lowers_it(tmp_path: Path) -> None:
    plain = profile_loop(tmp_path / "plain")
    m = cpu_memory(plain)
    cats = m.categories
    assert max(cats, key=lambda c: cats[c]) == "activations"
    # Each of the four blocks saves its BATCH x HIDDEN fp32 ReLU output for the backward pass
    # (4 MiB in all); all are live when the backward pass starts.
    assert cats["activations"] >= 4 * BATCH * HIDDEN * 4
    assert m.peak_phase in ("forward", "backward")
    assert sum(cats.values()) == m.peak_allocated
    assert not m.leak
    assert {"memory-activations", "memory-micro-batch", "memory-bf16"} <= finding_ids(plain)
    # The call sites are the model's code, not torch's.
    assert any("forward" in s.site and "test_memory_runs.py" in s.site for s in m.sites)

    fixed = cpu_memory(profile_loop(tmp_path / "checkpointed", checkpointed=True))
    assert fixed.categories["activations"] <= cats["activations"] / 2
    assert fixed.peak_allocated < m.peak_allocated


def test_keeping_losses_with_their_graphs_is_a_leak_with_its_call_site(tmp_path: Path) -> None:
    leaky = profile_loop(tmp_path / "leak", keep=lambda loss: loss)
    m = cpu_memory(leaky)
    assert m.leak
    # Each kept validation loss holds its forward pass's activations: at least the four
    # blocks' 64 x HIDDEN fp32 ReLU outputs per step.
    assert m.growth_per_step is not None
    assert m.growth_per_step >= 4 * 64 * HIDDEN * 4
    assert m.leak_sites
    assert "validation_loss" in m.leak_sites[0].site
    assert m.leak_sites[0].steps >= 2
    assert "memory-leak" in finding_ids(leaky)
    # The kept losses' activations are counted apart from this step's: checkpointing cannot
    # free them.
    assert m.categories["retained"] >= 3 * 4 * 64 * HIDDEN * 4
    assert m.categories["activations"] < 1.2 * 4 * BATCH * HIDDEN * 4

    fixed = cpu_memory(profile_loop(tmp_path / "item", keep=lambda loss: loss.item()))
    assert not fixed.leak
    assert fixed.leak_sites == []
    assert fixed.growth_per_step is not None
    assert abs(fixed.growth_per_step) < 1024
