"""The host: launches it cannot issue fast enough, its own work between launches, per-op
overhead on the CPU, and device memory allocated and freed every step."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from wallfinder.analysis.critpath import Change
from wallfinder.analysis.findings import (
    Facts,
    amdahl,
    calls_in_steps,
    host_calls,
    make_finding,
    ms_text,
)
from wallfinder.analysis.intervals import Coverage
from wallfinder.analysis.rules import rule
from wallfinder.analysis.steps import NO_LAUNCH
from wallfinder.diagnosis import Finding
from wallfinder.trace import Events, Kind, thread_key
from wallfinder.units import short_frame


@rule(Facts, id=("launch-bound", "host-work"), replay=Change(host=float("inf")))
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
            if lag <= f.thresholds.slack.queued_ns
            else "a deep queue: the host runs ahead, so launches are not what the GPU waits for"
        )
        queue = f"; launch-to-start median {lag / 1e3:.1f} µs ({depth})"
    queue += _slow_launches(f, kernels) + _per_shape(f)
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
    if f.dev.one_offs.recurring:
        fix = _PER_SHAPE_FIX + fix
    return make_finding(
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
    return make_finding(
        f,
        "host-work",
        "overhead",
        "The GPU waits while the host works between launches",
        share,
        f"{share:.0%} of each step the GPU waits for the host; {per_step:.0f} kernels per step "
        f"and {per_launch_ns / 1e6:.2f} ms of host time per launch: the host is busy with "
        f"its own work, not with launching (the launch path costs microseconds)"
        f"{_host_work_ranges(f)}{queue}",
        (_PER_SHAPE_FIX if f.dev is not None and f.dev.one_offs.recurring else "")
        + "move that work off the GPU's path: do it on the GPU, overlap it with GPU work (a "
        "background thread or DataLoader workers, prefetching with non_blocking copies from "
        "pinned memory), or batch it; cutting launches (torch.compile, CUDA graphs) would "
        "not help",
        speedup=amdahl(share),
    )


_PER_SHAPE_FIX = (
    "keep shapes static where code is built per shape (pad or bucket sequence lengths, a "
    "static KV cache; for attention, a backend that builds nothing per shape: "
    "torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION)); "
)


def _per_shape(f: Facts) -> str:
    """The ops that loaded or built code call after call (`OneOffs.recurring`), in words:
    per-shape code, part of the host's recurring time, not start-up."""
    assert f.dev is not None
    recurring = sorted(f.dev.one_offs.recurring.items(), key=lambda kv: -kv[1][1])
    if not recurring:
        return ""
    named = ", ".join(
        f"{f.trace.strings[op]} in {calls} calls ({ms_text(ns * 1e-9)})"
        for op, (calls, ns) in recurring[:3]
    )
    return (
        f"; code loaded or built again and again: {named}: a library or compiler building "
        "code for each new shape (cuDNN attention per sequence length, a JIT per input "
        "shape), recurring while shapes change, so not start-up (only the first is)"
    )


def _host_work_ranges(f: Facts) -> str:
    """The host ranges and ops on the launching threads that cover the GPU's idle time in the
    steady steps, most first, in words; ranges enclosing nearly all of it (a whole-run range)
    are left out where narrower ones say more."""
    assert f.dev is not None
    kinds = (Kind.ANNOTATION, Kind.CPU_OP)
    ts, dur, name, pid, tid, kind = f.trace.columns_of_kinds(
        kinds, "ts", "dur", "name", "pid", "tid", "kind"
    )
    thread = thread_key(pid, tid)
    window = np.searchsorted(f.scope.window_start, ts, side="right") - 1
    keep = (
        (window >= 0)
        & np.isin(thread, f.dev.launch_thread)
        & ~np.isin(name, f.trace.step_rows().name)
    )
    ts, dur, name, window = ts[keep], dur[keep], name[keep], window[keep]
    thread, kind = thread[keep], kind[keep]
    end = np.minimum(ts + dur, f.scope.window_end[window])
    busy = f.busy
    idle = np.maximum((end - ts) - busy.covered(ts, end), 0)
    if not idle.any():
        return ""
    codes, inverse = np.unique(name, return_inverse=True)
    total = np.bincount(inverse, weights=idle)
    whole = float(
        (f.scope.window_end - f.scope.window_start).sum()
        - busy.covered(f.scope.window_start, f.scope.window_end).sum()
    )
    enclosing = total >= 0.9 * whole
    if (~enclosing & (total >= 0.05 * whole)).any():
        total = np.where(enclosing, 0.0, total)
    top = [int(i) for i in np.argsort(-total)[:3] if total[i] > 0]
    steps = max(f.steps.count, 1)
    listed = ", ".join(
        f"{short_frame(f.trace.strings[int(codes[i])])} {ms_text(total[i] * 1e-9 / steps)}/step"
        f"{_on_cpu(f, (inverse == i) & (kind == Kind.CPU_OP), ts, end, thread)}"
        for i in top
    )
    named = total[inverse] > 0
    spans = Coverage.of(ts[named], end[named])
    traced = float((spans.ends - spans.starts - busy.covered(spans.starts, spans.ends)).sum())
    if whole - traced >= 0.1 * whole:
        untraced = (
            f"in no recorded op or range (Python) {ms_text((whole - traced) * 1e-9 / steps)}/step"
        )
        listed = f"{listed}, and {untraced}" if listed else untraced
    return f"; the host was in {listed} while the GPU waited" if listed else ""


def _on_cpu(
    f: Facts,
    rows: npt.NDArray[np.bool_],
    ts: npt.NDArray[np.int64],
    end: npt.NDArray[np.int64],
    thread: npt.NDArray[np.int64],
) -> str:
    """ " (CPU tensors: ...)" when the CPU op calls at `rows` launched no device work: their
    time is compute on the host (a loop on CPU tensors), which no launch-side fix shortens."""
    assert f.dev is not None
    if not rows.any():
        return ""
    launches = f.dev.launch_ts[np.isin(f.dev.launch_thread, thread[rows])]
    calls = Coverage.of(ts[rows], end[rows])
    if calls.covered(launches, launches + 1).any():
        return ""
    return " (launched no GPU work: compute on CPU tensors)"


def _slow_launches(f: Facts, kernels: np.ndarray) -> str:
    """The launch calls of the steady steps' kernels that took over `slow_launch_ns`, in
    words: first launches loading code (start-up, left out of the share) and the rest (the
    host stalled inside the runtime, which can recur)."""
    assert f.dev is not None
    launched = f.dev.launch_end[f.inside][kernels]
    calls = launched - f.dev.launch_ts[f.inside][kernels]
    # Launches that loaded their code, or made inside a one-off stretch (a library's first
    # call, a compile): start-up, not the runtime stalling.
    thread = f.dev.launch_thread[f.inside][kernels]
    at = f.dev.launch_ts[f.inside][kernels]
    one_off = f.dev.one_off[f.inside][kernels] | f.dev.one_offs.holds(thread, at)
    limit = f.thresholds.time.slow_launch_ns
    # A graph launch stands for all the kernels it replays: slow for them, not stalled.
    slow = (launched != NO_LAUNCH) & (calls > limit) & ~one_off & ~f.dev.graph[f.inside][kernels]
    out = ""
    if one_off.any():
        out += (
            f"; {int(one_off.sum())} first launch(es) loading kernel code took "
            f"{ms_text(float(calls[one_off].sum()) * 1e-9)}: start-up, a one-off cost left out of "
            "this share, which is of the step without it"
        )
    if slow.any():
        out += (
            f"; {int(slow.sum())} other launch call(s) took over {limit / 1e6:g} ms, "
            f"{ms_text(float(calls[slow].sum()) * 1e-9)} in all (the host stalled inside the "
            "runtime)"
        )
    return out


def _dispatch_bound(f: Facts, share: float) -> Finding | None:
    """The CPU's counterpart of launch-bound: ops so small that their time is the framework's
    fixed cost per op (in `host_overhead` with Python's time between ops)."""
    d = f.cpu_dispatch
    if d is None or d.calls_per_step == 0:
        return None
    return make_finding(
        f,
        "launch-bound",
        "overhead",
        "Per-op overhead, not arithmetic, takes the CPU's time",
        share,
        f"{share:.0%} of each step is framework overhead: {d.calls_per_step:.0f} calls per "
        f"step ({d.ops_per_step:.0f} ops, median call {d.median_call_ns / 1e3:.1f} µs) in "
        f"which no op computes for {f.thresholds.time.dispatch_self_ns // 1000} µs, so the fixed "
        "cost of each eager op (dispatch, autograd, allocation) outweighs its arithmetic; and "
        "Python time between ops",
        "issue fewer, larger ops: process whole batches instead of per-sample or per-element "
        "loops, vectorise Python loops over tensors, foreach/fused optimizers; torch.compile "
        "fuses ops and removes most of the per-op overhead",
        speedup=amdahl(share),
    )


_ALLOC_NAMES = ("cudaMalloc", "cudaFree", "hipMalloc", "hipFree", "cudaMallocAsync")


def _alloc_calls(f: Facts) -> Events:
    """The device allocator's calls in the steady steps."""
    return calls_in_steps(f, _ALLOC_NAMES)


@rule(Facts, id="allocator-churn", work=_alloc_calls)
def allocator_churn(f: Facts) -> Finding | None:
    """Device mallocs and frees in every steady step. Only with steps: in one window, first
    allocations (start-up, the first batch's shapes) cannot be told from churn."""
    if f.steps.count < 2:
        return None
    calls = host_calls(f, _ALLOC_NAMES)
    if not calls or f.step_s <= 0:
        return None
    seconds = sum(t for _, _, t in calls)
    share = seconds / f.step_s
    listed = ", ".join(f"{n} ×{c:.0f}/step" for n, c, _ in calls)
    return make_finding(
        f,
        "allocator-churn",
        "overhead",
        "Device memory is allocated and freed every step",
        share,
        f"{listed}, {ms_text(seconds)} per step on the host (the bound assumes none of it "
        "overlaps GPU work)",
        "let the caching allocator keep its memory: no torch.cuda.empty_cache() in the loop; "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; keep tensor shapes stable",
        speedup=amdahl(share),
    )
