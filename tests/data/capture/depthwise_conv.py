"""A depthwise convolution (groups = channels; about 2 FLOPs per byte moved) trained in a
loop: bandwidth-bound on any GPU, however its op is costed.

    python depthwise_conv.py OUT.json.gz"""

from __future__ import annotations

import sys

import torch
from torch import nn


def main(out: str) -> None:
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    c = 256
    model = nn.Sequential(
        nn.Conv2d(c, c, 7, padding=3, groups=c, bias=False),
        nn.Conv2d(c, c, 5, padding=2, groups=c, bias=False),
    ).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(32, c, 56, 56, device=dev)
    for _ in range(3):  # warm-up outside the window (cuDNN picks its algorithms)
        model(x).sum().backward()
    acts = [torch.profiler.ProfilerActivity.CPU]
    if dev.type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
        torch.cuda.synchronize()
    with torch.profiler.profile(activities=acts, record_shapes=True) as prof:
        for _ in range(4):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            prof.step()
    prof.export_chrome_trace(out)


if __name__ == "__main__":
    main(sys.argv[1])
