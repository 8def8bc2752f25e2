"""The step's dependency graph when the CPU is the device (no device kernels): the main
thread's top-level ops are the host chain and there are no device ops."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from wallfinder.analysis.classify import classify_op
from wallfinder.analysis.critpath.graph import split_gaps
from wallfinder.analysis.critpath.model import CATEGORIES, I64, MATMUL, NS, StepGraph
from wallfinder.analysis.dispatch import Dispatch
from wallfinder.analysis.gpu import CLASSES
from wallfinder.analysis.intervals import Coverage
from wallfinder.analysis.scope import Scope
from wallfinder.trace import Events, Kind, Trace


def cpu_graph(
    scope: Scope,
    mine: Events,
    category: npt.NDArray[np.int8],
    dispatch: Dispatch,
    beside: Coverage | None = None,
) -> StepGraph | None:
    """The steady steps as a dependency graph when the CPU is the device (no device kernels):
    the main thread's top-level ops in order are the host chain's calls, each op's own time
    its cost, and the time between them its gap: Python, the DataLoader, host-side
    collectives. There are no device ops: the chain is the step.

    `mine`: the main thread's events; `category`: theirs as `_cpu_categories` gives them (0
    data loading, 1 communication, 2 ops, 3 dispatch-sized ops, 4 Python, 9 step markers);
    `dispatch`: its split of their CPU ops. A host cut (`host:F`) divides the Python between
    the ops and each op's fixed cost per op, not its arithmetic: the fixed cost is measured
    from the dispatch-sized calls (their time over their ops), so an op tree of n ops keeps
    all but n fixed costs of its time. `beside`: the collectives on the main thread's other
    threads; the gaps they cover are host-side collectives too, which no host cut shortens."""
    if scope.count == 0:
        return None
    kept = np.flatnonzero(scope.kept)
    lo, hi = int(scope.start[kept[0]]), int(scope.end[kept[-1]])
    is_op = np.flatnonzero(mine.kind == Kind.CPU_OP)
    op_cat = category[is_op]
    ts, end = mine.ts[is_op], mine.end[is_op]
    not_op = mine.kind != Kind.CPU_OP
    data = Coverage.of(mine.ts[category == 0], mine.end[category == 0])
    comm = Coverage.of(mine.ts[(category == 1) & not_op], mine.end[(category == 1) & not_op])
    if beside is not None:
        comm = Coverage.union(comm, beside)
    length = np.maximum(end - ts, 1)
    in_data = data.covered(ts, ts + length) >= length
    pick = dispatch.top & (op_cat >= 1) & (op_cat <= 3) & (ts >= lo) & (ts < hi) & ~in_data
    calls = np.flatnonzero(pick)
    if calls.size == 0:
        return None
    calls = calls[np.argsort(ts[calls], kind="stable")]
    c_ts, c_end, c_cat = ts[calls], end[calls], op_cat[calls]
    prev_end = np.maximum(np.maximum.accumulate(np.concatenate([[lo], c_end[:-1]])), lo)
    gap = np.maximum(c_ts - prev_end, 0)
    inc = np.maximum(c_end - np.maximum(c_ts, prev_end), 0)
    gap_data, gap_comm, after_data = split_gaps(np.minimum(prev_end, c_ts), gap, data, comm)
    sized = c_cat == 3
    cost_fixed, per_op = _fixed_costs(inc, sized, dispatch.tree_ops[calls])
    call_cat = _call_categories(scope.trace, mine.name[is_op][calls], c_cat)
    steps = int(kept[-1] - kept[0]) + 1
    none = np.zeros(0, np.int64)
    return StepGraph(
        t0=lo,
        origin=0,
        gap=gap,
        gap_data=gap_data,
        gap_comm=gap_comm,
        after_data=after_data,
        cost=inc,
        sync=np.zeros(calls.size, dtype=bool),
        blocked=np.zeros(calls.size, dtype=bool),
        offset=c_ts - prev_end,
        call_first=np.r_[True, np.zeros(calls.size - 1, dtype=bool)],
        call_step=np.clip(np.searchsorted(scope.start[kept[0] :], c_ts, "right") - 1, 0, None),
        row=none,
        call=none,
        fixed=none,
        lat=none,
        dur=none,
        cls=np.zeros(0, np.int8),
        stream_first=np.zeros(0, dtype=bool),
        dep=none,
        dep_gap=none,
        after=none,
        host=none,
        host_lat=none,
        extra=none,
        stream_gap=none,
        drained_by=none,
        fused=np.zeros(0),
        roof_time=np.zeros(0),
        steps=steps,
        tail=max(hi - int(c_end.max()), 0),
        measured_s=float(hi - lo) * NS / steps,
        tie_ns=scope.thresholds.slack.tie_ns,
        cost_fixed=cost_fixed,
        call_cat=call_cat,
        call_ts=c_ts - lo,
        notes=(_note(per_op if sized.any() else None),),
    )


def _fixed_costs(
    inc: I64, sized: npt.NDArray[np.bool_], tree_ops: npt.NDArray[np.integer]
) -> tuple[I64, float]:
    """Per call, the part of its time a host cut leaves alone (`StepGraph.cost_fixed`: all but
    a fixed cost per op of its tree; none of a dispatch-sized call's), and that fixed cost per
    op (ns), measured from the dispatch-sized calls (`sized`)."""
    per_op = float(inc[sized].sum()) / max(int(tree_ops[sized].sum()), 1)
    fixed = np.maximum(inc - np.rint(tree_ops * per_op).astype(np.int64), 0)
    return np.where(sized, 0, fixed), per_op


def _call_categories(
    trace: Trace, names: npt.NDArray[np.int32], c_cat: npt.NDArray[np.int8]
) -> npt.NDArray[np.int8]:
    """Per call, what the path spends its own time in (an index into CATEGORIES): host for a
    dispatch-sized op, communication for a collective, else compute for a matmul-class op and
    bandwidth for the rest."""
    matmul_codes = [
        c
        for c in np.unique(names).tolist()
        if CLASSES.index(classify_op(trace.strings[c])) in MATMUL
    ]
    matmul = np.isin(names, matmul_codes)
    return np.where(
        c_cat == 3,
        CATEGORIES.index("host"),
        np.where(
            c_cat == 1,
            CATEGORIES.index("communication"),
            np.where(matmul, CATEGORIES.index("compute"), CATEGORIES.index("bandwidth")),
        ),
    ).astype(np.int8)


def _note(per_op: float | None) -> str:
    """The critical path's note on a CPU graph: what a host cut divides (`per_op`: the fixed
    cost per op the dispatch-sized calls measure, ns; None: no such call)."""
    if per_op is not None:
        return (
            f"CPU-only trace: the main thread's ops are the device; a host cut (host:F) divides "
            f"the Python between ops and each op's fixed cost, {per_op / 1e3:.1f} µs per op "
            "as the dispatch-sized calls measure it (an estimate), not the ops' arithmetic"
        )
    return (
        "CPU-only trace: the main thread's ops are the device; no dispatch-sized call "
        "measures the fixed cost per op, so a host cut (host:F) divides only the Python "
        "between ops"
    )
