"""Steps: the CPU step spans, the GPU windows that tile the timeline, and warm-up steps.

A step's GPU window ends where the last GPU work launched inside that CPU step ends, and begins
where the previous step's window ended (the first: at its CPU start). The windows tile the
timeline, so the GPU's wait before a step's first kernel (for the DataLoader, for the host)
belongs to that step.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from wallfinder.trace import Events, Kind, Trace

I64 = npt.NDArray[np.int64]

NO_LAUNCH = np.iinfo(np.int64).min
"""Launch time of a device op with no launch record. Not NONE (-1): a sentinel that a real
time could equal is never safe."""

WARMUP_FACTOR = 1.5
"""A leading step is warm-up when it takes this many times the median of the later steps."""

MAX_WARMUP_SHARE = 0.5
"""At most this share of the steps is ever dropped as warm-up."""

_STEP_NAME = re.compile(r"^ProfilerStep#(\d+)$")


@dataclass(frozen=True)
class StepSpans:
    """CPU spans of the steps, in time order; `source` says where they came from."""

    labels: list[str]
    cpu_start: I64
    cpu_end: I64
    source: str


def cpu_steps(trace: Trace) -> StepSpans:
    """Steps from `ProfilerStep#N` annotations; with none, one window over the whole trace.
    A step the program stopped inside (`trace.cut_step`) is not a step."""
    codes = trace.names_matching(lambda s: _STEP_NAME.match(s) is not None and s != trace.cut_step)
    annotations = trace.named((Kind.ANNOTATION, Kind.CPU_OP), codes)
    rows = np.arange(len(annotations))
    if rows.size:
        # Nested or repeated markers (some runners record the step twice): keep the outermost.
        starts, ends = annotations.ts[rows], annotations.end[rows]
        order = np.lexsort((-ends, starts))
        rows, starts, ends = rows[order], starts[order], ends[order]
        reach = np.maximum.accumulate(ends)
        keep = np.ones(rows.size, dtype=bool)
        keep[1:] = starts[1:] >= reach[:-1]
        rows = rows[keep]
        labels = [
            trace.strings[c].replace("ProfilerStep#", "step ") for c in annotations.name[rows]
        ]
        return StepSpans(labels, annotations.ts[rows], annotations.end[rows], "ProfilerStep")
    active = trace.of_kind(
        Kind.CPU_OP,
        Kind.RUNTIME,
        Kind.KERNEL,
        Kind.MEMCPY,
        Kind.MEMSET,
        Kind.ANNOTATION,
        Kind.PYTHON,
    )
    if len(active) == 0:
        active = trace.of_kind(Kind.OTHER, Kind.GPU_ANNOTATION)
    start = int(active.ts.min()) if len(active) else 0
    end = int(active.end.max()) if len(active) else 0
    return StepSpans(
        ["whole trace"], np.array([start]), np.array([end]), "whole trace (no ProfilerStep)"
    )


def gpu_windows(spans: StepSpans, gpu: Events, launch_ts: I64) -> tuple[I64, I64]:
    """Window [start, end) of each step on the device. `launch_ts` is each GPU op's launch
    time (NO_LAUNCH where unknown: such ops are placed by their own start)."""
    n = len(spans.labels)
    when = np.where(launch_ts != NO_LAUNCH, launch_ts, gpu.ts)
    step_of = np.searchsorted(spans.cpu_start, when, side="right") - 1
    inside = (step_of >= 0) & (when < spans.cpu_end[np.maximum(step_of, 0)])
    last_end = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
    if inside.any():
        np.maximum.at(last_end, step_of[inside], gpu.end[inside])
    # With no GPU work launched in a step, the window ends with the CPU step; a whole-trace
    # window also keeps the CPU work after the last kernel.
    end = np.where(last_end != np.iinfo(np.int64).min, last_end, spans.cpu_end)
    if spans.source != "ProfilerStep":
        end = np.maximum(end, spans.cpu_end)
    end = np.maximum.accumulate(np.maximum(end, spans.cpu_start))
    start = np.concatenate([[spans.cpu_start[0]], end[:-1]])
    return start.astype(np.int64), end.astype(np.int64)


def warmup_steps(durations: npt.NDArray[np.float64]) -> list[tuple[int, str]]:
    """Leading steps to drop as warm-up, with the reason for each."""
    n = durations.size
    dropped: list[tuple[int, str]] = []
    if n < 3:
        return dropped
    while len(dropped) < int(n * MAX_WARMUP_SHARE):
        i = len(dropped)
        rest = np.median(durations[i + 1 :])
        if rest <= 0 or durations[i] <= WARMUP_FACTOR * rest:
            break
        dropped.append(
            (
                i,
                f"took {durations[i] / rest:.1f}x the median of the later steps "
                "(first-iteration warm-up: compilation, autotuning, allocator growth)",
            )
        )
    return dropped
