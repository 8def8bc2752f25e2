"""The device timeline: which ops ran on the device, who launched them, the per-step breakdown
and the causes of idle time."""

from __future__ import annotations

import itertools
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from wallfinder.analysis.classify import (
    MATMUL_CLASSES,
    SYNC_CALLS,
    KernelClass,
    classify_kernel,
    classify_op,
    communication_ops,
)

# Defined in classify, with the other name tables; critpath and the pipeline read them here.
from wallfinder.analysis.classify import SYNC_RUNTIME as SYNC_RUNTIME
from wallfinder.analysis.classify import is_data_loading as is_data_loading
from wallfinder.analysis.intervals import Coverage, split_at
from wallfinder.analysis.oneoff import OneOffs, one_offs
from wallfinder.analysis.steps import NO_LAUNCH
from wallfinder.analysis.thresholds import SlackThresholds, TimeThresholds
from wallfinder.trace import NONE, Events, Kind, Trace, thread_mask

I64 = npt.NDArray[np.int64]

CLASSES = list(KernelClass)
_CLASS_INDEX = {c: i for i, c in enumerate(CLASSES)}
COMM = _CLASS_INDEX[KernelClass.COMMUNICATION]
COPY = _CLASS_INDEX[KernelClass.COPY]

IDLE_CAUSES = (
    "data_loading",
    "synchronization",
    "communication_wait",
    "host_overhead",
    "launch_latency",
    "dependency_wait",
    "startup",
    "other",
)
"""Causes of GPU idle time. A host wait is split by what the launching thread was doing
(DataLoader, a synchronising call, a collective on the host, other CPU ops or Python); then
the launch latency after the host issued the work; `dependency_wait` when the work had been
queued well before the GPU went idle (it waited on another stream, an event or a peer);
`startup` when what the GPU waited for was a one-off: a first launch loading the kernel's code
(`DeviceOps.one_off`), or host work in a one-off stretch (`DeviceOps.one_offs`: library
start-up, module loading, a JIT compile), which the steady state does not pay; and time
nothing in the trace explains."""

GRAPH_LAUNCHES = frozenset(
    {"cudaGraphLaunch", "cudaGraphLaunch_v10000", "cuGraphLaunch", "hipGraphLaunch"}
)
"""Runtime calls that replay a captured graph: every kernel they start correlates to them."""


class DeviceOps(msgspec.Struct, frozen=True):
    """Everything that ran on one device, sorted by start, with each op's launch."""

    device: int
    ops: Events
    cls: npt.NDArray[np.int8]
    launch_ts: I64
    launch_thread: I64
    launch_end: I64
    """When each op's launch call returned (NO_LAUNCH when it has none)."""
    graph: npt.NDArray[np.bool_]
    """Launched by a CUDA/HIP graph launch: replayed from a captured graph."""
    one_off: npt.NDArray[np.bool_]
    """The first launch of its kernel, and a call far slower than its launch API's usual one
    (`TimeThresholds.slow_launch_ns`, `first_launch_factor`): the launch loaded the kernel's
    code, a cost paid once per run."""
    one_offs: OneOffs
    """The host's one-off stretches (`oneoff.one_offs`): the GPU's wait for them is start-up."""
    _idle: dict[tuple[bytes, bytes, SlackThresholds], IdlePieces] = msgspec.field(
        default_factory=dict
    )
    """The idle pieces of each set of windows `idle_pieces` was asked for (the breakdown's,
    the timeline's and the rules' are the scope's windows): attributed once."""


def device_ops(trace: Trace, thresholds: TimeThresholds | None = None) -> DeviceOps | None:
    """The ops of the busiest device (kernels, memcpy, memset), or None when the trace has no
    device activity."""
    gpu = trace.of_kind(Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET)
    if len(gpu) == 0:
        return None
    pid_values = np.array(
        [v if isinstance(v, int) and not isinstance(v, bool) else NONE for v in trace.ids],
        dtype=np.int64,
    )
    device = np.where(gpu.device >= 0, gpu.device, pid_values[gpu.pid])
    busy = {int(d): int(gpu.dur[device == d].sum()) for d in np.unique(device)}
    main = max(busy, key=lambda d: busy[d])
    ops = gpu if len(busy) == 1 else gpu.take(np.flatnonzero(device == main))

    runtime = trace.of_kind(Kind.RUNTIME)
    launch_ts = np.full(len(ops), NO_LAUNCH, dtype=np.int64)
    launch_end = np.full(len(ops), NO_LAUNCH, dtype=np.int64)
    launch_thread = np.full(len(ops), NONE, dtype=np.int64)
    graph = np.zeros(len(ops), dtype=bool)
    api = np.full(len(ops), NONE, dtype=np.int64)
    has_corr = runtime.correlation >= 0
    if has_corr.any():
        r_corr = runtime.correlation[has_corr]
        order = np.argsort(r_corr, kind="stable")
        r_corr = r_corr[order]
        r_ts = runtime.ts[has_corr][order]
        r_end = runtime.end[has_corr][order]
        r_thread = runtime.thread[has_corr][order]
        pos = np.clip(np.searchsorted(r_corr, ops.correlation), 0, r_corr.size - 1)
        found = (ops.correlation >= 0) & (r_corr[pos] == ops.correlation)
        launch_ts[found] = r_ts[pos[found]]
        launch_end[found] = r_end[pos[found]]
        launch_thread[found] = r_thread[pos[found]]
        r_name = runtime.name[has_corr][order]
        api[found] = r_name[pos[found]]
        graph[found] = np.isin(r_name[pos[found]], trace.codes_of(GRAPH_LAUNCHES))
    t = thresholds or TimeThresholds()
    one_off = _one_off(trace, ops, launch_ts, launch_end, api, t)
    stretches = one_offs(trace, launch_ts, launch_end, launch_thread, ops, one_off, t)
    return DeviceOps(
        main,
        ops,
        _classes(trace, ops),
        launch_ts,
        launch_thread,
        launch_end,
        graph,
        one_off,
        stretches,
    )


def _one_off(
    trace: Trace, ops: Events, launch_ts: I64, launch_end: I64, api: I64, t: TimeThresholds
) -> npt.NDArray[np.bool_]:
    """Which ops' launches loaded their kernel's code: the first launch of each kernel name
    whose call took at least `slow_launch_ns` and `first_launch_factor` times the median call
    of the same runtime API (an API called once has no usual call to compare with). Later
    launches of a kernel as slow are the host stalling in the runtime, which can recur."""
    out = np.zeros(len(ops), dtype=bool)
    call = launch_end - launch_ts
    sync = trace.codes_of(SYNC_RUNTIME)
    rows = np.flatnonzero(
        (ops.kind == Kind.KERNEL) & (launch_ts != NO_LAUNCH) & ~np.isin(api, sync)
    )
    if rows.size == 0:
        return out
    rows = rows[np.lexsort((launch_ts[rows], ops.name[rows]))]
    first = rows[np.r_[True, ops.name[rows][1:] != ops.name[rows][:-1]]]
    slow = first[call[first] >= t.slow_launch_ns]
    if slow.size == 0:
        return out
    runtime = trace.of_kind(Kind.RUNTIME)
    for code in np.unique(api[slow]).tolist():
        calls = runtime.dur[runtime.name == code]
        mine = slow[api[slow] == code]
        out[mine] = call[mine] >= t.first_launch_factor * float(np.median(calls))
    return out


def _classes(trace: Trace, ops: Events) -> npt.NDArray[np.int8]:
    """Class of each device op: from the kernel name, else from the launching CPU op."""
    names = np.unique(ops.name)
    by_name = np.full(len(trace.strings), _CLASS_INDEX[KernelClass.OTHER], dtype=np.int8)
    for code in names.tolist():
        by_name[code] = _CLASS_INDEX[classify_kernel(trace.strings[code])]
    cls = by_name[ops.name]
    cls[ops.kind != Kind.KERNEL] = COPY
    unknown = np.flatnonzero((cls == _CLASS_INDEX[KernelClass.OTHER]) & (ops.external_id >= 0))
    if unknown.size:
        cpu = trace.of_kind(Kind.CPU_OP)
        has = cpu.external_id >= 0
        ext, op_name = cpu.external_id[has], cpu.name[has]
        order = np.argsort(ext, kind="stable")
        ext, op_name = ext[order], op_name[order]
        if ext.size:
            pos = np.clip(np.searchsorted(ext, ops.external_id[unknown]), 0, ext.size - 1)
            hit = ext[pos] == ops.external_id[unknown]
            for row, code in zip(unknown[hit].tolist(), op_name[pos[hit]].tolist(), strict=True):
                cls[row] = _CLASS_INDEX[classify_op(trace.strings[code])]
    return cls


class WindowBreakdown(msgspec.Struct, frozen=True):
    """Per window (step), nanoseconds: the parts sum to end − start."""

    start: I64
    end: I64
    compute: I64
    comm_exposed: I64
    copy_exposed: I64
    idle: I64
    idle_causes: dict[str, npt.NDArray[np.float64]]
    comm_hidden: I64
    """Communication beside compute (inside `compute`): what hiding more of it cannot use."""


def breakdown(
    trace: Trace, dev: DeviceOps, start: I64, end: I64, slack: SlackThresholds
) -> WindowBreakdown:
    ops = dev.ops
    is_kernel = ops.kind == Kind.KERNEL
    compute = Coverage.of(
        ops.ts[is_kernel & (dev.cls != COMM)], ops.end[is_kernel & (dev.cls != COMM)]
    )
    comm = Coverage.of(ops.ts[dev.cls == COMM], ops.end[dev.cls == COMM])
    copies = Coverage.of(ops.ts[~is_kernel], ops.end[~is_kernel])
    with_comm = Coverage.union(compute, comm)
    everything = Coverage.union(with_comm, copies)
    c = compute.covered(start, end)
    cc = with_comm.covered(start, end)
    a = everything.covered(start, end)
    idle = (end - start) - a
    causes = _idle_causes(trace, dev, everything, start, end, slack)
    # |comm ∩ compute| = |comm| − |comm − compute|.
    hidden = comm.covered(start, end) - (cc - c)
    return WindowBreakdown(start, end, c, cc - c, a - cc, idle, causes, hidden)


class BusyHolders(msgspec.Struct, frozen=True):
    """Who holds the device's busy time on the timeline (nanoseconds over the windows, per
    class in `CLASSES` order): see `busy_holders`."""

    held: npt.NDArray[np.float64]
    streaming: npt.NDArray[np.float64]
    """Of `held`, by matmul-class kernels that stream their operands."""
    comm_beside: float
    """The communication kernels' time beside compute, summed over them."""


_MATMUL = np.array([c in MATMUL_CLASSES for c in CLASSES])


def busy_holders(
    dev: DeviceOps,
    rows: npt.NDArray[np.bool_],
    start: I64,
    end: I64,
    streams: npt.NDArray[np.bool_],
) -> BusyHolders:
    """Which class holds each moment of the busy time (when a non-communication kernel runs)
    of the windows [start, end), over the device ops at `rows`; `streams`: per op, a matmul
    that streams its operands (bandwidth-bound). A moment goes to the first class running in
    it, in this order: matmuls that do not stream (GEMM, attention, convolution), matmuls that
    do, then the other classes, most kernel time first. So work beside a matmul (pointwise
    kernels on another stream, collectives, copies) never holds what the matmul runs through,
    and the held times sum to the busy time. Communication holds none; what its kernels run
    beside compute (summed: two at once count twice) is `comm_beside`."""
    ops = dev.ops
    kernel = rows & (ops.kind == Kind.KERNEL)
    compute = kernel & (dev.cls != COMM)
    dur = ops.dur.astype(np.float64)
    summed = np.bincount(dev.cls[compute], weights=dur[compute], minlength=len(CLASSES))
    matmuls = np.flatnonzero(_MATMUL).tolist()
    # (mask, class, whether it streams), in the order the holders take the timeline.
    order = [(kernel & (dev.cls == i) & ~streams, i, False) for i in matmuls]
    order += [(kernel & (dev.cls == i) & streams, i, True) for i in matmuls]
    order += [
        (kernel & (dev.cls == i), i, False)
        for i in np.argsort(-summed, kind="stable").tolist()
        if not _MATMUL[i] and i != COMM
    ]
    held = np.zeros(len(CLASSES))
    streaming = np.zeros(len(CLASSES))
    # Each holder takes what the union up to it covers past the union before it (the ops are
    # sorted by start: each union is read in place). The last union is all the busy time.
    sofar = np.zeros(len(ops), dtype=bool)
    covered = 0.0
    union = Coverage.of(ops.ts[:0], ops.end[:0])
    for mine, i, streamed in order:
        if not mine.any():
            continue
        sofar |= mine
        union = Coverage.of_sorted(ops.ts, ops.end, sofar)
        now = float(union.covered(start, end).sum())
        held[i] += now - covered
        if streamed:
            streaming[i] += now - covered
        covered = now
    comm = kernel & (dev.cls == COMM)
    beside = float(union.covered(ops.ts[comm], ops.end[comm]).sum()) if comm.any() else 0.0
    return BusyHolders(held, streaming, beside)


def _idle_causes(
    trace: Trace, dev: DeviceOps, busy: Coverage, start: I64, end: I64, slack: SlackThresholds
) -> dict[str, npt.NDArray[np.float64]]:
    pieces = idle_pieces(trace, dev, start, end, slack, busy)
    return {
        cause: np.bincount(pieces.window, weights=ns, minlength=start.size).astype(np.float64)
        for cause, ns in pieces.causes.items()
    }


class IdlePieces(msgspec.Struct, frozen=True):
    """The device's idle stretches in the windows (gaps in the busy time, split where a window
    starts), each with its time by cause (nanoseconds, summing to its length)."""

    start: I64
    end: I64
    window: npt.NDArray[np.intp]
    causes: dict[str, npt.NDArray[np.float64]]
    host_end: I64
    """Where the host wait in the piece ends (== `start` when the host was not waited for)."""
    thread: I64
    """The thread that launched the work ending the gap (NONE when unknown)."""
    op: npt.NDArray[np.intp]
    """The device op (row of `DeviceOps.ops`) whose start ends the gap (-1: none)."""

    def of_window(self, i: int) -> IdlePieces:
        """The pieces of window `i` alone (each piece is attributed on its own: the same as
        attributing that window's alone)."""
        mine = np.flatnonzero(self.window == i)
        return IdlePieces(
            self.start[mine],
            self.end[mine],
            self.window[mine],
            {cause: ns[mine] for cause, ns in self.causes.items()},
            self.host_end[mine],
            self.thread[mine],
            self.op[mine],
        )


def idle_pieces(
    trace: Trace,
    dev: DeviceOps,
    start: I64,
    end: I64,
    slack: SlackThresholds,
    busy: Coverage | None = None,
) -> IdlePieces:
    """The idle pieces of the windows [start, end) and their causes, attributed once per
    windows and kept on `dev` (the breakdown, the timeline and the rules all read the
    scope's). `busy`: the union of the device's ops where the caller has it already (else it
    is made here)."""
    key = (start.tobytes(), end.tobytes(), slack)
    done = dev._idle.get(key)
    if done is None:
        if busy is None:
            busy = Coverage.of(dev.ops.ts, dev.ops.end)
        done = dev._idle[key] = _idle_pieces(trace, dev, busy, start, end, slack)
    return done


def _idle_pieces(
    trace: Trace, dev: DeviceOps, busy: Coverage, start: I64, end: I64, slack: SlackThresholds
) -> IdlePieces:
    gap_start, gap_end = busy.gaps(int(start[0]), int(end[-1]))
    if gap_start.size == 0:
        empty = np.empty(0, np.int64)
        return IdlePieces(
            empty,
            empty,
            np.empty(0, np.intp),
            {cause: np.zeros(0) for cause in IDLE_CAUSES},
            empty,
            empty,
            np.empty(0, np.intp),
        )
    # The op that ends each gap, and when and where it was launched.
    op_starts = dev.ops.ts
    next_op = np.searchsorted(op_starts, gap_end, side="left")
    has_next = next_op < op_starts.size
    nxt = np.minimum(next_op, op_starts.size - 1)
    launch = np.where(has_next, dev.launch_ts[nxt], NO_LAUNCH)
    launched = np.where(has_next, dev.launch_end[nxt], NO_LAUNCH)
    thread = np.where(has_next, dev.launch_thread[nxt], NONE)
    # A gap no recorded launch ends (past the device's last op, or before an op whose launch
    # was not recorded) is still the host's while its thread works through it: a loop on CPU
    # tensors after the last kernel leaves the GPU idle by design, and the ops it runs are host
    # work, not time the trace cannot explain. The whole gap is read as a host wait on the
    # thread that launched the work before it.
    blind = launch == NO_LAUNCH
    before = np.searchsorted(op_starts, gap_start, side="left") - 1
    last_thread = np.where(before >= 0, dev.launch_thread[np.maximum(before, 0)], NONE)
    thread = np.where(blind, last_thread, thread)
    # A launch that loaded its code, or one made inside a one-off stretch (a library's first
    # call, a compile): the GPU's wait for its launch path is start-up.
    one_off = has_next & (dev.one_off[nxt] | dev.one_offs.holds(thread, launch))

    piece_start, piece_end, owner = split_at(gap_start, gap_end, start[1:])
    window = np.searchsorted(start, piece_start, side="right") - 1
    n = piece_start.size
    out = {cause: np.zeros(n) for cause in IDLE_CAUSES}
    g0 = gap_start[owner]
    lt = launch[owner]
    known = lt != NO_LAUNCH
    blind_host = ~known & (thread[owner] != NONE)
    # A one-off launch queues nothing until its call returns: the GPU waits for the code to
    # load even when the call began before the gap.
    first = one_off[owner]
    queued = known & (np.where(first, launched[owner], lt) < g0 - slack.queued_ns)
    host_end = np.where(
        known, np.clip(lt, piece_start, piece_end), np.where(blind_host, piece_end, piece_start)
    )
    # The launch path: the call itself, then at most `queued_ns` until the work starts.
    # Past that the work sat launched while the GPU waited on something else.
    path_end = np.clip(launched[owner] + slack.queued_ns, host_end, piece_end)
    late = known & ~queued
    out["launch_latency"] += np.where(late & ~first, path_end - host_end, 0)
    out["startup"] += np.where(late & first, path_end - host_end, 0)
    out["dependency_wait"] += np.where(queued, piece_end - piece_start, 0)
    out["dependency_wait"] += np.where(late, piece_end - path_end, 0)
    out["other"] += np.where(known | blind_host, 0, piece_end - piece_start)

    host = host_end > piece_start
    if host.any():
        _attribute_host_waits(
            trace,
            piece_start[host],
            host_end[host],
            g0[host],
            thread[owner][host],
            np.flatnonzero(host),
            out,
            slack.drain_ns,
            dev.one_offs,
            blind_host[host],
        )
    op = np.where(has_next, nxt, -1).astype(np.intp)
    return IdlePieces(piece_start, piece_end, window, out, host_end, thread[owner], op[owner])


def _attribute_host_waits(
    trace: Trace,
    a: I64,
    b: I64,
    g0: I64,
    thread: I64,
    piece: npt.NDArray[np.intp],
    out: dict[str, npt.NDArray[np.float64]],
    drain_ns: int,
    one_offs: OneOffs,
    blind: npt.NDArray[np.bool_],
) -> None:
    """Split each host wait [a, b) (of idle piece `piece`) by what the launching thread was
    doing (`drain_ns`: `SlackThresholds.drain_ns`). A one-off stretch of the thread
    (`one_offs`) comes first: whatever it holds (a first cudaFree, a cudaMalloc, its own
    work), the GPU waits for it once per run. A `blind` wait (no recorded launch ends it) is
    read without the thread's generic ranges and Python frames: one around it (a benchmark's
    whole-run range, the script's main frame) does not say the thread was busy when no launch
    shows it was about to issue work; its ops and runtime calls do."""
    threads = np.unique(thread)
    # Per kind of host row, each sorted by start and read in place: its ends, its category
    # and its launching thread (the index in `threads`; -1 for the other threads). A
    # coverage is the union of those of each kind's chosen rows (on a large trace a copy of
    # the rows, or a sort of them all, is tens of MB).
    kinds: list[tuple[I64, I64, npt.NDArray[np.int8], npt.NDArray[np.integer[Any]], bool]] = []
    for kind in (Kind.CPU_OP, Kind.ANNOTATION, Kind.PYTHON, Kind.RUNTIME):
        rows = trace.of_kind(kind)
        if len(rows) == 0:
            continue
        which = np.full(len(rows), -1, np.int8 if threads.size < 128 else np.int32)
        for i, t in enumerate(threads.tolist()):
            if t >= 0:  # (NONE: the gap's work was launched from no recorded thread)
                which[thread_mask(rows.pid, rows.tid, t)] = i
        spans = kind in (Kind.ANNOTATION, Kind.PYTHON)
        kinds.append((rows.ts, rows.end, host_categories(trace, rows.name), which, spans))

    def covering(i: int, upto: int, only: bool = False, ops: bool = False) -> Coverage:
        """Thread `i`'s host rows of category `upto` (`only`), or of it and those below (and
        the thread's one-off stretches, below them all); with `ops`, no range or Python frame
        of other host work (3): those of the DataLoader, a sync or a collective still say
        what the thread did."""
        parts = [
            Coverage.of_sorted(
                ts,
                end,
                (which == i)
                & ((cat == upto) if only else (cat <= upto))
                & ~(ops & spans & (cat == 3)),
            )
            for ts, end, cat, which, spans in kinds
        ]
        if not only:
            parts.append(once[i])
        return Coverage.union(*parts) if parts else Coverage.of(a[:0], a[:0])

    once = [
        Coverage.of(one_offs.start[one_offs.thread == t], one_offs.end[one_offs.thread == t])
        for t in threads.tolist()
    ]
    for (i, t), ops in itertools.product(enumerate(threads.tolist()), (False, True)):
        mine = (thread == t) & (blind == ops)
        if not mine.any():
            continue
        pa, pb, pw = a[mine], b[mine], piece[mine]
        startup = once[i].covered(pa, pb)
        np.add.at(out["startup"], pw, startup)
        # A sync that drained the queue cost the GPU at most the time the host was blocked in
        # it: without the sync, the host's next work would have overlapped that much queued
        # GPU work. The wait past that is what the host did after the sync, split as any other.
        blocked = covering(i, 1, only=True, ops=ops).lead(g0[mine], drain_ns)
        cut = np.clip(g0[mine] + blocked, pa, pb)
        # Time in the DataLoader is data loading even after a sync drained the queue: the GPU
        # would have run dry during a long wait for the next batch anyway.
        data = covering(i, 0, ops=ops)
        np.add.at(out["data_loading"], pw, data.covered(pa, pb) - startup)
        np.add.at(out["synchronization"], pw, (cut - pa) - data.covered(pa, cut))
        previous = data.covered(cut, pb)
        del data
        # Each cause takes what the host work up to its category covers past the ones before
        # (one coverage at a time: on a large trace each is tens of MB).
        for k, cause in enumerate(IDLE_CAUSES[1:4], start=1):
            upto = covering(i, k, ops=ops).covered(cut, pb)
            np.add.at(out[cause], pw, upto - previous)
            previous = upto
        np.add.at(out["other"], pw, (pb - cut) - previous)


_IGNORED = 9
"""The host category of what spans everything (step markers): no cause."""


def host_categories(trace: Trace, names: npt.NDArray[np.int32]) -> npt.NDArray[np.int8]:
    """0 data loading, 1 synchronisation, 2 communication wait, 3 other host work, _IGNORED
    (step markers, which span everything)."""
    return trace.once(_host_category_table)[names]


def _host_category_table(trace: Trace) -> npt.NDArray[np.int8]:
    # Per string, once per trace: the idle causes and the critical path's host gaps read the
    # host rows' categories a dozen times a run. Set from the last category to the first, so
    # that a name of several takes the first (a step marker before all).
    table = np.full(len(trace.strings), 3, dtype=np.int8)
    table[communication_ops(trace)] = 2
    table[trace.codes_of(SYNC_CALLS)] = 1
    table[trace.names_matching(is_data_loading)] = 0
    table[trace.names_matching(lambda s: s.startswith("ProfilerStep#"))] = _IGNORED
    table[trace.step_rows().name] = _IGNORED
    table.setflags(write=False)  # (shared by every caller)
    return table


def graph_replayed(dev: DeviceOps, inside: npt.NDArray[np.bool_]) -> float:
    """Share of the kernel time among `inside` ops that was replayed from graphs."""
    kernels = inside & (dev.ops.kind == Kind.KERNEL)
    total = float(dev.ops.dur[kernels].sum())
    return float(dev.ops.dur[kernels & dev.graph].sum()) / total if total > 0 else 0.0
