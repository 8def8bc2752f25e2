"""What the memory analysis costs on a trace dense with `[memory]` events.

    python benchmarks/bench_memory.py [--events 1000000] [--repeat 3] [--keep /tmp/mem.json]

Writes a synthetic training trace (a temporary file unless `--keep`): steps with a forward
pass of ops on the main thread, a backward pass on the autograd thread and an optimizer
annotation, user-code Python frames around them, and in each op one allocation (forward:
kept until the backward pass; backward: a temporary and a gradient; optimizer: a temporary),
so that about `--events` memory events fill it, with a slow leak. Then times, best of
`--repeat`: loading the trace, the memory analysis alone (`memory_profile` on the loaded
trace) and the whole `analyze`. Needs no torch.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from wallfinder import analyze
from wallfinder.analysis.steps import cpu_steps
from wallfinder.trace import load_trace

memory_profile_module = importlib.import_module("wallfinder.analysis.memory_profile")

PID, MAIN, AUTOGRAD = 100, 100, 101
LAYERS = 48
MiB = 1 << 20


class Writer:
    def __init__(self, out: Any) -> None:
        self.out, self.first = out, True
        self.total = 10 << 30  # parameters and state from before the trace
        self.reserved = 40 << 30
        self.addr = 1 << 40
        self.events = 0
        self.memory = 0

    def emit(self, event: dict[str, Any]) -> None:
        self.out.write(("" if self.first else ",\n") + json.dumps(event, separators=(",", ":")))
        self.first = False
        self.events += 1

    def span(self, name: str, cat: str, ts: float, dur: float, tid: int = MAIN) -> None:
        self.emit(
            {"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": tid, "ts": ts, "dur": dur}
        )

    def mem(self, ts: float, addr: int, nbytes: int, tid: int = MAIN) -> None:
        self.total += nbytes
        self.emit(
            {
                "ph": "i",
                "s": "t",
                "cat": "cpu_instant_event",
                "name": "[memory]",
                "pid": PID,
                "tid": tid,
                "ts": ts,
                "args": {
                    "Device Type": 1,
                    "Device Id": 0,
                    "Addr": addr,
                    "Bytes": nbytes,
                    "Total Allocated": self.total,
                    "Total Reserved": self.reserved,
                },
            }
        )
        self.memory += 1

    def new_addr(self, nbytes: int) -> int:
        self.addr += nbytes
        return self.addr


def write_trace(path: Path, events: int) -> tuple[int, int]:
    per_step = LAYERS * 8 + 4  # memory events in one step
    steps = max(events // per_step, 4)
    with path.open("w") as f:
        f.write('{"deviceProperties":[{"id":0,"name":"NVIDIA H100 80GB HBM3"}],"traceEvents":[\n')
        w = Writer(f)
        t = 0.0
        for s in range(steps):
            length = LAYERS * 40.0 + 100.0
            w.span(f"ProfilerStep#{s}", "user_annotation", t, length)
            w.span("train.py(40): train_step", "python_function", t + 1, length - 2)
            saved = []
            for layer in range(LAYERS):
                ts = t + 2 + layer * 20.0
                w.span("model.py(12): forward", "python_function", ts, 18)
                w.span("aten::linear", "cpu_op", ts + 1, 16)
                a = w.new_addr(8 * MiB)
                w.mem(ts + 2, a, 8 * MiB)
                saved.append(a)
                tmp = w.new_addr(MiB)
                w.mem(ts + 3, tmp, MiB)
                w.mem(ts + 4, tmp, -MiB)
            if s % 2 == 0:  # a slow leak: a small block kept every other step
                w.mem(t + 2 + LAYERS * 20.0 - 1, w.new_addr(64 * 1024), 64 * 1024)
            bt = t + 2 + LAYERS * 20.0
            w.span("train.py(44): train_step", "python_function", bt, LAYERS * 18.0 + 4)
            grads = []
            for layer in range(LAYERS):
                ts = bt + 2 + layer * 18.0
                w.span(
                    "autograd::engine::evaluate_function: AddmmBackward0",
                    "cpu_op",
                    ts,
                    16,
                    AUTOGRAD,
                )
                g = w.new_addr(2 * MiB)
                w.mem(ts + 1, g, 2 * MiB, AUTOGRAD)
                grads.append(g)
                tmp = w.new_addr(4 * MiB)
                w.mem(ts + 2, tmp, 4 * MiB, AUTOGRAD)
                w.mem(ts + 3, tmp, -4 * MiB, AUTOGRAD)
                w.mem(ts + 4, saved.pop(), -8 * MiB, AUTOGRAD)
            ot = bt + LAYERS * 18.0 + 6
            w.span("Optimizer.step#AdamW.step", "user_annotation", ot, 40)
            tmp = w.new_addr(16 * MiB)
            w.mem(ot + 1, tmp, 16 * MiB)
            w.mem(ot + 2, tmp, -16 * MiB)
            w.span("Optimizer.zero_grad#AdamW.zero_grad", "user_annotation", ot + 50, 20)
            for i, g in enumerate(grads):
                w.mem(ot + 51 + i * 0.1, g, -2 * MiB)
            t += length
        f.write("]}\n")
    return w.events, w.memory


def best(repeat: int, fn: Any) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return min(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000, help="memory events (about)")
    parser.add_argument("--repeat", type=int, default=3, help="best of N (default 3)")
    parser.add_argument("--keep", type=Path, help="write the trace here and keep it")
    args = parser.parse_args()
    folder = tempfile.TemporaryDirectory()
    path = args.keep or Path(folder.name) / "memory.json"
    total, memory = write_trace(path, args.events)
    mb = os.path.getsize(path) / 1e6
    print(f"trace: {mb:.0f} MB, {total:,} events, {memory:,} memory events")
    load_s, trace = best(args.repeat, lambda: load_trace(path))
    spans = cpu_steps(trace)
    import numpy as np

    kept = np.ones(len(spans.labels), dtype=bool)
    profile_s, profile = best(
        args.repeat,
        lambda: memory_profile_module.memory_profile(
            trace, spans, kept, device=0, capacity=80 << 30, capacity_source="bench"
        ),
    )
    analyze_s, diagnosis = best(args.repeat, lambda: analyze(path))
    m = profile.devices[0]
    print(f"load:           {load_s:6.2f} s")
    print(f"memory profile: {profile_s:6.2f} s ({memory / profile_s / 1e6:.1f} M memory events/s)")
    print(f"analyze (all):  {analyze_s:6.2f} s")
    print(
        f"result: peak {m.peak_allocated / 2**30:.2f} GiB in {m.peak_phase}, leak={m.leak}, "
        f"growth {m.growth_per_step / 1024:.0f} KiB/step, findings "
        f"{[f.id for f in diagnosis.memory.findings]}"
    )
    folder.cleanup()


if __name__ == "__main__":
    main()
