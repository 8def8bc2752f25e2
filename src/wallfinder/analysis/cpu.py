"""The CPU as the device: a trace with no device kernels is analysed on its main thread's
time, its ops the compute and the rest host overhead (`CpuDevice`, a `DeviceModel`)."""

from __future__ import annotations

import re
from typing import Final

import numpy as np
import numpy.typing as npt

from wallfinder.analysis.classify import classify_op, communication_ops
from wallfinder.analysis.critpath import StepGraph, cpu_graph
from wallfinder.analysis.device import TOP_ROWS, DeviceParts
from wallfinder.analysis.dispatch import Dispatch, dispatch_sized
from wallfinder.analysis.gpu import IDLE_CAUSES, SYNC_RUNTIME, WindowBreakdown, is_data_loading
from wallfinder.analysis.intervals import Coverage, in_windows
from wallfinder.analysis.phases import Attribution, attribute, host_work
from wallfinder.analysis.roofline import cpu_roofline, outermost
from wallfinder.analysis.scope import Scope
from wallfinder.analysis.steps import StepSpans
from wallfinder.analysis.thresholds import Thresholds
from wallfinder.diagnosis import (
    Breakdown,
    ClassShare,
    CpuActivity,
    Device,
    FusionCandidate,
    Mfu,
    OpRow,
    Roofline,
    StepTimeline,
)
from wallfinder.errors import WallfinderError
from wallfinder.hardware import DeviceSpec, cpu_spec
from wallfinder.trace import Events, Kind, Trace, thread_codes, thread_key

NS = 1e-9
I64 = npt.NDArray[np.int64]


class CpuDevice:
    """No device kernels: the CPU is the device, its main thread's time the step's."""

    basis: Final = "cpu"

    def __init__(self, trace: Trace, spec: DeviceSpec | None, thresholds: Thresholds) -> None:
        # The main thread's rows alone are copied (the host's are most of a trace's rows).
        kinds: tuple[Kind, ...] = (Kind.CPU_OP, Kind.ANNOTATION, Kind.PYTHON)
        pid, tid, name, dur = trace.columns_of_kinds(kinds, "pid", "tid", "name", "dur")
        # Without them, the runtime calls; only then the rest (the profiler's own spans,
        # which would otherwise make their thread the main one and their time the step's).
        for fallback in ((Kind.RUNTIME,), (Kind.RUNTIME, Kind.OTHER)):
            if pid.size == 0:
                kinds = fallback
                pid, tid, name, dur = trace.columns_of_kinds(kinds, "pid", "tid", "name", "dur")
        if pid.size == 0:
            raise WallfinderError(
                f"{trace.source}: no device kernels and no CPU activity to analyse"
            )
        self.trace = trace
        self.spec = spec if spec is not None and spec.vendor == "cpu" else cpu_spec()
        self.main = main = _main_thread(trace, thread_key(pid, tid), name, dur)
        self.mine = trace.on_thread(kinds, main)
        self.category, self.dispatch = _cpu_categories(
            trace, self.mine, thresholds.time.dispatch_self_ns
        )
        self.beside = _collectives_beside(trace, main)
        self.loop_idle = _loop_idle(trace, self.mine)
        self.tiny = self.python = self.waited = np.zeros(0, dtype=np.int64)

    def windows(self, spans: StepSpans) -> tuple[I64, I64]:
        return spans.cpu_start, spans.cpu_end

    def breakdown(self, start: I64, end: I64) -> WindowBreakdown:
        mine, category, beside = self.mine, self.category, self.beside
        cov = [Coverage.of(mine.ts[category <= k], mine.end[category <= k]) for k in range(5)]
        upto = [c.covered(start, end) for c in cov]
        data, comm = upto[0], upto[1] - upto[0]
        ops = upto[2] - upto[1]
        # Dispatch-sized ops are host overhead, as the gaps they leave on a GPU would be.
        self.tiny = upto[3] - upto[2]
        self.python = upto[4] - upto[3]
        # The collectives on the main thread's other threads count where it records nothing
        # of its own (it waits for them there, as far as the trace shows); beside its ops
        # they are hidden, as a GPU's communication beside compute is.
        outer = Coverage.union(cov[4], beside)
        with_beside = [Coverage.union(cov[k], beside).covered(start, end) for k in (1, 2, 4)]
        waited = self.waited = with_beside[2] - upto[4]
        hidden = ops - (with_beside[1] - with_beside[0])
        untraced = (end - start) - upto[4] - waited
        # Where the thread only waits (a device sync; a blocking queue get, poll or sleep in
        # Python), it does no work: that time is not host overhead, whatever frame holds it.
        # Each wait's time under Python frames, and outside every recorded frame.
        blocked = {}
        for cause, code in (("synchronization", _CPU_SYNC), ("other", _CPU_WAIT)):
            rows = category == code
            w = Coverage.of(mine.ts[rows], mine.end[rows])
            if code == _CPU_WAIT:
                w = Coverage.union(w, self.loop_idle)
            under_python = _outside(cov[3], w, start, end) - _outside(cov[4], w, start, end)
            alone = _outside(outer, w, start, end)
            self.python = self.python - under_python
            untraced = untraced - alone
            blocked[cause] = under_python + alone
        zeros = np.zeros(start.size, dtype=np.int64)
        causes = {k: np.zeros(start.size) for k in IDLE_CAUSES}
        causes["data_loading"] = data.astype(np.float64)
        causes["host_overhead"] = (self.tiny + self.python).astype(np.float64)
        causes["synchronization"] = blocked["synchronization"].astype(np.float64)
        causes["other"] = (untraced + blocked["other"]).astype(np.float64)
        idle = data + self.tiny + self.python + untraced + sum(blocked.values())
        return WindowBreakdown(start, end, ops, comm + waited, zeros, idle, causes, hidden)

    def parts(self, scope: Scope, bd: Breakdown) -> DeviceParts:
        trace, spec, mine, kept = self.trace, self.spec, self.mine, scope.kept
        total = float((scope.end - scope.start)[kept].sum()) or 1.0
        cpu, classes = _cpu_activity(
            scope,
            mine,
            self.category,
            bd,
            tiny=float(self.tiny[kept].sum()) / total,
            python=float(self.python[kept].sum()) / total,
            waited=float(self.waited[kept].sum()) / total,
        )
        runtime = trace.of_kind(Kind.RUNTIME)
        cpu_ops = self._ops()
        roof: Roofline | None = None
        mfu_ = Mfu(value=None, basis="unknown: the accelerator's work is not in the trace")
        if len(runtime):
            names = {trace.strings[c] for c in np.unique(runtime.name)}
            warning = (
                "the trace records accelerator runtime calls but no device kernels "
                f"(e.g. {sorted(names)[0]!r}): showing the CPU-side breakdown"
            )
        else:
            warning = "no device activity in the trace: the CPU is analysed as the device"
            # A pure CPU run: the ops' CPU time is their compute time. With accelerator
            # runtime calls (MTIA, a device whose kernels were not traced) it is only
            # dispatch time.
            roof, mfu_ = cpu_roofline(scope, cpu_ops)
        estimate = "; roofs are a nominal estimate (give --spec FILE for this CPU)"
        device = Device(
            name="CPU",
            kind="cpu",
            matched_spec=spec.name,
            spec_source=spec.source,
            peak_flops=dict(spec.peak_flops),
            mem_bandwidth=spec.mem_bandwidth,
            note="CPU-only trace: CPU-side breakdown" + (estimate if spec.estimate else ""),
        )
        return DeviceParts(
            device=device,
            breakdown=bd,
            classes=classes,
            roofline=roof,
            mfu=mfu_,
            warnings=[warning],
            cpu=cpu,
            dispatch=self.dispatch.summary(cpu_ops, scope.window_start, scope.window_end),
            main_thread=self.main,
        )

    def fusion(self, scope: Scope) -> list[FusionCandidate]:
        return []

    def timeline(self, scope: Scope) -> StepTimeline | None:
        return None

    def phases(self, scope: Scope) -> Attribution:
        return attribute(scope, host_work(scope, self._ops()))

    def graph(self, scope: Scope) -> StepGraph | None:
        return cpu_graph(scope, self.mine, self.category, self.dispatch, self.beside)

    def _ops(self) -> Events:
        """The main thread's CPU ops."""
        return self.mine.take(np.flatnonzero(self.mine.kind == Kind.CPU_OP))


def _main_thread(trace: Trace, keys: I64, names: npt.NDArray[np.int32], dur: I64) -> int:
    """The thread (`thread_key`) of the most step markers among host rows of these threads,
    names and durations; without markers, of the most time."""
    step_rows = np.isin(names, trace.names_matching(lambda s: s.startswith("ProfilerStep#")))
    pool = keys[step_rows] if step_rows.any() else keys
    weights = None if step_rows.any() else dur.astype(np.float64)
    uniq, inverse = np.unique(pool, return_inverse=True)
    return int(uniq[np.argmax(np.bincount(inverse, weights=weights))])


def _collectives_beside(trace: Trace, main: int) -> Coverage:
    """The collectives (ops and ranges the communication patterns name, e.g.
    `gloo:all_reduce`) on the other threads of the main thread's (`thread_key`) process: the
    threads a step's collectives run on (gloo's work threads, the autograd engine's), which
    the main thread waits for before its next step."""
    codes = communication_ops(trace)
    if codes.size == 0:
        return Coverage.of(np.zeros(0, np.int64), np.zeros(0, np.int64))
    rows = trace.named((Kind.CPU_OP, Kind.ANNOTATION), codes)
    pid, _ = thread_codes(main)
    rows = rows.take(np.flatnonzero((rows.pid == pid) & (rows.thread != main)))
    return Coverage.of(rows.ts, rows.end)


_CPU_SYNC, _CPU_WAIT = 5, 6
"""The CPU model's categories of a thread that waits: a device synchronisation, a blocking
Python call (outside the cumulative categories 0-4, so no work covers their time)."""

_BLOCKING_CALL = re.compile(
    r"^<built-in (?:method|function) (?:get|acquire|poll|select|sleep|wait|recv|"
    r"recv_multipart|recv_into|epoll_wait|control)\b"
)
"""A Python frame of a call that blocks its thread until something else happens: a queue's
`get`, a lock's `acquire`, `select`/`poll`/`epoll`/`kqueue.control`, `sleep`, a socket's
`recv` (an idle worker, an event loop with nothing to do, a client waiting on its server)."""


_EVENT_LOOP = re.compile(
    r"(?:^|/)(?:asyncio/(?:runners|base_events)\.py\(\d+\): (?:run|run_forever|"
    r"run_until_complete)|uvloop/__init__\.py\(\d+\): run)$"
)
"""The Python frame that runs an asyncio event loop: `asyncio.run`, the loop's `run_forever`
or `run_until_complete`, uvloop's `run`. Not `_run_once`, whose own time is the Python
loop's work."""


def _loop_idle(trace: Trace, mine: Events) -> Coverage:
    """The time the thread's event loops run with no frame recorded under them: the loop
    waiting for its next event (epoll in uvloop's C, or asyncio's selector) with nothing to
    run, a blocking call as the queue gets and polls are. A callback or coroutine step it
    runs is a frame under it and stays work; only the loop's own time is waiting (the few
    microseconds of C it runs between callbacks with it)."""
    codes = trace.names_matching(lambda s: _EVENT_LOOP.search(s) is not None)
    is_loop = np.isin(mine.name, codes)
    if not is_loop.any():
        return Coverage.of(np.zeros(0, np.int64), np.zeros(0, np.int64))
    loops = Coverage.of(mine.ts[is_loop], mine.end[is_loop])
    # What runs under a loop: every other row wholly inside one (an enclosing frame is not).
    under = ~is_loop & (loops.covered(mine.ts, mine.end) >= mine.end - mine.ts)
    work = Coverage.of(mine.ts[under], mine.end[under])
    gaps = [work.gaps(int(a), int(b)) for a, b in zip(loops.starts, loops.ends, strict=True)]
    return Coverage.of(np.concatenate([g[0] for g in gaps]), np.concatenate([g[1] for g in gaps]))


def _outside(c: Coverage, w: Coverage, start: I64, end: I64) -> I64:
    """Per window, the time `w` covers outside `c`."""
    return Coverage.union(c, w).covered(start, end) - c.covered(start, end)


def _cpu_categories(
    trace: Trace, events: Events, dispatch_self_ns: int
) -> tuple[npt.NDArray[np.int8], Dispatch]:
    """0 data loading, 1 communication, 2 ops, 3 dispatch-sized ops, 4 Python/annotations,
    5 device synchronisation, 6 a blocking Python call, 9 step markers; and the
    dispatch-sized trees among the CPU ops (`events`' CPU_OP rows)."""
    # Per string, from the last category to the first, so that a name of several takes the
    # first; the communication ops' codes are the trace's, classified once per run.
    table = np.full(len(trace.strings), 4, dtype=np.int8)
    table[communication_ops(trace)] = 1
    table[trace.names_matching(is_data_loading)] = 0
    table[trace.names_matching(lambda s: _BLOCKING_CALL.match(s) is not None)] = _CPU_WAIT
    table[trace.codes_of(SYNC_RUNTIME)] = _CPU_SYNC
    table[trace.names_matching(lambda s: s.startswith("ProfilerStep#"))] = 9
    cat = table[events.name]
    is_op = np.flatnonzero(events.kind == Kind.CPU_OP)
    dispatch = dispatch_sized(events.take(is_op), dispatch_self_ns)
    op_cat = cat[is_op]
    op_cat[op_cat == 4] = np.where(dispatch.sized[op_cat == 4], 3, 2)
    cat[is_op] = op_cat
    return cat, dispatch


def _cpu_activity(
    scope: Scope,
    mine: Events,
    category: npt.NDArray[np.int8],
    bd: Breakdown,
    *,
    tiny: float,
    python: float,
    waited: float,
) -> tuple[CpuActivity, list[ClassShare]]:
    """`tiny` and `python`: the shares of the step in dispatch-sized ops and in Python;
    `waited`: in collectives on other threads, the main thread recording nothing."""
    trace, start, end = scope.trace, scope.window_start, scope.window_end
    ops = mine.take(np.flatnonzero((category >= 1) & (category <= 3)))
    ops = ops.take(np.flatnonzero(outermost(ops) & in_windows(ops.ts, start, end)))
    steps = max(start.size, 1)
    dur = ops.dur.astype(np.float64)
    total = float(dur.sum()) or 1.0
    uniq, inverse = np.unique(ops.name, return_inverse=True)
    time = np.bincount(inverse, weights=dur) if uniq.size else np.zeros(0)
    count = np.bincount(inverse) if uniq.size else np.zeros(0, dtype=np.int64)
    op_cls = [classify_op(trace.strings[int(c)]).value for c in uniq.tolist()]
    by_class: dict[str, float] = {}
    for c, t in zip(op_cls, time.tolist(), strict=True):
        by_class[c] = by_class.get(c, 0.0) + t
    # With no op time at all there are no shares to split (ops recorded as 0 µs): no table.
    classes = (
        sorted(
            (ClassShare(cls=c, time_s=t * NS, share=t / total) for c, t in by_class.items()),
            key=lambda c: -c.time_s,
        )
        if dur.sum() > 0
        else []
    )
    top = [
        OpRow(
            name=trace.strings[int(uniq[i])],
            cls=op_cls[i],
            count=int(count[i]),
            time_s=float(time[i]) * NS,
            share=float(time[i]) / total,
        )
        for i in np.argsort(-time)[:TOP_ROWS].tolist()
    ]
    activity = CpuActivity(
        data_loading=bd.idle_causes["data_loading"],
        ops=bd.compute + bd.comm_exposed - waited + tiny,
        python=python,
        untraced=bd.idle_causes["other"],
        waiting_on_collectives=waited,
        op_time_by_class_s={c: t * NS / steps for c, t in by_class.items()},
        top_ops=top,
    )
    return activity, classes
