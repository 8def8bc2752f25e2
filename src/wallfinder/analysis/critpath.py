"""The step's dependency graph, its critical path, and what-if replay.

The graph is built from what the trace holds, as columns (no object per event):

- the **host chain**: the runtime calls of the threads that launch device work, in time order
  (the autograd engine's thread and the main thread take turns, so one chain), each with the
  host work before it (the gap since the previous call ended: Python and CPU ops, the
  DataLoader, host-side collectives) and its own cost;
- **launch → op**: each kernel, copy or set starts no earlier than its launch call plus the
  launch path's latency (correlation ids; a graph launch starts all its kernels);
- **stream order**: an op starts after the previous op on its stream ends;
- **event waits**: an op that started later than its launch and its stream allowed, just as
  an op on another stream ended, waited for that op (a stream/event wait: Kineto does not
  record which event, so the edge is taken from the timing);
- **measured order across streams**: an op stays after the op on another stream that ended
  last before it started. Kineto does not record which stream waits on which event, so an op
  that started at its launch (the host was late) may still depend on the other stream's work
  before it; without this edge a faster host would let the device run more concurrently than
  it ever did (a collective over work not yet done), and a replay predict a step shorter
  than the device's own busy time;
- **synchronisation**: a synchronising call (`cudaStreamSynchronize`, `cudaDeviceSynchronize`,
  `cudaEventSynchronize`, a blocking copy; HIP's likewise) returns after the device work it
  drained: the launched ops that had ended by the time it returned; a launch call blocked on a
  full launch queue likewise returns after the device op that freed its slot.

Replay re-times the graph: the host chain is a max-plus scan (each call starts when the
previous ended plus its host work; a sync ends no earlier than its drain), each stream a
max-plus scan (an op starts at the latest of its launch, its stream predecessor and the op it
waited for), both vectorised, iterated to the fixed point (the longest path); a graph that
takes many rounds is solved in one pass in dependency order instead, to the same times. The
unchanged graph reproduces the measured steps where the trace records every dependency; the
error is reported. A what-if changes the graph's weights (host gaps, call costs, op durations, sync
edges) and replays it; no replay is shorter than the device's busy time under the change.

When the CPU is the device (no device kernels), `cpu_graph` builds the same graph with the
main thread's top-level ops as the host chain and no device ops. A job's ranks are replayed
together by `job_replay`: joined at the collectives every rank takes part in, each ending when
the last rank arrives plus its transfer, each rank's work between two of them as measured.
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from wallfinder.analysis.classify import KernelClass, classify_op
from wallfinder.analysis.dispatch import Dispatch
from wallfinder.analysis.gpu import (
    CLASSES,
    COMM,
    QUEUED_SLACK_NS,
    SYNC_RUNTIME,
    _host_categories,
)
from wallfinder.analysis.intervals import Coverage
from wallfinder.analysis.rules import declared
from wallfinder.analysis.scope import Scope
from wallfinder.analysis.steps import NO_LAUNCH
from wallfinder.diagnosis import (
    CriticalPath,
    Finding,
    FusionCandidate,
    PathSegment,
    RankSummary,
    Roofline,
    StepTimeline,
    Wall,
    WhatIfRow,
)
from wallfinder.errors import WallfinderError
from wallfinder.trace import Events, Kind, Trace, thread_key

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
NS = 1e-9
NEVER = -(1 << 52)
"""A time before everything (ns): no constraint."""
MAX_ROUNDS = 5000
"""Fixed-point rounds at most: each round settles at least one more sync or event wait along
the longest chain, so this is only reached by a step with thousands of them."""
EDGE_SLACK_NS = 5_000
"""An op that started this long after its launch and stream allowed, within this long of
another stream's op ending, waited for that op."""

TIE_NS = EDGE_SLACK_NS
"""The critical path's walk takes an op's stream predecessor over its launch when the launch
was binding by at most this much (a tie: both chains are as long)."""

_MATMUL = frozenset(
    CLASSES.index(c) for c in (KernelClass.GEMM, KernelClass.CONVOLUTION, KernelClass.ATTENTION)
)
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

CATEGORIES = ("data", "host", "launch", "sync", "communication", "compute", "bandwidth", "wait")
"""What the critical path's time is spent in: the host waiting for the DataLoader, host work
(Python, CPU ops), launch calls and their latency, synchronising calls' own cost, collectives
(on the host or the device), matmul-class kernels, memory-bound and other kernels, and device
waits the graph cannot explain by an edge (start-up, unrecorded dependencies)."""

_WALL_OF: dict[str, Wall] = {
    "data": "overhead",
    "host": "overhead",
    "launch": "overhead",
    "sync": "overhead",
    "communication": "overhead",
    "wait": "overhead",
    "compute": "compute",
    "bandwidth": "bandwidth",
}

WHAT_IFS = {
    "data": "data-loading gaps removed",
    "host": "host overhead (host work and launch calls) cut by a factor (host:F, default 2)",
    "sync": "synchronisation points removed (the host no longer waits for the device)",
    "fuse": "memory-bound chains fused (each at the fusion analysis's fused time)",
    "matmul": "matmuls at a fraction of their roof (matmul:P, default 0.8)",
    "overlap": "each collective overlapped with the compute it waited for (it starts with the "
    "previous bucket's backward kernel instead of after it)",
}
"""The what-ifs `--what-if` takes, comma-separated (`data,host:4`)."""


@dataclass(frozen=True)
class Change:
    """A what-if: the graph's weights it changes. Identity by default."""

    data: bool = False
    host: float = 1.0
    """Host gaps (but the DataLoader's and collectives') and launch calls divided by this."""
    sync: bool = False
    fuse: bool = False
    matmul: float | None = None
    """Matmul-class kernels at this fraction of their roof (None: unchanged)."""
    overlap: bool = False
    """A collective that waited for an op on another stream (the bucket's last backward
    kernel) may start when that op starts, beside it."""

    @property
    def label(self) -> str:
        parts = []
        if self.data:
            parts.append("data")
        if self.host != 1.0:
            parts.append("host" if self.host == float("inf") else f"host:{self.host:g}")
        if self.sync:
            parts.append("sync")
        if self.fuse:
            parts.append("fuse")
        if self.matmul is not None:
            parts.append(f"matmul:{self.matmul:g}")
        if self.overlap:
            parts.append("overlap")
        return ",".join(parts) or "unchanged"


def parse_what_if(text: str) -> list[Change]:
    """The rows a `--what-if` text asks for: each item alone, then (for several) all of them
    combined. Raises `WallfinderError` for an unknown item or a bad factor."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise WallfinderError("--what-if: name at least one of " + ", ".join(WHAT_IFS))
    singles = [_parse_item(t) for t in items]
    if len(singles) == 1:
        return singles
    combined = Change()
    for c in singles:
        combined = Change(
            data=combined.data or c.data,
            host=max(combined.host, c.host),
            sync=combined.sync or c.sync,
            fuse=combined.fuse or c.fuse,
            matmul=c.matmul if c.matmul is not None else combined.matmul,
            overlap=combined.overlap or c.overlap,
        )
    return [*singles, combined]


def _parse_item(item: str) -> Change:
    name, _, arg = item.partition(":")
    name = name.strip().lower()
    if name not in WHAT_IFS:
        raise WallfinderError(f"--what-if: unknown change {name!r} (known: {', '.join(WHAT_IFS)})")
    value: float | None = None
    if arg:
        try:
            value = float(arg.rstrip("%")) / (100.0 if arg.endswith("%") else 1.0)
        except ValueError:
            raise WallfinderError(f"--what-if: {item!r}: {arg!r} is not a number") from None
    if name == "host":
        factor = 2.0 if value is None else value
        if not factor >= 1.0:
            raise WallfinderError(f"--what-if: {item!r}: the factor must be at least 1")
        return Change(host=factor)
    if name == "matmul":
        pct = 0.8 if value is None else value
        if not 0.0 < pct <= 1.0:
            raise WallfinderError(f"--what-if: {item!r}: the fraction of roof is in (0, 1]")
        return Change(matmul=pct)
    if value is not None:
        raise WallfinderError(f"--what-if: {name!r} takes no argument")
    return Change(
        data=name == "data", sync=name == "sync", fuse=name == "fuse", overlap=name == "overlap"
    )


DEFAULT_CHANGES = (
    Change(data=True),
    Change(host=2.0),
    Change(sync=True),
    Change(fuse=True),
    Change(matmul=0.8),
)

OVERLAP = Change(overlap=True)
"""The what-if of the exposed-communication finding's fix: in the default table when exposed
communication is the wall's cause (`default_changes`)."""


def default_changes(cause: str, device_ops: bool) -> tuple[Change, ...]:
    """The what-if table's rows when `--what-if` does not name them, for a step whose wall has
    `cause`: with no device ops (the CPU as the device) there is nothing to sync, fuse,
    re-time or overlap."""
    if not device_ops:
        return DEFAULT_CHANGES[:2]
    return DEFAULT_CHANGES + ((OVERLAP,) if cause == "comm_exposed" else ())


@dataclass(frozen=True, eq=False)
class StepGraph:
    """One rank's steady-state steps as a dependency graph: the host chain (calls), the device
    ops, and their edges. Times are ns relative to `t0`: the first steady step's CPU start,
    or its window's start when that is earlier (the host runs ahead of the device, so a step's
    CPU work begins before the previous step's device work ends)."""

    t0: int
    origin: int
    """Where the first steady step's window starts, relative to `t0`."""
    # The host chain, in time order.
    gap: I64
    """Host work before each call (since the previous call ended, or `t0`)."""
    gap_data: I64
    """Of `gap`: the part in the DataLoader."""
    gap_comm: I64
    """Of `gap`: the part in host-side collectives."""
    after_data: I64
    """Of `gap`: the time after its last stretch in the DataLoader (0: no DataLoader)."""
    cost: I64
    """The call's own time (for a sync: the part after the device drained)."""
    sync: npt.NDArray[np.bool_]
    blocked: npt.NDArray[np.bool_]
    """Launch calls that returned only when a device op ended (the launch queue was full): they
    wait for the device as a sync does, but no sync what-if removes that."""
    offset: I64
    """Each call's start less the previous calls' end: `gap` when positive, else how far it
    overlapped them."""
    call_first: npt.NDArray[np.bool_]
    """The first call of its thread's chain (the chains are in (thread, time) order)."""
    call_step: npt.NDArray[np.intp]
    """The steady step (index into the replayed range) each call is in."""
    # The device ops (rows of `DeviceOps.ops` in the range), sorted by (stream, start).
    row: I64
    call: I64
    """The op's launch call (NONE: placed at its measured start, `fixed`)."""
    fixed: I64
    lat: I64
    dur: I64
    cls: npt.NDArray[np.int8]
    stream_first: npt.NDArray[np.bool_]
    dep: I64
    """The op (index into these) it waited for on another stream (NONE: none)."""
    dep_gap: I64
    after: I64
    """The op (index into these) on another stream that ended last before it started, in the
    trace: it stays after it (NONE: none)."""
    host: I64
    """The later host call whose start released the op (NONE: none)."""
    host_lat: I64
    extra: I64
    """Per op: a wait after its launch that no edge explains, kept as a fixed delay."""
    stream_gap: I64
    """Per op: likewise, a wait after the op before it on its stream."""
    drained_by: I64
    """The sync call that waited for the op (NONE: none)."""
    fused: F64
    """Per op: its time with the fusion candidates fused (== dur where not in one)."""
    roof_time: F64
    """Per op: the share of its time a matmul at 100% of roof would take (NaN: unknown)."""
    steps: int
    tail: int
    """Host work after the last call, when the last step launched no device work or is a
    whole-trace window (either window ends with its CPU work); -1 otherwise."""
    measured_s: float
    """The measured mean step over the replayed range."""
    busy_s: float = 0.0
    """The device's busy time per step (the union of its ops over all streams, in the range):
    no fix that leaves the device's work as it is can make the step shorter, since the device
    would have to run more concurrently than it did."""
    busy_other_s: float = 0.0
    """The same without the collectives: the floor of a fix that overlaps them (`overlap`)."""
    cost_fixed: I64 | None = None
    """Of `cost`: the part a host cut leaves alone (a CPU op's arithmetic, when the CPU is the
    device); None: none (a runtime call is all host overhead)."""
    call_cat: npt.NDArray[np.int8] | None = None
    """Per call: what the path spends its own time in (an index into CATEGORIES); None:
    launch (runtime calls)."""
    notes: tuple[str, ...] = ()
    """What the critical path's notes say of how this graph was built."""


@dataclass(frozen=True, eq=False)
class Timing:
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
    trace, spans = scope.trace, scope.spans
    ops = dev.ops
    launched = dev.launch_ts != NO_LAUNCH
    if not launched.any():
        return None
    # The host chain: runtime calls on the launching threads, inside the range's CPU steps.
    runtime = trace.of_kind(Kind.RUNTIME)
    chain = np.isin(runtime.thread, np.unique(dev.launch_thread[launched]))
    kept = np.flatnonzero(scope.kept)
    first, last = replayed_steps(scope, runtime.ts[chain], ops.ts, centre)
    cut = (first, last) != (int(kept[0]), int(kept[-1]))
    w0, t_end = int(scope.start[first]), int(scope.end[last])
    cpu_lo, cpu_hi = int(spans.cpu_start[first]), int(spans.cpu_end[last])
    t0 = min(w0, cpu_lo)
    on = chain & (runtime.ts >= cpu_lo) & (runtime.ts < cpu_hi)
    rows = np.flatnonzero(on)
    if rows.size == 0:
        return None
    # One chain in time order: the launching threads take turns (the main thread blocks in
    # backward() while the autograd engine's thread launches), so the host is one resource;
    # a call that overlaps the one before starts before it ends (`offset` < 0).
    c_ts, c_end = runtime.ts[rows], runtime.end[rows]
    c_thread = runtime.thread[rows]
    call_first = np.zeros(rows.size, dtype=bool)
    call_first[0] = True
    prev_end = np.maximum(np.maximum.accumulate(np.concatenate([[t0], c_end[:-1]])), t0)
    gap = np.maximum(c_ts - prev_end, 0)
    offset = c_ts - prev_end
    inc = np.maximum(c_end - np.maximum(c_ts, prev_end), 0)
    gap_from = np.minimum(prev_end, c_ts)
    sync = np.isin(runtime.name[rows], trace.names_matching(SYNC_RUNTIME.__contains__))

    # What the host did in each gap, on the calling thread: the DataLoader, collectives.
    kinds = (Kind.CPU_OP, Kind.ANNOTATION, Kind.PYTHON, Kind.RUNTIME)
    # (Those around the range alone: only they can fill its gaps.)
    h_ts, h_dur, h_name, h_pid, h_tid = trace.columns_of_kinds(
        kinds, "ts", "dur", "name", "pid", "tid", overlapping=(t0, cpu_hi)
    )
    # Where the host's own work in the range ends: a whole-trace window keeps it after the
    # last kernel (`gpu_windows`), so its replay must too.
    host_end = int((h_ts + h_dur).max(initial=t0))
    # Only the DataLoader's and the collectives' rows are read on (a few of them).
    category = _host_categories(trace, h_name)
    few = np.flatnonzero((category == 0) | (category == 2))
    h_ts, h_end, category = h_ts[few], h_ts[few] + h_dur[few], category[few]
    h_thread = thread_key(h_pid[few], h_tid[few])
    del h_dur, h_name, h_pid, h_tid
    gap_data = np.zeros(rows.size, np.int64)
    gap_comm = np.zeros(rows.size, np.int64)
    after_data = np.zeros(rows.size, np.int64)
    for t in np.unique(c_thread).tolist():
        mine = c_thread == t
        here = h_thread == t
        data = Coverage.of(h_ts[here & (category == 0)], h_end[here & (category == 0)])
        comm = Coverage.of(h_ts[here & (category == 2)], h_end[here & (category == 2)])
        gap_data[mine], gap_comm[mine], after_data[mine] = _split_gaps(
            gap_from[mine], gap[mine], data, comm
        )
    call_step = np.clip(np.searchsorted(scope.start[first : last + 1], c_ts, "right") - 1, 0, None)
    # What each stage below leaves behind is freed as it ends, not with the graph built: the
    # graph's peak would hold them all (a few times the graph on traces of tens of MB).
    del chain, prev_end, gap_from, c_thread, h_ts, h_end, h_thread, category

    # The ops: launched by a chain call, or running in the range (placed where they ran).
    corr_of_call = runtime.correlation[rows]
    in_range = (ops.end > w0) & (ops.ts < t_end)
    order = np.argsort(corr_of_call, kind="stable")
    sorted_corr = corr_of_call[order]
    pos = np.clip(np.searchsorted(sorted_corr, ops.correlation), 0, max(sorted_corr.size - 1, 0))
    has_call = (ops.correlation >= 0) & (sorted_corr[pos] == ops.correlation) & launched
    # In flight at the start, or launched by the chain: not work the next step launched.
    early = (dev.launch_ts < cpu_lo) | ~launched
    keep = np.flatnonzero((in_range & early) | has_call)
    stream = np.where(ops.stream >= 0, ops.stream, ops.tid.astype(np.int64))[keep]
    keep = keep[np.lexsort((ops.ts[keep], stream))]
    stream = np.where(ops.stream >= 0, ops.stream, ops.tid.astype(np.int64))[keep]
    call = np.where(has_call[keep], order[pos[keep]], -1).astype(np.int64)
    o_ts, o_end = ops.ts[keep], ops.end[keep]
    del in_range, pos, has_call, early, order, sorted_corr, corr_of_call
    # A copy call that returned after its copy ended blocked on it (a copy to pageable
    # memory): it synchronised, whatever its name says.
    copy_call = np.isin(runtime.name[rows], trace.names_matching(lambda x: "emcpy" in x))
    own_end = np.full(rows.size, NEVER + t0, np.int64)
    np.maximum.at(own_end, call[call >= 0], o_end[call >= 0])
    sync |= copy_call & (own_end > NEVER + t0) & (c_end >= own_end - EDGE_SLACK_NS)
    blocked = _queue_full(c_ts, c_end, sync, call, o_ts, o_end)
    # The launch path: at most the call itself (not a blocking one: that is a wait) and then
    # QUEUED_SLACK_NS; an op that started later waited for something else.
    c = np.maximum(call, 0)
    path = np.where(sync[c] | blocked[c], 0, c_end[c] - c_ts[c]) + QUEUED_SLACK_NS
    lat = np.where(call >= 0, np.clip(o_ts - c_ts[c], 0, path), 0)
    fixed = np.where(call >= 0, NEVER, o_ts - t0)
    stream_first = np.concatenate([[True], stream[1:] != stream[:-1]])[: stream.size]

    # Event waits: an op that started later than its launch and stream allowed, just as an op
    # on another stream ended.
    launch_ready = np.where(call >= 0, c_ts[np.maximum(call, 0)] + lat, o_ts)
    prev = np.where(stream_first, NEVER + t0, np.concatenate([[NEVER + t0], o_end[:-1]]))
    allowed = np.maximum(launch_ready, prev)
    waited = o_ts - allowed > EDGE_SLACK_NS
    by_end = np.argsort(o_end, kind="stable")
    ends_sorted = o_end[by_end]
    cand = np.searchsorted(ends_sorted, o_ts + EDGE_SLACK_NS // 10, "right") - 1
    dep = np.full(keep.size, -1, np.int64)
    for back in range(2):  # the latest ending op, or the one before it when that is ours
        other = by_end[np.maximum(cand - back, 0)]
        ok = (
            waited
            & (dep < 0)
            & (cand - back >= 0)
            & (stream[other] != stream)
            & (o_end[other] >= o_ts - EDGE_SLACK_NS)
            & (o_end[other] <= o_ts + EDGE_SLACK_NS)
        )
        dep[ok] = other[ok]
    dep_gap = np.where(dep >= 0, np.maximum(o_ts - o_end[np.maximum(dep, 0)], 0), 0)
    after_op = _ended_before(o_ts, o_end, stream)
    # Else, an op that started just after a later host call began waited for the host there
    # (work the host released: a graph's node behind a host-side wait, a stream made ready).
    by_ts = np.argsort(c_ts, kind="stable")
    after = by_ts[np.maximum(np.searchsorted(c_ts[by_ts], o_ts, "right") - 1, 0)]
    host = np.where(
        waited
        & (dep < 0)
        & (c_ts[after] <= o_ts)
        & (c_ts[after] > c_ts[c])
        & (o_ts - c_ts[after] <= QUEUED_SLACK_NS),
        after,
        -1,
    )
    host_lat = np.where(host >= 0, o_ts - c_ts[np.maximum(host, 0)], 0)
    # What no edge explains stays as measured: a fixed delay after the op's launch.
    # after whichever held it last: its launch, or the op before it on its stream.
    unexplained = np.where(waited & (dep < 0) & (host < 0), o_ts - allowed, 0)
    after_prev = prev >= launch_ready
    extra = np.where(after_prev, 0, unexplained)
    stream_gap = np.where(after_prev, unexplained, 0)
    del by_end, ends_sorted, cand, by_ts, after, launch_ready, allowed, prev, unexplained
    del after_prev, waited, path, own_end, copy_call

    # Syncs (and calls blocked on a full queue): the first at or after an op's launch that
    # returned after the op ended.
    sync_idx = np.flatnonzero(sync | blocked)
    sync_idx = sync_idx[np.argsort(c_ts[sync_idx], kind="stable")]
    drained_by = np.full(keep.size, -1, np.int64)
    own = c_end - c_ts
    if sync_idx.size:
        after_launch = np.searchsorted(c_ts[sync_idx], c_ts[c])
        s_end = c_end[sync_idx]
        after_end = np.searchsorted(np.maximum.accumulate(s_end), o_end - EDGE_SLACK_NS)
        p = np.maximum(after_launch, after_end)
        ok = (call >= 0) & (p < sync_idx.size)
        drained_by[ok] = sync_idx[np.minimum(p, sync_idx.size - 1)][ok]
        drain = np.full(rows.size, NEVER + t0, np.int64)
        np.maximum.at(drain, drained_by[ok], o_end[ok])
        # A sync's own cost is what it took after the device drained.
        own = np.where(sync | blocked, c_end - np.clip(drain, c_ts, c_end), own)
    # The host's time moves by what each call adds to it (its part past the one before).
    own = np.where(sync | blocked, np.minimum(own, inc), inc)

    cls = dev.cls[keep]
    fused = _fused(ops.name[keep], ops.dur[keep].astype(np.float64), cls, fusion, trace)
    roof = np.full(keep.size, np.nan)
    if roofline is not None and roofline.pct_of_roof_matmul:
        matmul = np.isin(cls, list(_MATMUL))
        roof[matmul] = float(roofline.pct_of_roof_matmul)
    steps = last - first + 1
    # A last step that launched no device work ends with its CPU work, as its window does.
    last_cpu = int(spans.cpu_start[last])
    launched_last = (call >= 0) & (c_ts[c] >= last_cpu)
    if spans.whole:
        # Its window ends with the host's work when that outlasts the device's (frees, a
        # final sync after the last kernel): as the window, the replay ends with the later.
        tail = max(min(host_end, cpu_hi) - int(c_end.max()), 0)
    else:
        tail = -1 if launched_last.any() else max(cpu_hi - int(c_end.max()), 0)
    notes: tuple[str, ...] = ()
    if cut:
        notes = (
            f"replayed on {steps} consecutive steady step(s) of {kept.size} "
            f"({spans.labels[first]} to {spans.labels[last]}): the steady steps hold more "
            f"than {scope.thresholds.time.replay_nodes:,} host calls and device ops, and each "
            "replay's cost grows with them",
        )
    return StepGraph(
        t0=t0,
        origin=w0 - t0,
        gap=gap,
        gap_data=gap_data,
        gap_comm=gap_comm,
        after_data=after_data,
        cost=own,
        sync=sync,
        blocked=blocked,
        offset=offset,
        call_first=call_first,
        call_step=call_step,
        row=keep.astype(np.int64),
        call=call,
        fixed=fixed,
        lat=lat,
        dur=ops.dur[keep].astype(np.int64),
        cls=cls,
        stream_first=stream_first,
        dep=dep,
        dep_gap=dep_gap,
        after=after_op,
        host=host,
        host_lat=host_lat,
        extra=extra,
        stream_gap=stream_gap,
        drained_by=drained_by,
        fused=fused,
        roof_time=roof,
        steps=steps,
        tail=tail,
        measured_s=float(t_end - w0) * NS / steps,
        busy_s=_busy(o_ts, o_end, w0, t_end) * NS / steps,
        busy_other_s=_busy(o_ts[cls != COMM], o_end[cls != COMM], w0, t_end) * NS / steps,
        notes=notes,
    )


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


def _queue_full(
    c_ts: I64, c_end: I64, sync: npt.NDArray[np.bool_], call: I64, o_ts: I64, o_end: I64
) -> npt.NDArray[np.bool_]:
    """Launch calls that blocked on a full launch queue: long (over QUEUED_SLACK_NS), their own
    op started over QUEUED_SLACK_NS after they returned (the queue was deep), and they returned
    just after a device op ended (the slot it freed)."""
    out = np.zeros(c_ts.size, dtype=bool)
    mine = call >= 0
    if not mine.any():
        return out
    first_start = np.full(c_ts.size, -NEVER, np.int64)
    np.minimum.at(first_start, call[mine], o_ts[mine])
    deep = (c_end - c_ts > QUEUED_SLACK_NS) & (first_start - c_end > QUEUED_SLACK_NS) & ~sync
    rows = np.flatnonzero(deep)
    if rows.size == 0:
        return out
    ends = np.sort(o_end)
    i = np.searchsorted(ends, c_end[rows], "right") - 1
    freed = (i >= 0) & (c_end[rows] - ends[np.maximum(i, 0)] <= 2 * EDGE_SLACK_NS)
    out[rows[freed]] = True
    return out


def _busy(o_ts: I64, o_end: I64, lo: int, hi: int) -> int:
    """The time ops cover in [lo, hi)."""
    return Coverage.of(np.maximum(o_ts, lo), np.minimum(o_end, hi)).total


def _ended_before(o_ts: I64, o_end: I64, stream: I64) -> I64:
    """Per op, the op on another stream that ended last at or before it started (-1: none)."""
    out = np.full(o_ts.size, -1, np.int64)
    for s in np.unique(stream).tolist():
        mine = np.flatnonzero(stream == s)
        others = np.flatnonzero(stream != s)
        if others.size == 0:
            continue
        others = others[np.argsort(o_end[others], kind="stable")]
        i = np.searchsorted(o_end[others], o_ts[mine], "right") - 1
        out[mine] = np.where(i >= 0, others[np.maximum(i, 0)], -1)
    return out


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
    trace = scope.trace
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
    gap_data, gap_comm, after_data = _split_gaps(np.minimum(prev_end, c_ts), gap, data, comm)
    sized = c_cat == 3
    tree = dispatch.tree_ops[calls]
    per_op = float(inc[sized].sum()) / max(int(tree[sized].sum()), 1)
    cost_fixed = np.where(sized, 0, np.maximum(inc - np.rint(tree * per_op).astype(np.int64), 0))
    names = mine.name[is_op][calls]
    matmul_codes = [
        c
        for c in np.unique(names).tolist()
        if CLASSES.index(classify_op(trace.strings[c])) in _MATMUL
    ]
    matmul = np.isin(names, matmul_codes)
    call_cat = np.where(
        sized,
        CATEGORIES.index("host"),
        np.where(
            c_cat == 1,
            CATEGORIES.index("communication"),
            np.where(matmul, CATEGORIES.index("compute"), CATEGORIES.index("bandwidth")),
        ),
    ).astype(np.int8)
    if sized.any():
        note = (
            f"CPU-only trace: the main thread's ops are the device; a host cut (host:F) divides "
            f"the Python between ops and each op's fixed cost, {per_op / 1e3:.1f} µs per op "
            "as the dispatch-sized calls measure it (an estimate), not the ops' arithmetic"
        )
    else:
        note = (
            "CPU-only trace: the main thread's ops are the device; no dispatch-sized call "
            "measures the fixed cost per op, so a host cut (host:F) divides only the Python "
            "between ops"
        )
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
        cost_fixed=cost_fixed,
        call_cat=call_cat,
        notes=(note,),
    )


def _split_gaps(gap_from: I64, gap: I64, data: Coverage, comm: Coverage) -> tuple[I64, I64, I64]:
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


def replay(
    g: StepGraph,
    change: Change = Change(),
    one_pass_at: int = 0,
    orders: dict[bool, I64 | None] | None = None,
) -> Timing:
    """Re-time the graph with `change` applied: the longest path from `t0`, by max-plus scans
    iterated to the fixed point; a graph still moving after ONE_PASS_AFTER rounds (many syncs
    and waits in a row) is solved in one pass in dependency order, which gives the same times
    and the rounds the iteration would have taken (`_longest_path`). `one_pass_at`: the round
    that takes the one pass instead of ONE_PASS_AFTER (a what-if on a graph whose unchanged
    replay needed it takes it at once: its times are the same). `orders`: the dependency
    orders the graph's replays found, by edge set, shared between them (filled here)."""
    one_pass_at = one_pass_at or ONE_PASS_AFTER
    orders = {} if orders is None else orders
    n_calls = g.gap.size
    other = g.gap - g.gap_data - g.gap_comm
    gap = g.gap.astype(np.float64)
    cost = g.cost.astype(np.float64)
    if change.data:
        gap = gap - g.gap_data
    if change.host != 1.0:
        gap = gap - other + other / change.host
        fixed = 0.0 if g.cost_fixed is None else g.cost_fixed
        cost = np.where(g.sync | g.blocked, cost, fixed + (cost - fixed) / change.host)
    dur = g.dur.astype(np.float64)
    lat = g.lat.astype(np.float64)
    if change.host != 1.0:
        lat = lat / change.host
    if change.fuse:
        dur = np.minimum(dur, g.fused)
    if change.matmul is not None:
        known = np.isfinite(g.roof_time)
        # At P of the roof, a kernel now at R of it takes R / P of its time.
        dur = np.where(known, dur * np.minimum(g.roof_time / change.matmul, 1.0), dur)
    gap_i = np.rint(gap).astype(np.int64)
    cost_i = np.rint(cost).astype(np.int64)
    dur_i = np.rint(dur).astype(np.int64)
    lat_i = np.rint(lat).astype(np.int64)
    del other, gap, cost, dur, lat  # (the loop's peak would hold them too: free them first)
    use_sync = not change.sync
    if change.sync:
        cost_i = np.where(g.sync, 0, cost_i)

    a = np.cumsum(gap_i + cost_i)
    seg = np.cumsum(g.stream_first) - 1
    w = np.cumsum(dur_i + g.stream_gap)
    w_seg = w - (w - dur_i - g.stream_gap)[np.flatnonzero(g.stream_first)][seg]
    c_seg = np.cumsum(g.call_first) - 1
    a_seg = a - (a - gap_i - cost_i)[np.flatnonzero(g.call_first)][c_seg]
    del a, w
    has_call = g.call >= 0
    synced = (g.drained_by >= 0) & (use_sync | g.blocked[np.maximum(g.drained_by, 0)])
    # Overlapped, a collective's wait for the op before it on another stream ends when that
    # op starts (its duration and the gap after it come off the edge).
    dep_back = np.zeros(g.dur.size, np.int64)
    if change.overlap:
        early = (g.cls == COMM) & (g.dep >= 0)
        dep_back = np.where(early, dur_i[np.maximum(g.dep, 0)] + g.dep_gap, 0)
    # Likewise the measured order across streams into a collective.
    after_back = np.zeros(g.dur.size, np.int64)
    if change.overlap:
        after_back = np.where((g.cls == COMM) & (g.after >= 0), dur_i[np.maximum(g.after, 0)], 0)

    # What does not change from round to round, computed once: long graphs take thousands of
    # rounds, and each round updates only the rows an edge can move.
    step_gap = np.where(g.offset >= 0, gap_i, g.offset)
    call_rows = np.flatnonzero(has_call)
    # Every op's launch delay and wait across streams (the one pass reads them by op).
    op_delay, op_dep_add = lat_i + g.extra, g.dep_gap - dep_back
    call_of, delay = g.call[call_rows], op_delay[call_rows]
    del lat_i, dep_back
    ready = g.fixed.copy()
    released_rows = np.flatnonzero(g.host >= 0)
    host_call, host_lat = g.host[released_rows], g.host_lat[released_rows]
    released = np.full(g.dur.size, NEVER, np.int64)
    after_rows = np.flatnonzero(g.after >= 0)
    after_op, after_less = g.after[after_rows], after_back[after_rows]
    dep_rows = np.flatnonzero(g.dep >= 0)
    dep_op, dep_add = g.dep[dep_rows], op_dep_add[dep_rows]
    dep_and_after = g.after[dep_rows] >= 0
    dep_end = np.full(g.dur.size, NEVER, np.int64)
    # Only the calls that drain ops wait for the device (their drain above NEVER): the host
    # chain's running maximum is taken over them alone, and each call reads that of the last
    # of them at or before it on its chain.
    waits = np.unique(g.drained_by[synced])
    last = np.searchsorted(waits, np.arange(n_calls), side="right") - 1
    after_wait = last >= 0
    after_wait[after_wait] = c_seg[waits[last[after_wait]]] == c_seg[after_wait]
    last = np.maximum(last, 0)
    wait_seg, wait_base = c_seg[waits], cost_i[waits] - a_seg[waits]
    # Each wait's drain, the latest end of the ops it drains: a maximum per group of ops.
    synced_rows = np.flatnonzero(synced)
    del synced
    synced_rows = synced_rows[np.argsort(g.drained_by[synced_rows], kind="stable")]
    group_of = g.drained_by[synced_rows]
    group_starts = np.flatnonzero(np.r_[True, group_of[1:] != group_of[:-1]])
    before_waits = np.flatnonzero(~after_wait)
    first_calls = np.flatnonzero(g.call_first)
    drain_w = np.full(waits.size, NEVER, np.int64)
    rounds = 0
    op_end = np.zeros(g.dur.size, np.int64)
    solved = 0
    # Each round's host times and op releases are written over the last round's, in place:
    # a round's temporaries were most of the replay's peak memory.
    call_end = np.empty(n_calls, np.int64)
    call_start = np.empty(n_calls, np.int64)
    r = np.empty(g.dur.size, np.int64)
    while True:
        rounds += 1
        # Host, per thread: e_i = max(e_{i-1} + gap_i + cost_i, drain_i + cost_i), from 0.
        if waits.size:
            b = np.where(drain_w > NEVER, drain_w + wait_base, NEVER)
            lift = np.maximum(_seg_max(b, wait_seg), 0)
            np.take(lift, last, out=call_end)
            call_end[before_waits] = 0
            call_end += a_seg
        else:
            call_end[:] = a_seg
        # Each call starts after the one before it on its chain (a chain's first, from 0).
        call_start[1:] = call_end[:-1]
        call_start[0] = 0
        call_start[first_calls] = 0
        call_start += step_gap
        ready[call_rows] = call_start[call_of] + delay
        released[released_rows] = call_start[host_call] + host_lat
        np.maximum(ready, dep_end, out=r)
        np.maximum(r, released, out=r)
        # Streams: e_k = max(e_{k-1} + gap_k + dur_k, r_k + dur_k), per stream.
        r += dur_i
        r -= w_seg
        new_end = _seg_max(r, seg)
        new_end += w_seg
        if rounds > 1 and np.array_equal(new_end, op_end):
            rounds = max(rounds, solved)
            break
        solved = 0  # (were the one pass's ends not the fixed point, iterate on from them)
        op_end = new_end
        if rounds == one_pass_at:
            # Still moving: the longest path in one pass over the graph in dependency order,
            # checked by the next round (it must not move it).
            # The order depends on the edges alone: one per edge set (the sync what-if drops
            # the drains), kept for the graph's other replays.
            if use_sync not in orders:
                whole = orders.get(True)
                # Without the syncs the edges are the whole graph's less its drains: an order
                # of the whole graph is an order of them too (one traversal fewer).
                orders[use_sync] = (
                    whole
                    if whole is not None and not use_sync
                    else _dependency_order(g, synced_rows, group_of)
                )
            order = orders[use_sync]
            longest = (
                None
                if order is None
                else _longest_path(
                    g,
                    order,
                    step_gap,
                    gap_i + cost_i,
                    cost_i,
                    dur_i,
                    op_delay,
                    op_dep_add,
                    after_back,
                    synced_rows,
                    group_of,
                )
            )
            if longest is not None:
                op_end, solved = longest
        dep_end[after_rows] = op_end[after_op] - after_less
        dep_end[dep_rows] = np.maximum(
            op_end[dep_op] + dep_add, np.where(dep_and_after, dep_end[dep_rows], NEVER)
        )
        if waits.size:
            drain_w = np.maximum.reduceat(op_end[synced_rows], group_starts)
        if rounds >= MAX_ROUNDS:
            break
    drain = np.full(n_calls, NEVER, np.int64)
    drain[waits] = drain_w
    op_start = op_end - dur_i
    # The range ends where the last step's ops end (or its host chain, with no ops).
    # As the measured windows: the last step ends with the device work it launched.
    end = int(op_end[has_call].max()) if has_call.any() else 0
    if g.tail >= 0 or not has_call.any():
        end = max(end, int(call_end.max(initial=0)) + int(max(g.tail, 0) / change.host))
    return Timing(
        call_start=call_start,
        call_end=call_end,
        drain=drain,
        op_start=op_start,
        op_end=op_end,
        ready=ready,
        dep_end=dep_end,
        released=released,
        end=end,
        # The device's own floor: its busy time less what the change takes off its ops.
        step_s=max(
            float(end - g.origin) * NS / g.steps,
            (g.busy_other_s if change.overlap else g.busy_s)
            - float(np.sum(g.dur - dur_i)) * NS / g.steps,
        ),
        rounds=rounds,
    )


ONE_PASS_AFTER = 128
"""Fixed-point rounds after which the replay takes the longest path in one pass over the graph
in dependency order instead (one round is a few vectorised passes over the graph, the one pass
a Python loop over its nodes: as long as about this many rounds)."""


def one_pass_pays(nodes: int) -> int:
    """The rounds past which the one pass costs less than iterating on a graph of `nodes`:
    a round is a few vectorised passes (a fixed cost, then a few ns a node), the one pass a
    Python loop (about 0.6 µs a node); measured on graphs of 2,000 to 65,000 nodes, about
    nodes / 300 rounds, between 32 and ONE_PASS_AFTER. Either way the times are the same."""
    return min(max(nodes // 300, 32), ONE_PASS_AFTER)


def _dependency_order(g: StepGraph, synced_rows: I64, group_of: I64) -> I64 | None:
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


def _longest_path(
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
    order (`order`, from `_dependency_order`), and the rounds the iteration takes to it: a
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


def path_shares(g: StepGraph, t: Timing) -> dict[str, float]:
    """The critical path's time by category (CATEGORIES), as shares of the replayed range."""
    return walk_path(g, t).shares()


FOLD_STEPS = 1024
"""The walk sums its segments by category every this many steps back along the path, and
keeps only those in the window it is asked to keep: the whole path's segments (three int64s
each, tens of thousands on a large graph) are never held at once."""


class _Walk:
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


def walk_path(g: StepGraph, t: Timing, keep: tuple[int, int] = (0, 0)) -> _Walk:
    """The critical path, walked back from where the last step ends through each node's
    binding edge to the start of the range; its segments in `keep` ([lo, hi) in replayed ns)
    are kept, the rest only summed.

    The walk is a loop over the path's nodes, the one Python loop of the analysis that
    touches each node: a step of the path ("take") is written out in place, `if lo < cur:`
    the path spends [lo, cur) in a category and goes on from `lo`, rather than called."""
    walk = _Walk(keep)
    segs: array[int] = array("q")
    add = segs.extend
    cur = t.end
    if cur <= 0:
        return walk
    data, host, launch, sync, comm, compute, bandwidth, wait = range(len(CATEGORIES))
    has_call = g.call >= 0
    # Per stream, the previous op (NONE for the first).
    prev = np.where(g.stream_first, -1, np.arange(g.dur.size) - 1)
    # Per sync call, the op its drain waited for.
    drain_op = np.full(g.gap.size, -1, np.int64)
    synced = g.drained_by >= 0
    if synced.any():
        rows = np.flatnonzero(synced)
        rows = rows[np.lexsort((t.op_end[rows], g.drained_by[rows]))]
        last = np.r_[g.drained_by[rows][1:] != g.drained_by[rows][:-1], True]
        drain_op[g.drained_by[rows][last]] = rows[last]
    candidates = np.flatnonzero(has_call)
    node_op = int(candidates[np.argmax(t.op_end[candidates])]) if candidates.size else -1
    node_call = -1 if node_op >= 0 else int(np.argmax(t.call_end))
    if node_op >= 0 and cur > int(t.op_end[node_op]):
        # The last step ended with its host work (it launched nothing).
        node_op, node_call = -1, int(np.argmax(t.call_end))
    # Single elements read several times faster from memoryviews than from arrays.
    op_start, op_end, dep_end, released = (
        t.op_start.data,
        t.op_end.data,
        t.dep_end.data,
        t.released.data,
    )
    call_start, call_end, drain = t.call_start.data, t.call_end.data, t.drain.data
    cls, stream_gap, dep, after = g.cls.data, g.stream_gap.data, g.dep.data, g.after.data
    host_of, call_of, extra = g.host.data, g.call.data, g.extra.data
    call_first, is_sync, blocked = g.call_first.data, g.sync.data, g.blocked.data
    gap, gap_data, gap_comm, after_data = (
        g.gap.data,
        g.gap_data.data,
        g.gap_comm.data,
        g.after_data.data,
    )
    call_cat = None if g.call_cat is None else g.call_cat.data
    prev_l, has_call_l, drain_op_l = prev.data, has_call.data, drain_op.data
    c = -1
    for step in range(4 * (g.dur.size + g.gap.size) + 4):
        if cur <= 0:
            break
        if step % FOLD_STEPS == 0:
            walk.fold(segs)
        if node_op >= 0:
            k = node_op
            start = op_start[k]
            kind = cls[k]
            # A collective held up past its stream or launch waited for its peers.
            waited = comm if kind == COMM else wait
            lo = op_end[k]
            if lo < cur:
                add((lo, cur, waited))
                cur = lo
            if start < cur:
                add(
                    (
                        start,
                        cur,
                        comm if kind == COMM else compute if kind in _MATMUL else bandwidth,
                    )
                )
                cur = start
            p = prev_l[k]
            if p >= 0 and op_end[p] + stream_gap[k] >= start - TIE_NS:
                # A launch that came within TIE_NS of its stream freeing up ties with the
                # device's own chain: the path stays on the device and the small gap is the
                # launch's (as the breakdown calls it), instead of following the host chain
                # back through work that ran while the device was busy.
                lo = op_end[p] + stream_gap[k]
                if lo < cur:
                    add((lo, cur, launch))
                    cur = lo
                node_op = p
                continue
            if dep[k] >= 0 and dep_end[k] >= start:
                node_op = dep[k]
                lo = op_end[node_op]
                if lo < cur:
                    add((lo, cur, wait))
                    cur = lo
                continue
            if after[k] >= 0 and op_end[after[k]] >= start:
                node_op = after[k]
                continue
            c = host_of[k] if host_of[k] >= 0 and released[k] >= start else -1
            if c < 0 and has_call_l[k]:
                c = call_of[k]
                lo = max(cur - extra[k], call_start[c])
                if lo < cur:
                    add((lo, cur, waited))
                    cur = lo
            if c < 0:
                if cur > 0:
                    add((0, cur, wait))
                break
            lo = call_start[c]
            if lo < cur:
                add((lo, cur, launch))
                cur = lo
            node_op = -1
        else:
            if node_call < 0:
                if cur > 0:
                    add((0, cur, host))
                break
            c = node_call
            lo = call_end[c]
            if lo < cur:
                add((lo, cur, host))
                cur = lo
            if (is_sync[c] or blocked[c]) and drain_op_l[c] >= 0 and drain[c] > call_start[c]:
                lo = drain[c]
                if lo < cur:
                    add((lo, cur, sync if is_sync[c] else launch))
                    cur = lo
                node_op, node_call = drain_op_l[c], -1
                continue
            own = launch if call_cat is None else call_cat[c]
            lo = call_start[c]
            if lo < cur:
                add((lo, cur, sync if is_sync[c] else own))
                cur = lo
        # The host work before call `c`, split by what it was, up to the previous call's
        # end: the host work after the DataLoader's last stretch, the DataLoader, host-side
        # collectives, then the rest (the order of the last two is not recorded).
        before = 0 if call_first[c] else call_end[c - 1]
        total = gap[c]
        g_data, g_comm = gap_data[c], gap_comm[c]
        if (g_data or g_comm) and total > 0 and cur > before:
            # (Most gaps hold neither: the split is skipped, as it would take nothing.)
            scale = (cur - before) / total
            tail = min(after_data[c], total - g_data - g_comm) if g_data > 0 else 0
            for part, what in ((tail, host), (g_data, data), (g_comm, comm)):
                lo = cur - round(part * scale)
                if lo < cur:
                    add((lo, cur, what))
                    cur = lo
        if before < cur:
            add((before, cur, host))
            cur = before
        node_call = -1 if call_first[c] else c - 1
    walk.fold(segs)
    return walk


def wall_of(shares: dict[str, float]) -> Wall:
    """The wall a critical path hits: that of its largest group of categories."""
    walls: dict[Wall, float] = {}
    for k, v in shares.items():
        walls[_WALL_OF[k]] = walls.get(_WALL_OF[k], 0.0) + v
    return max(walls, key=lambda w: walls[w])


@dataclass(frozen=True, eq=False)
class WhatIf:
    """A rank's graph, its unchanged replay, and replays on demand: what the findings ask."""

    graph: StepGraph
    step_s: float
    """The unchanged replay's mean step."""
    rounds: int
    """The rounds the unchanged replay took."""
    blocked_s: float
    """The host's time per step inside synchronising calls (blocking copies included) in the
    unchanged replay: time it could not queue work, so the most that removing the syncs can
    save."""
    _done: dict[Change, tuple[float, dict[str, float]]] = field(default_factory=dict)
    """Each change's replayed step and path shares, replayed once: the table and the findings
    ask for several of the same changes."""
    _orders: dict[bool, I64 | None] = field(default_factory=dict)
    """The dependency orders the graph's one passes found, by edge set (see `replay`)."""

    @classmethod
    def of(cls, g: StepGraph, base: Timing, orders: dict[bool, I64 | None]) -> WhatIf:
        """The what-ifs of `g` from its unchanged replay `base`, of which only figures are
        kept (its per-node times are as large as the graph)."""
        blocked = float((base.call_end - base.call_start)[g.sync].sum()) * NS / g.steps
        return cls(g, base.step_s, base.rounds, blocked, _orders=orders)

    def _outcome(self, change: Change) -> tuple[float, dict[str, float]]:
        done = self._done.get(change)
        if done is None:
            # A change moves few edges: where the unchanged graph took more rounds than the
            # one pass costs, so will the changed one, and the one pass is taken at once.
            g = self.graph
            at_once = self.rounds > one_pass_pays(g.gap.size + g.dur.size)
            t = replay(g, change, 1 if at_once else 0, self._orders)
            done = self._done[change] = (t.step_s, path_shares(self.graph, t))
        return done

    @property
    def error(self) -> float:
        """How far the unchanged replay is from the measured step (a fraction, unsigned)."""
        g = self.graph
        return abs(self.step_s - g.measured_s) / g.measured_s if g.measured_s > 0 else 0.0

    def speedup(self, change: Change) -> tuple[float, Wall]:
        step_s, shares = self._outcome(change)
        return self.step_s / max(step_s, 1e-12), wall_of(shares)

    def row(self, change: Change) -> WhatIfRow:
        step_s, shares = self._outcome(change)
        return WhatIfRow(
            change=change.label,
            step_s=step_s,
            speedup=self.step_s / max(step_s, 1e-12),
            wall_after=wall_of(shares),
        )


def with_replay(whatif: WhatIf | None, finding: Finding, max_error: float) -> Finding:
    """`finding` with its gain replayed on the graph where the graph can (`replay_speedup`,
    `wall_after`), else marked as a bound (`gain_basis`): also where the unchanged replay
    misses the measured step by more than `max_error`, since that graph lacks dependencies.
    The change is the one the finding's rule declares (`rules.rule(replay=...)`)."""
    declaration = declared(finding.id)
    change = declaration.replay if declaration is not None else None
    if whatif is None or change is None or finding.saves != "time" or whatif.error > max_error:
        return msgspec.structs.replace(finding, gain_basis="bound")
    if change.host != 1.0 and whatif.graph.cost_fixed is not None:
        # On the CPU a host cut also divides the Python between ops and each op's fixed cost,
        # more than the per-op overhead finding's share: the table's `host:F` rows are that
        # fix, and the finding keeps its bound rather than a second figure for it.
        return msgspec.structs.replace(finding, gain_basis="bound")
    speedup, wall = whatif.speedup(change)
    # The replay moves what the graph holds; the Amdahl bound caps what removing the share
    # can give, so a replay above it is the graph's error, not a gain.
    speedup = min(max(speedup, 1.0), finding.max_speedup)
    return msgspec.structs.replace(
        finding, gain_basis="replay", replay_speedup=speedup, wall_after=wall
    )


def _kinds(change: Change) -> frozenset[str]:
    return frozenset(
        k
        for k, on in (
            ("data", change.data),
            ("host", change.host != 1.0),
            ("sync", change.sync),
            ("fuse", change.fuse),
            ("matmul", change.matmul is not None),
            ("overlap", change.overlap),
        )
        if on
    )


def covers(finding: Change, row: Change) -> bool:
    """The finding's change is the row's, or a larger one of the same kind (all host work
    gone against half of it, matmuls at their roof against 80% of it)."""
    return (
        _kinds(finding) == _kinds(row)
        and finding.host >= row.host
        and (row.matmul is None or (finding.matmul or 0.0) >= row.matmul)
    )


def consistent_rows(rows: Sequence[WhatIfRow], findings: Sequence[Finding]) -> list[WhatIfRow]:
    """The what-if rows, each no faster than a replayed finding whose fix is the same or
    larger says (a finding's replay is capped by its Amdahl bound, the share of the step the
    breakdown gives its cause), with that finding's wall after: one fix, one figure, in the
    table and in the findings."""
    ceilings: list[tuple[Change, str, float, Wall | None]] = []
    for f in findings:
        # What each finding's rule declares: the change it replays, or the what-if it bounds.
        d = declared(f.id)
        if d is not None and d.replay is not None and f.replay_speedup is not None:
            ceilings.append((d.replay, f.id, f.replay_speedup, f.wall_after))
        if d is not None and d.bounds is not None:
            ceilings.append((d.bounds, f.id, f.max_speedup, None))
    out = []
    for r in rows:
        try:
            change = parse_what_if(r.change)[-1]
        except WallfinderError:  # a job's straggler row: not a graph change
            out.append(r)
            continue
        caps = [(s, i, w) for c, i, s, w in ceilings if covers(c, change) and s < r.speedup]
        if not caps:
            out.append(r)
            continue
        speedup, by, wall = min(caps)
        out.append(
            msgspec.structs.replace(
                r,
                speedup=speedup,
                step_s=r.step_s * r.speedup / speedup,
                capped_by=by,
                wall_after=wall or r.wall_after,
            )
        )
    return out


def critical_path(
    scope: Scope,
    fusion: Sequence[FusionCandidate] = (),
    roofline: Roofline | None = None,
    changes: Sequence[Change] | None = None,
    timeline: StepTimeline | None = None,
    graph: StepGraph | None = None,
    cause: str = "",
) -> tuple[CriticalPath | None, WhatIf | None]:
    """The steady steps' critical path, the replay check and the what-if table (`changes`, or
    the default changes for a wall of `cause`); None when the graph cannot be built. `graph`:
    the graph a device model built itself (the CPU's, `cpu_graph`); else it is built from
    the device's ops."""
    centre = None
    if timeline is not None:
        centre = int(np.searchsorted(scope.start, _drawn_at(scope, timeline), "right")) - 1
    g = graph if graph is not None else build_graph(scope, fusion, roofline, centre)
    if g is None:
        return None, None
    orders: dict[bool, I64 | None] = {}
    base = replay(g, orders=orders)
    whatif = WhatIf.of(g, base, orders)
    window = _drawn_window(g, scope, timeline)
    walk = walk_path(g, base, window or (0, 0))
    del base  # (from here, its figures in `whatif` alone)
    shares = walk.shares()
    drawn = _in_step(walk, window)
    del walk
    notes = list(g.notes)
    if whatif.rounds >= MAX_ROUNDS:
        notes.append(f"the replay stopped after {MAX_ROUNDS} rounds: figures are approximate")
    if whatif.error > scope.thresholds.time.replay_error:
        notes.append(
            f"the unchanged replay misses the measured step by {whatif.error:.0%}: the graph "
            "lacks dependencies the trace does not record, so the findings keep their bounds "
            "and the what-ifs are rough"
        )
    if shares["wait"] >= 0.05:
        notes.append(
            f"{shares['wait']:.0%} of the critical path is device waits no recorded edge "
            "explains (an event or stream wait on work the trace does not show, a graph's "
            "internal edges): each kept as a fixed delay after its launch or the op before "
            "it on its stream, so a fix cannot shorten them, though one that launches the "
            "work sooner moves them with it"
        )
    if changes is None:
        changes = default_changes(cause, bool(g.dur.size))
    rows = [whatif.row(c) for c in changes]
    error = (whatif.step_s - g.measured_s) / g.measured_s if g.measured_s > 0 else 0.0
    return (
        CriticalPath(
            steps=g.steps,
            measured_step_s=g.measured_s,
            replayed_step_s=whatif.step_s,
            replay_error=error,
            shares=shares,
            wall=wall_of(shares),
            host_calls=int(g.gap.size),
            device_ops=int(g.dur.size),
            event_waits=int((g.dep >= 0).sum()),
            sync_edges=int((g.drained_by >= 0).sum()),
            what_if=rows,
            notes=notes,
            timeline=drawn,
        ),
        whatif,
    )


MAX_SEGMENTS = 300
"""Path segments drawn on the timeline, at most: neighbours of one category are merged, then
the shortest are merged into the one before them until they fit."""


def _drawn_at(scope: Scope, timeline: StepTimeline) -> int:
    """Where the timeline's step starts, in the trace's ns."""
    return int(scope.start[0]) + round(timeline.start_s / NS)


def _drawn_window(
    g: StepGraph, scope: Scope, timeline: StepTimeline | None
) -> tuple[int, int] | None:
    """The timeline's step, [start, end) in the graph's ns (None: no timeline)."""
    if timeline is None:
        return None
    a = _drawn_at(scope, timeline) - g.t0
    return a, a + round(timeline.duration_s / NS)


def _in_step(walk: _Walk, window: tuple[int, int] | None) -> list[PathSegment]:
    """The path's segments inside the timeline's step (`window`, the walk's kept window), in
    seconds from its start."""
    if window is None:
        return []
    a = window[0]
    merged: list[list[Any]] = []
    for lo, hi, cat in walk.segments():
        if merged and merged[-1][2] == cat and merged[-1][1] >= lo:
            merged[-1][1] = hi
        else:
            merged.append([lo, hi, cat])
    return [
        PathSegment(start_s=(lo - a) * NS, end_s=(hi - a) * NS, category=cat)
        for lo, hi, cat in _fewest(merged, MAX_SEGMENTS)
    ]


@dataclass(frozen=True, eq=False)
class JobReplay:
    """A job replayed across its ranks, joined at the collectives every rank takes part in: a
    collective ends on every rank when the last rank arrives plus its transfer time (the
    fastest rank's time in it), and each rank's work between two of them (its own graph
    between the joins) takes what it measured. Times are ns over the replayed span: from the
    first such collective's end to the last's."""

    measured_ns: float
    replayed_ns: float
    intervals: int
    """Collective-to-collective intervals replayed."""
    on_path_ns: F64
    """Per rank (column): the path's time in its work where it arrived last, more than
    EDGE_SLACK_NS after the next rank (the others waited for it)."""
    together_ns: float
    """The path's time in work where the last ranks arrived together (no one rank waited for)."""
    transfer_ns: float
    """The path's time in the collectives' transfers."""
    work: F64
    """Intervals x ranks: each rank's work from one join's end to its arrival at the next."""
    transfer: F64
    """Per interval: the transfer time of the collective that ends it."""

    def without(self, rank: int) -> float:
        """The replayed span with rank (column) `rank`'s work brought to the median of the
        other ranks' at every interval."""
        work = self.work.copy()
        work[:, rank] = np.median(np.delete(self.work, rank, axis=1), axis=1)
        return float((work.max(axis=1) + self.transfer).sum())


def job_replay(arrive: F64, dur: F64) -> JobReplay | None:
    """The job's cross-rank replay from its matched collectives: `arrive` and `dur` are
    instances x ranks, ns on aligned clocks (NaN: the rank has no such instance). None when
    fewer than two collectives are taken part in by every rank."""
    full = ~np.isnan(arrive).any(axis=1) & ~np.isnan(dur).any(axis=1)
    a, d = arrive[full], dur[full]
    if a.shape[0] < 2 or a.shape[1] < 2:
        return None
    order = np.argsort(np.median(a, axis=1), kind="stable")
    a, d = a[order], d[order]
    transfer = d.min(axis=1)[1:]
    end = a + d
    # Each rank's work from the previous join's end (on its clock) to its arrival at the next
    # (negative where it arrived before that one ended: collectives on two streams).
    work = a[1:] - end[:-1]
    binding = work.max(axis=1)
    last = np.argmax(work, axis=1)
    alone = (binding - np.sort(work, axis=1)[:, -2] > EDGE_SLACK_NS) & (binding > 0)
    return JobReplay(
        measured_ns=float(np.median(end[-1]) - np.median(end[0])),
        replayed_ns=float((binding + transfer).sum()),
        intervals=int(work.shape[0]),
        on_path_ns=np.bincount(last[alone], weights=binding[alone], minlength=a.shape[1]).astype(
            np.float64
        ),
        together_ns=float(np.maximum(binding[~alone], 0.0).sum()),
        transfer_ns=float(transfer.sum()),
        work=work,
        transfer=transfer,
    )


def _fewest(segments: list[list[Any]], most: int) -> list[list[Any]]:
    """`segments` with the shortest (the first of the shortest on a tie) merged into the one
    before it, again and again, until at most `most` are left (the first is never merged
    away). A heap of lengths with stale entries skipped: a step ~ tens of thousands of
    segments, which a scan per merge makes quadratic."""
    if len(segments) <= most:
        return segments
    before = list(range(-1, len(segments) - 1))
    after = list(range(1, len(segments) + 1))
    alive = [True] * len(segments)
    heap = [(hi - lo, j) for j, (lo, hi, _) in enumerate(segments) if j > 0]
    heapq.heapify(heap)
    left = len(segments)
    while left > most:
        length, j = heapq.heappop(heap)
        lo, hi, _ = segments[j]
        if not alive[j] or hi - lo != length:
            continue  # merged away, or grown since this entry was pushed
        i = before[j]
        segments[i][1] = hi
        alive[j] = False
        after[i] = after[j]
        if after[j] < len(segments):
            before[after[j]] = i
        if i > 0:
            heapq.heappush(heap, (segments[i][1] - segments[i][0], i))
        left -= 1
    return [s for s, keep in zip(segments, alive, strict=True) if keep]


def job_path(
    paths: Sequence[tuple[int | None, CriticalPath | None]],
    ranks: Sequence[RankSummary],
    straggler: int | None,
    joined: JobReplay | None = None,
    steps: float = 1.0,
) -> CriticalPath | None:
    """A job's critical path. With `joined` (the cross-rank replay, its columns in the order
    of `paths`; the traces hold `steps` steps, each with the same collectives):
    the path runs through the rank whose work the others wait for most on the replayed path
    (said with each rank's share in `rank_shares`), and the "straggler" what-if brings the
    named straggler (else that rank) to the median and replays the job. Without it: the
    straggler's path (else the rank with the longest replayed step), and the what-if is an
    estimate from the join's waits (the least wait of the other ranks leaves the step)."""
    known = [(r, p) for r, p in paths if p is not None]
    if not known:
        return None
    by_rank = dict(known)
    ids = [r for r, _ in paths]
    notes: list[str] = []
    shares: dict[str, float] = {}
    late: int | None = None
    if joined is not None:
        total = joined.replayed_ns or 1.0
        shares = {
            str(r if r is not None else i): float(v) / total
            for i, (r, v) in enumerate(zip(ids, joined.on_path_ns.tolist(), strict=True))
        }
        late = int(np.argmax(joined.on_path_ns))
        if joined.on_path_ns[late] <= 0:
            through = "no rank alone (the last ranks arrive together)"
        else:
            through = f"{shares[str(ids[late])]:.0%} through rank {ids[late]}'s work"
            if ids[late] in by_rank and (straggler is None or straggler not in by_rank):
                straggler = ids[late]
        error = (joined.replayed_ns - joined.measured_ns) / (joined.measured_ns or 1.0)
        notes.append(
            f"across ranks: between the {joined.intervals + 1} collectives every rank joins, "
            f"the job's path runs {through}, {joined.together_ns / total:.0%} through work "
            f"the last ranks finish together and {joined.transfer_ns / total:.0%} through "
            f"the transfers; the cross-rank replay's span is {error:+.1%} off the measured "
            "one (an estimate: each rank's work between two collectives is taken as measured)"
        )
    if straggler is None or straggler not in by_rank:
        straggler = max(known, key=lambda x: x[1].replayed_step_s)[0]
    path = by_rank[straggler]
    saving: float | None = None
    if joined is not None:
        # The straggler at the median, replayed: the job's step loses what the span loses.
        column = ids.index(straggler)
        # Every step has the same collectives: the intervals span this many steps.
        spanned = steps * joined.intervals / (joined.intervals + 1)
        saving = (joined.replayed_ns - joined.without(column)) * NS / max(spanned, 1e-12)
    else:
        waits = sorted(r.wait_s for r in ranks if r.rank != straggler and r.wait_s is not None)
        if waits:
            notes.append(
                "across ranks: fewer than two collectives join every rank here (point-to-point, "
                "or groups with ranks whose traces are not here), so the job is not replayed "
                "across ranks: the straggler row is an estimate from the collectives' waits"
            )
            # Every other rank waits for the straggler at least the least of their waits: the
            # straggler at the median takes that off every rank's step.
            saving = waits[0]
    rows = list(path.what_if)
    if saving is not None:
        step = max(path.measured_step_s - saving, 1e-12)
        rows.append(
            WhatIfRow(
                change="straggler",
                step_s=step,
                speedup=path.measured_step_s / step,
                wall_after=path.wall,
            )
        )
    return msgspec.structs.replace(
        path,
        rank=straggler,
        what_if=rows,
        notes=[*path.notes, *notes],
        rank_shares=shares,
    )


__all__ = [
    "CATEGORIES",
    "WHAT_IFS",
    "Change",
    "JobReplay",
    "StepGraph",
    "Timing",
    "WhatIf",
    "build_graph",
    "consistent_rows",
    "covers",
    "cpu_graph",
    "critical_path",
    "job_path",
    "job_replay",
    "parse_what_if",
    "path_shares",
    "replay",
    "with_replay",
]
