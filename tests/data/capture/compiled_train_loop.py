"""The compiled training loop of compiled_train.py (its model and loop, imported) without a
profiler of its own, for `wallfinder run` to measure: a graph break inside the model (a
data-dependent branch, compiled_train.py's `Net.forward`) and a batch size that changes once
(a recompile).

    wallfinder run --steps 4 --warmup 3 -- python compiled_train_loop.py"""

from __future__ import annotations

import torch
from compiled_train import train

if __name__ == "__main__":
    train(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
