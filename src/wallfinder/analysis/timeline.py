"""The device timeline of one representative step: where the device was busy, where it was
idle and why, and what the host was doing in the gaps. Bounded in size whatever the step
holds, so a report can draw it."""

from __future__ import annotations

from typing import Literal

import numpy as np
import numpy.typing as npt

from wallfinder.analysis.gpu import CLASSES, COMM, DeviceOps, IdlePieces, idle_pieces
from wallfinder.analysis.intervals import Coverage
from wallfinder.analysis.scope import Scope
from wallfinder.diagnosis import StepTimeline, TimelineGap, TimelineSpan
from wallfinder.trace import Kind, Trace, thread_key
from wallfinder.units import short_frame

I64 = npt.NDArray[np.int64]
Lane = Literal["compute", "communication", "copy"]

NS = 1e-9
MAX_SPANS = 300
"""Busy spans over all lanes, at most: spans closer than the resolution are merged, and the
resolution doubles until they fit."""
MAX_GAPS = 200
"""Idle gaps listed, at most (the longest); the others are counted."""
FINEST = 500
"""The finest resolution is the step's length divided by this."""
_HOST_KINDS = (Kind.CPU_OP, Kind.ANNOTATION, Kind.PYTHON, Kind.RUNTIME)


def step_timeline(scope: Scope) -> StepTimeline | None:
    """The timeline of the steady-state step whose length is closest to the median of
    theirs; None when there is no such step."""
    trace, dev, start, end, kept = scope.trace, scope.gpu, scope.start, scope.end, scope.kept
    labels = scope.labels
    rows = np.flatnonzero(kept & (end > start))
    if rows.size == 0:
        return None
    length = (end - start)[rows]
    i = int(rows[np.argmin(np.abs(length - np.median(length)))])
    a, b = int(start[i]), int(end[i])
    ops = dev.ops
    is_kernel = ops.kind == Kind.KERNEL
    # The lanes are the breakdown's parts: compute, communication, copies.
    lanes: dict[Lane, npt.NDArray[np.bool_]] = {
        "compute": is_kernel & (dev.cls != COMM),
        "communication": dev.cls == COMM,
        "copy": ~is_kernel,
    }
    overlapping = (ops.end > a) & (ops.ts < b)
    resolution = max((b - a) // FINEST, 1)
    while True:
        spans = [
            span
            for lane, mask in lanes.items()
            for span in _lane_spans(dev, lane, mask & overlapping, a, b, resolution)
        ]
        if len(spans) <= MAX_SPANS:
            break
        resolution *= 2
    pieces = idle_pieces(trace, dev, start, end, scope.thresholds.slack).of_window(i)
    gaps, unlisted = _gaps(trace, pieces, a, b, resolution)
    unlisted_ns = (pieces.end - pieces.start)[unlisted]
    return StepTimeline(
        step=labels[i],
        start_s=float(a - int(start[0])) * NS,
        duration_s=float(b - a) * NS,
        resolution_s=float(resolution) * NS,
        spans=sorted(spans, key=lambda s: (s.start_s, s.lane)),
        gaps=gaps,
        unlisted_gaps=int(unlisted_ns.size),
        unlisted_gap_s=float(unlisted_ns.sum()) * NS,
    )


def _lane_spans(
    dev: DeviceOps, lane: Lane, mask: npt.NDArray[np.bool_], a: int, b: int, resolution: int
) -> list[TimelineSpan]:
    """The busy spans of one lane in [a, b): its ops' union, with gaps shorter than
    `resolution` closed."""
    if not mask.any():
        return []
    ts = np.clip(dev.ops.ts[mask], a, b)
    te = np.clip(dev.ops.end[mask], a, b)
    cov = Coverage.of(ts, te)
    new = np.ones(cov.starts.size, dtype=bool)
    new[1:] = cov.starts[1:] - cov.ends[:-1] >= resolution
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, cov.starts.size - 1)
    busy = np.add.reduceat(cov.ends - cov.starts, first)
    span_start, span_end = cov.starts[first], cov.ends[last]
    # Each op belongs to the span its (clipped) start lies in.
    span_of = np.searchsorted(span_start, ts, side="right") - 1
    count = np.bincount(span_of, minlength=first.size)
    n_cls = len(CLASSES)
    by_class = np.bincount(span_of * n_cls + dev.cls[mask], weights=(te - ts).astype(np.float64))
    by_class = np.pad(by_class, (0, first.size * n_cls - by_class.size)).reshape(-1, n_cls)
    top = np.argmax(by_class, axis=1)
    return [
        TimelineSpan(
            lane=lane,
            start_s=float(span_start[k] - a) * NS,
            end_s=float(span_end[k] - a) * NS,
            busy_s=float(busy[k]) * NS,
            ops=int(count[k]),
            cls=CLASSES[int(top[k])].value,
        )
        for k in range(first.size)
    ]


def _gaps(
    trace: Trace, pieces: IdlePieces, a: int, b: int, resolution: int
) -> tuple[list[TimelineGap], npt.NDArray[np.intp]]:
    """The longest idle gaps (at least `resolution` long, at most MAX_GAPS), each with its
    causes and what the host was doing; and the rows of `pieces` not listed."""
    length = pieces.end - pieces.start
    candidates = np.flatnonzero(length >= resolution)
    listed = np.sort(candidates[np.argsort(-length[candidates], kind="stable")][:MAX_GAPS])
    unlisted = np.setdiff1d(np.arange(length.size), listed)
    hosts = _host_activity(trace, pieces, listed, a, b)
    gaps = [
        TimelineGap(
            start_s=float(pieces.start[k] - a) * NS,
            end_s=float(pieces.end[k] - a) * NS,
            causes_s={cause: float(ns[k]) * NS for cause, ns in pieces.causes.items() if ns[k] > 0},
            host=hosts.get(k),
        )
        for k in listed.tolist()
    ]
    return gaps, unlisted


def _host_activity(
    trace: Trace, pieces: IdlePieces, listed: npt.NDArray[np.intp], a: int, b: int
) -> dict[int, str]:
    """For each listed piece with a host wait, the name of the host event on the launching
    thread that explains the wait best: of those that cover at least half as much of it as
    the one that covers most, the shortest (the most specific)."""
    waits = listed[pieces.host_end[listed] > pieces.start[listed]]
    if waits.size == 0:
        return {}
    # (The rows around the step alone: all the host's rows are most of a large trace.)
    ts, dur, name, pid, tid = trace.columns_of_kinds(
        _HOST_KINDS, "ts", "dur", "name", "pid", "tid", overlapping=(a, b)
    )
    thread = thread_key(pid, tid)
    steps = trace.names_matching(lambda s: s.startswith("ProfilerStep#"))
    near = (
        np.isin(thread, np.unique(pieces.thread[waits]))
        & (ts < b)
        & (ts + dur > a)
        & ~np.isin(name, steps)
    )
    ts, end, name, thread = ts[near], ts[near] + dur[near], name[near], thread[near]
    out: dict[int, str] = {}
    for k in waits.tolist():
        lo, hi = int(pieces.start[k]), int(pieces.host_end[k])
        overlap = np.where(thread == pieces.thread[k], np.minimum(end, hi) - np.maximum(ts, lo), 0)
        best = int(overlap.max()) if overlap.size else 0
        if best <= 0:
            continue
        good = np.flatnonzero(2 * overlap >= best)
        pick = good[np.argmin((end - ts)[good])]
        out[k] = short_frame(trace.strings[int(name[pick])])
    return out
