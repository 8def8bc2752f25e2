"""The critical path drawn on the timeline's step: its segments there, neighbours of one
category merged and the shortest merged away until they are few enough to draw."""

from __future__ import annotations

import heapq

import numpy as np
import numpy.typing as npt

from wallfinder.analysis.critpath.model import CATEGORIES, I64, NS, StepGraph
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
    lo, hi, cat = walk.rows()
    # Neighbours of one category merge when the one before reaches the next: a merged
    # segment runs from its first's start to its last's end.
    first = np.ones(lo.size, bool)
    first[1:] = (cat[1:] != cat[:-1]) | (hi[:-1] < lo[1:])
    starts = np.flatnonzero(first)
    ends = np.r_[starts[1:], lo.size] - 1
    kept, kept_hi = fewest(lo[starts], hi[ends], MAX_SEGMENTS)
    return [
        PathSegment(start_s=(x - a) * NS, end_s=(y - a) * NS, category=CATEGORIES[c])
        for x, y, c in zip(
            lo[starts][kept].tolist(), kept_hi.tolist(), cat[starts][kept].tolist(), strict=True
        )
    ]


def fewest(lo: I64, hi: I64, most: int) -> tuple[npt.NDArray[np.intp], I64]:
    """The segments `lo`, `hi` (their starts and ends, in order) with the shortest (the first
    of the shortest on a tie) merged into the one before it, again and again, until at most
    `most` are left (the first is never merged away): the indices of those left, and their
    ends.

    Merged one at a time, a segment's length is its end's distance from the start of the
    next one left (the segments it took in end there), and a merge grows only the one before
    it. Where the segments are in time order (starts increasing, ends not decreasing), a
    merge never grows one past the merged one's length, so the merges come in order of
    (length, index), and when each segment would go depends on those after it alone: they
    are found in one pass from the last (`_merge_order`), and the first merges are taken.
    Segments out of order are merged one at a time (a heap)."""
    n = lo.size
    if n <= most:
        return np.arange(n), hi
    if n > 1 and not (bool((lo[1:] > lo[:-1]).all()) and bool((hi[1:] >= hi[:-1]).all())):
        return _one_at_a_time(lo, hi, most)
    when = _merge_order(lo.tolist(), hi.tolist())
    # The first n - most to go, by their (length, index) when they go (all distinct).
    merged = np.zeros(n, bool)
    try:
        order = np.argsort(np.array(when[1:], np.int64))
    except OverflowError:  # (lengths past what int64 holds with the index)
        order = np.array(sorted(range(n - 1), key=when[1:].__getitem__), np.intp)
    merged[1 + order[: n - most]] = True
    keep = np.flatnonzero(~merged)
    # Each one left ends where the last it took in ends: just before the next one left.
    return keep, hi[np.r_[keep[1:], n] - 1]


def _merge_order(lo: list[int], hi: list[int]) -> list[int]:
    """Per segment (in time order), when merging the shortest one at a time would merge it
    away, as its (length then, index) in one integer; the first's, 0 (never merged).

    A segment's length grows as the ones after it go: it goes when its length reaches the
    time the next one left would go. That is the next one's, else the next to outlast it,
    and so on: the chain of ever later ones after it (a stack, read from the last)."""
    n = len(lo)
    when = [0] * n
    later: list[int] = []
    for i in range(n - 1, 0, -1):
        start = lo[i]
        while later:
            j = later[-1]
            at = (hi[j - 1] - start) * n + i
            if at < when[j]:
                break
            later.pop()
        else:
            at = (hi[n - 1] - start) * n + i
        when[i] = at
        later.append(i)
    return when


def _one_at_a_time(lo: I64, hi: I64, most: int) -> tuple[npt.NDArray[np.intp], I64]:
    """`fewest`, one merge at a time: a heap of lengths with stale entries skipped (a scan per
    merge is quadratic)."""
    los, his = lo.tolist(), hi.tolist()
    n = len(los)
    before = list(range(-1, n - 1))
    after = list(range(1, n + 1))
    alive = [True] * n
    heap = [(his[j] - los[j], j) for j in range(1, n)]
    heapq.heapify(heap)
    left = n
    while left > most:
        length, j = heapq.heappop(heap)
        if not alive[j] or his[j] - los[j] != length:
            continue  # merged away, or grown since this entry was pushed
        i = before[j]
        his[i] = his[j]
        alive[j] = False
        after[i] = after[j]
        if after[j] < n:
            before[after[j]] = i
        if i > 0:
            heapq.heappush(heap, (his[i] - los[i], i))
        left -= 1
    keep = np.flatnonzero(alive)
    return keep, np.array(his, np.int64)[keep]
