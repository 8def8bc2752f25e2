"""The replay's one pass: the longest path over the graph in dependency order, which gives
the times the rounds iterate to, and how many rounds they take (for graphs whose iteration
would take many).

The host chain is compressed first: between two calls that wait for the device (a sync's or
a blocked launch's drains) or a chain's first call, each call ends a fixed time after the
one before (its host gap and cost), so a stretch of them is one node, its head, and every
call in it is the head's time plus its offset. The pass then visits the heads and the device
ops alone (a few hundred heads for tens of thousands of calls on a sync-heavy step), each
with its inputs read from flat lists, a time and its edge count packed in one integer."""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from itertools import islice

import msgspec
import numpy as np
import numpy.typing as npt

from wallfinder.analysis.critpath.model import I64, MAX_ROUNDS, StepGraph

NONE = -1


class Segments(msgspec.Struct, frozen=True, eq=False):
    """The host chain cut into stretches that each start at a head: a chain's first call or
    a call with drains (`group_of`: the wait of each drained op, grouped). Per call, its
    stretch (`seg`) and its end's offset from its head's (`off`, the host's own time between
    them); per stretch, its head (`heads`)."""

    heads: I64
    seg: I64
    off: I64

    @classmethod
    def of(cls, g: StepGraph, inc: I64, group_of: I64) -> Segments:
        head = g.call_first.copy()
        head[group_of] = True
        heads = np.flatnonzero(head)
        seg = np.cumsum(head) - 1
        a = np.cumsum(inc)
        return cls(heads, seg, a - a[heads][seg])


Inputs = tuple[list[npt.NDArray[np.intp]], list[npt.NDArray[np.intp]], npt.NDArray[np.intp]]


def _inputs(g: StepGraph, s: Segments, group_of: I64) -> Inputs:
    """The compressed graph's nodes (ops 0..n_ops-1, then the heads) and, per node, its
    inputs: per op, the stretches its launch and its release read (their calls' predecessors),
    the ops it stays after and waits for across streams, the op before it on its stream; per
    head, the stretch before it. As node indices, with `never` (no such input) and `zero` (a
    time of 0: the chain's start) past the nodes. Also each head's drained ops' wait, as
    heads' nodes."""
    n_ops, n_heads = g.dur.size, s.heads.size
    never, zero = n_ops + n_heads, n_ops + n_heads + 1
    first = g.call_first

    def stretch_before(calls: I64) -> npt.NDArray[np.intp]:
        # A call reads the end of the one before it on its chain, which is in some stretch;
        # a chain's first reads the start (0).
        c = np.maximum(calls, 0)
        return np.where(first[c], zero, n_ops + s.seg[np.maximum(c - 1, 0)])

    launch = np.where(g.call >= 0, stretch_before(g.call), zero)
    release = np.where(g.host >= 0, stretch_before(g.host), never)
    after = np.where(g.after >= 0, g.after, never)
    dep = np.where(g.dep >= 0, g.dep, never)
    prev = np.where(g.stream_first, never, np.arange(n_ops) - 1)
    h = s.heads
    head_prev = np.where(first[h], zero, n_ops + s.seg[np.maximum(h - 1, 0)])
    wait_of = n_ops + s.seg[group_of]
    return [launch, release, after, dep, prev], [head_prev], wait_of


Layout = tuple[Segments, Inputs]


def _layout(g: StepGraph, group_of: I64) -> Layout:
    """The host chain's stretches for the drains `group_of` and the compressed graph's
    inputs (`_inputs`): what the order and the one pass both read of an edge set."""
    s = Segments.of(g, np.zeros(g.gap.size, np.int64), group_of)
    return s, _inputs(g, s, group_of)


def dependency_order(
    g: StepGraph, synced_rows: I64, group_of: I64, layout: Layout | None = None
) -> I64 | None:
    """The compressed graph's nodes (ops, then the heads of `Segments`) in an order where
    each comes after every node it depends on; None when the graph has a cycle.
    `synced_rows`, `group_of`: the ops each sync drains and their sync (the drain edges,
    which the `sync` what-if removes); the other edges are the graph's own.

    The measured order is tried first (`_measured_order`), and taken when every edge goes
    forward in it: a graph read from a trace is in it, and any order that keeps the edges
    gives the one pass the same times. Else Kahn's traversal finds one. `layout`: the edge
    set's `_layout`, where the caller has it."""
    s, (op_in, head_in, wait_of) = layout or _layout(g, group_of)
    n_ops = g.dur.size
    nodes = n_ops + s.heads.size
    # Node ids fit 32 bits (the replayed range is capped far below), which halves the edges.
    ids = np.int32 if nodes < 2**31 else np.int64
    src = np.concatenate([*op_in, *head_in, synced_rows], dtype=ids)
    dst = np.concatenate(
        [np.arange(n_ops)] * len(op_in) + [n_ops + np.arange(s.heads.size), wait_of], dtype=ids
    )
    real = src < nodes
    src, dst = src[real], dst[real]
    measured = _measured_order(g, s.heads.size, synced_rows, wait_of - n_ops)
    if measured is not None:
        at = np.empty(nodes, np.int64)
        at[measured] = np.arange(nodes)
        if bool((at[src] < at[dst]).all()):
            return measured
    return _kahn(nodes, src, dst)


def _measured_order(g: StepGraph, n_heads: int, drained: I64, wait: I64) -> I64 | None:
    """The nodes in the order the trace saw them: the ops by their measured start (`row`:
    the device's ops are in that order), each head of the host chain after the ops drained
    by it and by the heads before it (it returned after they ended), the heads in chain
    order. None: the ops' rows are not in the trace's order (the CPU as the device)."""
    if g.row.size and int(g.row.min()) < 0:
        return None
    latest = np.full(n_heads, -1, np.int64)
    np.maximum.at(latest, wait, g.row[drained])
    key = np.concatenate([2 * g.row, 2 * np.maximum.accumulate(latest) + 1])
    # (Stable: heads of one key stay in chain order.)
    return np.argsort(key, kind="stable").astype(np.int64)


def _kahn(
    nodes: int, src: npt.NDArray[np.signedinteger], dst: npt.NDArray[np.signedinteger]
) -> I64 | None:
    """The nodes in dependency order by Kahn's traversal of the edges `src` -> `dst`; None
    when they hold a cycle."""
    indeg = np.bincount(dst, minlength=nodes).tolist()
    sptr = np.zeros(nodes + 1, np.int64)
    np.cumsum(np.bincount(src, minlength=nodes), out=sptr[1:])
    # Each node's successors (memoryviews, read one element at a time, not lists of ints).
    succ = dst[np.argsort(src, kind="stable")].data
    del src, dst
    ptr = sptr.data
    order = array("q")
    visit = order.append
    stack = [v for v in range(nodes) if indeg[v] == 0]
    while stack:
        v = stack.pop()
        visit(v)
        for w in succ[ptr[v] : ptr[v + 1]]:
            indeg[w] -= 1
            if indeg[w] == 0:
                stack.append(w)
    return np.frombuffer(order, np.int64) if len(order) == nodes else None


class Plan:
    """What the one pass reads that depends on the graph and its edge set alone, laid out
    once and kept for the graph's replays (a what-if changes weights, not edges): the
    compressed graph's inputs (`_inputs`), the ops in `order` as runs between the heads with
    their common inputs in that order, and each head's drained ops. Of a head's drained ops
    on one stream only the last can bind where no op on the stream ends before the one before
    it (`latest_drained`); the pass reads those alone then."""

    def __init__(
        self,
        g: StepGraph,
        order: I64,
        synced_rows: I64,
        group_of: I64,
        layout: Layout | None = None,
    ) -> None:
        n_ops = g.dur.size
        self.order = order
        self.s, (op_in, (head_prev,), _) = layout or _layout(g, group_of)
        n_heads = self.s.heads.size
        launch, release, after, dep, prev = op_in
        wait_seg = self.s.seg[group_of]
        # Read one element at a time from memoryviews, not lists: a list holds a Python int
        # per element (some 30 bytes more each, tens of MB over a large graph's columns).
        self.dptr = np.searchsorted(wait_seg, np.arange(n_heads + 1)).data
        self.drained = np.ascontiguousarray(synced_rows, np.int64).data
        # The last of each head's drained ops on each stream (the ops are by stream, then
        # start; a group's rows in that order): the one that ends last there when no op on
        # the stream ends before the one before it.
        rows = np.asarray(synced_rows, np.int64)
        stream = np.cumsum(g.stream_first) - 1
        if rows.size:
            by_group = np.lexsort((rows, stream[rows], wait_seg))
            ordered = rows[by_group]
            g_seg, g_stream = wait_seg[by_group], stream[ordered]
            last = np.r_[(g_seg[1:] != g_seg[:-1]) | (g_stream[1:] != g_stream[:-1]), True]
            kept, kept_seg = ordered[last], g_seg[last]
        else:
            kept, kept_seg = rows, wait_seg
        self.latest_dptr = np.searchsorted(kept_seg, np.arange(n_heads + 1)).data
        self.latest_drained = np.ascontiguousarray(kept, np.int64).data
        self.hs, self.dp = (np.ascontiguousarray(x, np.int64).data for x in (release, dep))
        self.hp = np.ascontiguousarray(head_prev, np.int64).data
        # The ops in the order, their common inputs laid out in it (read in step, not looked
        # up), as runs between the heads. Few ops are released by a later call or wait for
        # an op across streams: the others skip those two inputs.
        is_head = order >= n_ops
        self.ops = order[~is_head]
        self.run: list[int] = np.diff(
            np.flatnonzero(is_head) - np.arange(int(is_head.sum())), prepend=0
        ).tolist()
        rare = (g.host >= 0) | (g.dep >= 0)
        self.ordered_in = tuple(
            np.ascontiguousarray(x[self.ops], np.int64).data for x in (launch, after, prev)
        )
        self.rare = rare[self.ops].data
        self.heads = order[is_head].data

    @classmethod
    def of(cls, g: StepGraph, synced_rows: I64, group_of: I64) -> Plan | None:
        """The plan of `g` with these drains, in its `dependency_order` (None: a cycle), the
        edge set laid out once for both."""
        layout = _layout(g, group_of)
        order = dependency_order(g, synced_rows, group_of, layout)
        return None if order is None else cls(g, order, synced_rows, group_of, layout)


def longest_path(
    g: StepGraph,
    order: I64,
    step_gap: I64,
    inc: I64,
    cost: I64,
    dur: I64,
    delay: I64,
    dep_add: I64,
    after_less: I64,
    synced_rows: I64,
    group_of: I64,
    plan: Plan | None = None,
) -> tuple[I64, int] | None:
    """The ops' ends at the replay's fixed point, by one pass over the compressed graph in
    dependency order (`order`, from `dependency_order`), and the rounds the iteration takes to
    it: a round settles the paths with one more edge read from the previous round (a sync's
    drain, a wait across streams), so the rounds are two more than the most such edges on the
    fewest-edge longest path to any op. None when the iteration would stop at MAX_ROUNDS (it
    is then iterated). `delay`, `dep_add`, `after_less`: per op, read where it has a launch,
    a wait across streams, an order after one. `plan`: the graph's `Plan` for `order` and
    these drains, where a replay before laid it out (else laid out here)."""
    if plan is None:
        plan = Plan(g, order, synced_rows, group_of)
    n_ops = g.dur.size
    heads_at = plan.s.heads
    n_heads = heads_at.size
    a = np.cumsum(inc)
    off = a - a[heads_at][plan.s.seg]
    # A time t reached over c edges read from a previous round is t * m - c: the larger time
    # wins a max, and of equal times the fewer edges (the rounds count the fewest). m is
    # above any path's edge count, so the two never mix.
    m = 1 << (n_ops + n_heads + 1).bit_length()
    first = g.call_first

    def reach(calls: I64, add: I64) -> I64:
        # What a launch or a release adds to the stretch it reads: the calls from its head
        # to the one before it, then the host gap before it and the op's own delay.
        c = np.maximum(calls, 0)
        return np.where(first[c], 0, off[np.maximum(c - 1, 0)]) + step_gap[c] + add

    launch_add = np.where(g.call >= 0, reach(g.call, delay), g.fixed)
    release_add = np.where(g.host >= 0, reach(g.host, g.host_lat), 0)
    h = heads_at
    head_add = np.where(first[h], 0, off[np.maximum(h - 1, 0)]) + inc[h]
    # Each op's duration is added to each of its inputs up front (the latest input plus
    # the duration is the latest of the inputs plus it): one addition fewer per op.
    weights = (
        launch_add + dur,
        release_add + dur,
        dur - after_less,
        dep_add + dur,
        g.stream_gap + dur,
        head_add,
        cost[h],
    )
    # "Never" is below any path's time (the sum of the graph's largest weights over every
    # node), kept small: Python adds integers of a few machine words fastest.
    largest = max((int(np.abs(w).max()) for w in weights if w.size), default=0)
    never = -4 * (n_ops + n_heads + 1) * (largest + 1) * m
    lc, hc, ac, dc, pc, head_c, drain_c = (
        _scaled(w, m, -1 if i in (2, 3, 6) else 0) for i, w in enumerate(weights)
    )
    # An op on a stream ends no earlier than the one before it there where no weight along
    # the stream is negative: of a head's drained ops, the last on each stream then binds.
    monotone = not weights[4].size or int(weights[4].min()) >= 0
    dptr, drained = (
        (plan.latest_dptr, plan.latest_drained) if monotone else (plan.dptr, plan.drained)
    )
    hs, dp, hp = plan.hs, plan.dp, plan.hp
    ops = plan.ops
    ordered = zip(
        ops.data,
        *plan.ordered_in,
        *(_in_order(w, ops) for w in (lc, ac, pc)),
        plan.rare,
        strict=True,
    )
    x_of: list[int] = [0] * (n_ops + n_heads) + [never, 0]
    for j, r in zip(plan.heads, plan.run, strict=True):
        _ops(islice(ordered, r), x_of, hs, hc, dp, dc)
        j -= n_ops
        x = x_of[hp[j]] + head_c[j]
        add = drain_c[j]
        for k in drained[dptr[j] : dptr[j + 1]]:
            y = x_of[k] + add
            if y > x:
                x = y
        x_of[n_ops + j] = x
    _ops(ordered, x_of, hs, hc, dp, dc)
    packed = x_of[:n_ops]
    try:
        p = np.array(packed, np.int64)
        ends = -((-p) // m)
        edges = ends * m - p
    except OverflowError:  # (times past what int64 holds packed: unpacked one by one)
        ends = np.array([-((-x) // m) for x in packed], np.int64)
        edges = np.array([-((-x) // m) * m - x for x in packed], np.int64)
    rounds = 2 + int(edges.max(initial=0))
    if rounds >= MAX_ROUNDS:
        return None
    return ends, rounds


Weights = memoryview | list[int]


def _ops(
    ordered: Iterator[tuple[int, int, int, int, int, int, int, bool]],
    x_of: list[int],
    hs: memoryview,
    hc: Weights,
    dp: memoryview,
    dc: Weights,
) -> None:
    """The one pass over a run of ops (each with its launch's, its order's and its stream's
    inputs and their weights, and whether it has the rare two), into `x_of`."""
    for v, ls, af, pv, lw, aw, pw, few in ordered:
        x = x_of[ls] + lw
        if few:
            y = x_of[hs[v]] + hc[v]
            if y > x:
                x = y
            y = x_of[dp[v]] + dc[v]
            if y > x:
                x = y
        y = x_of[af] + aw
        if y > x:
            x = y
        y = x_of[pv] + pw
        if y > x:
            x = y
        x_of[v] = x


def _in_order(w: Weights, at: I64) -> Weights:
    """The weights `w` (`_scaled`'s) of the nodes `at`, in that order."""
    if isinstance(w, list):
        return [w[i] for i in at.tolist()]
    return np.asarray(w)[at].data


def _scaled(x: I64, m: int, plus: int = 0) -> Weights:
    """`x * m + plus`, read one element at a time: an int64 memoryview where it fits, else
    Python integers (exact either way)."""
    if x.size and int(np.abs(x).max()) >= (1 << 62) // m:
        return [int(v) * m + plus for v in x.tolist()]
    return np.ascontiguousarray(x * m + plus, np.int64).data
