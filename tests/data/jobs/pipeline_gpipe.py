"""A 2-stage GPipe pipeline with 2 microbatches (torch.distributed.pipelining, CPU, gloo).

Run it with `torchrun --nproc-per-node 2` (under `wallfinder run` to profile it): rank 0 holds
the first stage, rank 1 the second and the loss. Each stage is the same few Linear layers, so
the stages are balanced and the time a stage waits for its neighbour is the schedule's bubble,
(p-1)/(m+p-1) = 1/3 of the step by theory.

`pipeline_gpipe.py 1f1b M` runs Schedule1F1B with M microbatches instead (the same bubble by
theory, (p-1)/(M+p-1); torch 2.13's Schedule1F1B records no ranges around its microbatches).
"""

import sys

import torch
import torch.distributed as dist
from gloo_job import finish
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

STEPS = 8
ONE_F_ONE_B = sys.argv[1:2] == ["1f1b"]
MICROBATCHES = int(sys.argv[2]) if ONE_F_ONE_B else 2
WIDTH = 512
BATCH = 256

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(rank)
torch.set_num_threads(1)  # each stage its own core: the stages' compute does not contend
layers = [torch.nn.Linear(WIDTH, WIDTH) for _ in range(4)]
block = torch.nn.Sequential(*[m for layer in layers for m in (layer, torch.nn.ReLU())])
stage = PipelineStage(block, rank, world, torch.device("cpu"))
schedule = (Schedule1F1B if ONE_F_ONE_B else ScheduleGPipe)(
    stage, n_microbatches=MICROBATCHES, loss_fn=lambda out, y: ((out - y) ** 2).mean()
)
opt = torch.optim.SGD(block.parameters(), lr=0.01)
for _ in range(STEPS):
    opt.zero_grad()
    if rank == 0:
        schedule.step(torch.randn(BATCH, WIDTH))
    else:
        schedule.step(target=torch.randn(BATCH, WIDTH))
    opt.step()
finish()
