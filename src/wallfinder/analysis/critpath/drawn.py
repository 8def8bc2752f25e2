"""The critical path drawn on the timeline's step: its segments there, neighbours of one
category merged and the shortest merged away until they are few enough to draw."""

from __future__ import annotations

import heapq
from typing import Any

from wallfinder.analysis.critpath.model import NS, StepGraph
from wallfinder.analysis.critpath.path import Walk
from wallfinder.analysis.scope import Scope
from wallfinder.diagnosis import PathSegment, StepTimeline

MAX_SEGMENTS = 300
"""Path segments drawn on the timeline, at most: neighbours of one category are merged, then
the shortest are merged into the one before them until they fit."""


def drawn_at(scope: Scope, timeline: StepTimeline) -> int:
    """Where the timeline's step starts, in the trace's ns."""
    return int(scope.start[0]) + round(timeline.start_s / NS)


def drawn_window(
    g: StepGraph, scope: Scope, timeline: StepTimeline | None
) -> tuple[int, int] | None:
    """The timeline's step, [start, end) in the graph's ns (None: no timeline)."""
    if timeline is None:
        return None
    a = drawn_at(scope, timeline) - g.t0
    return a, a + round(timeline.duration_s / NS)


def in_step(walk: Walk, window: tuple[int, int] | None) -> list[PathSegment]:
    """The path's segments inside the timeline's step (`window`, the walk's kept window), in
    seconds from its start."""
    if window is None:
        return []
    a = window[0]
    merged: list[list[Any]] = []
    for lo, hi, cat in walk.segments():
        if merged and merged[-1][2] == cat and merged[-1][1] >= lo:
            merged[-1][1] = hi
        else:
            merged.append([lo, hi, cat])
    return [
        PathSegment(start_s=(lo - a) * NS, end_s=(hi - a) * NS, category=cat)
        for lo, hi, cat in fewest(merged, MAX_SEGMENTS)
    ]


def fewest(segments: list[list[Any]], most: int) -> list[list[Any]]:
    """`segments` with the shortest (the first of the shortest on a tie) merged into the one
    before it, again and again, until at most `most` are left (the first is never merged
    away). A heap of lengths with stale entries skipped: a step ~ tens of thousands of
    segments, which a scan per merge makes quadratic."""
    if len(segments) <= most:
        return segments
    before = list(range(-1, len(segments) - 1))
    after = list(range(1, len(segments) + 1))
    alive = [True] * len(segments)
    heap = [(hi - lo, j) for j, (lo, hi, _) in enumerate(segments) if j > 0]
    heapq.heapify(heap)
    left = len(segments)
    while left > most:
        length, j = heapq.heappop(heap)
        lo, hi, _ = segments[j]
        if not alive[j] or hi - lo != length:
            continue  # merged away, or grown since this entry was pushed
        i = before[j]
        segments[i][1] = hi
        alive[j] = False
        after[i] = after[j]
        if after[j] < len(segments):
            before[after[j]] = i
        if i > 0:
            heapq.heappush(heap, (segments[i][1] - segments[i][0], i))
        left -= 1
    return [s for s, keep in zip(segments, alive, strict=True) if keep]
