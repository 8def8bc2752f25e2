"""One function run eagerly and then compiled, in one profile with no ProfilerStep: what an
engineer comparing eager with compiled records. The truth: two regions of the same work, the
compiled one's first call compiling.

    python eager_vs_compiled.py OUT.json.gz"""

from __future__ import annotations

import sys

import torch


def gelu_mlp(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    h = x @ w1
    h = 0.5 * h * (1.0 + torch.tanh(0.7978845608 * (h + 0.044715 * h * h * h)))
    return (h @ w2).softmax(-1)


def main(out: str) -> None:
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    x = torch.randn(2048, 1024, device=dev)
    w1 = torch.randn(1024, 4096, device=dev) * 0.02
    w2 = torch.randn(4096, 1024, device=dev) * 0.02
    compiled = torch.compile(gelu_mlp)
    gelu_mlp(x, w1, w2)  # the eager path's own first call, outside the window
    acts = [torch.profiler.ProfilerActivity.CPU]
    if dev.type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
        torch.cuda.synchronize()
    with torch.profiler.profile(activities=acts, record_shapes=True) as prof:
        for _ in range(10):
            gelu_mlp(x, w1, w2)
        for _ in range(10):
            compiled(x, w1, w2)
        if dev.type == "cuda":
            torch.cuda.synchronize()
    prof.export_chrome_trace(out)


if __name__ == "__main__":
    main(sys.argv[1])
