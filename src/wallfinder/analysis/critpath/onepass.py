"""The replay's one pass: the longest path over the graph in dependency order, which gives
the times the rounds iterate to, and how many rounds they take (for graphs whose iteration
would take many)."""

from __future__ import annotations

from array import array

import numpy as np

from wallfinder.analysis.critpath.model import I64, MAX_ROUNDS, NEVER, StepGraph


def dependency_order(g: StepGraph, synced_rows: I64, group_of: I64) -> I64 | None:
    """The graph's nodes (calls, then ops: op k is node n_calls + k) in an order where each
    comes after every node it depends on, by Kahn's traversal; None when the graph has a
    cycle. `synced_rows`, `group_of`: the ops each sync drains and their sync (the drain
    edges, which the `sync` what-if removes); the other edges are the graph's own."""
    n_calls, n_ops = g.gap.size, g.dur.size
    first = g.call_first
    # The edges, node ids: calls, then ops.
    chain = np.flatnonzero(~first)
    launched = np.flatnonzero(g.call >= 0)
    launched = launched[~first[g.call[launched]]]
    hosted = np.flatnonzero(g.host >= 0)
    hosted = hosted[~first[g.host[hosted]]]
    streamed = np.flatnonzero(~g.stream_first)
    deps, afters = np.flatnonzero(g.dep >= 0), np.flatnonzero(g.after >= 0)
    nodes = n_calls + n_ops
    # Node ids fit 32 bits (the replayed range is capped far below), which halves the edges.
    ids = np.int32 if nodes < 2**31 else np.int64
    src = np.concatenate(
        [
            chain - 1,
            n_calls + synced_rows,
            g.call[launched] - 1,
            g.host[hosted] - 1,
            n_calls + streamed - 1,
            n_calls + g.dep[deps],
            n_calls + g.after[afters],
        ],
        dtype=ids,
    )
    dst = np.concatenate(
        [
            chain,
            group_of,
            n_calls + launched,
            n_calls + hosted,
            n_calls + streamed,
            n_calls + deps,
            n_calls + afters,
        ],
        dtype=ids,
    )
    del chain, launched, hosted, streamed, deps, afters
    indeg = np.bincount(dst, minlength=nodes).tolist()
    # Each node's successors: the edges grouped by their source, and where each group starts.
    sptr = np.zeros(nodes + 1, np.int64)
    np.cumsum(np.bincount(src, minlength=nodes), out=sptr[1:])
    by_src = np.argsort(src, kind="stable")
    del src
    # Read one element at a time: memoryviews, not lists (a list holds a Python int per
    # element: ~20 of them over a quarter of a million nodes is a few hundred MB). The order
    # is written to an array of int64 likewise, not a list of ints.
    succ = dst[by_src].data
    del dst, by_src
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
) -> tuple[I64, int] | None:
    """The ops' ends at the replay's fixed point, by one pass over the graph in dependency
    order (`order`, from `dependency_order`), and the rounds the iteration takes to it: a
    round settles the paths with one more edge read from the previous round (a sync's drain, a
    wait across streams), so the rounds are two more than the most such edges on the
    fewest-edge longest path to any op. None when the iteration would stop at MAX_ROUNDS (it
    is then iterated). `delay`, `dep_add`, `after_less`: per op, read where it has a launch,
    a wait across streams, an order after one."""
    n_calls, n_ops = g.gap.size, g.dur.size
    first = g.call_first
    nodes = n_calls + n_ops
    gptr = np.searchsorted(group_of, np.arange(n_calls + 1)).data
    drains = np.ascontiguousarray(synced_rows).data
    first_l, inc_l, cost_l, step_l = first.data, inc.data, cost.data, step_gap.data
    call_l, host_l, dep_l, after_l = g.call.data, g.host.data, g.dep.data, g.after.data
    delay_ll, dep_add_ll, after_less_ll = delay.data, dep_add.data, after_less.data
    fixed_l, host_lat_l = g.fixed.data, g.host_lat.data
    sfirst_l, sgap_l, dur_l = g.stream_first.data, g.stream_gap.data, dur.data
    value = [0] * nodes
    edges = [0] * nodes
    for v in order.data:  # (a memoryview: no list of the order's ints alongside)
        if v < n_calls:
            if first_l[v]:
                e, c = inc_l[v], 0
            else:
                e, c = value[v - 1] + inc_l[v], edges[v - 1]
            lo, hi = gptr[v], gptr[v + 1]
            if lo < hi:
                best, bc = NEVER, 0
                for k in drains[lo:hi]:
                    x, xc = value[n_calls + k], edges[n_calls + k] + 1
                    if x > best:
                        best, bc = x, xc
                    elif x == best and xc < bc:
                        bc = xc
                best += cost_l[v]
                if best > e:
                    e, c = best, bc
                elif best == e and bc < c:
                    c = bc
        else:
            k = v - n_calls
            ci = call_l[k]
            if ci >= 0:
                if first_l[ci]:
                    r, rc = step_l[ci] + delay_ll[k], 0
                else:
                    r, rc = value[ci - 1] + step_l[ci] + delay_ll[k], edges[ci - 1]
            else:
                r, rc = fixed_l[k], 0
            # Its other inputs, in place (a call per op was a third of the loop's time): the
            # host call that released it, then the ops it waits for on other streams (each
            # with the edges read from the previous round on it).
            h = host_l[k]
            if h >= 0:
                if first_l[h]:
                    x, xc = step_l[h] + host_lat_l[k], 0
                else:
                    x, xc = value[h - 1] + step_l[h] + host_lat_l[k], edges[h - 1]
                if x > r:
                    r, rc = x, xc
                elif x == r and xc < rc:
                    rc = xc
            o = after_l[k]
            if o >= 0:
                x, xc = value[n_calls + o] - after_less_ll[k], edges[n_calls + o] + 1
                if x > r:
                    r, rc = x, xc
                elif x == r and xc < rc:
                    rc = xc
            o = dep_l[k]
            if o >= 0:
                x, xc = value[n_calls + o] + dep_add_ll[k], edges[n_calls + o] + 1
                if x > r:
                    r, rc = x, xc
                elif x == r and xc < rc:
                    rc = xc
            e, c = r + dur_l[k], rc
            if not sfirst_l[k]:
                x, xc = value[v - 1] + sgap_l[k] + dur_l[k], edges[v - 1]
                if x > e:
                    e, c = x, xc
                elif x == e and xc < c:
                    c = xc
        value[v], edges[v] = e, c
    rounds = 2 + max(edges[n_calls:], default=0)
    if rounds >= MAX_ROUNDS:
        return None
    return np.array(value[n_calls:], np.int64), rounds
