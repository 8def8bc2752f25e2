"""An FSDP2 job for the parallelism tests: a small MLP stack with `fully_shard` per block and
on the root, two gloo ranks on the CPU. Under `wallfinder run -- torchrun --nproc-per-node 2
fsdp2_job.py` its trace holds FSDP's own ranges (`FSDP::all_gather_copy_in`,
`FSDP::post_backward_reduce`, ...) and the gloo all-gathers and reduce-scatters they call."""

import torch
import torch.distributed as dist
from gloo_job import finish, train
from torch import nn
from torch.distributed.fsdp import fully_shard

dist.init_process_group("gloo")
torch.manual_seed(0)
width, blocks = 256, 3
model = nn.Sequential(*(nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(blocks)))
for block in model:
    fully_shard(block)
fully_shard(model)
train(model, width)
finish()
