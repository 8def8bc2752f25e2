"""The replay's one pass (`critpath.onepass`: the host chain compressed to its heads, a time
and its edge count packed in one integer) against a plain longest path over the whole graph,
node by node, on generated graphs: the same ops' ends and the same rounds."""

from __future__ import annotations

from graphlib import CycleError, TopologicalSorter

import numpy as np
import numpy.typing as npt
from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec.structs import replace

from wallfinder.analysis.critpath.model import NEVER, StepGraph
from wallfinder.analysis.critpath.onepass import Plan, dependency_order, longest_path

INT = np.int64


def graph(
    first: list[bool],
    call: list[int],
    host: list[int],
    after: list[int],
    dep: list[int],
    stream_first: list[bool],
    stream_gap: list[int],
    fixed: list[int],
    host_lat: list[int],
    row: list[int] | None = None,
) -> StepGraph:
    """A StepGraph with what the one pass reads (the rest empty); `row`: each op's place in
    the measured order (None: all 0)."""
    n_calls, n_ops = len(first), len(call)
    z_c, z_o = np.zeros(n_calls, INT), np.zeros(n_ops, INT)
    return StepGraph(
        t0=0,
        origin=0,
        gap=z_c,
        gap_data=z_c,
        gap_comm=z_c,
        after_data=z_c,
        cost=z_c,
        sync=np.zeros(n_calls, bool),
        blocked=np.zeros(n_calls, bool),
        offset=z_c,
        call_first=np.array(first, bool),
        call_step=np.zeros(n_calls, np.intp),
        row=z_o if row is None else np.array(row, INT),
        call=np.array(call, INT),
        fixed=np.array(fixed, INT),
        lat=z_o,
        dur=z_o,
        cls=np.zeros(n_ops, np.int8),
        stream_first=np.array(stream_first, bool),
        dep=np.array(dep, INT),
        dep_gap=z_o,
        after=np.array(after, INT),
        host=np.array(host, INT),
        host_lat=np.array(host_lat, INT),
        extra=z_o,
        stream_gap=np.array(stream_gap, INT),
        drained_by=np.full(n_ops, -1, INT),
        fused=np.zeros(n_ops),
        roof_time=np.zeros(n_ops),
        steps=1,
        tail=-1,
        measured_s=0.0,
        tie_ns=0,
    )


def reference(
    g: StepGraph,
    step_gap: list[int],
    inc: list[int],
    cost: list[int],
    dur: list[int],
    delay: list[int],
    dep_add: list[int],
    after_less: list[int],
    drained_by: list[int],
) -> tuple[list[int], int] | None:
    """The longest path from the start to every node of the whole graph, each call and op
    alone in a topological order (None: a cycle): its time, and of the paths that reach it,
    the fewest edges read from a previous round (drains, waits across streams); the rounds
    are two more than the most of those at any op."""
    n_calls, n_ops = g.gap.size, g.dur.size
    first, call, host = g.call_first.tolist(), g.call.tolist(), g.host.tolist()
    after, dep, sfirst = g.after.tolist(), g.dep.tolist(), g.stream_first.tolist()
    deps: dict[tuple[str, int], set[tuple[str, int]]] = {}
    for c in range(n_calls):
        deps[("c", c)] = {("c", c - 1)} if not first[c] else set()
        deps[("c", c)] |= {("o", k) for k in range(n_ops) if drained_by[k] == c}
    for k in range(n_ops):
        ins = {("c", x - 1) for x in (call[k], host[k]) if x >= 0 and not first[x]}
        ins |= {("o", x) for x in (after[k], dep[k]) if x >= 0}
        deps[("o", k)] = ins | ({("o", k - 1)} if not sfirst[k] else set())
    try:
        order = list(TopologicalSorter(deps).static_order())
    except CycleError:
        return None
    best: dict[tuple[str, int], tuple[int, int]] = {}

    def pick(options: list[tuple[int, int]]) -> tuple[int, int]:
        # The latest time; of equal times, the fewest edges.
        return max(options, key=lambda o: (o[0], -o[1]))

    def end_before(c: int) -> tuple[int, int]:
        return (0, 0) if first[c] else best[("c", c - 1)]

    for kind, i in order:
        if kind == "c":
            t, e = end_before(i)
            options = [(t + inc[i], e)]
            options += [
                (best[("o", k)][0] + cost[i], best[("o", k)][1] + 1)
                for k in range(n_ops)
                if drained_by[k] == i
            ]
        else:
            options = []
            if call[i] >= 0:
                t, e = end_before(call[i])
                options.append((t + step_gap[call[i]] + delay[i], e))
            else:
                options.append((int(g.fixed[i]), 0))
            if host[i] >= 0:
                t, e = end_before(host[i])
                options.append((t + step_gap[host[i]] + int(g.host_lat[i]), e))
            if after[i] >= 0:
                t, e = best[("o", after[i])]
                options.append((t - after_less[i], e + 1))
            if dep[i] >= 0:
                t, e = best[("o", dep[i])]
                options.append((t + dep_add[i], e + 1))
            t, e = pick(options)
            options = [(t + dur[i], e)]
            if not sfirst[i]:
                t, e = best[("o", i - 1)]
                options.append((t + int(g.stream_gap[i]) + dur[i], e))
        best[(kind, i)] = pick(options)
    ends = [best[("o", k)] for k in range(n_ops)]
    return [t for t, _ in ends], 2 + max((e for _, e in ends), default=0)


@st.composite
def graphs(draw: st.DrawFn, acyclic: bool = False) -> tuple[StepGraph, dict[str, list[int]]]:
    """A step's graph with its edges drawn at random: calls on one or two chains, ops on up
    to three streams, each op launched by a call (or placed where it ran), some released by
    a later call, after or waiting for ops on other streams, drained by a sync. Edges go
    forward in a drawn time (acyclic) unless a few go back (a cycle, which both must refuse;
    never where `acyclic`). The ops' rows (their measured order) are mostly their order in
    that time, as a trace gives them, else shuffled (an order the edges break)."""
    n_calls = draw(st.integers(1, 14))
    n_ops = draw(st.integers(1, 14))
    backward = not acyclic and draw(st.booleans()) and draw(st.integers(0, 9)) == 0
    # Calls at even times, ops at odd ones: an edge goes from an earlier time to a later.
    split = draw(st.integers(0, n_calls - 1))
    first = [i == 0 or i == split for i in range(n_calls)]
    op_time = sorted(draw(st.lists(st.integers(0, 2 * n_calls), min_size=n_ops, max_size=n_ops)))
    stream = draw(st.lists(st.integers(0, 2), min_size=n_ops, max_size=n_ops))
    # Sorted by (stream, time) as the graph keeps its ops.
    rows = sorted(range(n_ops), key=lambda k: (stream[k], op_time[k], k))
    t = [2 * op_time[k] + 1 for k in rows]
    s = [stream[k] for k in rows]
    stream_first = [k == 0 or s[k] != s[k - 1] for k in range(n_ops)]

    def earlier_call(k: int) -> int:
        below = [c for c in range(n_calls) if 2 * c < t[k]]
        return draw(st.sampled_from(below)) if below and draw(st.booleans()) else -1

    call = [earlier_call(k) for k in range(n_ops)]
    host = [
        c if c >= 0 and draw(st.integers(0, 3)) == 0 else -1
        for c in map(earlier_call, range(n_ops))
    ]

    def other_op(k: int) -> int:
        ok = [j for j in range(n_ops) if s[j] != s[k] and (t[j] < t[k] or backward)]
        return draw(st.sampled_from(ok)) if ok and draw(st.booleans()) else -1

    after = [other_op(k) for k in range(n_ops)]
    dep = [other_op(k) if draw(st.integers(0, 2)) == 0 else -1 for k in range(n_ops)]
    drained_by = []
    for k in range(n_ops):
        later = [c for c in range(n_calls) if 2 * c > t[k] or backward]
        drained_by.append(draw(st.sampled_from(later)) if later and draw(st.booleans()) else -1)
    small = st.integers(-5, 40)
    weights = {
        name: draw(st.lists(small, min_size=size, max_size=size))
        for name, size in (
            ("step_gap", n_calls),
            ("inc", n_calls),
            ("cost", n_calls),
            ("dur", n_ops),
            ("delay", n_ops),
            ("dep_add", n_ops),
            ("after_less", n_ops),
            ("stream_gap", n_ops),
            ("host_lat", n_ops),
            ("fixed", n_ops),
        )
    }
    weights["inc"] = [abs(x) for x in weights["inc"]]
    weights["dur"] = [abs(x) for x in weights["dur"]]
    weights["drained_by"] = drained_by
    # Ties in time broken as a trace's ops are (by stream, then start: any order would do).
    row = sorted(range(n_ops), key=lambda k: (t[k], k))
    if draw(st.integers(0, 3)) == 0:
        row = draw(st.permutations(row))
    g = graph(
        first,
        call,
        host,
        after,
        dep,
        stream_first,
        weights["stream_gap"],
        [NEVER if c >= 0 else f for c, f in zip(call, weights["fixed"], strict=True)],
        weights["host_lat"],
        [row.index(k) for k in range(n_ops)],
    )
    return g, weights


def _drained(w: dict[str, list[int]]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The ops a sync drains, grouped by the call that drains them (`longest_path`'s rows and
    groups)."""
    drained_by = np.array(w["drained_by"], INT)
    rows = np.flatnonzero(drained_by >= 0)
    rows = rows[np.argsort(drained_by[rows], kind="stable")]
    return rows, drained_by[rows]


@settings(max_examples=300, deadline=None)
@given(graphs())
def test_the_one_pass_gives_the_plain_longest_paths_ends_and_rounds(
    drawn: tuple[StepGraph, dict[str, list[int]]],
) -> None:
    g, w = drawn
    rows, group = _drained(w)
    expected = reference(
        g,
        w["step_gap"],
        w["inc"],
        w["cost"],
        w["dur"],
        w["delay"],
        w["dep_add"],
        w["after_less"],
        w["drained_by"],
    )
    order = dependency_order(g, rows, group)
    if expected is None:
        assert order is None
        return
    assert order is not None
    assert_in_dependency_order(g, w["drained_by"], order.tolist())
    got = longest_path(
        g,
        order,
        np.array(w["step_gap"], INT),
        np.array(w["inc"], INT),
        np.array(w["cost"], INT),
        np.array(w["dur"], INT),
        np.array(w["delay"], INT),
        np.array(w["dep_add"], INT),
        np.array(w["after_less"], INT),
        rows,
        group,
    )
    assert got is not None
    ends, rounds = got
    assert ends.tolist() == expected[0]
    assert rounds == expected[1]


@settings(max_examples=200, deadline=None)
@given(graphs(acyclic=True), st.lists(st.integers(-5, 40), min_size=28, max_size=28))
def test_one_plan_serves_every_replay_of_its_graph(
    drawn: tuple[StepGraph, dict[str, list[int]]], other: list[int]
) -> None:
    # The plan laid out once (by the first replay) and reused by a what-if's replay with
    # other weights: the same ends and rounds as the plain longest path under those weights,
    # also where an op's stream gap plus its duration is negative (every drained op read).
    g, w = drawn
    rows, group = _drained(w)
    order = dependency_order(g, rows, group)
    assert order is not None
    plan = Plan(g, order, rows, group)
    n_calls, n_ops = g.gap.size, g.dur.size

    def shifted(values: list[int], by: int) -> list[int]:
        return [v + other[(i + by) % len(other)] for i, v in enumerate(values)]

    names = ("step_gap", "inc", "cost", "dur", "delay", "dep_add", "after_less")
    for weights in (w, {k: shifted(w[k], i) for i, k in enumerate(names)}):
        inc, dur = [abs(x) for x in weights["inc"]], [abs(x) for x in weights["dur"]]
        gw = replace(g, stream_gap=np.array(shifted(w["stream_gap"], 3), INT))
        expected = reference(
            gw,
            weights["step_gap"][:n_calls],
            inc[:n_calls],
            weights["cost"][:n_calls],
            dur[:n_ops],
            weights["delay"][:n_ops],
            weights["dep_add"][:n_ops],
            weights["after_less"][:n_ops],
            w["drained_by"],
        )
        assert expected is not None
        got = longest_path(
            gw,
            order,
            *(
                np.array(x, INT)
                for x in (
                    weights["step_gap"],
                    inc,
                    weights["cost"],
                    dur,
                    weights["delay"],
                    weights["dep_add"],
                    weights["after_less"],
                )
            ),
            rows,
            group,
            plan,
        )
        assert got is not None
        assert got[0].tolist() == expected[0]
        assert got[1] == expected[1]


def assert_in_dependency_order(g: StepGraph, drained_by: list[int], order: list[int]) -> None:
    """`order` holds the compressed graph's nodes (the ops, then the host chain's heads: each
    chain's first call and each call that drains ops) once each, every node after each node
    it reads: an op after its launch's and its release's stretches (that of the call before
    each), the ops it stays after and waits for, and the op before it on its stream; a head
    after the stretch before it and the ops it drains."""
    n_calls, n_ops = g.gap.size, g.dur.size
    first = g.call_first.tolist()
    heads = [c for c in range(n_calls) if first[c] or c in drained_by]
    assert sorted(order) == list(range(n_ops + len(heads)))
    at = {v: i for i, v in enumerate(order)}

    def stretch(c: int) -> int:
        return n_ops + max(j for j, h in enumerate(heads) if h <= c)

    for k in range(n_ops):
        ins = [stretch(c - 1) for c in (int(g.call[k]), int(g.host[k])) if c >= 0 and not first[c]]
        ins += [x for x in (int(g.after[k]), int(g.dep[k])) if x >= 0]
        ins += [] if g.stream_first[k] else [k - 1]
        assert all(at[x] < at[k] for x in ins), (k, ins)
    for j, h in enumerate(heads):
        ins = [] if first[h] else [stretch(h - 1)]
        ins += [k for k in range(n_ops) if drained_by[k] == h]
        assert all(at[x] < at[n_ops + j] for x in ins), (h, ins)


def test_the_measured_order_is_taken_where_every_edge_goes_forward_in_it() -> None:
    # Two ops on two streams, no edge between them, and a host chain of one call that
    # drains nothing: every order holds the edges, and the one taken is the trace's (the
    # head first, as it drained nothing; the ops by their measured start), not a traversal's.
    g = graph([True], [-1, -1], [-1, -1], [-1, -1], [-1, -1], [True, True], [0, 0], [0, 5], [0, 0])
    none = np.zeros(0, INT)
    assert dependency_order(g, none, none).tolist() == [2, 0, 1]
    # Measured the other way round, the ops swap.
    swapped = graph(
        [True], [-1, -1], [-1, -1], [-1, -1], [-1, -1], [True, True], [0, 0], [5, 0], [0, 0], [1, 0]
    )
    assert dependency_order(swapped, none, none).tolist() == [2, 1, 0]


def test_a_drain_reads_an_earlier_op_that_ends_after_a_later_one_on_its_stream() -> None:
    # Two ops on one stream drained by the sync (call 1): the second starts before the first
    # ends (a negative gap) and ends first, so the drain waits for the first; the op that
    # call 2 launches after the sync starts after it. Of a stream's drained ops the last is
    # read alone only where none ends before the one before it.
    g = graph(
        [True, False, False],
        [0, 0, 2],
        [-1, -1, -1],
        [-1, -1, -1],
        [-1, -1, -1],
        [True, False, True],
        [0, -9, 0],
        [NEVER, NEVER, NEVER],
        [0, 0, 0],
        [0, 1, 2],
    )
    rows, group = np.array([0, 1], INT), np.array([1, 1], INT)
    order = dependency_order(g, rows, group)
    assert order is not None
    zero_c, zero_o = np.zeros(3, INT), np.zeros(3, INT)
    dur = np.array([10, 1, 5], INT)
    got = longest_path(
        g,
        order,
        zero_c,
        zero_c,
        zero_c,
        dur,
        zero_o,
        zero_o,
        zero_o,
        rows,
        group,
        Plan(g, order, rows, group),
    )
    assert got is not None
    assert got[0].tolist() == [10, 2, 15]
