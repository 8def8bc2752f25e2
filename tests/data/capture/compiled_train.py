"""A compiled training loop with a graph break inside the model and a batch size that
changes once (a recompile), profiled over its first steps (compiling) and its steady ones.

    python compiled_train.py OUT.json.gz COUNTERS.json

COUNTERS.json keeps what torch itself said (Dynamo's counters, compile times, graph breaks
with their reasons) as the truth a diagnosis of the trace is checked against."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class Net(nn.Module):
    def __init__(self, d: int = 512) -> None:
        super().__init__()
        self.a = Block(d)
        self.b = Block(d)
        self.head = nn.Linear(d, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        if float(h.mean()) > 1e9:  # a data-dependent branch: Dynamo breaks the graph here
            h = h * 0
        return self.head(self.b(h))


def train(dev: torch.device, each_step: Callable[[], object] = lambda: None) -> None:
    """The compiled model trained for 10 steps, its batch size 64 then 96 (a recompile);
    `each_step` runs after every step."""
    torch.manual_seed(0)
    model = Net().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step_fn = torch.compile(model)
    for n in [64] * 5 + [96] * 5:  # the batch size changes once: a recompile
        x = torch.randn(n, 128, 512, device=dev)
        t = torch.randint(0, 10, (n, 128), device=dev)
        loss = nn.functional.cross_entropy(step_fn(x).flatten(0, 1), t.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        each_step()


def main(out: str, counters_out: str) -> None:
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    acts = [torch.profiler.ProfilerActivity.CPU]
    if dev.type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts, record_shapes=True, with_stack=False) as prof:
        train(dev, prof.step)
    prof.export_chrome_trace(out)
    from torch._dynamo.utils import compile_times, counters

    said = {
        "counters": {k: dict(v) for k, v in counters.items()},
        "compile_times": compile_times(repr="str"),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
    }
    with open(counters_out, "w") as f:
        json.dump(said, f, indent=1, default=str)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
