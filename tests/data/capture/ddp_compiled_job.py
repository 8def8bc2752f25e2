"""The job behind tests/data/h100_ddp_compiled.json.gz: a small MLP compiled with
torch.compile and wrapped in DistributedDataParallel, so its trace holds the ranges that
once broke the module view (`DistributedDataParallel.forward`, `Torch-Compiled Region: 0/0`),
NCCL all-reduces and Inductor's Triton kernels.

Captured on an H100 with wallfinder itself, unmodified:

    wallfinder run --steps 3 --warmup 3 --modules --trace-dir DIR -- python ddp_compiled_job.py

It runs alone (world size 1) or under torchrun; on a machine without a GPU it uses gloo."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn


def main() -> None:
    if "RANK" not in os.environ:  # alone: a world of one
        os.environ.update(
            RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29533"
        )
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    model = nn.Sequential(
        nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 4096), nn.GELU(), nn.Linear(4096, 1024)
    ).to(device)
    ddp = nn.parallel.DistributedDataParallel(torch.compile(model))
    optimizer = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    x = torch.randn(512, 1024, device=device)
    for _ in range(int(os.environ.get("STEPS", "10"))):
        with torch.profiler.record_function("DLRM_Net.forward"):
            loss = ddp(x).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
