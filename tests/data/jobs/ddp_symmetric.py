"""A symmetric data-parallel job for `wallfinder run -- torchrun --nproc-per-node 2`: two gloo
ranks on the CPU doing the same work, four gradient buckets (four all-reduces) a step. Neither
rank is a straggler, however busy the machine makes one of them now and then."""

import atexit
import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
torch.manual_seed(0)
layers = [torch.nn.Linear(128, 128) for _ in range(4)]
model = torch.nn.parallel.DistributedDataParallel(
    torch.nn.Sequential(*layers),
    bucket_cap_mb=0.06,  # one 64 KiB layer a bucket: several collectives a step
)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(int(os.environ.get("STEPS", "10"))):
    opt.zero_grad()
    model(torch.randn(32, 128)).sum().backward()
    opt.step()
dist.barrier()
# gloo can abort in its C++ teardown after the program is done: run the exit handlers
# (wallfinder's writes its status), then skip that teardown (see tests/integration/test_run.py).
atexit._run_exitfuncs()
os._exit(0)
