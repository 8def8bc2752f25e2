"""The compiled training loop of compiled_train.py (its model, imported) without a profiler of
its own, for `wallfinder run` to measure: a graph break inside the model (a data-dependent
branch, compiled_train.py's `Net.forward`) and a batch size that changes once (a recompile).

    wallfinder run --steps 4 --warmup 3 -- python compiled_train_loop.py"""

from __future__ import annotations

import torch
from compiled_train import Net
from torch import nn


def main() -> None:
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    model = Net().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step_fn = torch.compile(model)
    for n in [64] * 5 + [96] * 5:  # the batch size changes once: a recompile
        x = torch.randn(n, 128, 512, device=dev)
        t = torch.randint(0, 10, (n, 128), device=dev)
        loss = nn.functional.cross_entropy(step_fn(x).flatten(0, 1), t.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


if __name__ == "__main__":
    main()
