"""A LOGDIR of runs for `wallfinder serve`'s tests, as tensorboard_trace_handler lays one out."""

from __future__ import annotations

from pathlib import Path

from tracegen import TraceBuilder, training_trace

LOADER_HEAVY = 400.0
"""The DataLoader wait of the num_workers=0 run (µs per step): its wall is overhead."""


def make_logdir(root: Path) -> Path:
    """A num_workers=0/4 pair (tensorboard_trace_handler's file names), a two-rank job, and
    a run whose trace is cut short."""
    logdir = root / "log"
    training_trace(loader_us=LOADER_HEAVY).write(logdir / "workers0" / "host_11.17.pt.trace.json")
    training_trace(loader_us=5.0).write(logdir / "workers4" / "host_12.17.pt.trace.json.gz")
    for rank in (0, 1):
        b = training_trace(builder=TraceBuilder(rank=rank, world_size=2, pid=100 + rank))
        b.write(logdir / "job" / f"host_{rank}.18.pt.trace.json")
    broken = logdir / "broken"
    broken.mkdir()
    (broken / "host_13.19.pt.trace.json").write_text('{"traceEvents": [{"ph": "X"')
    return logdir
