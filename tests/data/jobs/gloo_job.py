"""What the gloo jobs here share: their training loop and their exit."""

import atexit
import os

import torch
import torch.distributed as dist
from torch import nn


def train(model: nn.Module, width: int) -> None:
    """`STEPS` (default 8) SGD steps of `model` on one random batch of 64 rows."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, width)
    for _ in range(int(os.environ.get("STEPS", "8"))):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()


def finish() -> None:
    """Leave the process group and exit. torch 2.13's gloo can abort in its C++ teardown after
    the program is done (see tests/integration/test_run.py GLOO_SAFE_EXIT): run the exit
    handlers (wallfinder's hook writes its status there), then skip that teardown."""
    dist.barrier()
    dist.destroy_process_group()
    atexit._run_exitfuncs()
    os._exit(0)
