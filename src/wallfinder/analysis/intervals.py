"""Interval arithmetic on sorted int64 nanosecond intervals, vectorised.

A set of intervals is merged once into a `Coverage`; from then on, how much of any window
[a, b) it covers is two binary searches, for any number of windows at once. Set differences
come from unions: |A − B| = |A ∪ B| − |B|, which is why the breakdown's parts sum exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]

_LOW = np.iinfo(np.int64).min


@dataclass(frozen=True)
class Coverage:
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
