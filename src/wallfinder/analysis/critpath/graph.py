"""Building the step's dependency graph (`StepGraph`, whose docstring in `model` says what
it holds) from the device's ops and the host's runtime calls."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import numpy as np
import numpy.typing as npt

from wallfinder.analysis.accumulation import micro_step_syncs
from wallfinder.analysis.classify import KernelClass
from wallfinder.analysis.critpath.edges import drains, event_waits, queue_full
from wallfinder.analysis.critpath.model import (
    F64,
    I64,
    MATMUL,
    NEVER,
    NS,
    StepGraph,
)
from wallfinder.analysis.gpu import (
    CLASSES,
    COMM,
    SYNC_RUNTIME,
    DeviceOps,
    host_categories,
)
from wallfinder.analysis.intervals import Coverage
from wallfinder.analysis.scope import Scope
from wallfinder.analysis.steps import NO_LAUNCH
from wallfinder.analysis.thresholds import SlackThresholds
from wallfinder.diagnosis import FusionCandidate, Roofline
from wallfinder.trace import Events, Kind, Trace, thread_key

_MEMORY_BOUND = frozenset(
    CLASSES.index(c)
    for c in (
        KernelClass.ELEMENTWISE,
        KernelClass.REDUCTION,
        KernelClass.NORMALIZATION,
        KernelClass.SOFTMAX,
        KernelClass.COPY,
    )
)


def build_graph(
    scope: Scope,
    fusion: Sequence[FusionCandidate] = (),
    roofline: Roofline | None = None,
    centre: int | None = None,
) -> StepGraph | None:
    """The dependency graph of the steady-state steps, or None when there is nothing to
    replay (no device ops, no launch records, or no steady step). Steps holding more than
    the `replay_nodes` threshold of host calls and device ops are cut to the consecutive
    steady steps around step `centre` (else the middle one) that fit (`replayed_steps`)."""
    dev = scope.dev
    if dev is None or scope.count == 0:
        return None
    trace, ops = scope.trace, dev.ops
    launched = dev.launch_ts != NO_LAUNCH
    if not launched.any():
        return None
    # The host chain: runtime calls on the launching threads, inside the range's CPU steps.
    runtime = trace.of_kind(Kind.RUNTIME)
    on_chain = np.isin(runtime.thread, np.unique(dev.launch_thread[launched]))
    r = _Range.of(scope, runtime.ts[on_chain], ops.ts, centre)
    h = _host_chain(scope, runtime, on_chain, r)
    del on_chain
    if h is None:
        return None
    # What each stage below leaves behind is freed as it ends, not with the graph built: the
    # graph's peak would hold them all (a few times the graph on traces of tens of MB).
    keep, stream, call = _device_ops(dev, runtime.correlation[h.rows], launched, r)
    o_ts, o_end = ops.ts[keep], ops.end[keep]
    slack = scope.thresholds.slack
    sync, blocked, lat, fixed = _launches(
        trace, runtime.name[h.rows], h, call, o_ts, o_end, r.t0, slack
    )
    stream_first = np.concatenate([[True], stream[1:] != stream[:-1]])[: stream.size]
    w = event_waits(h.ts, call, lat, o_ts, o_end, stream, stream_first, r.t0, slack)
    drained_by, cost = drains(h.ts, h.end, h.inc, sync, blocked, call, o_end, r.t0, slack.edge_ns)
    cls = dev.cls[keep]
    fused = _fused(ops.name[keep], ops.dur[keep].astype(np.float64), cls, fusion, trace)
    return StepGraph(
        t0=r.t0,
        origin=r.w0 - r.t0,
        gap=h.gap,
        gap_data=h.gap_data,
        gap_comm=h.gap_comm,
        after_data=h.after_data,
        cost=cost,
        sync=sync,
        blocked=blocked,
        offset=h.offset,
        call_first=h.first,
        call_step=h.step,
        row=keep.astype(np.int64),
        call=call,
        fixed=fixed,
        lat=lat,
        dur=ops.dur[keep].astype(np.int64),
        cls=cls,
        stream_first=stream_first,
        dep=w.dep,
        dep_gap=w.dep_gap,
        after=w.after,
        host=w.host,
        host_lat=w.host_lat,
        extra=w.extra,
        stream_gap=w.stream_gap,
        drained_by=drained_by,
        fused=fused,
        roof_time=_roof_time(cls, roofline),
        steps=r.steps,
        tail=_tail(scope, r, h, call),
        measured_s=float(r.t_end - r.w0) * NS / r.steps,
        tie_ns=slack.tie_ns,
        busy_s=_busy(o_ts, o_end, r.w0, r.t_end) * NS / r.steps,
        busy_other_s=_busy(o_ts[cls != COMM], o_end[cls != COMM], r.w0, r.t_end) * NS / r.steps,
        notes=r.notes(scope),
        accum=micro_step_syncs(scope).rows[keep],
        once=_once(dev, runtime.thread[h.rows], h.ts),
    )


def _once(dev: DeviceOps, thread: I64, ts: I64) -> npt.NDArray[np.bool_] | None:
    """The chain's calls inside a one-off stretch (None: the trace has none)."""
    if not len(dev.one_offs):
        return None
    once = dev.one_offs.holds(thread, ts)
    return once if once.any() else None


class _Range(msgspec.Struct, frozen=True, eq=False):
    """The steps the graph replays, `first` to `last` (step indices): where their windows
    start and end (`w0`, `t_end`), where their CPU work starts and ends (`cpu_lo`, `cpu_hi`),
    the graph's origin `t0` (the earlier start), and whether the steady steps were `cut` to
    the node budget."""

    first: int
    last: int
    w0: int
    t_end: int
    cpu_lo: int
    cpu_hi: int
    t0: int
    cut: bool

    @classmethod
    def of(cls, scope: Scope, call_ts: I64, op_ts: I64, centre: int | None) -> _Range:
        """The range of `replayed_steps` for the chain's calls and the device's ops (their
        starts: `call_ts`, `op_ts`)."""
        kept = np.flatnonzero(scope.kept)
        first, last = replayed_steps(scope, call_ts, op_ts, centre)
        w0, cpu_lo = int(scope.start[first]), int(scope.spans.cpu_start[first])
        return cls(
            first=first,
            last=last,
            w0=w0,
            t_end=int(scope.end[last]),
            cpu_lo=cpu_lo,
            cpu_hi=int(scope.spans.cpu_end[last]),
            t0=min(w0, cpu_lo),
            cut=(first, last) != (int(kept[0]), int(kept[-1])),
        )

    @property
    def steps(self) -> int:
        return self.last - self.first + 1

    def notes(self, scope: Scope) -> tuple[str, ...]:
        """What the critical path's notes say of the range: why it was cut, if it was."""
        if not self.cut:
            return ()
        spans, kept = scope.spans, int(scope.kept.sum())
        return (
            f"replayed on {self.steps} consecutive steady step(s) of {kept} "
            f"({spans.labels[self.first]} to {spans.labels[self.last]}): the steady steps hold "
            f"more than {scope.thresholds.time.replay_nodes:,} host calls and device ops, and "
            "each replay's cost grows with them",
        )


class HostChain(msgspec.Struct, frozen=True, eq=False):
    """The host chain's calls (`rows` of the trace's runtime calls) in time order: their
    start and end, the host work before each (`gap`, and the parts of it in the DataLoader
    and in host-side collectives, `StepGraph`'s fields of those names), how far each started
    past the calls before it (`offset`), what each adds to the host's time past them (`inc`),
    which is its thread's first (`first`), the step each is in, and where the host's own work
    in the range ends (`host_end`)."""

    rows: I64
    ts: I64
    end: I64
    first: npt.NDArray[np.bool_]
    gap: I64
    gap_data: I64
    gap_comm: I64
    after_data: I64
    offset: I64
    inc: I64
    step: npt.NDArray[np.intp]
    host_end: int


def _host_chain(
    scope: Scope, runtime: Events, on_chain: npt.NDArray[np.bool_], r: _Range
) -> HostChain | None:
    """The chain's calls in the range's CPU steps (None: none), with the host work before
    each."""
    rows = np.flatnonzero(on_chain & (runtime.ts >= r.cpu_lo) & (runtime.ts < r.cpu_hi))
    if rows.size == 0:
        return None
    # One chain in time order: the launching threads take turns (the main thread blocks in
    # backward() while the autograd engine's thread launches), so the host is one resource;
    # a call that overlaps the one before starts before it ends (`offset` < 0).
    c_ts, c_end = runtime.ts[rows], runtime.end[rows]
    call_first = np.zeros(rows.size, dtype=bool)
    call_first[0] = True
    prev_end = np.maximum(np.maximum.accumulate(np.concatenate([[r.t0], c_end[:-1]])), r.t0)
    gap = np.maximum(c_ts - prev_end, 0)
    gap_data, gap_comm, after_data, host_end = _host_gaps(
        scope.trace, runtime.thread[rows], np.minimum(prev_end, c_ts), gap, r
    )
    return HostChain(
        rows=rows,
        ts=c_ts,
        end=c_end,
        first=call_first,
        gap=gap,
        gap_data=gap_data,
        gap_comm=gap_comm,
        after_data=after_data,
        offset=c_ts - prev_end,
        inc=np.maximum(c_end - np.maximum(c_ts, prev_end), 0),
        step=np.clip(
            np.searchsorted(scope.start[r.first : r.last + 1], c_ts, "right") - 1, 0, None
        ),
        host_end=host_end,
    )


def _host_gaps(
    trace: Trace, c_thread: I64, gap_from: I64, gap: I64, r: _Range
) -> tuple[I64, I64, I64, int]:
    """What the host did in each gap, on the calling thread: the DataLoader, collectives
    (`split_gaps`); and where the host's own work in the range ends."""
    kinds = (Kind.CPU_OP, Kind.ANNOTATION, Kind.PYTHON, Kind.RUNTIME)
    # (Those around the range alone: only they can fill its gaps.)
    h_ts, h_dur, h_name, h_pid, h_tid = trace.columns_of_kinds(
        kinds, "ts", "dur", "name", "pid", "tid", overlapping=(r.t0, r.cpu_hi)
    )
    # Where the host's own work in the range ends: a whole-trace window keeps it after the
    # last kernel (`gpu_windows`), so its replay must too.
    host_end = int((h_ts + h_dur).max(initial=r.t0))
    # Only the DataLoader's and the collectives' rows are read on (a few of them).
    category = host_categories(trace, h_name)
    few = np.flatnonzero((category == 0) | (category == 2))
    h_ts, h_end, category = h_ts[few], h_ts[few] + h_dur[few], category[few]
    h_thread = thread_key(h_pid[few], h_tid[few])
    del h_dur, h_name, h_pid, h_tid
    gap_data = np.zeros(gap.size, np.int64)
    gap_comm = np.zeros(gap.size, np.int64)
    after_data = np.zeros(gap.size, np.int64)
    for t in np.unique(c_thread).tolist():
        mine = c_thread == t
        here = h_thread == t
        data = Coverage.of(h_ts[here & (category == 0)], h_end[here & (category == 0)])
        comm = Coverage.of(h_ts[here & (category == 2)], h_end[here & (category == 2)])
        gap_data[mine], gap_comm[mine], after_data[mine] = split_gaps(
            gap_from[mine], gap[mine], data, comm
        )
    return gap_data, gap_comm, after_data, host_end


def _device_ops(
    dev: DeviceOps, corr_of_call: I64, launched: npt.NDArray[np.bool_], r: _Range
) -> tuple[I64, I64, I64]:
    """The ops the graph holds: launched by a chain call, or running in the range (placed
    where they ran); as rows of the device's ops sorted by (stream, start), their streams,
    and their launch calls (indices into the chain; -1: none)."""
    ops = dev.ops
    in_range = (ops.end > r.w0) & (ops.ts < r.t_end)
    order = np.argsort(corr_of_call, kind="stable")
    sorted_corr = corr_of_call[order]
    pos = np.clip(np.searchsorted(sorted_corr, ops.correlation), 0, max(sorted_corr.size - 1, 0))
    has_call = (ops.correlation >= 0) & (sorted_corr[pos] == ops.correlation) & launched
    # In flight at the start, or launched by the chain: not work the next step launched.
    early = (dev.launch_ts < r.cpu_lo) | ~launched
    keep = np.flatnonzero((in_range & early) | has_call)
    stream = np.where(ops.stream >= 0, ops.stream, ops.tid.astype(np.int64))[keep]
    keep = keep[np.lexsort((ops.ts[keep], stream))]
    stream = np.where(ops.stream >= 0, ops.stream, ops.tid.astype(np.int64))[keep]
    call = np.where(has_call[keep], order[pos[keep]], -1).astype(np.int64)
    return keep, stream, call


def _launches(
    trace: Trace,
    names: npt.NDArray[np.int32],
    h: HostChain,
    call: I64,
    o_ts: I64,
    o_end: I64,
    t0: int,
    slack: SlackThresholds,
) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_], I64, I64]:
    """Which calls synchronise (by name, or a copy that blocked) and which blocked on a full
    launch queue; per op, its launch path's latency and (for an op with no launch call) its
    measured start, relative to `t0` (NEVER: it has a launch call)."""
    sync = np.isin(names, trace.codes_of(SYNC_RUNTIME))
    # A copy call that returned after its copy ended blocked on it (a copy to pageable
    # memory): it synchronised, whatever its name says.
    copy_call = np.isin(names, trace.names_matching(lambda x: "emcpy" in x))
    own_end = np.full(h.rows.size, NEVER + t0, np.int64)
    np.maximum.at(own_end, call[call >= 0], o_end[call >= 0])
    sync |= copy_call & (own_end > NEVER + t0) & (h.end >= own_end - slack.edge_ns)
    del copy_call, own_end
    blocked = queue_full(h.ts, h.end, sync, call, o_ts, o_end, slack)
    # The launch path: at most the call itself (not a blocking one: that is a wait) and then
    # `queued_ns`; an op that started later waited for something else.
    c = np.maximum(call, 0)
    path = np.where(sync[c] | blocked[c], 0, h.end[c] - h.ts[c]) + slack.queued_ns
    lat = np.where(call >= 0, np.clip(o_ts - h.ts[c], 0, path), 0)
    fixed = np.where(call >= 0, NEVER, o_ts - t0)
    return sync, blocked, lat, fixed


def _roof_time(cls: npt.NDArray[np.int8], roofline: Roofline | None) -> F64:
    """Per op: the share of its time a matmul at 100% of roof would take (NaN: unknown)."""
    roof = np.full(cls.size, np.nan)
    if roofline is not None and roofline.pct_of_roof_matmul:
        matmul = np.isin(cls, list(MATMUL))
        roof[matmul] = float(roofline.pct_of_roof_matmul)
    return roof


def _tail(scope: Scope, r: _Range, h: HostChain, call: I64) -> int:
    """`StepGraph.tail`: the host work after the last call, when the range ends with it."""
    # A last step that launched no device work ends with its CPU work, as its window does.
    last_cpu = int(scope.spans.cpu_start[r.last])
    launched_last = (call >= 0) & (h.ts[np.maximum(call, 0)] >= last_cpu)
    if scope.spans.whole:
        # Its window ends with the host's work when that outlasts the device's (frees, a
        # final sync after the last kernel): as the window, the replay ends with the later.
        return max(min(h.host_end, r.cpu_hi) - int(h.end.max()), 0)
    return -1 if launched_last.any() else max(r.cpu_hi - int(h.end.max()), 0)


def replayed_steps(
    scope: Scope, call_ts: I64, op_ts: I64, centre: int | None = None
) -> tuple[int, int]:
    """The first and last step the graph replays: those from the first steady step to the
    last when their host calls (`call_ts`: the chain's calls' starts) and device ops
    (`op_ts`) number no more than the `replay_nodes` threshold; else the run of consecutive
    steady steps around `centre` (a step index; else the middle steady step) grown one step
    at a time, on the side with fewer, while it fits, and at least that step."""
    kept = np.flatnonzero(scope.kept)
    first, last = int(kept[0]), int(kept[-1])
    budget = scope.thresholds.time.replay_nodes
    spans = scope.spans
    calls, ops = np.sort(call_ts), np.sort(op_ts)
    per_step = (
        np.searchsorted(calls, spans.cpu_end[first : last + 1])
        - np.searchsorted(calls, spans.cpu_start[first : last + 1])
        + np.searchsorted(ops, scope.end[first : last + 1])
        - np.searchsorted(ops, scope.start[first : last + 1])
    ).astype(np.int64)
    if int(per_step.sum()) <= budget:
        return first, last
    steady = scope.kept[first : last + 1].tolist()
    size = per_step.tolist()
    c = (centre if centre is not None and first <= centre <= last else -1) - first
    if c < 0 or not steady[c]:
        c = int(kept[kept.size // 2]) - first
    lo = hi = c
    total = size[c]
    while True:
        left = size[lo - 1] if lo > 0 and steady[lo - 1] else None
        right = size[hi + 1] if hi + 1 < len(size) and steady[hi + 1] else None
        options = [(n, side) for n, side in ((left, -1), (right, 1)) if n is not None]
        if not options:
            break
        n, side = min(options)
        if total + n > budget:
            break
        total += n
        if side < 0:
            lo -= 1
        else:
            hi += 1
    return first + lo, first + hi


def _busy(o_ts: I64, o_end: I64, lo: int, hi: int) -> int:
    """The time ops cover in [lo, hi)."""
    return Coverage.of(np.maximum(o_ts, lo), np.minimum(o_end, hi)).total


def split_gaps(gap_from: I64, gap: I64, data: Coverage, comm: Coverage) -> tuple[I64, I64, I64]:
    """Of each host gap [gap_from, gap_from + gap): the part in the DataLoader, the part in
    host-side collectives, and the host work after the DataLoader's last stretch in it (a
    step's batch comes first, the ops that use it after; 0 with no DataLoader)."""
    a, b = gap_from, gap_from + gap
    gap_data = data.covered(a, b)
    after_data = np.zeros(gap.size, np.int64)
    if data.starts.size:
        i = np.searchsorted(data.starts, b, side="left") - 1
        data_end = np.where(i >= 0, np.minimum(data.ends[np.maximum(i, 0)], b), a)
        after_data = np.where(gap_data > 0, b - np.maximum(data_end, a), 0)
    gap_comm = np.minimum(comm.covered(a, b), gap - gap_data)
    return gap_data, gap_comm, after_data


def _fused(
    names: npt.NDArray[np.int32],
    dur: F64,
    cls: npt.NDArray[np.int8],
    fusion: Sequence[FusionCandidate],
    trace: Trace,
) -> F64:
    """Each op's time with the fusion candidates fused: a candidate's kernels scaled so that
    their time is the candidate's less its saving (an estimate: every launch of a kernel the
    candidate names is scaled, in a chain or not)."""
    out: F64 = dur.copy()
    for c in fusion:
        if c.time_s <= 0:
            continue
        factor = max(1.0 - c.max_saving_s / c.time_s, 0.0)
        member = np.isin(names, [trace.code_of(k) for k in c.kernels])
        member &= np.isin(cls, list(_MEMORY_BOUND))
        out[member] = np.minimum(out[member], dur[member] * factor)
    return out
