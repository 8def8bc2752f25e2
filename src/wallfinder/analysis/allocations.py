"""The one allocate/free replay of a memory history, shared by both memory sources.

An allocator snapshot's trace entries and a profiler trace's `[memory]` events are both a
history of allocations and frees of blocks at addresses. Each source turns its history into
columns (address, size, action) and replays it here, vectorised: the running level of
allocated bytes, which free ends which allocation, and what is live after any event. What a
block holds (its category) and where it came from (its call site) stay with the source;
`rank_sites` groups live blocks by both the same way for each.

A leak is judged the same way for both, once each source has cut its history into steps:
allocated memory rising at the step boundaries (`step_growth`), and blocks allocated in
earlier steps that are still alive at the end of later ones (`Replay.kept_across`,
`by_site`). A block freed within its step or the next (activations freed in the backward
pass, gradients held until the optimizer step or the next zero_grad) is never one; neither
is one step's working set, however large.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import msgspec
import numpy as np
import numpy.typing as npt

from wallfinder.analysis.thresholds import MemoryThresholds
from wallfinder.diagnosis import MemorySite
from wallfinder.trace.model import ALLOC, FREE

__all__ = ["Growth", "Replay", "by_site", "rank_sites", "step_growth"]

I64 = npt.NDArray[np.int64]


class Replay(msgspec.Struct, frozen=True):
    """One device's allocate/free history replayed (event `i` is row `i` of the columns)."""

    addr: I64
    action: I64
    """`wallfinder.trace.snapshot.ALLOC` or `FREE` per event (the sign of a profiler memory
    event's bytes); any other action (an allocator's segment events, an out-of-memory
    event) is left out of the replay."""
    size: I64
    """Bytes of the block each allocation or free is of (not signed)."""
    level: I64
    """Allocated bytes after each event, counted from the history's start (negative where
    blocks allocated before it are freed)."""
    free_of: I64
    """For an allocation, the index of the free of its block: the next event at its address,
    when that is a free (-1: never freed in the history). -1 for other events."""

    @classmethod
    def of(cls, addr: I64, size: I64, action: I64) -> Replay:
        """The replay of events at addresses `addr`, of `size` bytes, doing `action`."""
        addr = np.asarray(addr, dtype=np.int64)
        action = np.asarray(action, dtype=np.int64)
        size = np.asarray(size, dtype=np.int64)
        level = np.cumsum(np.where(action == ALLOC, size, np.where(action == FREE, -size, 0)))
        return cls(addr, action, size, level, _pair(addr, action))

    @property
    def alloc(self) -> npt.NDArray[np.bool_]:
        """Whether each event is an allocation."""
        alloc: npt.NDArray[np.bool_] = self.action == ALLOC
        return alloc

    def live_after(self, i: int) -> I64:
        """Indices of the allocations live just after event `i`, in the order they were made."""
        upto = np.arange(self.action.size) <= i
        return np.flatnonzero(self.alloc & upto & ((self.free_of < 0) | (self.free_of > i)))

    def from_before(self) -> npt.NDArray[np.bool_]:
        """Whether each event is a free at an address no earlier event allocated: of a block
        allocated before the history began."""
        frees = np.flatnonzero(self.action == FREE)
        allocs = np.flatnonzero(self.alloc)
        out = np.zeros(self.action.size, dtype=bool)
        out[frees] = True
        if allocs.size == 0:
            return out
        # The first allocation at each address (np.unique keeps the first of each).
        addrs, first = np.unique(self.addr[allocs], return_index=True)
        at = np.minimum(np.searchsorted(addrs, self.addr[frees]), addrs.size - 1)
        earlier = (addrs[at] == self.addr[frees]) & (allocs[first[at]] < frees)
        out[frees[earlier]] = False
        return out

    def kept_across(self, step: I64, counted: I64) -> I64:
        """Allocations made in one of the `counted` steps (step indices, in order) before the
        last of them and never freed: still alive at the end of every later step. `step` is
        each event's step (negative: in none)."""
        if counted.size < 2:
            return np.zeros(0, dtype=np.int64)
        earlier = np.isin(step, counted[:-1]) & (step >= 0)
        return np.flatnonzero(self.alloc & (self.free_of < 0) & earlier)


def _pair(addr: I64, action: I64) -> I64:
    """For each allocation, the index of the free of its block (see `Replay.free_of`)."""
    n = action.size
    rows = np.flatnonzero((action == ALLOC) | (action == FREE))
    order = rows[np.lexsort((rows, addr[rows]))]
    a, act = addr[order], action[order]
    free_of = np.full(n, -1, dtype=np.int64)
    pairs = np.flatnonzero((a[:-1] == a[1:]) & (act[:-1] == ALLOC) & (act[1:] == FREE))
    free_of[order[pairs]] = order[pairs + 1]
    return free_of


def rank_sites(blocks: Iterable[tuple[str, str, int]], top: int) -> list[MemorySite]:
    """The `top` (call site, category) pairs of `blocks` (site, category, bytes) by bytes.

    One row per site and category: a training-loop line that builds both the parameters and
    the optimizer state shows as two rows, not one mislabelled one."""
    sizes: dict[tuple[str, str], int] = {}
    counts: dict[tuple[str, str], int] = {}
    for site, cat, nbytes in blocks:
        key = (site, cat)
        sizes[key] = sizes.get(key, 0) + nbytes
        counts[key] = counts.get(key, 0) + 1
    ranked = sorted(sizes, key=lambda k: (-sizes[k], k))[:top]
    return [
        MemorySite(site=s, category=c, bytes=sizes[s, c], count=counts[s, c]) for s, c in ranked
    ]


def by_site(members: I64, site: Callable[[int], str], step: I64) -> dict[str, list[int]]:
    """`members` (event indices) grouped by call site, keeping the sites whose blocks were
    allocated in at least two steps: one step's blocks are its working set (or state made
    once), not growth that persists."""
    groups: dict[str, list[int]] = {}
    for i in members.tolist():
        groups.setdefault(site(i), []).append(i)
    return {s: m for s, m in groups.items() if len({int(step[i]) for i in m}) >= 2}


class Growth(msgspec.Struct, frozen=True):
    """Allocated bytes at the step boundaries: their slope per step (None: too few steps to
    tell), the growth it makes over them, and whether that is a leak."""

    per_step: float | None
    bytes: int
    leak: bool


def step_growth(levels: npt.NDArray[np.float64], peak: int, limits: MemoryThresholds) -> Growth:
    """Whether allocated bytes at consecutive step boundaries (`levels`, the first step's
    start first) rise step over step by enough to be a leak."""
    # Not the first boundary: a first step that allocates what the loop then keeps (its
    # outputs, gradients and optimizer state made lazily, the CPU's counters starting) is not
    # a leak.
    if levels.size >= 4:
        levels = levels[1:]
    if levels.size < 3:
        return Growth(None, 0, False)
    diffs = np.diff(levels)
    slope = round(float(np.polyfit(np.arange(levels.size, dtype=np.float64), levels, 1)[0]), 1)
    growth = int(slope * diffs.size)
    rises, drops = int((diffs > 0).sum()), int((diffs < 0).sum())
    # A leak rises, if only every few steps, and seldom falls: batches of varying size move
    # the level both ways.
    leak = (
        growth >= max(limits.leak_bytes, limits.leak_share * peak)
        and rises >= max(1, 2 * drops)
        and drops <= limits.leak_drops * diffs.size
    )
    return Growth(slope, growth, leak)
