"""The critical path: walked back from where the replayed range ends through each node's
binding edge, its time summed by category (CATEGORIES) and the wall it hits."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from wallfinder.analysis.critpath.model import CATEGORIES, I64, MATMUL, StepGraph
from wallfinder.analysis.critpath.timing import Timing
from wallfinder.analysis.gpu import COMM
from wallfinder.analysis.verdict import wall_of_parts
from wallfinder.diagnosis import Wall

CATEGORY_WALLS: dict[str, Wall] = {
    "data": "overhead",
    "host": "overhead",
    "launch": "overhead",
    "sync": "overhead",
    "communication": "overhead",
    "wait": "overhead",
    "compute": "compute",
    "bandwidth": "bandwidth",
}
"""The wall each category of the path's time is in."""


def path_shares(g: StepGraph, t: Timing) -> dict[str, float]:
    """The critical path's time by category (CATEGORIES), as shares of the replayed range."""
    return walk_path(g, t).shares()


def wall_of(shares: dict[str, float]) -> Wall:
    """The wall a critical path hits: that of its largest group of categories
    (`verdict.wall_of_parts`)."""
    return wall_of_parts((CATEGORY_WALLS[k], v) for k, v in shares.items())


FOLD_STEPS = 1024
"""The walk adds its segments to the sums and the kept window this many at a time (the sums
are of integers, exact in float64: the chunks change no figure)."""


class Walk:
    """The critical path as it was walked back: the time per category (sums of integers,
    exact in float64 below 2**53 ns: 104 days), and the segments (start, end, category index
    in CATEGORIES) in replayed ns that overlap the window [lo, hi) it keeps, latest first."""

    def __init__(self, keep: tuple[int, int]) -> None:
        self._keep = keep
        self._took = np.zeros(len(CATEGORIES))
        self._kept: list[I64] = []

    def add(self, start: I64, end: I64, category: npt.NDArray[np.int8]) -> None:
        """Add segments (their starts, ends and category indices; latest first) to the sums
        and the window."""
        self._took += np.bincount(
            category, weights=(end - start).astype(np.float64), minlength=len(CATEGORIES)
        )
        lo, hi = self._keep
        inside = (end > lo) & (start < hi)
        if inside.any():
            self._kept.append(np.stack([start[inside], end[inside], category[inside]], axis=1))

    @property
    def out(self) -> dict[str, float]:
        """The path's time (ns) in each category."""
        return dict(zip(CATEGORIES, self._took.tolist(), strict=True))

    def rows(self) -> tuple[I64, I64, I64]:
        """The segments in the kept window, earliest first, clipped to it: their starts, ends
        and category indices."""
        lo, hi = self._keep
        rows = np.concatenate(self._kept)[::-1] if self._kept else np.zeros((0, 3), np.int64)
        start, end = np.maximum(rows[:, 0], lo), np.minimum(rows[:, 1], hi)
        inside = end > start
        return start[inside], end[inside], rows[inside, 2]

    def segments(self) -> list[tuple[int, int, str]]:
        """`rows`, each as (start, end, category)."""
        start, end, cat = self.rows()
        return [
            (a, b, CATEGORIES[c])
            for a, b, c in zip(start.tolist(), end.tolist(), cat.tolist(), strict=True)
        ]

    def shares(self) -> dict[str, float]:
        out = self.out
        total = float(sum(out.values())) or 1.0
        return {k: float(v) / total for k, v in out.items()}


def walk_path(g: StepGraph, t: Timing, keep: tuple[int, int] = (0, 0)) -> Walk:
    """The critical path, walked back from where the last step ends through each node's
    binding edge to the start of the range; its segments in `keep` ([lo, hi) in replayed ns)
    are kept, the rest only summed.

    Which edge binds at each node does not depend on where the path is, only on the replay:
    it is read for every node at once (`_Binding`), and the path is followed through it a
    stretch at a time (`_route`: a run of the host chain up to the call that waited for the
    device is one step, an op one step). Each node the path crosses then moves it back to
    the times its events say (the op's end, its start, its launch; the call's end, its start,
    the host work before it), in order: the path's position after each is the running
    minimum of those times, and the time between two positions is the segment's, in the
    category of the event (`_Events`)."""
    walk = Walk(keep)
    cur = t.end
    if cur <= 0:
        return walk
    b = _Binding(g, t)
    kinds, ids = _nodes(_route(g, t, b, cur))
    # A block of nodes at a time: their events' tables stay small (the position carried from
    # one block to the next is all a block reads of those before it).
    at: int | None = cur
    for i in range(0, kinds.size, WALK_NODES):
        if at is None:
            break
        at = _Events(g, t, b, kinds[i : i + WALK_NODES], ids[i : i + WALK_NODES]).walk(at, walk)
    return walk


WALK_NODES = 16384
"""The nodes of the path whose events are laid out at once: each block's tables cost some
11 MB at this size, a bounded figure whatever the trace (4096 took 2.8 MB, and a walk of
40,000 nodes 1.2 ms more in its ten blocks' set-up)."""


# A node's kind on the path: an op; a call (its own time, then the host work before it); a
# call entered through its launch (the host work before it alone); the call that waited for
# the device (its end, then its drain); the chain's start (the host work before its first
# call, from 0).
OP, CALL, GAP, TAKE, START = range(5)
# Each op's binding edge: the op before it on its stream, the op it waited for across
# streams, the op it stays after, the later call that released it, its launch call, none.
PREV, DEP, AFTER, RELEASED, LAUNCHED, NONE = range(6)


class _Binding:
    """Per node, the edge the path leaves it by, read from the replay (the walk's rules, at
    every node at once): per op its edge (PREV ... NONE) and the node it leads to; per call
    whether the path leaves it for the device (a sync or blocked launch whose drain bound
    it), and for each call the last such call at or before it and its chain's first."""

    def __init__(self, g: StepGraph, t: Timing) -> None:
        n_ops, n_calls = g.dur.size, g.gap.size
        start = t.op_start
        k = np.arange(n_ops)
        prev = np.where(g.stream_first, -1, k - 1)
        p = np.maximum(prev, 0)
        by_prev = (prev >= 0) & (t.op_end[p] + g.stream_gap >= start - g.tie_ns)
        by_dep = ~by_prev & (g.dep >= 0) & (t.dep_end >= start)
        a = np.maximum(g.after, 0)
        by_after = ~by_prev & ~by_dep & (g.after >= 0) & (t.op_end[a] >= start)
        rest = ~(by_prev | by_dep | by_after)
        by_release = rest & (g.host >= 0) & (t.released >= start)
        by_launch = rest & ~by_release & (g.call >= 0)
        self.edge = np.select(
            [by_prev, by_dep, by_after, by_release, by_launch],
            [PREV, DEP, AFTER, RELEASED, LAUNCHED],
            NONE,
        ).astype(np.int8)
        self.to = np.select(
            [by_prev, by_dep, by_after, by_release, by_launch],
            [prev, g.dep, g.after, g.host, g.call],
            -1,
        )
        # Per op, the earliest op its run of edges to the op before it on its stream reaches
        # (itself where its edge is another): the path crosses such a run as a range of ops.
        self.prev_low = np.maximum.accumulate(np.where(self.edge != PREV, k, -1))
        self.drain_op = _drain_ops(g, t)
        self.take = (g.sync | g.blocked) & (self.drain_op >= 0) & (t.drain > t.call_start)
        idx = np.arange(n_calls)
        self.last_take = np.maximum.accumulate(np.where(self.take, idx, -1)) if n_calls else idx
        self.chain_start = np.maximum.accumulate(np.where(g.call_first, idx, 0)) if n_calls else idx


Stretch = tuple[int, list[int], int, bool]
"""A stretch of the path: (OP, the ops followed as ranges, each its first op and its last
(the earliest: first, first - 1, ... last), flat, 0, False), or (CALL or GAP, [the first
call], the last call, whether the last waited for the device)."""


def _route(g: StepGraph, t: Timing, b: _Binding, end: int) -> list[Stretch]:
    """The path, latest first, as stretches: a run of ops followed one by one, or a run of
    the host chain from its first call back to its last (kind CALL, or GAP where the path
    entered the first through its launch): the call that waited for the device (the path
    goes on at the op it drained), or the chain's first call (the path ends at the chain's
    start). Stops after as many nodes as the graph holds (a walk that never reached the
    start)."""
    out: list[Stretch] = []
    limit = 4 * (g.dur.size + g.gap.size) + 4
    edge, to, prev_low = b.edge.tolist(), b.to.tolist(), b.prev_low.tolist()
    last_take, chain_start, drain_op = b.last_take, b.chain_start, b.drain_op
    op, call = _last_node(g, t, end)
    from_gap = False
    steps = 0
    while steps < limit:
        if op >= 0:
            # Along the device until an edge leaves it for the host (or none): a run of
            # edges to the op before on the stream at once, as a range of ops.
            runs: list[int] = []
            while True:
                low = max(prev_low[op], op - (limit - steps) + 1)
                runs += (op, low)
                steps += op - low + 1
                op = low
                if edge[op] >= RELEASED or steps >= limit:
                    break
                op = to[op]
            out.append((OP, runs, 0, False))
            if edge[op] == NONE or edge[op] < RELEASED:
                break
            call, from_gap = to[op], True
        # Along the host chain, back to the call that waited for the device, or its start.
        first = int(chain_start[call])
        below = call - 1 if from_gap else call
        taken = int(last_take[below]) if below >= first else -1
        took = taken >= first
        last = taken if took else first
        out.append((GAP if from_gap else CALL, [call], last, took))
        steps += call - last + 1
        if not took:
            break
        op = int(drain_op[taken])
    return out


SLOTS = 6
"""Events per node on the path: an op's end, start, its edge's and its launch's; a call's
end, start (or drain), the three parts of a split host gap, the host work before it."""
NO = np.iinfo(np.int64).max
"""An event that does not happen: a time no position is after."""


class _Events:
    """The path's events, SLOTS per node in walk order: the time each moves the path back
    to, and its category. Two kinds of event move it by an amount that depends on where the
    path is when it comes: a launch's wait that no edge explains (`extra`, at most up to the
    call), and a host gap split between the DataLoader, collectives and the rest (scaled to
    the part of the gap the path crosses). Those are solved by iterating from the other
    events' positions until no position moves."""

    def __init__(
        self, g: StepGraph, t: Timing, b: _Binding, kinds: npt.NDArray[np.int8], ids: I64
    ) -> None:
        n = kinds.size
        lo = np.full((n, SLOTS), NO, np.int64)
        cat = np.zeros((n, SLOTS), np.int8)
        check = np.zeros(n, bool)
        self.g, self.t = g, t
        # Ops.
        o = np.flatnonzero(kinds == OP)
        k = ids[o]
        comm = g.cls[k] == COMM
        waited = np.where(comm, COMMUNICATION, WAIT)
        matmul = np.isin(g.cls[k], list(MATMUL))
        lo[o, 0], cat[o, 0] = t.op_end[k], waited
        lo[o, 1], cat[o, 1] = (
            t.op_start[k],
            np.where(comm, COMMUNICATION, np.where(matmul, COMPUTE, BANDWIDTH)),
        )
        check[o] = True
        e, to = b.edge[k], b.to[k]
        # (Each edge's node read where it is of that kind: `to` is an op or a call.)
        dep_end = t.op_end[np.where(e == DEP, to, 0)] if e.size else to
        released = t.call_start[np.where(e == RELEASED, to, 0)] if e.size else to
        prev_end = t.op_end[np.maximum(k - 1, 0)] + g.stream_gap[k]
        lo[o, 2] = np.select(
            [e == PREV, e == DEP, e == RELEASED, e == NONE], [prev_end, dep_end, released, 0], NO
        )
        cat[o, 2] = np.select(
            [e == PREV, e == RELEASED, e == LAUNCHED], [LAUNCH, LAUNCH, waited], WAIT
        )
        launched = e == LAUNCHED
        lo[o[launched], 3] = t.call_start[to[launched]]
        cat[o[launched], 3] = LAUNCH
        self.launch_rows = o[launched]
        self.launch_extra = g.extra[k[launched]]
        self.launch_start = t.call_start[to[launched]]
        # Calls: each node a call whose own time (not for GAP) and host work before it the
        # path crosses; the last of a stretch (TAKE) its end and drain alone.
        c_rows = np.flatnonzero((kinds == CALL) | (kinds == GAP) | (kinds == TAKE))
        c = ids[c_rows]
        own_cat = np.full(c.size, LAUNCH, np.int8) if g.call_cat is None else g.call_cat[c]
        full = kinds[c_rows] != GAP
        take = kinds[c_rows] == TAKE
        f = c_rows[full]
        lo[f, 0], cat[f, 0] = t.call_end[c[full]], HOST
        check[f] = True
        lo[f, 1] = np.where(take[full], t.drain[c[full]], t.call_start[c[full]])
        cat[f, 1] = np.where(g.sync[c[full]], SYNC, np.where(take[full], LAUNCH, own_cat[full]))
        h = c_rows[~take]
        hc = c[~take]
        before = np.where(g.call_first[hc], 0, t.call_end[np.maximum(hc - 1, 0)])
        lo[h, 5], cat[h, 5] = before, HOST
        cat[h, 2], cat[h, 3], cat[h, 4] = HOST, DATA, COMMUNICATION
        split = ((g.gap_data[hc] > 0) | (g.gap_comm[hc] > 0)) & (g.gap[hc] > 0)
        self.split_rows = h[split]
        self.split_calls = hc[split]
        self.split_before = before[split]
        # The chain's start: the host work before its first call, from 0.
        s = np.flatnonzero(kinds == START)
        lo[s, 0], cat[s, 0] = 0, HOST
        check[s] = True
        self.lo, self.cat, self.check = lo, cat, check

    def walk(self, end: int, walk: Walk) -> int | None:
        """The path's segments from `end` into `walk`: where it is after each event is the
        running minimum of the events' times; the events that depend on the position are
        solved by iterating; the path is cut where it reaches 0 at a node (as the walk stops
        there). Returns where the path is after the nodes (None: it stopped)."""
        lo = self.lo
        flat = lo.reshape(-1)
        split_at = self.split_rows * SLOTS + 2
        launch_at = self.launch_rows * SLOTS + 2
        g = self.g
        total = g.gap[self.split_calls]
        g_data = g.gap_data[self.split_calls]
        g_comm = g.gap_comm[self.split_calls]
        tail = np.where(
            g_data > 0, np.minimum(g.after_data[self.split_calls], total - g_data - g_comm), 0
        )
        parts = np.stack([tail, g_data, g_comm], axis=1).astype(np.float64)
        # pos[i]: where the path is before event i (pos[i + 1]: after it).
        pos = np.empty(flat.size + 1, np.int64)
        while True:
            pos[0] = end
            pos[1:] = flat
            np.minimum.accumulate(pos, out=pos)
            # Where the path is as each position-dependent event comes.
            at_split, at_launch = pos[split_at], pos[launch_at]
            crossed = at_split > self.split_before
            scale = (at_split - self.split_before) / total
            cut = np.cumsum(np.rint(parts * scale[:, None]).astype(np.int64), axis=1)
            new_split = np.where(crossed[:, None], at_split[:, None] - cut, NO)
            new_launch = np.maximum(at_launch - self.launch_extra, self.launch_start)
            if np.array_equal(new_split, lo[self.split_rows, 2:5]) and np.array_equal(
                new_launch, lo[self.launch_rows, 2]
            ):
                break
            lo[self.split_rows, 2:5] = new_split
            lo[self.launch_rows, 2] = new_launch
        del self.lo, lo, flat
        # The walk stops at the first node it reaches at or before 0.
        stop = np.flatnonzero(self.check & (pos[:-1:SLOTS] <= 0))
        n = int(stop[0]) * SLOTS if stop.size else pos.size - 1
        moved = np.flatnonzero(pos[1 : n + 1] < pos[:n])
        category = self.cat.reshape(-1)[moved]
        for i in range(0, moved.size, FOLD_STEPS):
            at = moved[i : i + FOLD_STEPS]
            walk.add(pos[at + 1], pos[at], category[i : i + FOLD_STEPS])
        return None if stop.size else int(pos[-1])


def _nodes(route: list[Stretch]) -> tuple[npt.NDArray[np.int8], I64]:
    """The route's nodes in walk order: per node its kind and its op or call (-1: the
    chain's start). Each stretch is a block of them, laid out at once."""
    highs: list[int] = []
    lows: list[int] = []
    runs: list[int] = []
    sizes: list[int] = []
    is_op: list[bool] = []
    firsts: list[int] = []
    lasts: list[int] = []
    kinds_of: list[int] = []
    tooks: list[bool] = []
    for kind, first, last, took in route:
        is_op.append(kind == OP)
        if kind == OP:
            highs += first[0::2]
            lows += first[1::2]
            runs.append(len(first) // 2)
            sizes.append(0)  # (its ops counted below)
            continue
        sizes.append(first[0] - last + 1 + (0 if took else 1))
        firsts.append(first[0])
        lasts.append(last)
        kinds_of.append(kind)
        tooks.append(took)
    size = np.array(sizes, np.int64)
    op_block = np.array(is_op, bool)
    hi, lo = np.array(highs, np.int64), np.array(lows, np.int64)
    per_run = hi - lo + 1
    if runs:
        n_runs = np.array(runs, np.int64)
        size[op_block] = np.add.reduceat(per_run, np.cumsum(n_runs) - n_runs)
    at = np.cumsum(size) - size
    total = int(size.sum())
    kinds = np.full(total, CALL, np.int8)
    ids = np.full(total, -1, np.int64)
    if runs:
        where = _spread(at[op_block], size[op_block])
        # Each range from its first op down to its last.
        kinds[where] = OP
        ids[where] = np.repeat(hi + np.cumsum(per_run) - per_run, per_run) - np.arange(where.size)
    if firsts:
        top, bottom = np.array(firsts, np.int64), np.array(lasts, np.int64)
        n = top - bottom + 1
        base = at[~op_block]
        where = _spread(base, n)
        # Back along the chain: the block's first call, then each one before it.
        ids[where] = np.repeat(top + base, n) - where
        kinds[base] = kinds_of
        ended = np.array(tooks, bool)
        kinds[(base + n - 1)[ended]] = TAKE
        kinds[(base + n)[~ended]] = START
    return kinds, ids


def _spread(at: I64, size: I64) -> I64:
    """The positions of blocks of `size` that start at `at`, in order."""
    total = int(size.sum())
    return np.repeat(at - (np.cumsum(size) - size), size) + np.arange(total)


def _last_node(g: StepGraph, t: Timing, end: int) -> tuple[int, int]:
    """Where the walk starts (an op, or else a call; -1: not that kind): the launched op that
    ends last, or the call that ends last when the last step ended with its host work (it
    launched nothing)."""
    candidates = np.flatnonzero(g.call >= 0)
    node_op = int(candidates[np.argmax(t.op_end[candidates])]) if candidates.size else -1
    if node_op < 0 or end > int(t.op_end[node_op]):
        return -1, int(np.argmax(t.call_end))
    return node_op, -1


def _drain_ops(g: StepGraph, t: Timing) -> I64:
    """Per sync call, the op its drain waited for (the last to end of those it drained; -1:
    none)."""
    drain_op = np.full(g.gap.size, -1, np.int64)
    synced = g.drained_by >= 0
    if synced.any():
        rows = np.flatnonzero(synced)
        rows = rows[np.lexsort((t.op_end[rows], g.drained_by[rows]))]
        last = np.r_[g.drained_by[rows][1:] != g.drained_by[rows][:-1], True]
        drain_op[g.drained_by[rows][last]] = rows[last]
    return drain_op


DATA, HOST, LAUNCH, SYNC, COMMUNICATION, COMPUTE, BANDWIDTH, WAIT = range(len(CATEGORIES))
