"""A fresh process's first GPU work, profiled from the start: the first matmul pays cuBLAS's
start-up (handle, workspace) and the first convolution cuDNN's, each inside an op that runs
once in the window, beside a few microseconds of kernels. The truth a diagnosis must tell:
library start-up, a one-off cost, not host work to move to a thread.

    python first_run_startup.py OUT.json.gz"""

from __future__ import annotations

import sys

import torch


def main(out: str) -> None:
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    # The tensors exist before the profiler starts (the context is up), as in a user's
    # script that builds its model first and profiles its first batch.
    x = torch.randn(256, 512, device=dev)
    w = torch.randn(512, 512, device=dev)
    img = torch.randn(8, 16, 32, 32, device=dev)
    conv = torch.nn.Conv2d(16, 32, 3, padding=1).to(dev)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU]
    if dev.type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts, record_shapes=True) as prof:
        y = x @ w
        z = conv(img)
        s = y.relu().sum() + z.sum()
        s.item()
    prof.export_chrome_trace(out)


if __name__ == "__main__":
    main(sys.argv[1])
