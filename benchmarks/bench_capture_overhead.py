"""What measuring costs: step time of one training loop bare, under `wallfinder.StepTimer`,
and under the full profiler (`wallfinder.profile`, every step recorded) as it records by
default (shapes and a range around each module's forward), without the module ranges, and
with Python stacks, on this machine's device (CUDA/ROCm when present, else the CPU).

    python benchmarks/bench_capture_overhead.py [--steps 50] [--repeat 5] [--hidden 1024]
        [--model mlp|transformer]

`--model transformer` is a 6-layer encoder (d=hidden, 4 heads, batch 8 x 32 tokens): many
small modules, where a per-module cost shows most.

Each condition runs `--repeat` times, interleaved so that drift in the machine hits them all
alike; a step is timed from one optimizer step to the next with the host clock, the device
synchronised at each boundary in every condition (the same cost everywhere). The figure is the
median step of each condition and its overhead over bare. The goal for the step timer is under
1%; the profiler's overhead is printed next to it for scale. Needs torch.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

import wallfinder


def build(hidden: int, device: str, kind: str) -> Callable[[], None]:
    torch.manual_seed(0)
    model: torch.nn.Module
    if kind == "transformer":
        layer = torch.nn.TransformerEncoderLayer(hidden, 4, 4 * hidden, batch_first=True)
        model = torch.nn.TransformerEncoder(layer, 6, enable_nested_tensor=False).to(device)
        x = torch.randn(8, 32, hidden, device=device)
    else:
        model = torch.nn.Sequential(
            torch.nn.Linear(hidden, 4 * hidden),
            torch.nn.GELU(),
            torch.nn.Linear(4 * hidden, hidden),
            torch.nn.LayerNorm(hidden),
        ).to(device)
        x = torch.randn(64, hidden, device=device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()

    return step


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed(
    step: Callable[[], None], steps: int, device: str, context: AbstractContextManager[Any]
) -> list[float]:
    times = []
    with context:
        sync(device)
        last = time.perf_counter()
        for _ in range(steps):
            step()
            sync(device)
            now = time.perf_counter()
            times.append(now - last)
            last = now
    return times[2:]  # the first steps under a new context pay its set-up


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--model", choices=("mlp", "transformer"), default="mlp")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    step = build(args.hidden, device, args.model)
    for _ in range(5):  # warm up the allocator, kernels and caches
        step()
    with tempfile.TemporaryDirectory() as tmp:
        conditions: dict[str, Callable[[], AbstractContextManager[Any]]] = {
            "bare": nullcontext,
            "StepTimer": lambda: wallfinder.StepTimer(),
            "profile, no modules": lambda: wallfinder.profile(
                wait=0, warmup=1, active=args.steps, trace_dir=tmp, modules=False
            ),
            "profile (default)": lambda: wallfinder.profile(
                wait=0, warmup=1, active=args.steps, trace_dir=tmp
            ),
            "profile + stacks": lambda: wallfinder.profile(
                wait=0, warmup=1, active=args.steps, trace_dir=tmp, stacks=True
            ),
        }
        medians: dict[str, list[float]] = {name: [] for name in conditions}
        for _ in range(args.repeat):
            for name, make in conditions.items():
                medians[name].append(statistics.median(timed(step, args.steps, device, make())))
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    print(
        f"device: {name}; torch {torch.__version__}; {args.model} hidden {args.hidden}; "
        f"{args.steps} steps x {args.repeat} repeats"
    )
    bare = statistics.median(medians["bare"])
    print(f"{'condition':<22} {'median step ms':>15} {'overhead':>9}")
    for cond, values in medians.items():
        m = statistics.median(values)
        print(f"{cond:<22} {m * 1e3:>15.3f} {(m / bare - 1):>+9.2%}")


if __name__ == "__main__":
    main()
