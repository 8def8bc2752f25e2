"""A tensor-parallel job for the parallelism tests: an MLP whose first linear is column-parallel
and second row-parallel (torch.distributed.tensor.parallel), two gloo ranks on the CPU. Under
`wallfinder run -- torchrun --nproc-per-node 2 tp_job.py` its trace holds the all-reduce after
each row-parallel layer, inside the forward."""

import atexit
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

mesh = init_device_mesh("cpu", (int(os.environ["WORLD_SIZE"]),))
torch.manual_seed(0)
width, layers = 256, 2


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


model = nn.Sequential(*(MLP() for _ in range(layers)))
for mlp in model:
    parallelize_module(mlp, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(64, width)
for _ in range(int(os.environ.get("STEPS", "8"))):
    opt.zero_grad()
    model(x).square().mean().backward()
    opt.step()
dist.barrier()
dist.destroy_process_group()
# torch 2.13's gloo can abort in its C++ teardown after the program is done: run the exit
# handlers (wallfinder's hook writes its status there), then skip that teardown.
atexit._run_exitfuncs()
os._exit(0)
