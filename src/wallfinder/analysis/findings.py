"""Findings: symptom → cause → fix, each with its evidence and the most it can gain.

Each rule is a small function over one rank's `Facts` returning a `Finding` or None,
registered with `@rule(Facts)` (analysis/rules.py). A finding's `share` is the part of the
step it can remove at most, and `max_speedup` the Amdahl bound 1 / (1 − share): what fixing it
could give if that share went to zero (or, where stated, to what the device's faster path
would take).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import numpy.typing as npt

from wallfinder.analysis.classify import MATMUL_CLASSES, KernelClass, classify_op
from wallfinder.analysis.critpath import OVERLAP, Change, WhatIf, with_replay
from wallfinder.analysis.dispatch import DISPATCH_SELF_NS, DispatchSummary
from wallfinder.analysis.gpu import CLASSES, COMM, COPY, QUEUED_SLACK_NS, DeviceOps
from wallfinder.analysis.intervals import Coverage, in_windows
from wallfinder.analysis.phases import PHASES, Attribution, user_frames
from wallfinder.analysis.roofline import enclosing, outermost
from wallfinder.analysis.rules import evaluate, rule
from wallfinder.analysis.scope import Scope
from wallfinder.analysis.steps import NO_LAUNCH
from wallfinder.analysis.thresholds import Thresholds
from wallfinder.analysis.verdict import MIN_STEPS_FOR_STABILITY
from wallfinder.diagnosis import (
    Breakdown,
    Finding,
    FusionCandidate,
    MemoryProfile,
    Roofline,
    Steps,
    Wall,
)
from wallfinder.trace import Events, Kind, Trace, thread_codes, thread_key
from wallfinder.units import ms, short_frame, short_kernel

_SOFTMAX = CLASSES.index(KernelClass.SOFTMAX)

_SYNC_NAMES = (
    "aten::item",
    "aten::_local_scalar_dense",
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "hipStreamSynchronize",
    "hipDeviceSynchronize",
    "hipEventSynchronize",
)
_ALLOC_NAMES = ("cudaMalloc", "cudaFree", "hipMalloc", "hipFree", "cudaMallocAsync")


@dataclass(frozen=True)
class Facts:
    """What the rules look at: one rank's scope (the trace, its device ops, the steady-state
    windows, the peaks and the thresholds) and the analyses already made."""

    scope: Scope
    steps: Steps
    breakdown: Breakdown
    roofline: Roofline | None
    fusion: list[FusionCandidate]
    cpu_dispatch: DispatchSummary | None = None  # CPU-only traces: the dispatch-sized ops
    memory: MemoryProfile | None = None
    whatif: WhatIf | None = None  # the step's dependency graph, to replay a fix on
    attribution: Attribution | None = None
    """Each unit of work's phase and module (`phases.attribute`)."""
    main_thread: int | None = None
    """The CPU as the device: the thread (`thread_key`) whose time is the step's."""

    @property
    def trace(self) -> Trace:
        return self.scope.trace

    @property
    def dev(self) -> DeviceOps | None:
        return self.scope.dev

    @property
    def inside(self) -> npt.NDArray[np.bool_]:
        """Per device op: inside a steady-state step."""
        return self.scope.inside

    @property
    def window_start(self) -> npt.NDArray[np.int64]:
        """The steady-state steps: [start, end) in trace ns."""
        return self.scope.window_start

    @property
    def window_end(self) -> npt.NDArray[np.int64]:
        return self.scope.window_end

    @property
    def thresholds(self) -> Thresholds:
        return self.scope.thresholds

    @property
    def peak_flops(self) -> dict[str, float]:
        return self.scope.peak_flops

    @property
    def sm_count(self) -> int | None:
        return self.scope.sm_count

    @property
    def steady(self) -> float:
        """The share of the step that recurs: all of it but the one-off start-up the GPU
        waited for inside the steady-state steps (idle cause `startup`: first launches
        loading kernel code)."""
        return max(1.0 - self.breakdown.idle_causes.get("startup", 0.0), 1e-9)

    def share(self, part: float) -> float:
        """`part`, a share of the measured step, as a share of its recurring time: what a
        fix can remove from every later step, which its Amdahl bound is over."""
        return min(part / self.steady, 1.0)

    @property
    def step_s(self) -> float:
        """The recurring step, seconds: the mean steady-state step less its one-off
        start-up."""
        return self.breakdown.per_step_ms["step"] / 1e3 * self.steady

    def per_step(self, count: int) -> float:
        return count / max(self.steps.count, 1)

    @cached_property
    def busy(self) -> Coverage:
        """The device's busy time: the union of its ops over all streams (traces with a
        device), found once for the rules that read the idle gaps."""
        assert self.dev is not None
        return Coverage.of(self.dev.ops.ts, self.dev.ops.end)

    @property
    def hideable(self) -> float:
        """The share of the step that communication could still hide behind: the compute no
        collective runs beside yet. Hidden, a collective runs beside compute, and only beside
        compute it does not already run beside: the step cannot become shorter than its
        communication or its compute."""
        b = self.breakdown
        return self.share(max(b.compute - b.comm_hidden, 0.0))

    @cached_property
    def comm_codes(self) -> npt.NDArray[np.int32]:
        """The codes of the names the communication patterns call collectives."""
        return self.trace.names_matching(lambda s: classify_op(s) is KernelClass.COMMUNICATION)

    @cached_property
    def user_frames(self) -> Events:
        """Python frames of the user's code (traces recorded with stacks), found once for
        every rule that names call sites."""
        return user_frames(self.trace)


def amdahl(share: float) -> float:
    """The most a fix that removes `share` of the step can speed it up."""
    return 1.0 / max(1.0 - min(share, 0.999), 1e-3)


def _finding(
    f: Facts,
    id: str,
    wall: Wall,
    title: str,
    share: float,
    evidence: str,
    fix: str,
    *,
    speedup: float,
    reach: float | None = None,
) -> Finding | None:
    if share < f.thresholds.time.min_share:
        return None
    return Finding(
        id=id,
        wall=wall,
        title=title,
        share=share,
        max_speedup=speedup,
        evidence=evidence,
        fix=fix,
        reach=reach,
    )


def _ms(seconds: float) -> str:
    return f"{ms(seconds)} ms"


@rule(Facts)
def data_loading(f: Facts) -> Finding | None:
    share = f.share(f.breakdown.idle_causes.get("data_loading", 0.0))
    workers = f.trace.code_of("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__")
    if workers >= 0:
        fix = (
            "the DataLoader already uses worker processes but they cannot keep up: more "
            "num_workers, a larger prefetch_factor, persistent_workers=True, cheaper "
            "decoding/augmentation (or move it to the GPU), faster storage"
        )
    else:
        fix = (
            "load batches in the background: DataLoader(num_workers=4 or more, "
            + ("pin_memory=True, " if f.dev is not None else "")
            + "persistent_workers=True, prefetch_factor=2+); move decoding/augmentation off "
            "the training process"
        )
    # A CPU-only trace: the CPU is the device, and the training loop is what waits.
    waiter = "the GPU is idle while the host is" if f.dev is not None else "the training loop is"
    return _finding(
        f,
        "data-loading",
        "overhead",
        "The GPU waits for the DataLoader"
        if f.dev is not None
        else "The training loop waits for the DataLoader",
        share,
        f"{share:.0%} of each step ({_ms(share * f.step_s)}) {waiter} in the DataLoader's "
        "__next__" + call_sites(f, _DATALOADER_NAMES, (Kind.ANNOTATION, Kind.CPU_OP)),
        fix,
        speedup=amdahl(share),
    )


@rule(Facts)
def synchronization(f: Facts) -> Finding | None:
    if f.dev is None:
        # No device work recorded: a sync's wait is the device's own work, which removing
        # the sync would not remove (the GPU cannot be said to idle after it).
        return None
    share = f.share(f.breakdown.idle_causes.get("synchronization", 0.0))
    names = _host_calls(f, _SYNC_NAMES)
    listed = ", ".join(f"{n} ×{c:.0f}/step" for n, c, _ in names[:4]) or "synchronising calls"
    blocked = ""
    if f.whatif is not None and f.step_s > 0:
        # The GPU may stay busy while the host is blocked (the sync drains a deep queue), then
        # idle while the host refills it: idle the breakdown gives the host's overhead. Where
        # the replay without syncs gains a real share, the bound is the host's blocked time.
        # Removing the syncs saves at most the host's blocked time, and at most the idle the
        # host causes (the sync's, and the host's overhead and launches after it).
        causes = f.breakdown.idle_causes
        host_idle = f.share(
            sum(causes.get(k, 0.0) for k in ("synchronization", "host_overhead", "launch_latency"))
        )
        gain = f.whatif.speedup(Change(sync=True))[0]
        held = min(f.whatif.blocked_s / f.step_s, host_idle)
        if 1.0 - 1.0 / gain >= f.thresholds.time.min_share and held > share:
            share = held
            blocked = (
                f"the host is blocked {_ms(f.whatif.blocked_s)} per step in synchronising "
                "calls and blocking copies, unable to queue work, and the GPU idles after each "
                f"while the host catches up: {host_idle:.0%} of the step is the GPU waiting for "
                "the host (the bound is the smaller of the two)"
            )
    return _finding(
        f,
        "sync-in-step",
        "overhead",
        "The host blocks on the GPU inside the step",
        share,
        (blocked or f"{share:.0%} of each step the GPU is idle after the host waited for it")
        + f": {listed}"
        + _where_calls(f, _SYNC_NAMES)
        + call_sites(f, _SYNC_NAMES, (Kind.CPU_OP, Kind.RUNTIME)),
        "remove .item(), .cpu(), print/logging of tensors and torch.cuda.synchronize() from "
        "the step (log every N steps, keep metrics on the GPU); use non_blocking=True copies",
        speedup=amdahl(share),
    )


@rule(Facts)
def launch_bound(f: Facts) -> Finding | None:
    causes = f.breakdown.idle_causes
    share = f.share(causes.get("host_overhead", 0.0) + causes.get("launch_latency", 0.0))
    if f.dev is None:
        return _dispatch_bound(f, share)
    kernels = f.dev.ops.kind[f.inside] == Kind.KERNEL
    durations = f.dev.ops.dur[f.inside][kernels]
    if durations.size == 0:
        return None
    short_ns = f.thresholds.time.short_kernel_ns
    short = float((durations < short_ns).mean())
    per_step = f.per_step(int(durations.size))
    # How far ahead the host runs: kernels that start right after their launch call returns
    # (a shallow queue) are fed just in time; a deep queue means launches are not what holds
    # the GPU back. A graph's kernels all share its one launch, so they say nothing of it.
    graph = f.dev.graph[f.inside][kernels]
    launched = f.dev.launch_end[f.inside][kernels]
    known = (launched != NO_LAUNCH) & ~graph
    starts = f.dev.ops.ts[f.inside][kernels]
    queue = ""
    if known.any():
        lag = max(float(np.median(starts[known] - launched[known])), 0.0)
        depth = (
            "a shallow queue: the GPU is fed just in time"
            if lag <= QUEUED_SLACK_NS
            else "a deep queue: the host runs ahead, so launches are not what the GPU waits for"
        )
        queue = f"; launch-to-start median {lag / 1e3:.1f} µs ({depth})"
    queue += _slow_launches(f, kernels)
    replayed = f.breakdown.graph_replayed
    if replayed >= 0.5:
        queue += (
            f"; {replayed:.0%} of kernel time is already replayed from CUDA/HIP graphs: the "
            "GPU waits for what the host does between replays"
        )
        fix = (
            "shorten or overlap the host's work between graph replays (input preparation, "
            "sampling, scheduling, Python): do it while the previous replay runs, capture "
            "more of the step in the graph, larger batches"
        )
    else:
        host_ns = causes.get("host_overhead", 0.0) * f.breakdown.per_step_ms["step"] * 1e6
        per_launch = host_ns / max(per_step, 1.0)
        if per_launch > f.thresholds.time.host_work_per_launch_ns:
            return _host_work(f, share, per_step, per_launch, queue)
        fix = (
            "cut the launches: torch.compile (fuses kernels and drops Python overhead), CUDA "
            "graphs (torch.compile(mode='reduce-overhead')), larger batches, fused/foreach "
            "optimizers"
        )
    return _finding(
        f,
        "launch-bound",
        "overhead",
        "The host cannot launch kernels fast enough",
        share,
        f"{share:.0%} of each step the GPU waits for the host to issue work (CPU ops, Python, "
        f"launch latency); {per_step:.0f} kernels per step, {short:.0%} of them under "
        f"{short_ns // 1000} µs, median {np.median(durations) / 1e3:.1f} µs{queue}",
        fix,
        speedup=amdahl(share),
    )


def _host_work(
    f: Facts, share: float, per_step: float, per_launch_ns: float, queue: str
) -> Finding | None:
    """Launch-bound's other face: few launches with long host work between them. The GPU
    waits for the host's own work (a Python loop, preparing inputs, I/O), which cutting or
    fusing launches would not shorten."""
    return _finding(
        f,
        "host-work",
        "overhead",
        "The GPU waits while the host works between launches",
        share,
        f"{share:.0%} of each step the GPU waits for the host; {per_step:.0f} kernels per step "
        f"and {per_launch_ns / 1e6:.2f} ms of host time per launch: the host is busy with "
        f"its own work, not with launching (the launch path costs microseconds)"
        f"{_host_work_ranges(f)}{queue}",
        "move that work off the GPU's path: do it on the GPU, overlap it with GPU work (a "
        "background thread or DataLoader workers, prefetching with non_blocking copies from "
        "pinned memory), or batch it; cutting launches (torch.compile, CUDA graphs) would "
        "not help",
        speedup=amdahl(share),
    )


def _host_work_ranges(f: Facts) -> str:
    """The host ranges and ops on the launching threads that cover the GPU's idle time in the
    steady steps, most first, in words; ranges enclosing nearly all of it (a whole-run range)
    are left out where narrower ones say more."""
    assert f.dev is not None
    kinds = (Kind.ANNOTATION, Kind.CPU_OP)
    ts, dur, name, pid, tid = f.trace.columns_of_kinds(kinds, "ts", "dur", "name", "pid", "tid")
    window = np.searchsorted(f.window_start, ts, side="right") - 1
    keep = (
        (window >= 0)
        & np.isin(thread_key(pid, tid), f.dev.launch_thread)
        & ~np.isin(name, f.trace.step_rows().name)
    )
    ts, dur, name, window = ts[keep], dur[keep], name[keep], window[keep]
    end = np.minimum(ts + dur, f.window_end[window])
    busy = f.busy
    idle = np.maximum((end - ts) - busy.covered(ts, end), 0)
    if not idle.any():
        return ""
    codes, inverse = np.unique(name, return_inverse=True)
    total = np.bincount(inverse, weights=idle)
    whole = float(
        (f.window_end - f.window_start).sum() - busy.covered(f.window_start, f.window_end).sum()
    )
    enclosing = total >= 0.9 * whole
    if (~enclosing & (total >= 0.05 * whole)).any():
        total = np.where(enclosing, 0.0, total)
    top = [int(i) for i in np.argsort(-total)[:3] if total[i] > 0]
    steps = max(f.steps.count, 1)
    listed = ", ".join(
        f"{short_frame(f.trace.strings[int(codes[i])])} {_ms(total[i] * 1e-9 / steps)}/step"
        for i in top
    )
    named = total[inverse] > 0
    spans = Coverage.of(ts[named], end[named])
    traced = float((spans.ends - spans.starts - busy.covered(spans.starts, spans.ends)).sum())
    if whole - traced >= 0.1 * whole:
        untraced = (
            f"in no recorded op or range (Python) {_ms((whole - traced) * 1e-9 / steps)}/step"
        )
        listed = f"{listed}, and {untraced}" if listed else untraced
    return f"; the host was in {listed} while the GPU waited" if listed else ""


def _slow_launches(f: Facts, kernels: np.ndarray) -> str:
    """The launch calls of the steady steps' kernels that took over `slow_launch_ns`, in
    words: first launches loading code (start-up, left out of the share) and the rest (the
    host stalled inside the runtime, which can recur)."""
    assert f.dev is not None
    launched = f.dev.launch_end[f.inside][kernels]
    calls = launched - f.dev.launch_ts[f.inside][kernels]
    one_off = f.dev.one_off[f.inside][kernels]
    limit = f.thresholds.time.slow_launch_ns
    # A graph launch stands for all the kernels it replays: slow for them, not stalled.
    slow = (launched != NO_LAUNCH) & (calls > limit) & ~one_off & ~f.dev.graph[f.inside][kernels]
    out = ""
    if one_off.any():
        out += (
            f"; {int(one_off.sum())} first launch(es) loading kernel code took "
            f"{_ms(float(calls[one_off].sum()) * 1e-9)}: start-up, a one-off cost left out of "
            "this share, which is of the step without it"
        )
    if slow.any():
        out += (
            f"; {int(slow.sum())} other launch call(s) took over {limit / 1e6:g} ms, "
            f"{_ms(float(calls[slow].sum()) * 1e-9)} in all (the host stalled inside the "
            "runtime)"
        )
    return out


def _dispatch_bound(f: Facts, share: float) -> Finding | None:
    """The CPU's counterpart of launch-bound: ops so small that their time is the framework's
    fixed cost per op (in `host_overhead` with Python's time between ops)."""
    d = f.cpu_dispatch
    if d is None or d.calls_per_step == 0:
        return None
    return _finding(
        f,
        "launch-bound",
        "overhead",
        "Per-op overhead, not arithmetic, takes the CPU's time",
        share,
        f"{share:.0%} of each step is framework overhead: {d.calls_per_step:.0f} calls per "
        f"step ({d.ops_per_step:.0f} ops, median call {d.median_call_ns / 1e3:.1f} µs) in "
        f"which no op computes for {DISPATCH_SELF_NS // 1000} µs, so the fixed cost of each "
        "eager op (dispatch, autograd, allocation) outweighs its arithmetic; and Python time "
        "between ops",
        "issue fewer, larger ops: process whole batches instead of per-sample or per-element "
        "loops, vectorise Python loops over tensors, foreach/fused optimizers; torch.compile "
        "fuses ops and removes most of the per-op overhead",
        speedup=amdahl(share),
    )


@rule(Facts)
def dependency_wait(f: Facts) -> Finding | None:
    share = f.share(f.breakdown.idle_causes.get("dependency_wait", 0.0))
    return _finding(
        f,
        "dependency-wait",
        "overhead",
        "Launched work waits on another stream, an event, a peer or unrecorded work",
        share,
        f"{share:.0%} of each step ({_ms(share * f.step_s)}) the GPU is idle although the work "
        "that ends the wait was already launched (before the gap, or over 50 µs before it "
        "started): it waited for a dependency, or the GPU ran work the trace did not record"
        f"{_waiting_work(f)}",
        "find what it waits for: cross-stream waits (cudaStreamWaitEvent, copies on a side "
        "stream), a collective waiting for a slower rank (compare the ranks' traces), events "
        "recorded late, another process on the GPU, or work from before the profiler started "
        "(profile more steps); overlap or remove the dependency",
        speedup=amdahl(share),
    )


def _waiting_work(f: Facts) -> str:
    """The work that ended the steady steps' dependency waits, most idle time first, with
    how long before it started it was launched, in words."""
    if f.dev is None:
        return ""
    nxt, waited = _waited_work(f)
    if nxt.size == 0:
        return ""
    ops = f.dev.ops
    names, inverse = np.unique(ops.name[nxt], return_inverse=True)
    idle = np.bincount(inverse, weights=waited.astype(np.float64))
    lead = ops.ts[nxt] - f.dev.launch_end[nxt]
    said = []
    for i in np.argsort(-idle)[:2].tolist():
        mine = inverse == i
        graph = " (replayed from a graph)" if f.dev.graph[nxt[mine]].all() else ""
        said.append(
            f"{short_kernel(f.trace.strings[int(names[i])])}{graph} "
            f"{_ms(idle[i] * 1e-9 / max(f.steps.count, 1))}/step, launched a median "
            f"{_ms(float(np.median(lead[mine])) * 1e-9)} before it started"
        )
    return "; the waits end at " + ", ".join(said)


def _waited_work(f: Facts) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.int64]]:
    """The device ops (rows) that ended the steady steps' dependency waits — gaps in the
    device's busy time whose next op had been launched before the gap began — and the idle
    time each ended (ns)."""
    dev = f.dev
    assert dev is not None
    ops = dev.ops
    if ops.ts.size == 0:
        return np.zeros(0, dtype=np.intp), np.zeros(0, dtype=np.int64)
    busy = f.busy
    lo, hi = int(f.window_start.min()), int(f.window_end.max())
    gap_start, gap_end = busy.gaps(lo, hi)
    nxt = np.searchsorted(ops.ts, gap_end, side="left")
    keep = in_windows(gap_start, f.window_start, f.window_end) & (nxt < ops.ts.size)
    gap_start, gap_end, nxt = gap_start[keep], gap_end[keep], nxt[keep]
    # As the idle causes count it: all of a gap whose work was queued before it began, and
    # the part of a gap past its work's launch path (the call, then QUEUED_SLACK_NS).
    launched = dev.launch_end[nxt]
    known = launched != NO_LAUNCH
    queued = known & (launched < gap_start - QUEUED_SLACK_NS)
    waited = np.where(
        queued, gap_end - gap_start, np.clip(gap_end - (launched + QUEUED_SLACK_NS), 0, None)
    )
    waited = np.where(known, waited, 0)
    keep = waited > 0
    return nxt[keep], waited[keep].astype(np.int64)


@rule(Facts)
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
        f"while the host waits, is {reach:.0%} of the step ({_ms(reach * f.step_s)}): the bound"
        if reach < share - 0.005
        else ""
    )
    return _finding(
        f,
        "host-collective-wait",
        "overhead",
        "The host waits in collectives while the GPU idles",
        share,
        f"{share:.0%} of each step ({_ms(share * f.step_s)}) the GPU is idle while the thread "
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


def _collectives_called(f: Facts) -> Events:
    """The host's collectives in the steady steps (ops and ranges the communication patterns
    name): the ones called, not the ops inside them (c10d::allreduce_ holds
    record_param_comms and nccl:all_reduce), the outermost per thread."""
    ops = f.trace.named((Kind.CPU_OP, Kind.ANNOTATION), f.comm_codes)
    ops = ops.take(np.flatnonzero(in_windows(ops.ts, f.window_start, f.window_end)))
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


@rule(Facts)
def exposed_communication(f: Facts) -> Finding | None:
    b = f.breakdown
    share = f.share(b.comm_exposed)
    if share < f.thresholds.time.min_share:
        return None
    reach = min(share, f.hideable)
    overlap = (
        "overlap communication with the backward pass: DDP bucket_cap_mb (smaller first "
        "buckets), gradient_as_bucket_view=True, no find_unused_parameters; FSDP "
        "backward_prefetch/forward_prefetch; check the slowest rank (stragglers)"
    )
    cheaper = (
        "make the collectives cheaper: fewer bytes (a bf16/fp16 compression or PowerSGD "
        "comm hook), fewer and larger calls, a faster backend or interconnect, and no slower "
        "rank to wait for"
    )
    fix, limit = overlap, ""
    rest = _ms((share - reach) * f.step_s)
    if reach < 0.005:
        limit = (
            "; hiding it behind compute can save nothing (the bound): the step has no compute "
            f"that a collective does not already run beside, so all {rest} must come off "
            "the collectives themselves"
        )
        fix = f"{cheaper} (the step has no compute to hide them behind)"
    elif reach < share - 0.005:
        limit = (
            f"; hiding it behind compute can save at most {_ms(reach * f.step_s)} per step "
            f"({reach:.0%}, the bound): all the compute not already beside a collective; the "
            f"other {rest} must come off the collectives themselves"
        )
        fix = f"{overlap}; beyond what overlap can hide, {cheaper}"
    return _finding(
        f,
        "exposed-comm",
        "overhead",
        "Collectives are not hidden behind compute",
        share,
        f"{share:.0%} of each step ({_ms(share * f.step_s)}) communication runs with no compute "
        f"beside it{_collectives_beside(f)}{_gradient_sync_tail(f)}{limit}"
        + _overlap_replay(f, reach),
        fix,
        speedup=amdahl(reach),
        reach=reach,
    )


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


@rule(Facts)
def exposed_copies(f: Facts) -> Finding | None:
    share = f.share(f.breakdown.copy_exposed)
    if f.dev is None:
        return None
    copies = _copy_rows(f.dev, f.inside)
    names = [f.trace.strings[int(c)] for c in np.unique(f.dev.ops.name[copies])]
    pageable = [n for n in names if "Pageable" in n]
    detail = f"; copies from pageable memory: {', '.join(pageable)}" if pageable else ""
    return _finding(
        f,
        "exposed-copies",
        "overhead",
        "Memory copies stall the GPU" + (" (pageable host memory)" if pageable else ""),
        share,
        f"{share:.0%} of each step ({_ms(share * f.step_s)}) the GPU only copies memory{detail}",
        "pin host memory (DataLoader pin_memory=True, tensor.pin_memory()) and copy with "
        "non_blocking=True; keep tensors on the device instead of moving them each step",
        speedup=amdahl(share),
    )


@rule(Facts)
def fp32_matmul(f: Facts) -> Finding | None:
    r = f.roofline
    if r is None or f.dev is None or f.step_s <= 0:
        return None
    share = r.fp32_matmul_without_tensor_cores_s / f.step_s
    faster = f.peak_flops.get("tf32") or f.peak_flops.get("bf16") or f.peak_flops.get("fp16")
    fp32 = f.peak_flops.get("fp32")
    ratio = faster / fp32 if faster and fp32 else None
    # Bound: those matmuls run `ratio` times faster (the tensor-core peak over the fp32 one).
    remaining = share / ratio if ratio else 0.0
    speedup = 1.0 / max(1.0 - share + remaining, 1e-3)
    assumption = (
        f" (bound assumes they speed up {ratio:.0f}x, the device's tensor-core/fp32 peak ratio)"
        if ratio
        else ""
    )
    return _finding(
        f,
        "fp32-matmul",
        "compute",
        "Matmuls run in fp32 without tensor cores",
        share,
        f"{_ms(r.fp32_matmul_without_tensor_cores_s)} per step of matmul kernels use fp32 "
        f"CUDA cores{_where_fp32(f)}{assumption}",
        "torch.backends.cuda.matmul.allow_tf32 = True (or torch.set_float32_matmul_precision"
        "('high')), or torch.autocast(dtype=torch.bfloat16); fp16 autocast with GradScaler on "
        "devices without TF32/bf16",
        speedup=speedup,
    )


@rule(Facts)
def fusion(f: Facts) -> Finding | None:
    if not f.fusion or f.step_s <= 0:
        return None
    saving = sum(c.max_saving_s for c in f.fusion)
    share = saving / f.step_s
    top = f.fusion[0]
    ops = ", ".join(top.ops[:4]) or "unknown ops"
    where = _where_kernels(f, top.kernels)
    return _finding(
        f,
        "fusable-pointwise",
        "bandwidth",
        "Chains of memory-bound kernels could be fused",
        share,
        f"{len(f.fusion)} repeated runs of memory-bound kernels; the costliest ({ops}) takes "
        f"{_ms(top.time_s)} per step{where}; fusing could save at most {_ms(saving)} per step",
        "torch.compile the model (Inductor fuses pointwise/norm chains); or use fused ops "
        "(fused LayerNorm/RMSNorm, fused optimizer)",
        speedup=amdahl(share),
    )


@rule(Facts)
def unstable_steps(f: Facts) -> Finding | None:
    s = f.steps
    if s.stable or s.mean_s <= 0 or s.count < MIN_STEPS_FOR_STABILITY:
        return None
    # What the slow steps cost: their time over the median. Steps faster than the median
    # make the spread too, but running every step at the median would not recover them.
    kept = np.array([b.duration_s for b in f.breakdown.steps if not b.warmup], dtype=np.float64)
    if kept.size == 0 or kept.sum() <= 0:
        return None
    share = float(np.maximum(kept - s.median_s, 0.0).sum() / kept.sum())
    return _finding(
        f,
        "unstable-steps",
        "overhead",
        "Step time is unstable",
        share,
        f"CV {s.cv:.0%} over {s.count} steps; median {_ms(s.median_s)}, slowest {_ms(s.max_s)} "
        "(the bound assumes every step slower than the median ran at the median)",
        "look at the slow steps for periodic work (checkpointing, evaluation, logging, "
        "garbage collection, data loader stalls, stragglers); profile more steps",
        speedup=amdahl(share),
    )


@rule(Facts)
def allocator_churn(f: Facts) -> Finding | None:
    """Device mallocs and frees in every steady step. Only with steps: in one window, first
    allocations (start-up, the first batch's shapes) cannot be told from churn."""
    if f.steps.count < 2:
        return None
    calls = _host_calls(f, _ALLOC_NAMES)
    if not calls or f.step_s <= 0:
        return None
    seconds = sum(t for _, _, t in calls)
    share = seconds / f.step_s
    listed = ", ".join(f"{n} ×{c:.0f}/step" for n, c, _ in calls)
    return _finding(
        f,
        "allocator-churn",
        "overhead",
        "Device memory is allocated and freed every step",
        share,
        f"{listed}, {_ms(seconds)} per step on the host (the bound assumes none of it "
        "overlaps GPU work)",
        "let the caching allocator keep its memory: no torch.cuda.empty_cache() in the loop; "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; keep tensor shapes stable",
        speedup=amdahl(share),
    )


def call_sites(f: Facts, names: tuple[str, ...], kinds: tuple[Kind, ...]) -> str:
    """Where the named ops are called from: the innermost user-code Python frame around them
    (traces recorded with_stack=True), most frequent first; "" without stacks."""
    user = f.user_frames
    if len(user) == 0:
        return ""
    codes = np.array([c for n in names if (c := f.trace.code_of(n)) >= 0], dtype=np.int32)
    ops = f.trace.named(kinds, codes)
    ops = ops.take(np.flatnonzero(in_windows(ops.ts, f.window_start, f.window_end)))
    if len(ops) == 0:
        return ""
    rows = enclosing(user, ops.thread, ops.ts)
    rows = rows[rows >= 0]
    if rows.size == 0:
        return ""
    sites, counts = np.unique(user.name[rows], return_counts=True)
    top = np.argsort(-counts)[:3]
    listed = ", ".join(
        f"{short_frame(f.trace.strings[int(sites[i])])} ×{f.per_step(int(counts[i])):.0f}/step"
        for i in top.tolist()
    )
    return f"; called from {listed}"


def _host_calls(f: Facts, names: tuple[str, ...]) -> list[tuple[str, float, float]]:
    """(name, calls per step, seconds per step) of the named host ops and runtime calls that
    start inside the steady-state steps, most frequent first."""
    out = []
    for name in names:
        code = f.trace.code_of(name)
        if code < 0:
            continue
        rows = f.trace.named((Kind.CPU_OP, Kind.RUNTIME), np.array([code], dtype=np.int32))
        inside = in_windows(rows.ts, f.window_start, f.window_end)
        if not inside.any():
            continue
        seconds = float(rows.dur[inside].sum()) * 1e-9 / max(f.steps.count, 1)
        out.append((name, f.per_step(int(inside.sum())), seconds))
    out.sort(key=lambda x: -x[1])
    return out


_DATALOADER_NAMES = (
    "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
    "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__",
)
_CAST_NAMES = ("aten::to", "aten::_to_copy", "aten::copy_", "aten::contiguous", "aten::clone")


@rule(Facts)
def repeated_casts(f: Facts) -> Finding | None:
    if f.dev is None or f.step_s <= 0:
        return None
    calls = _host_calls(f, _CAST_NAMES)
    copy_kernels = _cast_rows(f.dev, f.inside)
    seconds = float(f.dev.ops.dur[copy_kernels].sum()) * 1e-9 / max(f.steps.count, 1)
    share = seconds / f.step_s
    listed = ", ".join(f"{n} ×{c:.0f}/step" for n, c, _ in calls[:3]) or "copy kernels"
    return _finding(
        f,
        "repeated-casts",
        "bandwidth",
        "Tensors are cast or copied over and over",
        share,
        f"{listed}; copy/cast kernels take {_ms(seconds)} per step"
        + call_sites(f, _CAST_NAMES, (Kind.CPU_OP,)),
        "cast once: model.to(device, dtype) before the loop, inputs created in the dtype and "
        "device they are used in, no .float()/.half()/.contiguous() round trips in the step",
        speedup=amdahl(share),
    )


@rule(Facts)
def unfused_attention(f: Facts) -> Finding | None:
    """bmm/matmul → softmax → bmm/matmul on one thread: attention written by hand."""
    if f.dev is None or f.step_s <= 0:
        return None
    ops = f.trace.of_kind(Kind.CPU_OP)
    matmul = f.trace.names_matching(lambda s: s in ("aten::bmm", "aten::matmul"))
    softmax = f.trace.names_matching(lambda s: s in ("aten::softmax", "aten::_softmax"))
    if matmul.size == 0 or softmax.size == 0:
        return None
    relevant = np.isin(ops.name, np.concatenate([matmul, softmax]))
    rows = np.flatnonzero(relevant)
    thread = ops.thread
    order = rows[np.lexsort((ops.ts[rows], thread[rows]))]
    names = ops.name[order]
    by_thread = thread[order]
    # follows[i]: row i is on the same thread as row i − 1.
    follows = np.concatenate([[False], by_thread[1:] == by_thread[:-1]])
    is_mm = np.isin(names, matmul)
    is_sm = np.isin(names, softmax)
    pattern = is_sm[1:-1] & is_mm[:-2] & is_mm[2:] & follows[1:-1] & follows[2:]
    count = int(pattern.sum())
    if count == 0:
        return None
    softmax_kernels = _softmax_rows(f.dev, f.inside)
    seconds = float(f.dev.ops.dur[softmax_kernels].sum()) * 1e-9 / max(f.steps.count, 1)
    share = seconds / f.step_s
    return _finding(
        f,
        "unfused-attention",
        "bandwidth",
        "Attention is computed unfused (bmm → softmax → bmm)",
        share,
        f"{f.per_step(count):.0f} bmm → softmax → bmm sequences per step; the softmax kernels "
        f"alone take {_ms(seconds)} per step and the score matrix goes through memory "
        "(the bound counts only the softmax time)",
        "use torch.nn.functional.scaled_dot_product_attention (flash/memory-efficient "
        "kernels keep the scores on chip)",
        speedup=amdahl(share),
    )


@rule(Facts)
def slow_optimizer(f: Facts) -> Finding | None:
    """An optimizer step that launches many small kernels (not fused/foreach)."""
    if f.dev is None or f.step_s <= 0:
        return None
    codes = f.trace.names_matching(lambda s: s.startswith("Optimizer.step#"))
    spans = f.trace.named((Kind.ANNOTATION, Kind.CPU_OP), codes)
    if len(spans) == 0:
        return None
    ops = f.dev.ops
    launch = f.dev.launch_ts
    k = np.searchsorted(spans.ts, launch, side="right") - 1
    in_step = (k >= 0) & (launch < spans.end[np.maximum(k, 0)]) & f.inside
    kernels = int(in_step.sum())
    per_step = f.per_step(kernels)
    if per_step < f.thresholds.time.optimizer_kernels:
        return None
    seconds = float(ops.dur[in_step].sum()) * 1e-9 / max(f.steps.count, 1)
    host = float(spans.dur.sum()) * 1e-9 / max(len(spans), 1)
    share = min(host, f.step_s) / f.step_s
    name = f.trace.strings[int(spans.name[0])]
    return _finding(
        f,
        "slow-optimizer",
        "overhead",
        "The optimizer step launches many small kernels",
        share,
        f"{name}: {per_step:.0f} kernels per step ({_ms(seconds)} of GPU time), "
        f"{_ms(host)} on the host",
        "use a fused or foreach optimizer: torch.optim.AdamW(..., fused=True) or "
        "foreach=True; apex/FusedAdam; or torch.compile the optimizer step",
        speedup=amdahl(share),
    )


@rule(Facts)
def warmup_cost(f: Facts) -> Finding | None:
    """Start-up and warm-up: the steps set aside (compilation, autotuning, first-call
    set-up) and, inside the steady steps, the GPU's wait for first launches loading kernel
    code (idle cause `startup`). A one-off cost per run, shown as a share of the profiled
    time; it gains the steady-state step nothing, so its bound is 1x and it ranks last."""
    s = f.steps
    if s.median_s <= 0:
        return None
    extra = sum(max(0.0, d.duration_s - s.median_s) for d in s.dropped)
    loading = f.breakdown.idle_causes.get("startup", 0.0) * s.mean_s * s.count
    total = extra + s.mean_s * s.count + s.median_s * len(s.dropped)
    share = (extra + loading) / total
    if share < f.thresholds.time.min_share:
        return None
    said = []
    if s.dropped:
        said.append(
            f"{len(s.dropped)} step(s) set aside took {_ms(extra)} more than a steady step "
            f"({s.dropped[0].reason})"
        )
    if loading > 0:
        said.append(
            f"in the steady {'steps' if s.count > 1 else 'window'}, the GPU waited "
            f"{_ms(loading)} on {_first_launches(f)}"
        )
    startup = not s.dropped or s.dropped[0].step == "start-up"
    return Finding(
        id="warm-up",
        wall="overhead",
        title="Start-up takes a share of the profiled time"
        if startup
        else "The first steps pay a warm-up cost",
        share=share,
        max_speedup=1.0,
        evidence="; ".join(said)
        + f": a one-off cost per run, {share:.0%} of the profiled time, none of it in the "
        "steady state",
        fix="cache compilation (TORCHINDUCTOR_CACHE_DIR / torch.compile mode and dynamic=False "
        "to avoid recompiles), keep shapes static, warm up cudnn.benchmark before timing; "
        "profile more steps, so that the steady state is measured",
        saves="once",
    )


def _first_launches(f: Facts) -> str:
    """The first launches loading code inside the steady steps, in words."""
    if f.dev is None:
        return "first launches of kernels loading their code"
    rows = np.flatnonzero(f.inside & f.dev.one_off)
    calls = f.dev.launch_end[rows] - f.dev.launch_ts[rows]
    top = rows[np.argsort(-calls, kind="stable")][:2]
    named = ", ".join(
        f"{short_kernel(f.trace.strings[int(f.dev.ops.name[r])])} "
        f"{_ms(float(f.dev.launch_end[r] - f.dev.launch_ts[r]) * 1e-9)}"
        for r in top.tolist()
    )
    return f"{rows.size} first launch(es) of a kernel loading its code ({named})"


@rule(Facts)
def tiny_grids(f: Facts) -> Finding | None:
    """Kernels launched with fewer blocks than the device has SMs leave most of it idle."""
    if f.dev is None or not f.sm_count or f.step_s <= 0:
        return None
    ops = f.dev.ops
    rows, blocks, small = _tiny_grid_kernels(f, f.sm_count)
    if not small.any():
        return None
    dur = ops.dur[rows][small].astype(np.float64)
    # Bound: with enough blocks to fill the device, a kernel would take dur × blocks / SMs.
    saved = float((dur * (1.0 - blocks[small] / f.sm_count)).sum()) * 1e-9
    steps = max(f.steps.count, 1)
    # Kernels on several streams overlap: filling the device removes at most the time it
    # computes.
    share = min(saved / steps / f.step_s, f.breakdown.compute)
    names = ops.name[rows][small]
    uniq, counts = np.unique(names, return_counts=True)
    # The most frequent, by their short names (instantiations of one template read alike).
    short = [short_kernel(f.trace.strings[int(c)]) for c in uniq[np.argsort(-counts)].tolist()]
    top = list(dict.fromkeys(short))[:2]
    return _finding(
        f,
        "tiny-grids",
        "compute",
        "Kernels too small to fill the GPU",
        share,
        f"{f.per_step(int(small.sum())):.0f} kernels per step "
        f"({_ms(float(dur.sum()) * 1e-9 / steps)}) launch fewer blocks than the device's "
        f"{f.sm_count} SMs, e.g. "
        + ", ".join(top)
        + " (the bound assumes they would fill the device)",
        "give each kernel more work: larger batches, fuse small ops (torch.compile), batch "
        "small matmuls (bmm/grouped GEMM), avoid per-sample loops",
        speedup=1.0 / max(1.0 - share, 1e-3),
    )


def _tiny_grid_kernels(
    f: Facts, sm_count: int
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
    """The steady steps' kernels with a recorded grid (device op rows), their blocks, and
    which of them launch fewer blocks than the device has SMs."""
    assert f.dev is not None
    ops = f.dev.ops
    # Collectives run on a few blocks by design (one per channel): not a grid to grow.
    kernels = f.inside & (ops.kind == Kind.KERNEL) & (ops.grid > 0) & (f.dev.cls != COMM)
    rows = np.flatnonzero(kernels)
    codes, inverse = np.unique(ops.grid[rows], return_inverse=True)
    blocks = np.array([f.trace.blocks(int(c)) for c in codes.tolist()], dtype=np.int64)
    blocks = blocks[inverse] if rows.size else np.zeros(0, dtype=np.int64)
    return rows, blocks, (blocks > 0) & (blocks < sm_count)


_MATMUL_OPS = (
    "mm",
    "addmm",
    "bmm",
    "baddbmm",
    "matmul",
    "linear",
    "_scaled_mm",
    "conv",
    "convolution",
    "attention",
    "flash",
    "efficient",
)


def _compact(shapes: str) -> str:
    """Recorded input shapes without spaces and without the trailing scalars' empty lists."""
    return re.sub(r"(,\[\])+\]$", "]", shapes.replace(" ", ""))


@rule(Facts)
def matmuls_below_roof(f: Facts) -> Finding | None:
    """Compute-bound matmul ops well below their roof: shapes, precision or the kernel. An
    accelerator's finding: its fixes (tensor-core shapes, lower precision, autotuned
    kernels) are a GPU's, and a CPU's roofs are nominal."""
    r = f.roofline
    if r is None or f.dev is None or f.step_s <= 0:
        return None
    steps = max(f.steps.count, 1)
    slow = [
        o
        for o in r.ops
        # Latency-bound by counters: a matmul with too little work to fill the device.
        if o.bound in ("compute", "latency")
        and o.pct_of_roof is not None
        and o.pct_of_roof < f.thresholds.near_peak
        and any(m in o.name for m in _MATMUL_OPS)
    ]
    if not slow:
        return None
    # Bound: each op reaching its roof, i.e. its time × (1 − % of roof) removed.
    saved = sum(o.time_s * (1.0 - (o.pct_of_roof or 0.0)) for o in slow) / steps
    share = saved / f.step_s
    listed = "; ".join(
        f"{o.name} {_compact(o.shapes)} {o.dtype} at {o.pct_of_roof or 0:.0%} of roof"
        + (f" ({o.bound}-bound by counters)" if o.bound_basis == "counters" else "")
        for o in slow[:3]
    )
    return _finding(
        f,
        "matmul-below-roof",
        "compute",
        "Matmuls run well below their roof",
        share,
        f"{listed} (the bound assumes each reached its roof)" + _where_below_roof(f),
        "make shapes tensor-core friendly (dimensions multiples of 8/16, avoid tiny or skinny "
        "GEMMs; batch small ones), use the lowest precision that trains (bf16, fp8 with "
        "_scaled_mm), try torch.compile(mode='max-autotune') for better kernels",
        speedup=amdahl(share),
    )


def _where_kernels(f: Facts, names: list[str]) -> str:
    """The module and phase most of the named kernels' time sits in ("" when unknown)."""
    a = f.attribution
    if a is None or f.dev is None:
        return ""
    return a.where(_named_rows(f, names), f.dev.ops.dur.astype(np.float64))


def _named_rows(f: Facts, names: list[str]) -> npt.NDArray[np.bool_]:
    """The steady steps' device ops with one of these names."""
    assert f.dev is not None
    codes = np.array([c for n in names if (c := f.trace.code_of(n)) >= 0], dtype=np.int32)
    return f.inside & np.isin(f.dev.ops.name, codes)


def _where_below_roof(f: Facts) -> str:
    """Where the compute-bound matmul kernels below their roof sit."""
    a = f.attribution
    if a is None or f.dev is None:
        return ""
    return a.where(_below_roof_rows(f.dev, a, f), f.dev.ops.dur.astype(np.float64))


def _below_roof_rows(dev: DeviceOps, a: Attribution, f: Facts) -> npt.NDArray[np.bool_]:
    """The steady steps' compute-bound matmul-class kernels below the near-peak share of their
    roof."""
    w = a.work
    matmul = np.isin(dev.cls, [CLASSES.index(c) for c in MATMUL_CLASSES])
    with np.errstate(invalid="ignore"):
        below: npt.NDArray[np.bool_] = (
            f.inside & matmul & (w.bound == 1) & (w.pct < f.thresholds.near_peak)
        )
    return below


def _where_fp32(f: Facts) -> str:
    """Where the fp32 matmul kernels that skip the tensor cores sit."""
    a = f.attribution
    if a is None or f.dev is None:
        return ""
    return a.where(_fp32_rows(a, f.inside), f.dev.ops.dur.astype(np.float64))


def _fp32_rows(a: Attribution, inside: npt.NDArray[np.bool_]) -> npt.NDArray[np.bool_]:
    """The steady steps' fp32 matmul kernels that skip the tensor cores."""
    rows: npt.NDArray[np.bool_] = inside & a.work.fp32_no_tc
    return rows


def _copy_rows(dev: DeviceOps, inside: npt.NDArray[np.bool_]) -> npt.NDArray[np.bool_]:
    """The steady steps' memory copies."""
    rows: npt.NDArray[np.bool_] = inside & (dev.ops.kind == Kind.MEMCPY)
    return rows


def _cast_rows(dev: DeviceOps, inside: npt.NDArray[np.bool_]) -> npt.NDArray[np.bool_]:
    """The steady steps' copy/cast kernels (not memcpy)."""
    rows: npt.NDArray[np.bool_] = inside & (dev.ops.kind == Kind.KERNEL) & (dev.cls == COPY)
    return rows


def _softmax_rows(dev: DeviceOps, inside: npt.NDArray[np.bool_]) -> npt.NDArray[np.bool_]:
    """The steady steps' softmax kernels."""
    rows: npt.NDArray[np.bool_] = inside & (dev.cls == _SOFTMAX)
    return rows


def _comm_rows(dev: DeviceOps, inside: npt.NDArray[np.bool_]) -> npt.NDArray[np.bool_]:
    """The steady steps' communication kernels."""
    rows: npt.NDArray[np.bool_] = inside & (dev.cls == COMM)
    return rows


def finding_work(f: Facts, finding: str) -> Events:
    """The work a finding (by id) is about, to mark on the timeline: device ops of the
    steady-state steps (its kernels or copies), or host calls (its syncs, allocations); empty
    when the finding names no particular work (data loading, unstable steps)."""
    dev, a = f.dev, f.attribution
    calls = _FINDING_CALLS.get(finding)
    if calls is not None:
        return _calls_in_steps(f, *calls)
    rows: npt.NDArray[np.bool_] | None = None
    if dev is not None:
        if finding == "dependency-wait":
            rows = np.zeros(len(dev.ops), dtype=bool)
            rows[_waited_work(f)[0]] = True
        elif finding == "exposed-comm":
            rows = _comm_rows(dev, f.inside)
        elif finding == "exposed-copies":
            rows = _copy_rows(dev, f.inside)
        elif finding == "repeated-casts":
            rows = _cast_rows(dev, f.inside)
        elif finding == "unfused-attention":
            rows = _softmax_rows(dev, f.inside)
        elif finding == "fusable-pointwise":
            rows = _named_rows(f, [k for c in f.fusion for k in c.kernels])
        elif finding == "tiny-grids" and f.sm_count:
            kernels, _, small = _tiny_grid_kernels(f, f.sm_count)
            rows = np.zeros(len(dev.ops), dtype=bool)
            rows[kernels[small]] = True
        elif finding == "fp32-matmul" and a is not None:
            rows = _fp32_rows(a, f.inside)
        elif finding == "matmul-below-roof" and a is not None:
            rows = _below_roof_rows(dev, a, f)
    if rows is None or dev is None:
        return f.trace.of_kind(Kind.KERNEL).take(slice(0, 0))
    return dev.ops.take(np.flatnonzero(rows))


_FINDING_CALLS: dict[str, tuple[tuple[str, ...], tuple[Kind, ...]]] = {
    "data-loading": (_DATALOADER_NAMES, (Kind.ANNOTATION, Kind.CPU_OP)),
    "sync-in-step": (_SYNC_NAMES, (Kind.CPU_OP, Kind.RUNTIME)),
    "allocator-churn": (_ALLOC_NAMES, (Kind.CPU_OP, Kind.RUNTIME)),
}
"""The findings about host calls: the calls' names and kinds."""


def _where_calls(f: Facts, names: tuple[str, ...]) -> str:
    """Where the named host calls in the steady-state steps sit."""
    a = f.attribution
    if a is None:
        return ""
    calls = _calls_in_steps(f, names)
    return a.where_calls(calls.thread, calls.ts) if len(calls) else ""


def _calls_in_steps(
    f: Facts, names: tuple[str, ...], kinds: tuple[Kind, ...] = (Kind.CPU_OP, Kind.RUNTIME)
) -> Events:
    """The named host ops and runtime calls (`kinds`) that start in a steady-state step's
    host span."""
    codes = np.array([c for n in names if (c := f.trace.code_of(n)) >= 0], dtype=np.int32)
    calls = f.trace.named(kinds, codes)
    spans, kept = f.scope.spans, f.scope.kept
    return calls.take(
        np.flatnonzero(in_windows(calls.ts, spans.cpu_start[kept], spans.cpu_end[kept]))
    )


def _phase_times(f: Facts) -> tuple[dict[str, float], dict[str, float]] | None:
    """Per phase, seconds per step: device time (exposed time on a CPU-only trace) and
    exposed time; None without phases or without backward evidence."""
    a = f.attribution
    if a is None:
        return None
    p = a.phases
    busy = p.gpu_s or p.exposed_s
    if busy.get("backward", 0.0) <= 0 or busy.get("forward", 0.0) <= 0:
        return None
    return busy, p.exposed_s


@rule(Facts)
def forward_heavy(f: Facts) -> Finding | None:
    """A forward that takes longer than its backward: not what training looks like (the
    backward does about twice the forward's work), so the forward waits on something: a
    synchronising call in it (without one, the idle is the host's launching, launch-bound's)."""
    times = _phase_times(f)
    if times is None or f.dev is None or f.step_s <= 0 or f.attribution is None:
        return None
    busy, exposed = times
    fwd, bwd = busy["forward"], busy["backward"]
    if exposed["forward"] <= f.thresholds.time.forward_over_backward * exposed["backward"]:
        return None
    # Bound: the device's idle time inside the forward (what a forward without host stalls
    # would not wait), not the forward's work.
    idle = max(exposed["forward"] - fwd, 0.0)
    share = min(idle / f.step_s, 1.0)
    calls = _calls_in_steps(f, _FORWARD_STALLS)
    phase, _ = f.attribution.place_calls(calls.thread, calls.ts)
    in_forward = phase == PHASES.index("forward")
    names, counts = np.unique(calls.name[in_forward], return_counts=True)
    if names.size == 0:
        # Nothing in the forward waits on the device: its idle is the host launching the
        # forward's ops one by one (Python runs the forward, C++ the backward), which
        # launch-bound or host-work report with their own fix. Claiming it again here
        # would count the same time twice under a fix that does not apply.
        return None
    listed = ", ".join(
        f"{f.trace.strings[int(n)]} ×{f.per_step(int(c)):.0f}/step"
        for n, c in zip(names.tolist(), counts.tolist(), strict=True)
    )
    return _finding(
        f,
        "forward-heavy",
        "overhead",
        "The forward takes longer than the backward",
        share,
        f"forward {_ms(exposed['forward'])} per step against backward "
        f"{_ms(exposed['backward'])} (device time {_ms(fwd)} and {_ms(bwd)}; a backward is "
        f"usually about twice its forward); the device idles {_ms(idle)} per step inside the "
        f"forward; synchronising calls in the forward: {listed} (the bound is that idle time)",
        "look in the forward for .item(), .cpu(), .tolist(), print(tensor), data-dependent "
        "shapes (nonzero, boolean masks) and Python control flow on tensor values; keep "
        "metrics on the device and log every N steps",
        speedup=amdahl(share),
    )


_FORWARD_STALLS = (
    "aten::item",
    "aten::_local_scalar_dense",
    "aten::nonzero",
    "aten::is_nonzero",
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaMemcpy",
    "hipStreamSynchronize",
    "hipDeviceSynchronize",
    "hipMemcpy",
)


@rule(Facts)
def backward_heavy(f: Facts) -> Finding | None:
    """A backward well above twice its forward: recomputation (activation checkpointing),
    or a backward that is slower than it need be."""
    times = _phase_times(f)
    if times is None or f.step_s <= 0 or f.attribution is None:
        return None
    busy, _ = times
    fwd, bwd = busy["forward"], busy["backward"]
    ratio = bwd / fwd
    if ratio <= f.thresholds.time.backward_over_forward:
        return None
    a = f.attribution
    w = a.work
    rows = a.recompute & w.inside
    dur = (w.end - w.ts).astype(np.float64)
    recompute = float(dur[rows].sum()) * 1e-9 / max(f.steps.count, 1)
    if recompute > 0:
        saved = recompute
        seen = (
            f"forward modules re-run inside the backward (activation checkpointing): "
            f"{_ms(recompute)} per step of recomputation{a.where(rows, dur)}; "
            "the bound is that recomputation, which checkpointing trades for memory"
        )
        fix = (
            "expected with activation checkpointing: checkpoint fewer blocks where memory "
            "allows (selective checkpointing of the cheap ops), or recompute only attention"
        )
    else:
        saved = max(bwd - 2.0 * fwd, 0.0)
        seen = (
            "no recomputation is visible (no module re-run inside the backward)"
            if a.modules is not None and a.modules.source == "modules"
            else "the trace has no module records, so recomputation cannot be seen"
        ) + "; the bound is the backward's time beyond twice its forward"
        fix = (
            "find the slow backward kernels (the module table's backward column): "
            "non-contiguous gradients, fp32 reductions, scatter/index_add backward of "
            "embeddings and gathers; torch.compile fuses the backward too"
        )
    share = min(saved / f.step_s, 1.0)
    return _finding(
        f,
        "backward-heavy",
        "compute",
        "The backward takes more than twice the forward",
        share,
        f"backward {_ms(bwd)} per step, {ratio:.1f}x the forward's {_ms(fwd)}; {seen}",
        fix,
        speedup=amdahl(share),
    )


@rule(Facts)
def optimizer_heavy(f: Facts) -> Finding | None:
    """An optimizer step that is a large share of the step (when it is not the many small
    kernels `slow_optimizer` reports)."""
    a = f.attribution
    if a is None or f.step_s <= 0 or len(a.ranges.optimizer) == 0:
        return None
    share = f.share(a.phases.exposed.get("optimizer", 0.0))
    if share < f.thresholds.time.optimizer_share or slow_optimizer(f) is not None:
        return None
    names = sorted({f.trace.strings[int(c)] for c in np.unique(a.ranges.optimizer.name)})
    fused = any("fused" in n.lower() for n in names)
    busy = a.phases.gpu_s.get("optimizer", 0.0)
    return _finding(
        f,
        "optimizer-heavy",
        "bandwidth" if busy >= a.phases.exposed_s.get("optimizer", 0.0) / 2 else "overhead",
        "The optimizer step is a large share of the step",
        share,
        f"{', '.join(names[:3])}: {share:.0%} of the step ({_ms(share * f.step_s)})"
        + (f", {_ms(busy)} of it device time" if f.dev is not None else "")
        + " (the bound removes it all)",
        (
            "the optimizer is already fused: its time is the parameter and state traffic; "
            "keep optimizer states in bf16 or 8-bit, shard them (ZeRO/FSDP), or step less "
            "often (gradient accumulation)"
        )
        if fused
        else "use a fused or foreach optimizer (torch.optim.AdamW(..., fused=True) or "
        "foreach=True), or torch.compile the optimizer step",
        speedup=amdahl(share),
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
    for start, end in zip(f.window_start.tolist(), f.window_end.tolist(), strict=True):
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
        f"; {_ms(seconds)} per step of it ({listed}) between the last backward kernel and "
        "the optimizer step: the gradient sync is not overlapped with the backward"
    )


def find(facts: Facts, wall: Wall) -> list[Finding]:
    """Every rank rule's finding, the ones that move `wall` first, each group by bound on
    gain."""
    limit = facts.thresholds.time.replay_error
    found = [
        with_replay(facts.whatif, x, limit) if x.saves == "time" else x
        for x in evaluate(facts, facts.scope.views)
    ]
    return sorted(found, key=lambda x: (x.wall != wall, -x.max_speedup))
