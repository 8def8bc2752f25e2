"""The critical path's walk as it was before `critpath.path` read the binding edges of every
node at once: one Python loop over the path's nodes, kept verbatim as the reference the
vectorised walk is checked against (`test_walk.py`)."""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable

import numpy as np

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
"""The walk sums its segments by category every this many steps back along the path, and
keeps only those in the window it is asked to keep: the whole path's segments (three int64s
each, tens of thousands on a large graph) are never held at once."""


class Walk:
    """The critical path as it was walked back: the time per category (sums of integers,
    exact in float64 below 2**53 ns: 104 days), and the segments (start, end, category index
    in CATEGORIES) in replayed ns that overlap the window [lo, hi) it keeps, latest first."""

    def __init__(self, keep: tuple[int, int]) -> None:
        self._keep = keep
        self._took = np.zeros(len(CATEGORIES))
        self._kept: list[I64] = []

    def fold(self, segments: array[int]) -> None:
        """Add `segments` (flat: start, end, category, ...) to the sums and the window, and
        empty it for the walk to go on."""
        if len(segments):
            self._add(np.frombuffer(segments, dtype=np.int64).reshape(-1, 3))
            del segments[:]  # (no view of it is left: `_add` keeps copies)

    def _add(self, rows: I64) -> None:
        self._took += np.bincount(
            rows[:, 2],
            weights=(rows[:, 1] - rows[:, 0]).astype(np.float64),
            minlength=len(CATEGORIES),
        )
        lo, hi = self._keep
        inside = (rows[:, 1] > lo) & (rows[:, 0] < hi)
        if inside.any():
            self._kept.append(rows[inside])

    @property
    def out(self) -> dict[str, float]:
        """The path's time (ns) in each category."""
        return dict(zip(CATEGORIES, self._took.tolist(), strict=True))

    def segments(self) -> list[tuple[int, int, str]]:
        """The segments in the kept window, earliest first, clipped to it."""
        lo, hi = self._keep
        rows = np.concatenate(self._kept)[::-1] if self._kept else np.zeros((0, 3), np.int64)
        start, end = np.maximum(rows[:, 0], lo), np.minimum(rows[:, 1], hi)
        inside = end > start
        return [
            (a, b, CATEGORIES[c])
            for a, b, c in zip(
                start[inside].tolist(), end[inside].tolist(), rows[inside, 2].tolist(), strict=True
            )
        ]

    def shares(self) -> dict[str, float]:
        out = self.out
        total = float(sum(out.values())) or 1.0
        return {k: float(v) / total for k, v in out.items()}


def walk_path(g: StepGraph, t: Timing, keep: tuple[int, int] = (0, 0)) -> Walk:
    """The critical path, walked back from where the last step ends through each node's
    binding edge to the start of the range; its segments in `keep` ([lo, hi) in replayed ns)
    are kept, the rest only summed.

    The walk alternates between the device (`_Walker.device`: back along ops, by their
    streams and waits) and the host (`_Walker.host`: back along the chain's calls and the
    work between them), each a loop over the path's nodes: the one Python loop of the
    analysis that touches each node, so a step of the path is written out in place, `if lo
    < cur:` the path spends [lo, cur) in a category and goes on from `lo`, rather than
    called."""
    walk = Walk(keep)
    cur = t.end
    if cur <= 0:
        return walk
    walker = _Walker(g, t, walk)
    op, call = _last_node(g, t, cur)
    from_gap = False
    while True:
        if op >= 0:
            cur, call = walker.device(op, cur)
            if call < 0:
                break
            from_gap = True
        cur, op = walker.host(call, cur, from_gap)
        if op < 0:
            break
    walk.fold(walker.segs)
    return walk


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


class _Walker:
    """The walk's state: the graph's and the replay's columns as memoryviews (single elements
    read several times faster from them than from arrays), the segments walked since the last
    fold (flat: start, end, category, ...), and the steps taken (at most `limit`: each step is
    a node, and a walk that never reached the start would stop there). The segments are folded
    into the walk every FOLD_STEPS steps."""

    def __init__(self, g: StepGraph, t: Timing, walk: Walk) -> None:
        self.walk = walk
        self.segs: array[int] = array("q")
        self.step = 0
        self.limit = 4 * (g.dur.size + g.gap.size) + 4
        self.op_start, self.op_end = t.op_start.data, t.op_end.data
        self.dep_end, self.released = t.dep_end.data, t.released.data
        self.call_start, self.call_end, self.drain = (
            t.call_start.data,
            t.call_end.data,
            t.drain.data,
        )
        self.cls, self.stream_gap, self.dep = g.cls.data, g.stream_gap.data, g.dep.data
        self.after, self.host_of, self.call_of = g.after.data, g.host.data, g.call.data
        self.extra, self.call_first = g.extra.data, g.call_first.data
        self.is_sync, self.blocked = g.sync.data, g.blocked.data
        self.gap, self.gap_data = g.gap.data, g.gap_data.data
        self.gap_comm, self.after_data = g.gap_comm.data, g.after_data.data
        self.call_cat = None if g.call_cat is None else g.call_cat.data
        # Per stream, the previous op (-1 for the first).
        self.prev = np.where(g.stream_first, -1, np.arange(g.dur.size) - 1).data
        self.has_call = (g.call >= 0).data
        self.drain_op = _drain_ops(g, t).data
        self.tie = g.tie_ns

    def _leg(
        self,
    ) -> tuple[
        array[int], Callable[[Iterable[int]], None], Callable[[array[int]], None], int, int, int
    ]:
        """What a leg of the walk reads at every node, to bind as locals: the segments, their
        `extend`, the fold, the steps taken, their limit and the fold's period."""
        return self.segs, self.segs.extend, self.walk.fold, self.step, self.limit, FOLD_STEPS

    def device(self, k: int, cur: int) -> tuple[int, int]:
        """Back from op `k` (the path at `cur`) along the device, to the host call whose
        launch or release it waited for: the path's time there and that call (-1: the path
        ends here)."""
        segs, add, fold, step, limit, every = self._leg()
        # (Locals: the loop reads them at every node.)
        communication, compute, bandwidth, launch, wait = (
            COMMUNICATION,
            COMPUTE,
            BANDWIDTH,
            LAUNCH,
            WAIT,
        )
        comm, matmul, tie = COMM, MATMUL, self.tie
        op_start, op_end, dep_end, released = (
            self.op_start,
            self.op_end,
            self.dep_end,
            self.released,
        )
        cls, stream_gap, dep, after, prev = (
            self.cls,
            self.stream_gap,
            self.dep,
            self.after,
            self.prev,
        )
        host_of, call_of, has_call, extra = self.host_of, self.call_of, self.has_call, self.extra
        call_start = self.call_start
        while step < limit and cur > 0:
            if step % every == 0:
                fold(segs)
            step += 1
            start = op_start[k]
            kind = cls[k]
            # A collective held up past its stream or launch waited for its peers.
            waited = communication if kind == comm else wait
            lo = op_end[k]
            if lo < cur:
                add((lo, cur, waited))
                cur = lo
            if start < cur:
                what = communication if kind == comm else compute if kind in matmul else bandwidth
                add((start, cur, what))
                cur = start
            p = prev[k]
            if p >= 0 and op_end[p] + stream_gap[k] >= start - tie:
                # A launch that came within `tie_ns` of its stream freeing up ties with the
                # device's own chain: the path stays on the device and the small gap is the
                # launch's (as the breakdown calls it), instead of following the host chain
                # back through work that ran while the device was busy.
                lo = op_end[p] + stream_gap[k]
                if lo < cur:
                    add((lo, cur, launch))
                    cur = lo
                k = p
                continue
            if dep[k] >= 0 and dep_end[k] >= start:
                k = dep[k]
                lo = op_end[k]
                if lo < cur:
                    add((lo, cur, wait))
                    cur = lo
                continue
            if after[k] >= 0 and op_end[after[k]] >= start:
                k = after[k]
                continue
            c = host_of[k] if host_of[k] >= 0 and released[k] >= start else -1
            if c < 0 and has_call[k]:
                c = call_of[k]
                lo = max(cur - extra[k], call_start[c])
                if lo < cur:
                    add((lo, cur, waited))
                    cur = lo
            if c < 0:
                if cur > 0:
                    add((0, cur, wait))
                return self._at(step, cur, -1)
            lo = call_start[c]
            if lo < cur:
                add((lo, cur, launch))
                cur = lo
            return self._at(step, cur, c)
        return self._at(step, cur, -1)

    def _at(self, step: int, cur: int, node: int) -> tuple[int, int]:
        """Where a leg of the walk stopped (`cur`, the next node), with its steps kept."""
        self.step = step
        return cur, node

    def host(self, c: int, cur: int, from_gap: bool) -> tuple[int, int]:
        """Back from call `c` (the path at `cur`; `from_gap`: the path reached it from the
        device, through its launch, and goes on from the host work before it) along the host
        chain, to the op a synchronising call drained: the path's time there and that op (-1:
        the path ends here)."""
        segs, add, fold, step, limit, every = self._leg()
        host, sync, launch = HOST, SYNC, LAUNCH
        call_start, call_end, drain, drain_op = (
            self.call_start,
            self.call_end,
            self.drain,
            self.drain_op,
        )
        is_sync, blocked, call_cat, call_first = (
            self.is_sync,
            self.blocked,
            self.call_cat,
            self.call_first,
        )
        gap, gap_data, gap_comm = self.gap, self.gap_data, self.gap_comm
        while True:
            if not from_gap:
                if step >= limit or cur <= 0:
                    return self._at(step, cur, -1)
                if step % every == 0:
                    fold(segs)
                step += 1
                if c < 0:
                    if cur > 0:
                        add((0, cur, host))
                    return self._at(step, cur, -1)
                lo = call_end[c]
                if lo < cur:
                    add((lo, cur, host))
                    cur = lo
                if (is_sync[c] or blocked[c]) and drain_op[c] >= 0 and drain[c] > call_start[c]:
                    lo = drain[c]
                    if lo < cur:
                        add((lo, cur, sync if is_sync[c] else launch))
                        cur = lo
                    return self._at(step, cur, drain_op[c])
                own = launch if call_cat is None else call_cat[c]
                lo = call_start[c]
                if lo < cur:
                    add((lo, cur, sync if is_sync[c] else own))
                    cur = lo
            from_gap = False
            # The host work before call `c`, up to the previous call's end.
            before = 0 if call_first[c] else call_end[c - 1]
            if (gap_data[c] or gap_comm[c]) and gap[c] > 0 and cur > before:
                # (Most gaps hold neither: the split is skipped, as it would take nothing.)
                cur = self._split_gap(c, cur, before)
            if before < cur:
                add((before, cur, host))
                cur = before
            c = -1 if call_first[c] else c - 1

    def _split_gap(self, c: int, cur: int, before: int) -> int:
        """The host work before call `c` split by what it was, back from `cur` towards the
        previous call's end (`before`): the host work after the DataLoader's last stretch,
        the DataLoader, host-side collectives (the rest, before them, is the caller's; the
        order of the last two is not recorded). Returns where the split ends."""
        total, g_data, g_comm = self.gap[c], self.gap_data[c], self.gap_comm[c]
        scale = (cur - before) / total
        tail = min(self.after_data[c], total - g_data - g_comm) if g_data > 0 else 0
        for part, what in ((tail, HOST), (g_data, DATA), (g_comm, COMMUNICATION)):
            lo = cur - round(part * scale)
            if lo < cur:
                self.segs.extend((lo, cur, what))
                cur = lo
        return cur
