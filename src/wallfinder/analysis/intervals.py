"""Interval arithmetic on sorted int64 nanosecond intervals, vectorised.

A set of intervals is merged once into a `Coverage`; from then on, how much of any window
[a, b) it covers is two binary searches, for any number of windows at once. Set differences
come from unions: |A − B| = |A ∪ B| − |B|, which is why the breakdown's parts sum exactly.
"""

from __future__ import annotations

from typing import Any, Protocol

import msgspec
import numpy as np
import numpy.typing as npt

from wallfinder.trace import NONE

I64 = npt.NDArray[np.int64]

_LOW = np.iinfo(np.int64).min


class Coverage(msgspec.Struct, frozen=True):
    """A union of intervals: disjoint, sorted [starts[i], ends[i]) and the covered length
    before each interval (`before[i]`)."""

    starts: I64
    ends: I64
    before: I64

    @classmethod
    def of(cls, starts: I64, ends: I64) -> Coverage:
        if starts.size == 0:
            empty = np.empty(0, np.int64)
            return cls(empty, empty, empty)
        if not (starts[1:] >= starts[:-1]).all():
            # (Sorted already, as a kind's rows are, the input is read as it is: a stable
            # sort would leave it unchanged, and its index and copies are the largest part
            # of this function's memory.)
            order = np.argsort(starts, kind="stable")
            starts, ends = starts[order], ends[order]
            del order
        reach = np.maximum(ends, starts)
        np.maximum.accumulate(reach, out=reach)
        # A new merged interval begins where a start lies beyond everything before it.
        new = np.empty(starts.shape, dtype=bool)
        new[0] = True
        np.greater(starts[1:], reach[:-1], out=new[1:])
        return cls._merged(starts, reach, new)

    @classmethod
    def of_sorted(cls, starts: I64, ends: I64, rows: npt.NDArray[np.bool_]) -> Coverage:
        """`of` the intervals at `rows` (a mask) of intervals sorted by start, without
        copying them out: the same coverage, with a third of the memory on many rows."""
        if not rows.any():
            return cls.of(starts[:0], ends[:0])
        # The running reach of the chosen intervals alone (the others cannot raise it).
        reach = np.maximum(ends, starts)
        reach[~rows] = _LOW
        np.maximum.accumulate(reach, out=reach)
        new = rows.copy()
        new[1:] &= starts[1:] > reach[:-1]
        return cls._merged(starts, reach, new)

    @classmethod
    def _merged(cls, starts: I64, reach: I64, new: npt.NDArray[np.bool_]) -> Coverage:
        """The merged intervals of intervals sorted by start: each begins at a start marked
        `new` and ends at the running reach (`reach`: the latest end so far) just before the
        next one begins."""
        at = np.flatnonzero(new)
        group_starts = starts[at]
        group_ends = reach[np.append(at[1:] - 1, starts.size - 1)]
        lengths = group_ends - group_starts
        before = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        return cls(group_starts, group_ends, before)

    @classmethod
    def union(cls, *parts: Coverage) -> Coverage:
        return cls.of(
            np.concatenate([p.starts for p in parts]), np.concatenate([p.ends for p in parts])
        )

    def covered_until(self, t: I64) -> I64:
        """Covered length in (-inf, t) for each t."""
        if self.starts.size == 0:
            return np.zeros(np.shape(t), dtype=np.int64)
        i = np.searchsorted(self.starts, t, side="right") - 1
        valid = i >= 0
        j = np.where(valid, i, 0)
        inside: I64 = np.minimum(t, self.ends[j]) - self.starts[j]
        result: I64 = np.where(valid, self.before[j] + np.maximum(inside, 0), 0)
        return result

    def covered(self, a: I64, b: I64) -> I64:
        """Covered length of each window [a[k], b[k])."""
        result: I64 = np.maximum(self.covered_until(b) - self.covered_until(a), 0)
        return result

    def gaps(self, lo: int, hi: int) -> tuple[I64, I64]:
        """The uncovered intervals within [lo, hi)."""
        starts = np.concatenate([[lo], self.ends])
        ends = np.concatenate([self.starts, [hi]])
        starts = np.clip(starts, lo, hi)
        ends = np.clip(ends, lo, hi)
        keep = ends > starts
        return starts[keep].astype(np.int64), ends[keep].astype(np.int64)

    @property
    def total(self) -> int:
        return int((self.ends - self.starts).sum())

    def lead(self, t: I64, slack: int = 0) -> I64:
        """For each t that lies in an interval (extended by `slack` at its end), how long that
        interval had run by t (at most its length); 0 for a t outside every interval."""
        if self.starts.size == 0:
            return np.zeros(np.shape(t), dtype=np.int64)
        i = np.searchsorted(self.starts, t, side="right") - 1
        j = np.maximum(i, 0)
        inside = (i >= 0) & (t <= self.ends[j] + slack)
        result: I64 = np.where(inside, np.minimum(t, self.ends[j]) - self.starts[j], 0)
        return result

    def contains(self, t: I64, slack: int = 0) -> npt.NDArray[np.bool_]:
        """Whether each t lies in an interval (extended by `slack` at its end)."""
        if self.starts.size == 0:
            return np.zeros(np.shape(t), dtype=bool)
        i = np.searchsorted(self.starts, t, side="right") - 1
        j = np.maximum(i, 0)
        return (i >= 0) & (t <= self.ends[j] + slack)


def split_at(starts: I64, ends: I64, cuts: I64) -> tuple[I64, I64, npt.NDArray[np.intp]]:
    """Split disjoint sorted intervals at the sorted `cuts` points. Returns the pieces and,
    for each piece, the index of the interval it came from."""
    if starts.size == 0:
        empty = np.empty(0, np.int64)
        return empty, empty, np.empty(0, np.intp)
    inner = cuts[(cuts > starts.min()) & (cuts < ends.max())]
    owner = np.searchsorted(starts, inner, side="right") - 1
    valid = (owner >= 0) & (inner < ends[np.maximum(owner, 0)]) & (inner > starts[owner])
    inner, owner = inner[valid], owner[valid]
    points_start = np.concatenate([starts, inner])
    origin = np.concatenate([np.arange(starts.size), owner])
    order = np.lexsort((points_start, origin))
    piece_starts = points_start[order]
    piece_origin = origin[order]
    piece_ends = np.empty_like(piece_starts)
    piece_ends[:-1] = piece_starts[1:]
    last = np.append(piece_origin[1:] != piece_origin[:-1], True)
    piece_ends[last] = ends[piece_origin[last]]
    return piece_starts, piece_ends, piece_origin.astype(np.intp)


def in_windows(t: I64, start: I64, end: I64) -> npt.NDArray[np.bool_]:
    """Whether each time lies in one of the sorted, disjoint windows [start[k], end[k])."""
    w = np.searchsorted(start, t, side="right") - 1
    result: npt.NDArray[np.bool_] = (w >= 0) & (t < end[np.maximum(w, 0)])
    return result


MAX_STEPS_BACK = 64
"""How many ended sibling ops the containment search steps over before giving up."""

FEW_THREADS = 8
"""Up to how many threads' queries `enclosing_of` answers one thread at a time (a pass over
the rows each) rather than by one sort of every row by thread."""


class Spans(Protocol):
    """Rows with a start, an end and a thread: `Events`, or a few columns of some of them."""

    @property
    def ts(self) -> npt.NDArray[np.int64]: ...
    @property
    def end(self) -> npt.NDArray[np.int64]: ...
    @property
    def thread(self) -> npt.NDArray[np.int64]: ...
    def __len__(self) -> int: ...


def enclosing(cpu: Spans, thread: npt.NDArray[np.int64], t: npt.NDArray[np.int64]) -> Any:
    """Row of the innermost event of `cpu` (ops, Python frames) on `thread` that encloses
    time `t` (NONE if none)."""
    return enclosing_of(cpu.thread, cpu.ts, cpu.end, thread, t)


def enclosing_of(
    key: npt.NDArray[np.int64],
    ts: npt.NDArray[np.int64],
    end: npt.NDArray[np.int64],
    thread: npt.NDArray[np.int64],
    t: npt.NDArray[np.int64],
) -> Any:
    """As `enclosing`, of the events whose threads, starts and ends are given (a few columns
    of a large table, without copying the rest)."""
    # (Queries most often all on one thread: no unique of them then.)
    asked = thread[:1] if thread.size and (thread == thread[0]).all() else np.unique(thread)
    if asked.size <= FEW_THREADS and bool((ts[1:] >= ts[:-1]).all()):
        # Rows by start already (a kind's rows) and queries on few threads: each thread's
        # rows, picked in order, are sorted by start as they are, so no sort of every row
        # (and no table of every row's thread) is needed: on a large trace a few queries
        # cost a pass over the rows, not a sort of them.
        out = np.full(t.size, NONE, dtype=np.int64)
        for th in asked.tolist():
            rows = np.flatnonzero(key == th)
            if rows.size == 0:
                continue
            mine = slice(None) if asked.size == 1 else np.flatnonzero(thread == th)
            if rows.size == key.size:  # every row on this thread: read the columns in place
                out[mine] = _innermost(ts, end, t[mine])
                continue
            found = _innermost(ts[rows], end[rows], t[mine])
            out[mine] = np.where(found >= 0, rows[np.maximum(found, 0)], NONE)
        return out
    threads = np.unique(key)
    rank = np.searchsorted(threads, key)
    del key
    base = int(ts.min())
    span = int(max(end.max(), t.max()) - base) + 1
    if threads.size < 2**15 and bool((ts[1:] >= ts[:-1]).all()):
        # Rows by start already (a kind's rows): a stable sort of the small ranks alone
        # (a radix sort) gives the same order.
        order = np.argsort(rank.astype(np.int16), kind="stable")
        sorted_key = rank[order]
        del rank
        sorted_key *= span
        sorted_key += ts[order]
        sorted_key -= base
    else:
        combined = rank.astype(np.int64, copy=False)
        del rank
        combined *= span
        combined += ts
        combined -= base
        order = np.argsort(combined, kind="stable")
        sorted_key = combined[order]
        del combined
    q_rank = np.searchsorted(threads, thread)
    valid = (q_rank < threads.size) & (threads[np.minimum(q_rank, threads.size - 1)] == thread)
    q = q_rank.astype(np.int64) * span + (t - base)
    i = np.searchsorted(sorted_key, q, side="right") - 1
    ends = end[order]
    del end
    # A query's candidates stay on its thread: no lower than its thread's first row.
    lowest = np.searchsorted(sorted_key, q_rank.astype(np.int64) * span, side="left")
    found = _step_back(ends, np.where(valid, i, NONE), t, lowest)
    return np.where(found >= 0, order[np.maximum(found, 0)], NONE)


def _innermost(ts: I64, end: I64, t: I64) -> I64:
    """Index of the innermost of one thread's events (sorted by start) that encloses each
    time `t` (NONE if none), as `enclosing_of` searches."""
    return _step_back(end, np.searchsorted(ts, t, side="right") - 1, t)


def _step_back(ends: I64, cand: I64, at: I64, lowest: I64 | int = 0) -> I64:
    """For each query, its first candidate `cand` being the latest event to start at or
    before its time `at` (events sorted by start), the innermost event that encloses that
    time: the first candidate that has not ended by then, stepping back over at most
    `MAX_STEPS_BACK` ended siblings and never below `lowest` (the first event of the query's
    thread); NONE if none."""
    out = np.full(cand.size, NONE, dtype=np.int64)
    low = np.broadcast_to(np.asarray(lowest, dtype=np.int64), cand.shape)
    # The queries still searching: compacted as they are answered, so that each step back
    # costs what is left, not every query again (most are answered by the first candidate).
    idx = np.flatnonzero(cand >= low)
    cand, at, low = cand[idx], at[idx], low[idx]
    for _ in range(MAX_STEPS_BACK):
        if idx.size == 0:
            break
        contains = ends[cand] >= at
        out[idx[contains]] = cand[contains]
        # Not enclosing: an ended sibling; step back to an earlier op of the same thread.
        back = ~contains & (cand > low)
        idx, cand, at, low = idx[back], cand[back] - 1, at[back], low[back]
    return out
