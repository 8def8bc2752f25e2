"""Replay: re-timing the graph, with a what-if's change applied.

The host chain is a max-plus scan (each call starts when the previous ended plus its host
work; a sync ends no earlier than its drain), each stream a max-plus scan (an op starts at the
latest of its launch, its stream predecessor and the op it waited for), both vectorised,
iterated to the fixed point (the longest path); a graph that takes many rounds is solved in
one pass in dependency order instead (`onepass`), to the same times. The unchanged graph
reproduces the measured steps where the trace records every dependency; the error is
reported. A what-if changes the graph's weights (host gaps, call costs, op durations, sync
edges) and replays it; no replay is shorter than the device's busy time under the change.
"""

from __future__ import annotations

import msgspec
import numpy as np
import numpy.typing as npt

from wallfinder.analysis.critpath.change import UNCHANGED, Change
from wallfinder.analysis.critpath.lever import Cuts
from wallfinder.analysis.critpath.model import I64, MAX_ROUNDS, NEVER, NS, StepGraph
from wallfinder.analysis.critpath.onepass import Plan, longest_path
from wallfinder.analysis.gpu import COMM

ONE_PASS_AFTER = 128
"""Fixed-point rounds after which the replay takes the longest path in one pass over the graph
in dependency order instead, at most (`one_pass_pays`)."""


def one_pass_pays(nodes: int) -> int:
    """The rounds past which the one pass costs less than iterating on a graph of `nodes`:
    a round is a few vectorised passes (a fixed cost, then a few ns a node), the one pass a
    Python loop over the device's ops and the host chain's heads (`onepass`), with its
    dependency order found once per graph; measured on graphs of 2,000 to 65,000 nodes (a
    sync-heavy step: 42,000 calls in 522 stretches, 22,000 ops), about nodes / 850 rounds,
    between 32 and ONE_PASS_AFTER. Either way the times are the same."""
    return min(max(nodes // 850, 32), ONE_PASS_AFTER)


class Timing(msgspec.Struct, frozen=True, eq=False):
    """A replay: when each call and op started and ended, and the mean step."""

    call_start: I64
    call_end: I64
    drain: I64
    op_start: I64
    op_end: I64
    ready: I64
    dep_end: I64
    released: I64
    end: int
    """Where the last step's window ends."""
    step_s: float
    rounds: int


def replay(
    g: StepGraph,
    change: Change = UNCHANGED,
    one_pass_at: int = 0,
    orders: dict[bool, Plan | None] | None = None,
    cuts: Cuts | None = None,
) -> Timing:
    """Re-time the graph with `change` applied: the longest path from `t0`, by max-plus scans
    iterated to the fixed point; a graph still moving after the rounds the one pass costs
    (`one_pass_pays`: many syncs and waits in a row), or whose host chain waits for the
    device more times than that, is solved in one pass in dependency order, which gives the
    same times and the rounds the iteration would have taken (`longest_path`).
    `one_pass_at`: the round that takes the one pass instead (a what-if on a graph whose
    unchanged replay needed it takes it at once: its times are the same). `orders`: the
    dependency orders the graph's replays found and their one passes' `Plan`, by edge set,
    shared between them (filled here)."""
    pays = one_pass_pays(g.gap.size + g.dur.size)
    orders = {} if orders is None else orders
    gap_i, cost_i, dur_i, lat_i = _weights(g, change, cuts)
    use_sync = not change.sync
    synced = (g.drained_by >= 0) & (use_sync | g.blocked[np.maximum(g.drained_by, 0)])
    # What does not change from round to round, computed once: long graphs take thousands of
    # rounds, and each round updates only the rows an edge can move.
    host = _HostScan(g, gap_i, cost_i, synced)
    device = _DeviceScan(g, dur_i, lat_i, change.overlap)
    drains = _Drains(g, synced)
    del lat_i, synced
    if not one_pass_at:
        # The host chain is one resource: each call that waits for the device waits for work
        # launched since the one before it waited, so a round settles about one such wait
        # (522 waits took 684 rounds on the sync-heavy V100 step, 84 took 86 on a B200 one).
        # More of them than the one pass costs in rounds: it is taken at once.
        one_pass_at = 1 if host.waits.size > pays else pays
    rounds = solved = 0
    op_end = np.zeros(g.dur.size, np.int64)
    drain_w = np.full(host.waits.size, NEVER, np.int64)
    while True:
        rounds += 1
        host.scan(drain_w)
        new_end = device.scan(host.call_start)
        if rounds > 1 and np.array_equal(new_end, op_end):
            rounds = max(rounds, solved)
            break
        solved = 0  # (were the one pass's ends not the fixed point, iterate on from them)
        op_end = new_end
        if rounds == one_pass_at:
            # Still moving: the longest path in one pass over the graph in dependency order,
            # checked by the next round (it must not move it).
            longest = _one_pass(g, orders, use_sync, host, device, drains, gap_i, cost_i, dur_i)
            if longest is not None:
                op_end, solved = longest
        device.settle(op_end)
        if host.waits.size:
            drain_w = np.maximum.reduceat(op_end[drains.rows], drains.starts)
        if rounds >= MAX_ROUNDS:
            break
    return _timing(g, change, host, device, op_end, drain_w, rounds)


def moves(g: StepGraph, change: Change, cuts: Cuts | None = None) -> bool:
    """Whether `change` (with a lever's `cuts`) moves anything the replay reads on `g`: its
    weights (host gaps, call costs, op durations, launch latencies), its sync edges, the
    collectives an overlap starts early (and the floor it takes without them), or the host
    work after the last call. A change that moves nothing replays to the unchanged graph's
    times, so it need not be replayed."""
    if change.sync and bool(((g.drained_by >= 0) & ~g.blocked[np.maximum(g.drained_by, 0)]).any()):
        return True
    if change.overlap and bool((g.cls == COMM).any()):
        return True
    if change.host != 1.0 and g.tail > 0:
        return True
    base = _weights(g, UNCHANGED, None)
    return not all(
        np.array_equal(a, b) for a, b in zip(_weights(g, change, cuts), base, strict=True)
    )


def _weights(g: StepGraph, change: Change, cuts: Cuts | None) -> tuple[I64, I64, I64, I64]:
    """The graph's weights with `change` applied, in whole ns: per call the host gap before
    it and its cost; per op its duration and its launch path's latency."""
    other = g.gap - g.gap_data - g.gap_comm
    gap = g.gap.astype(np.float64)
    cost = g.cost.astype(np.float64)
    if change.data:
        gap = gap - g.gap_data
    if change.host != 1.0:
        # One-off start-up (`once`) is not host work a cut shrinks: no later step pays it.
        cut = other if g.once is None else np.where(g.once, 0, other)
        gap = gap - cut + cut / change.host
        fixed = 0.0 if g.cost_fixed is None else g.cost_fixed
        kept = g.sync | g.blocked if g.once is None else g.sync | g.blocked | g.once
        cost = np.where(kept, cost, fixed + (cost - fixed) / change.host)
    dur = g.dur.astype(np.float64)
    lat = g.lat.astype(np.float64)
    if change.host != 1.0:
        scaled = lat / change.host
        if g.once is not None:  # a launch inside a one-off stretch: its path is start-up
            scaled = np.where((g.call >= 0) & g.once[np.maximum(g.call, 0)], lat, scaled)
        lat = scaled
    if change.fuse:
        dur = np.minimum(dur, g.fused)
    if change.matmul is not None:
        known = np.isfinite(g.roof_time)
        # At P of the roof, a kernel now at R of it takes R / P of its time.
        dur = np.where(known, dur * np.minimum(g.roof_time / change.matmul, 1.0), dur)
    if change.accum and g.accum is not None:
        # The micro-steps' all-reduces do not run: each takes no time, so what waited for it
        # waits only for what it waited for (its bucket's backward kernel). Its launch stays
        # (DDP still launches the backward's kernels), and so do the waits no edge explains,
        # kept as fixed delays as under every change.
        dur = np.where(g.accum, 0.0, dur)
    if cuts is not None:
        # A strategy lever: its collectives' time that the change hides or shrinks.
        dur = np.maximum(dur - cuts.op, 0.0)
        cost = np.maximum(cost - cuts.call, 0.0)
        gap = np.maximum(gap - cuts.gap, 0.0)
    cost_i = np.rint(cost).astype(np.int64)
    if change.sync:
        cost_i = np.where(g.sync, 0, cost_i)
    return (
        np.rint(gap).astype(np.int64),
        cost_i,
        np.rint(dur).astype(np.int64),
        np.rint(lat).astype(np.int64),
    )


class _HostScan:
    """The host chain's round: per thread, e_i = max(e_{i-1} + gap_i + cost_i, drain_i +
    cost_i), from 0; each call starts after the one before it on its chain. Only the calls
    that drain ops wait for the device (`waits`, their drain above NEVER): the chain's running
    maximum is taken over them alone, and each call reads that of the last of them at or
    before it on its chain. Each round's times are written over the last round's, in place
    (`call_start`, `call_end`): a round's temporaries were most of the replay's peak memory."""

    def __init__(
        self, g: StepGraph, gap_i: I64, cost_i: I64, synced: npt.NDArray[np.bool_]
    ) -> None:
        n_calls = g.gap.size
        a = np.cumsum(gap_i + cost_i)
        c_seg = np.cumsum(g.call_first) - 1
        self.a_seg = a - (a - gap_i - cost_i)[np.flatnonzero(g.call_first)][c_seg]
        del a
        self.step_gap = np.where(g.offset >= 0, gap_i, g.offset)
        self.waits = np.unique(g.drained_by[synced])
        last = np.searchsorted(self.waits, np.arange(n_calls), side="right") - 1
        after_wait = last >= 0
        after_wait[after_wait] = c_seg[self.waits[last[after_wait]]] == c_seg[after_wait]
        self.last = np.maximum(last, 0)
        self.wait_seg = c_seg[self.waits]
        self.wait_base = cost_i[self.waits] - self.a_seg[self.waits]
        self.before_waits = np.flatnonzero(~after_wait)
        self.first_calls = np.flatnonzero(g.call_first)
        self.call_end = np.empty(n_calls, np.int64)
        self.call_start = np.empty(n_calls, np.int64)

    def scan(self, drain_w: I64) -> None:
        """The calls' times, given each wait's drain (`drain_w`)."""
        call_end, call_start = self.call_end, self.call_start
        if self.waits.size:
            b = np.where(drain_w > NEVER, drain_w + self.wait_base, NEVER)
            lift = np.maximum(_seg_max(b, self.wait_seg), 0)
            np.take(lift, self.last, out=call_end)
            call_end[self.before_waits] = 0
            call_end += self.a_seg
        else:
            call_end[:] = self.a_seg
        # Each call starts after the one before it on its chain (a chain's first, from 0).
        call_start[1:] = call_end[:-1]
        call_start[0] = 0
        call_start[self.first_calls] = 0
        call_start += self.step_gap


class _DeviceScan:
    """The streams' round: per stream, e_k = max(e_{k-1} + gap_k + dur_k, r_k + dur_k), where
    an op is ready (r_k) at the latest of its launch, the host call that released it and the
    ops it waits for on other streams (`dep_end`, settled from the last round's ends). With
    `overlap`, a collective's wait for the op before it on another stream ends when that op
    starts (its duration and the gap after it come off the edge), and likewise the measured
    order across streams into a collective."""

    def __init__(self, g: StepGraph, dur_i: I64, lat_i: I64, overlap: bool) -> None:
        n_ops = g.dur.size
        self.dur_i = dur_i
        self.seg = np.cumsum(g.stream_first) - 1
        w = np.cumsum(dur_i + g.stream_gap)
        self.w_seg = w - (w - dur_i - g.stream_gap)[np.flatnonzero(g.stream_first)][self.seg]
        del w
        dep_back = np.zeros(n_ops, np.int64)
        self.after_back = np.zeros(n_ops, np.int64)
        if overlap:
            early = (g.cls == COMM) & (g.dep >= 0)
            dep_back = np.where(early, dur_i[np.maximum(g.dep, 0)] + g.dep_gap, 0)
            self.after_back = np.where(
                (g.cls == COMM) & (g.after >= 0), dur_i[np.maximum(g.after, 0)], 0
            )
        self.has_call = g.call >= 0
        self.call_rows = np.flatnonzero(self.has_call)
        # Every op's launch delay and wait across streams (the one pass reads them by op).
        self.op_delay, self.op_dep_add = lat_i + g.extra, g.dep_gap - dep_back
        self.call_of, self.delay = g.call[self.call_rows], self.op_delay[self.call_rows]
        self.ready = g.fixed.copy()
        self.released_rows = np.flatnonzero(g.host >= 0)
        self.host_call = g.host[self.released_rows]
        self.host_lat = g.host_lat[self.released_rows]
        self.released = np.full(n_ops, NEVER, np.int64)
        self.after_rows = np.flatnonzero(g.after >= 0)
        self.after_op = g.after[self.after_rows]
        self.after_less = self.after_back[self.after_rows]
        self.dep_rows = np.flatnonzero(g.dep >= 0)
        self.dep_op, self.dep_add = g.dep[self.dep_rows], self.op_dep_add[self.dep_rows]
        self.dep_and_after = g.after[self.dep_rows] >= 0
        self.dep_end = np.full(n_ops, NEVER, np.int64)
        self._r = np.empty(n_ops, np.int64)

    def scan(self, call_start: I64) -> I64:
        """The ops' ends, given the calls' starts and the waits settled last round."""
        r = self._r
        self.ready[self.call_rows] = call_start[self.call_of] + self.delay
        self.released[self.released_rows] = call_start[self.host_call] + self.host_lat
        np.maximum(self.ready, self.dep_end, out=r)
        np.maximum(r, self.released, out=r)
        r += self.dur_i
        r -= self.w_seg
        new_end = _seg_max(r, self.seg)
        new_end += self.w_seg
        return new_end

    def settle(self, op_end: I64) -> None:
        """Each op's waits across streams, from the ops' ends (`op_end`)."""
        dep_end = self.dep_end
        dep_end[self.after_rows] = op_end[self.after_op] - self.after_less
        dep_end[self.dep_rows] = np.maximum(
            op_end[self.dep_op] + self.dep_add,
            np.where(self.dep_and_after, dep_end[self.dep_rows], NEVER),
        )


class _Drains:
    """The drain edges: the ops each wait drains (`rows`, grouped by their wait: `group`),
    and where each group starts (`starts`); each wait's drain is the latest end in its
    group."""

    def __init__(self, g: StepGraph, synced: npt.NDArray[np.bool_]) -> None:
        rows = np.flatnonzero(synced)
        self.rows = rows[np.argsort(g.drained_by[rows], kind="stable")]
        self.group = g.drained_by[self.rows]
        self.starts = np.flatnonzero(np.r_[True, self.group[1:] != self.group[:-1]])


def _one_pass(
    g: StepGraph,
    orders: dict[bool, Plan | None],
    use_sync: bool,
    host: _HostScan,
    device: _DeviceScan,
    drains: _Drains,
    gap_i: I64,
    cost_i: I64,
    dur_i: I64,
) -> tuple[I64, int] | None:
    """The ops' ends at the fixed point and the rounds to it, by `longest_path` (None: the
    graph has a cycle, or the iteration would stop at MAX_ROUNDS)."""
    # The order and the pass's layout depend on the edges alone: one per edge set (the sync
    # what-if drops the drains, and with them the host chain's heads), kept for the graph's
    # other replays.
    if use_sync not in orders:
        orders[use_sync] = Plan.of(g, drains.rows, drains.group)
    plan = orders[use_sync]
    if plan is None:
        return None
    return longest_path(
        g,
        plan.order,
        host.step_gap,
        gap_i + cost_i,
        cost_i,
        dur_i,
        device.op_delay,
        device.op_dep_add,
        device.after_back,
        drains.rows,
        drains.group,
        plan,
    )


def _timing(
    g: StepGraph,
    change: Change,
    host: _HostScan,
    device: _DeviceScan,
    op_end: I64,
    drain_w: I64,
    rounds: int,
) -> Timing:
    """The replay's times, from the fixed point's."""
    drain = np.full(g.gap.size, NEVER, np.int64)
    drain[host.waits] = drain_w
    has_call, call_end = device.has_call, host.call_end
    # The range ends where the last step's ops end (or its host chain, with no ops).
    # As the measured windows: the last step ends with the device work it launched.
    end = int(op_end[has_call].max()) if has_call.any() else 0
    if g.tail >= 0 or not has_call.any():
        end = max(end, int(call_end.max(initial=0)) + int(max(g.tail, 0) / change.host))
    cut = g.dur - device.dur_i
    if change.overlap:
        # Its floor leaves the collectives out already: what `accum` takes off them is not
        # taken off it again.
        cut = np.where(g.cls == COMM, 0, cut)
    return Timing(
        call_start=host.call_start,
        call_end=call_end,
        drain=drain,
        op_start=op_end - device.dur_i,
        op_end=op_end,
        ready=device.ready,
        dep_end=device.dep_end,
        released=device.released,
        end=end,
        # The device's own floor: its busy time less what the change takes off its ops.
        step_s=max(
            float(end - g.origin) * NS / g.steps,
            (g.busy_other_s if change.overlap else g.busy_s) - float(np.sum(cut)) * NS / g.steps,
        ),
        rounds=rounds,
    )


def _seg_max(values: I64, seg: I64) -> I64:
    """The running maximum of `values` within each segment (`seg`: the segment of each entry,
    non-decreasing): one pass, each segment lifted above the ones before it."""
    if values.size == 0:
        return values
    real = values > NEVER
    floor = min(int(values.min(where=real, initial=_BIG)) - 1, -1) if real.any() else -1
    out: I64 = np.where(real, values, floor)
    span = int(out.max()) - int(out.min()) + 1
    # In place: the replay calls this thousands of times on long graphs.
    shift = seg * span
    out += shift
    np.maximum.accumulate(out, out=out)
    out -= shift
    return out


_BIG = np.iinfo(np.int64).max
