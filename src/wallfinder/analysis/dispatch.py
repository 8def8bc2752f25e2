"""CPU-only traces: which op time is the framework's fixed cost per op rather than arithmetic.

On a GPU, many tiny ops show as idle device time: the kernels finish faster than the host can
issue them. On the CPU the same host work is inside the ops' own durations (the dispatcher,
autograd bookkeeping, allocation, the profiler's record of each op), so without this split a
loop of thousands of tiny ops reads as a busy CPU doing arithmetic and gets the bandwidth or
compute verdict, whose fixes do not help it.

A top-level call (an op called from Python, with every op it calls) is dispatch-sized when no
op in it runs for `TimeThresholds.dispatch_self_ns` of its own time (time not spent in the ops
it calls): arithmetic happens in an op's own time, so a call whose ops all return within a few
µs is a chain of fixed costs. Own time, not the call's length: a large matmul wrapped in
`linear`, or an autograd node that calls a dozen small helpers around one large op, still
does arithmetic.
"""

from __future__ import annotations

import msgspec
import numpy as np
import numpy.typing as npt

from wallfinder.analysis.intervals import in_windows
from wallfinder.trace import Events


class DispatchSummary(msgspec.Struct, frozen=True):
    """The dispatch-sized calls of the steady-state steps, for the evidence of a finding."""

    calls_per_step: float
    ops_per_step: float
    median_call_ns: float


class Dispatch(msgspec.Struct, frozen=True):
    """Per op of one thread (the `ops` given to `dispatch_sized`): `sized` marks the ops of
    dispatch-sized calls, `top` the top-level ops (the calls), `tree_ops` each call's number
    of ops (0 for ops that are not top-level)."""

    sized: npt.NDArray[np.bool_]
    top: npt.NDArray[np.bool_]
    tree_ops: npt.NDArray[np.int64]

    def summary(
        self, ops: Events, start: npt.NDArray[np.int64], end: npt.NDArray[np.int64]
    ) -> DispatchSummary:
        """The dispatch-sized calls that start inside the steps [start, end)."""
        calls = in_windows(ops.ts, start, end) & self.top & self.sized
        steps = max(start.size, 1)
        return DispatchSummary(
            calls_per_step=int(calls.sum()) / steps,
            ops_per_step=int(self.tree_ops[calls].sum()) / steps,
            median_call_ns=float(np.median(ops.dur[calls])) if calls.any() else 0.0,
        )


def dispatch_sized(ops: Events, self_ns: int) -> Dispatch:
    """Find the dispatch-sized calls among `ops`: the CPU ops of one thread, none of whose ops
    runs `self_ns` (`TimeThresholds.dispatch_self_ns`) on its own."""
    n = len(ops)
    if n == 0:
        empty = np.zeros(0, dtype=bool)
        return Dispatch(empty, empty, np.zeros(0, np.int64))
    # Parents before their children, also when both start at the same time.
    order = np.lexsort((-ops.end, ops.ts))
    ts, end = ops.ts[order], ops.end[order]
    dur = end - ts
    reach = np.maximum.accumulate(end)
    top = np.ones(n, dtype=bool)
    top[1:] = ts[1:] >= reach[:-1]
    root = np.maximum.accumulate(np.where(top, np.arange(n), 0))
    own = dur - _children_time(ts, end)
    most_own = np.zeros(n, dtype=np.int64)
    np.maximum.at(most_own, root, own)
    sized = most_own[root] < self_ns
    tree_ops = np.where(top, np.bincount(root, minlength=n), 0)
    back = np.empty(n, dtype=np.int64)
    back[order] = np.arange(n)
    return Dispatch(sized=sized[back], top=top[back], tree_ops=tree_ops[back].astype(np.int64))


def _children_time(ts: npt.NDArray[np.int64], end: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Per op (sorted by start, parents first): the summed durations of its direct children.
    An op's depth is the number of earlier ops still open when it starts; its parent is the
    last earlier op one level up. One pass per nesting level, none per event."""
    n = ts.size
    open_before = np.arange(n) - np.searchsorted(np.sort(end), ts, side="right")
    depth = np.maximum(open_before, 0)
    parent = np.full(n, -1, dtype=np.int64)
    for level in range(1, int(depth.max()) + 1):
        above = np.flatnonzero(depth == level - 1)
        kids = np.flatnonzero(depth == level)
        at = np.searchsorted(above, kids) - 1
        ok = at >= 0
        parent[kids[ok]] = above[at[ok]]
    # Only a parent that really contains the child (traces are not always well nested).
    has = parent >= 0
    has[has] = (ts[parent[has]] <= ts[has]) & (end[has] <= end[parent[has]])
    return np.bincount(parent[has], weights=(end - ts)[has], minlength=n).astype(np.int64)
