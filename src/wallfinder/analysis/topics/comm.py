"""Communication: collectives the compute does not hide, and the host waiting in them."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from wallfinder.analysis.accumulation import DDP_FORWARD, micro_step_syncs
from wallfinder.analysis.critpath import ACCUM, OVERLAP
from wallfinder.analysis.findings import (
    NO_ROWS,
    Facts,
    amdahl,
    call_sites,
    make_finding,
    ms_text,
)
from wallfinder.analysis.gpu import COMM
from wallfinder.analysis.intervals import Coverage, in_windows
from wallfinder.analysis.phases import PHASES
from wallfinder.analysis.roofline import outermost
from wallfinder.analysis.rules import claimed, rule
from wallfinder.diagnosis import Finding
from wallfinder.trace import Events, Kind, thread_codes
from wallfinder.units import short_kernel


@rule(Facts, id="host-collective-wait")
def host_collective_wait(f: Facts) -> Finding | None:
    """The GPU idle while the thread that launches its work is inside a collective on the host
    (a blocking all_reduce or barrier, `.wait()` on async work): the idle cause the verdict
    names `communication_wait`."""
    share = f.share(f.breakdown.idle_causes.get("communication_wait", 0.0))
    if share < f.thresholds.time.min_share:
        return None  # before looking for the collectives' names
    listed = _listed_calls(f, _collectives_called(f))
    names = tuple(f.trace.strings[int(c)] for c in f.comm_codes.tolist())
    # Not blocked, the host would queue the work after the collective while it runs: the
    # device's compute is all the wait can hide behind.
    reach = min(share, f.hideable)
    limit = (
        f"; the device's compute no collective runs beside, all the work that could run "
        f"while the host waits, is {reach:.0%} of the step ({ms_text(reach * f.step_s)}): the bound"
        if reach < share - 0.005
        else ""
    )
    return make_finding(
        f,
        "host-collective-wait",
        "overhead",
        "The host waits in collectives while the GPU idles",
        share,
        f"{share:.0%} of each step ({ms_text(share * f.step_s)}) the GPU is idle while the thread "
        f"that launches its work is inside a collective{': ' + listed if listed else ''}"
        + call_sites(f, names, (Kind.CPU_OP, Kind.ANNOTATION))
        + limit,
        "do not block the host on collectives in the step: async_op=True and wait() only "
        "where the result is needed, let DDP/FSDP overlap gradient reduction with the backward "
        "pass, reduce metrics and barrier() every N steps; if the wait is for a slower rank, "
        "analyse the job's rank traces together (a folder) to find it",
        speedup=amdahl(reach),
        reach=reach,
    )


def explained(f: Facts) -> float:
    """The share of the measured step, of its exposed communication, that the parallel
    strategies' own findings claim (`rules.Claim`), at most all of it."""
    return min(sum(c.share for c in f.once(claimed)), f.breakdown.comm_exposed)


def _collectives_called(f: Facts) -> Events:
    """The host's collectives in the steady steps (ops and ranges the communication patterns
    name): the ones called, not the ops inside them (c10d::allreduce_ holds
    record_param_comms and nccl:all_reduce), the outermost per thread."""
    ops = f.trace.named((Kind.CPU_OP, Kind.ANNOTATION), f.comm_codes)
    ops = ops.take(np.flatnonzero(in_windows(ops.ts, f.scope.window_start, f.scope.window_end)))
    top = np.zeros(len(ops), dtype=bool)
    for thread in np.unique(ops.thread).tolist():
        rows = np.flatnonzero(ops.thread == thread)
        top[rows] = outermost(ops.take(rows))
    return ops.take(np.flatnonzero(top))


def _listed_calls(f: Facts, ops: Events) -> str:
    """The three most called names of `ops`, each with its calls per step."""
    called, counts = np.unique(ops.name, return_counts=True)
    return ", ".join(
        f"{f.trace.strings[int(called[i])]} ×{f.per_step(int(counts[i])):.0f}/step"
        for i in np.argsort(-counts, kind="stable")[:3].tolist()
    )


def _comm_rows(f: Facts) -> npt.NDArray[np.bool_]:
    """The steady steps' communication kernels."""
    if f.dev is None:
        return NO_ROWS
    rows: npt.NDArray[np.bool_] = f.inside & (f.dev.cls == COMM)
    return rows


# Exposed communication keeps its bound rather than a replay: the `overlap` what-if moves a
# collective only as far as the op it waited for, which gained nothing on any real trace tried
# (the collectives there wait for peers the graph does not hold), so the finding keeps what
# hiding can reach (the compute beside it) rather than a replayed 1.00x that would read as
# "nothing to gain", and says what the replay gives; the what-if's row is capped by it.
@rule(Facts, id="exposed-comm", bounds=OVERLAP, work=_comm_rows)
def exposed_communication(f: Facts) -> Finding | None:
    b = f.breakdown
    # What a parallel strategy's own finding explains (a pipeline stage waiting for its
    # neighbour, FSDP's all-gathers, TP's all-reduces) is that finding's, with its own fix:
    # not counted twice. This finding keeps the rest.
    share = f.share(max(b.comm_exposed - explained(f), 0.0))
    if share < f.thresholds.time.min_share:
        return None
    reach = min(share, f.hideable)
    overlap = f"overlap communication with the backward pass: {_overlap_levers(f)}"
    cheaper = (
        "make the collectives cheaper: fewer bytes (a bf16/fp16 compression or PowerSGD "
        "comm hook), fewer and larger calls, a faster backend or interconnect, and no slower "
        "rank to wait for"
    )
    fix, limit = overlap, ""
    rest = ms_text((share - reach) * f.step_s)
    if reach < 0.005:
        limit = (
            "; hiding it behind compute can save nothing (the bound): the step has no compute "
            f"that a collective does not already run beside, so all {rest} must come off "
            "the collectives themselves"
        )
        fix = f"{cheaper} (the step has no compute to hide them behind)"
    elif reach < share - 0.005:
        limit = (
            f"; hiding it behind compute can save at most {ms_text(reach * f.step_s)} per step "
            f"({reach:.0%}, the bound): all the compute not already beside a collective; the "
            f"other {rest} must come off the collectives themselves"
        )
        fix = f"{overlap}; beyond what overlap can hide, {cheaper}"
    return make_finding(
        f,
        "exposed-comm",
        "overhead",
        "Collectives are not hidden behind compute",
        share,
        f"{share:.0%} of each step ({ms_text(share * f.step_s)}) communication runs with no "
        f"compute beside it{_collectives_beside(f)}{_gradient_sync_tail(f)}{limit}"
        + _overlap_replay(f, reach),
        fix,
        speedup=amdahl(reach),
        reach=reach,
    )


_OVERLAP_LEVERS = {
    "DDP": "DDP bucket_cap_mb (smaller first buckets), gradient_as_bucket_view=True, no "
    "find_unused_parameters",
    "ZeRO-1/2": "DeepSpeed overlap_comm=True with a smaller reduce_bucket_size, "
    "contiguous_gradients=True",
    "FSDP": "FSDP reduce-scatters each unit's gradients after that unit's backward, so only "
    "the last units' cannot hide: a smaller last unit (wrap the final blocks on their own), "
    "reduce in bf16 (MixedPrecisionPolicy reduce_dtype), and on accumulation micro-batches "
    "no sync (set_requires_gradient_sync(False)); backward_prefetch/forward_prefetch",
    "ZeRO-3": "DeepSpeed overlap_comm=True, a smaller reduce_bucket_size and "
    "stage3_prefetch_bucket_size",
}
"""Each data-parallel layout's levers for overlapping its gradient reduction with the
backward pass, by the strategy's name in `Parallelism`."""


def _overlap_levers(f: Facts) -> str:
    """The overlap levers of the strategies the trace shows (every layout's where it shows
    none), and the stragglers to check."""
    seen = [k for k in _OVERLAP_LEVERS if k in f.strategies()] or ["DDP", "FSDP"]
    return "; ".join(_OVERLAP_LEVERS[k] for k in seen) + "; check the slowest rank (stragglers)"


def _collectives_beside(f: Facts) -> str:
    """A CPU-only trace's collectives on threads other than the step's, in words: where its
    exposed communication comes from ("" on a device, or with none)."""
    if f.main_thread is None:
        return ""
    ops = _collectives_called(f)
    pid, _ = thread_codes(f.main_thread)
    ops = ops.take(np.flatnonzero((ops.pid == pid) & (ops.thread != f.main_thread)))
    threads = np.unique(ops.thread).size
    if threads == 0:
        return ""
    return (
        f" ({_listed_calls(f, ops)} on {threads} thread{'s' if threads > 1 else ''} other "
        "than the step's, which records no work of its own meanwhile: it waits for them, or "
        "runs code the trace does not show)"
    )


def _overlap_replay(f: Facts, reach: float) -> str:
    """What the `overlap` what-if replays, and why it gains less than the bound where it does
    ("" without a graph of device ops to replay)."""
    w = f.whatif
    if w is None or w.graph.dur.size == 0:
        return ""
    speedup, _ = w.speedup(OVERLAP)
    said = f"; the `overlap` what-if replays {speedup:.2f}x"
    if speedup >= amdahl(reach) * 0.99:
        return said
    g = w.graph
    comm = g.cls == COMM
    held = int((comm & ((g.extra > 0) | (g.stream_gap > 0))).sum())
    waits = (
        f" ({held} of the {int(comm.sum())} collectives in the replayed steps wait on work no "
        "recorded edge explains: a peer, an unrecorded event)"
        if held
        else ""
    )
    return (
        f"{said}: it starts each collective beside the op it waited for and keeps the rest of "
        f"the order the trace recorded{waits}, where the bound hides all of the exposed "
        "communication that compute could cover"
    )


def _gradient_sync_tail(f: Facts) -> str:
    """The exposed collectives that run after the step's last backward kernel and before its
    optimizer step, in words ("" when there are none or no phases): the gradient all-reduce
    was not overlapped with the backward (DDP buckets, FSDP prefetch)."""
    a = f.attribution
    if a is None or f.dev is None or f.step_s <= 0:
        return ""
    w, phase = a.work, a.phase
    backward = phase == PHASES.index("backward")
    optimizer = phase == PHASES.index("optimizer")
    comm = phase == PHASES.index("communication")
    if not (backward.any() and comm.any()):
        return ""
    others = Coverage.of(w.ts[~comm], w.end[~comm])
    both = Coverage.union(others, Coverage.of(w.ts[comm], w.end[comm]))
    exposed = 0.0
    names: dict[int, float] = {}
    for start, end in zip(f.scope.window_start.tolist(), f.scope.window_end.tolist(), strict=True):
        here = (w.ts >= start) & (w.ts < end)
        if not (backward & here).any():
            continue
        lo = int(w.end[backward & here].max())
        opt = optimizer & here & (w.ts >= lo)
        hi = int(w.ts[opt].min()) if opt.any() else int(end)
        if hi <= lo:
            continue
        tail = np.array([lo]), np.array([hi])
        exposed += float((both.covered(*tail) - others.covered(*tail))[0])
        for row in np.flatnonzero(comm & (w.ts < hi) & (w.end > lo)).tolist():
            code = int(f.dev.ops.name[row])
            names[code] = names.get(code, 0.0) + float(min(w.end[row], hi) - max(w.ts[row], lo))
    seconds = exposed * 1e-9 / max(f.steps.count, 1)
    if seconds <= 0:
        return ""
    top = sorted(names, key=lambda c: -names[c])[:2]
    listed = ", ".join(short_kernel(f.trace.strings[c]) for c in top)
    return (
        f"; {ms_text(seconds)} per step of it ({listed}) between the last backward kernel and "
        "the optimizer step: the gradient sync is not overlapped with the backward"
    )


def _synced_micro_steps(f: Facts) -> npt.NDArray[np.bool_]:
    return micro_step_syncs(f.scope).rows


@rule(Facts, id="grad-sync-per-micro-step", replay=ACCUM, work=_synced_micro_steps)
def grad_sync_per_micro_step(f: Facts) -> Finding | None:
    """Gradient accumulation under DDP without `no_sync()`: the gradients are all-reduced in
    every micro-step, where one all-reduce per optimizer step would do. The bound is the time
    those extra all-reduces leave no compute beside; the gain is the replay without them (the
    `accum` what-if removes the same kernels, `micro_step_syncs`)."""
    if f.dev is None or f.step_s <= 0:
        return None
    syncs = micro_step_syncs(f.scope)
    rows, micro = syncs.rows, syncs.per_step
    if not rows.any():
        return None
    ops = f.dev.ops
    compute = (ops.kind == Kind.KERNEL) & (f.dev.cls != COMM)
    beside = Coverage.of(ops.ts[compute], ops.end[compute])
    mine = Coverage.of(ops.ts[rows], ops.end[rows])
    steps = max(f.steps.count, 1)
    exposed = float((mine.ends - mine.starts - beside.covered(mine.starts, mine.ends)).sum())
    seconds = exposed * 1e-9 / steps
    share = seconds / f.step_s
    busy = float(ops.dur[rows].sum()) * 1e-9 / steps
    return make_finding(
        f,
        "grad-sync-per-micro-step",
        "overhead",
        "Gradients are all-reduced at every micro-step of gradient accumulation",
        share,
        f"{micro:.0f} micro-steps per optimizer step ({DDP_FORWARD} ranges), and the "
        f"gradients are all-reduced in each: {f.per_step(int(rows.sum())):.0f} all-reduce "
        f"kernel(s) per step ({ms_text(busy)}) in the micro-steps before the last, "
        f"{ms_text(seconds)} of it with no compute beside it (the bound: what syncing only in "
        "the last micro-step removes)",
        "accumulate without syncing: run every micro-step but the last under "
        "`with model.no_sync():` (DDP and FSDP), or let the training library do it "
        "(Accelerate's accelerator.accumulate(model), Lightning's accumulate_grad_batches): "
        "the gradients are then all-reduced once per optimizer step",
        speedup=amdahl(share),
    )
