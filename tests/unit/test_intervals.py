"""Interval arithmetic (`Coverage`, `split_at`) against a brute-force reference on small
integer intervals, where a set of intervals is the set of unit cells [x, x + 1) it covers."""

from __future__ import annotations

import itertools

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given
from hypothesis import strategies as st

from wallfinder.analysis import intervals as intervals_module
from wallfinder.analysis.intervals import Coverage, enclosing_of, split_at

I64 = npt.NDArray[np.int64]
LO, HI = 0, 40

Pairs = list[tuple[int, int]]


def arr(values: list[int]) -> I64:
    return np.array(values, dtype=np.int64)


def cov(pairs: Pairs) -> Coverage:
    return Coverage.of(arr([s for s, _ in pairs]), arr([e for _, e in pairs]))


def cells(pairs: Pairs) -> set[int]:
    """The unit cells covered by some interval (an interval with end <= start is empty)."""
    return {x for s, e in pairs for x in range(s, e)}


def runs(points: set[int]) -> Pairs:
    """Maximal runs of consecutive cells, as [start, end) intervals."""
    out: Pairs = []
    for x in sorted(points):
        if out and out[-1][1] == x:
            out[-1] = (out[-1][0], x + 1)
        else:
            out.append((x, x + 1))
    return out


intervals = st.lists(
    st.tuples(st.integers(LO, HI), st.integers(0, 12)).map(lambda p: (p[0], p[0] + p[1])),
    max_size=12,
)
nonempty_intervals = st.lists(
    st.tuples(st.integers(LO, HI), st.integers(1, 12)).map(lambda p: (p[0], p[0] + p[1])),
    max_size=12,
)
points = st.integers(LO - 5, HI + 20)


# Coverage.of / union -------------------------------------------------------------------------


@given(nonempty_intervals)
def test_coverage_is_the_maximal_runs_of_the_union(pairs: Pairs) -> None:
    c = cov(pairs)
    assert list(zip(c.starts.tolist(), c.ends.tolist(), strict=True)) == runs(cells(pairs))


@given(intervals)
def test_coverage_intervals_are_sorted_disjoint_and_before_is_the_running_total(
    pairs: Pairs,
) -> None:
    c = cov(pairs)
    assert (c.ends >= c.starts).all()
    assert (c.starts[1:] > c.ends[:-1]).all()
    lengths = c.ends - c.starts
    np.testing.assert_array_equal(c.before, np.cumsum(lengths) - lengths)
    assert c.total == len(cells(pairs))


@given(intervals, intervals)
def test_union_of_coverages_covers_the_union_of_cells(a: Pairs, b: Pairs) -> None:
    u = Coverage.union(cov(a), cov(b))
    assert u.total == len(cells(a) | cells(b))
    assert u.covered(arr([LO - 5]), arr([HI + 20])).tolist() == [len(cells(a) | cells(b))]


@given(intervals)
def test_coverage_of_intervals_in_start_order_is_that_of_any_order(pairs: Pairs) -> None:
    # In start order the input is read as it is (no sort); any other order is sorted first.
    in_order = sorted(pairs)
    starts, ends = arr([s for s, _ in in_order]), arr([e for _, e in in_order])
    before = (starts.copy(), ends.copy())
    a, b = Coverage.of(starts, ends), cov(list(reversed(pairs)))
    for x, y in ((a.starts, b.starts), (a.ends, b.ends), (a.before, b.before)):
        assert x.tolist() == y.tolist()
    # The input is neither changed nor shared with the result.
    assert starts.tolist() == before[0].tolist()
    assert ends.tolist() == before[1].tolist()
    assert not np.shares_memory(a.starts, starts)
    assert not np.shares_memory(a.ends, ends)


@given(intervals, st.lists(st.booleans(), min_size=12, max_size=12))
def test_coverage_of_chosen_sorted_intervals_is_that_of_the_chosen_ones_alone(
    pairs: Pairs, chosen: list[bool]
) -> None:
    in_order = sorted(pairs)
    starts, ends = arr([s for s, _ in in_order]), arr([e for _, e in in_order])
    rows = np.array(chosen[: len(in_order)], dtype=bool)
    got, want = Coverage.of_sorted(starts, ends, rows), Coverage.of(starts[rows], ends[rows])
    for x, y in ((got.starts, want.starts), (got.ends, want.ends), (got.before, want.before)):
        assert x.tolist() == y.tolist()
    assert got.total == len(cells([p for p, c in zip(in_order, rows.tolist(), strict=True) if c]))


# covered / covered_until -----------------------------------------------------------------------


@given(intervals, st.lists(st.tuples(points, points), min_size=1, max_size=8))
def test_covered_counts_the_covered_cells_of_each_window(
    pairs: Pairs, windows: list[tuple[int, int]]
) -> None:
    c = cov(pairs)
    covered = cells(pairs)
    got = c.covered(arr([a for a, _ in windows]), arr([b for _, b in windows]))
    want = [len(covered & set(range(a, b))) for a, b in windows]
    assert got.tolist() == want


@given(intervals, st.lists(points, min_size=1, max_size=8))
def test_covered_until_counts_the_covered_cells_before_each_time(
    pairs: Pairs, times: list[int]
) -> None:
    covered = cells(pairs)
    got = cov(pairs).covered_until(arr(times))
    assert got.tolist() == [sum(1 for x in covered if x < t) for t in times]


def test_covered_of_an_empty_coverage_is_zero() -> None:
    empty = cov([])
    assert empty.total == 0
    assert empty.covered(arr([0, 5]), arr([10, 20])).tolist() == [0, 0]
    assert empty.covered_until(arr([3])).tolist() == [0]


def test_covered_by_hand() -> None:
    c = cov([(10, 20), (15, 30), (40, 50)])
    assert c.starts.tolist() == [10, 40]
    assert c.ends.tolist() == [30, 50]
    assert c.covered(arr([0, 12, 25, 30, 45, 60]), arr([100, 18, 45, 40, 46, 70])).tolist() == [
        30,
        6,
        10,
        0,
        1,
        0,
    ]


def test_touching_intervals_merge_into_one() -> None:
    c = cov([(0, 5), (5, 8)])
    assert c.starts.tolist() == [0]
    assert c.ends.tolist() == [8]


def test_an_end_before_its_start_counts_as_empty() -> None:
    c = cov([(10, 4), (20, 25)])
    assert c.total == 5
    assert c.covered(arr([0]), arr([100])).tolist() == [5]


# gaps -------------------------------------------------------------------------------------------


@given(intervals, points, points)
def test_gaps_are_exactly_the_uncovered_cells_of_the_range(pairs: Pairs, lo: int, hi: int) -> None:
    gs, ge = cov(pairs).gaps(lo, hi)
    assert (ge > gs).all()
    assert (gs[1:] >= ge[:-1]).all()
    got = {x for s, e in zip(gs.tolist(), ge.tolist(), strict=True) for x in range(s, e)}
    assert got == set(range(lo, hi)) - cells(pairs)


@given(nonempty_intervals, points, points)
def test_gaps_between_nonempty_intervals_are_maximal(pairs: Pairs, lo: int, hi: int) -> None:
    gs, ge = cov(pairs).gaps(lo, hi)
    assert list(zip(gs.tolist(), ge.tolist(), strict=True)) == runs(
        set(range(lo, hi)) - cells(pairs)
    )


def test_gaps_by_hand() -> None:
    gs, ge = cov([(10, 20), (30, 40)]).gaps(0, 50)
    assert gs.tolist() == [0, 20, 40]
    assert ge.tolist() == [10, 30, 50]
    gs, ge = cov([(10, 20), (30, 40)]).gaps(15, 35)
    assert (gs.tolist(), ge.tolist()) == ([20], [30])
    gs, ge = cov([]).gaps(3, 9)
    assert (gs.tolist(), ge.tolist()) == ([3], [9])


# contains ---------------------------------------------------------------------------------------


@given(nonempty_intervals, st.lists(points, min_size=1, max_size=8), st.integers(0, 4))
def test_contains_is_true_from_a_start_to_the_end_plus_slack(
    pairs: Pairs, times: list[int], slack: int
) -> None:
    c = cov(pairs)
    merged = runs(cells(pairs))
    want = [any(s <= t <= e + slack for s, e in merged) for t in times]
    assert c.contains(arr(times), slack).tolist() == want


def test_contains_by_hand() -> None:
    c = cov([(10, 20)])
    assert c.contains(arr([9, 10, 15, 20, 21, 25, 26]), 5).tolist() == [
        False,
        True,
        True,
        True,
        True,
        True,
        False,
    ]
    assert cov([]).contains(arr([1])).tolist() == [False]


# split_at ---------------------------------------------------------------------------------------


def split_reference(pairs: Pairs, cuts: list[int]) -> list[tuple[int, int, int]]:
    out: list[tuple[int, int, int]] = []
    for i, (s, e) in enumerate(pairs):
        inner = sorted({c for c in cuts if s < c < e})
        bounds = [s, *inner, e]
        out.extend((a, b, i) for a, b in itertools.pairwise(bounds))
    return out


disjoint = nonempty_intervals.map(lambda pairs: runs(cells(pairs)))


@given(disjoint, st.lists(points, max_size=8, unique=True).map(sorted))
def test_split_at_cuts_each_interval_at_the_cuts_inside_it(pairs: Pairs, cuts: list[int]) -> None:
    s, e, owner = split_at(arr([a for a, _ in pairs]), arr([b for _, b in pairs]), arr(cuts))
    got = list(zip(s.tolist(), e.tolist(), owner.tolist(), strict=True))
    assert got == split_reference(pairs, cuts)


@given(disjoint, st.lists(points, max_size=8).map(sorted))
def test_split_at_with_repeated_cuts_gives_the_same_nonempty_pieces(
    pairs: Pairs, cuts: list[int]
) -> None:
    s, e, owner = split_at(arr([a for a, _ in pairs]), arr([b for _, b in pairs]), arr(cuts))
    got = [
        (a, b, o) for a, b, o in zip(s.tolist(), e.tolist(), owner.tolist(), strict=True) if b > a
    ]
    assert got == split_reference(pairs, cuts)
    assert int((e - s).sum()) == sum(b - a for a, b in pairs)


def test_split_at_by_hand() -> None:
    s, e, owner = split_at(arr([0, 20]), arr([10, 30]), arr([5, 10, 15, 25, 40]))
    assert s.tolist() == [0, 5, 20, 25]
    assert e.tolist() == [5, 10, 25, 30]
    assert owner.tolist() == [0, 0, 1, 1]


def test_split_at_with_no_intervals_gives_no_pieces() -> None:
    s, e, owner = split_at(arr([]), arr([]), arr([1, 2]))
    assert s.size == e.size == owner.size == 0


@given(
    st.lists(
        st.tuples(st.integers(0, 9), st.integers(0, 40), st.integers(0, 12)),
        min_size=1,
        max_size=40,
    ),
    st.lists(st.tuples(st.integers(0, 10), st.integers(-3, 60)), min_size=1, max_size=12),
)
def test_enclosing_of_answers_thread_by_thread_as_one_sort_of_every_row(
    events: list[tuple[int, int, int]], queries: list[tuple[int, int]]
) -> None:
    # Rows by start (a kind's rows), ties and nested and sibling events included: queries on
    # few threads are answered one thread at a time, on many by one sort; the same rows.
    events = sorted(events, key=lambda e: e[1])
    key = np.array([e[0] for e in events], np.int64)
    ts = np.array([e[1] for e in events], np.int64)
    end = ts + np.array([e[2] for e in events], np.int64)
    thread = np.array([q[0] for q in queries], np.int64)
    t = np.array([q[1] for q in queries], np.int64)
    few = enclosing_of(key, ts, end, thread, t)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(intervals_module, "FEW_THREADS", -1)
        assert enclosing_of(key, ts, end, thread, t).tolist() == few.tolist()
