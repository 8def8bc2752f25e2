"""A tensor-parallel job for the parallelism tests: an MLP whose first linear is column-parallel
and second row-parallel (torch.distributed.tensor.parallel), two gloo ranks on the CPU. Under
`wallfinder run -- torchrun --nproc-per-node 2 tp_job.py` its trace holds the all-reduce after
each row-parallel layer, inside the forward."""

import os

import torch
from gloo_job import finish, train
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
train(model, width)
finish()
