"""torch.compile in a trace: its compiled regions, the eager code beside them, the kernels
Inductor fused, and the compile itself as a one-off cost.

A compiled region is the calls of one `Torch-Compiled Region: F/C` range (frame F's C-th
compile). A call that overlaps the compiler's own ranges (Dynamo tracing, AOT autograd,
Inductor, autotuning: `trace.dynamo.compile_range`) compiled, and is set aside with them;
the others are the region's steady calls. The eager region is the top-level ops of the
regions' thread, outside every region and compile, when they repeat one sequence: one
function run eagerly N times, then compiled, in one trace (what an engineer comparing the
two records). Both are timed alike, per call, from its start to the end of its own work and
the device work it launched (cut at the next call), so that they compare on the same footing.
"""

from __future__ import annotations

import msgspec
import numpy as np
import numpy.typing as npt

from wallfinder.analysis.intervals import Coverage, in_windows
from wallfinder.analysis.scope import Scope
from wallfinder.diagnosis import CodeRegion, CompiledCode, DynamoRecord, FusedKernel
from wallfinder.trace import Events, Kind
from wallfinder.trace.dynamo import (
    compile_codes,
    compile_range,
    fused_kernel,
    region_codes,
    region_name,
    runtime_range,
)

I64 = npt.NDArray[np.int64]
NS = 1e-9

TOP_KERNELS = 12
"""Fused kernels listed, by time."""

COMPILE_FACTOR = 10.0
"""A region call this many times its region's median call, with no compile range recorded
around it, compiled too (a trace recorded without the compiler's ranges)."""


class _Calls(msgspec.Struct, frozen=True):
    """Calls of one piece of code on the host: [ts, end)."""

    ts: I64
    end: I64


def compiled_code(scope: Scope) -> CompiledCode | None:
    """torch.compile in the scope's trace (None: no compiled region, Inductor kernel or
    Dynamo record)."""
    trace = scope.trace
    regions = trace.named((Kind.CPU_OP, Kind.ANNOTATION), region_codes(trace))
    compiles = trace.named((Kind.CPU_OP, Kind.ANNOTATION), compile_codes(trace))
    compiled = Coverage.of(compiles.ts.astype(np.int64), compiles.end.astype(np.int64))
    kernels = _fused_rows(scope)
    if len(regions) == 0 and not kernels.any() and trace.dynamo is None:
        return None
    rows: list[CodeRegion] = []
    steady: list[_Calls] = []
    compiling = 0
    for code in np.unique(regions.name).tolist():
        mine = regions.take(np.flatnonzero(regions.name == code))
        mine = mine.take(np.argsort(mine.ts, kind="stable"))
        calls = _steady_calls(mine, compiled)
        compiling += len(mine) - calls.ts.size
        if calls.ts.size:
            steady.append(calls)
            rows.append(_region(scope, f"compiled {region_name(trace.strings[code])}", calls))
    eager = _eager(scope, regions, compiles) if len(regions) else None
    speedup = None
    if eager is not None and len(rows) == 1 and rows[0].time_per_call_s > 0:
        speedup = eager.time_per_call_s / rows[0].time_per_call_s
    return CompiledCode(
        regions=rows,
        eager=eager,
        speedup=speedup,
        share=_share(scope, steady),
        compile_s=_covered(compiled) * NS,
        compiling_calls=compiling,
        kernels=_kernels(scope, kernels, steady),
        dynamo=dynamo_record(trace.dynamo),
    )


def _covered(cover: Coverage) -> int:
    return int((cover.ends - cover.starts).sum())


def _overlaps(cover: Coverage, ts: I64, end: I64) -> npt.NDArray[np.bool_]:
    """Per interval [ts, end): it overlaps `cover`."""
    if cover.starts.size == 0:
        return np.zeros(ts.size, dtype=bool)
    # The last covered interval that starts before each end reaches past its start.
    at = np.searchsorted(cover.starts, end, side="left") - 1
    ok = at >= 0
    hit = np.zeros(ts.size, dtype=bool)
    hit[ok] = cover.ends[at[ok]] > ts[ok]
    return hit


def _steady_calls(calls: Events, compiled: Coverage) -> _Calls:
    """A region's calls that did not compile: none overlapping a compile range, none far
    longer than the region's median call."""
    ts, end = calls.ts.astype(np.int64), calls.end.astype(np.int64)
    keep = ~_overlaps(compiled, ts, end)
    if keep.sum() >= 2:
        dur = end - ts
        keep &= dur < COMPILE_FACTOR * max(float(np.median(dur[keep])), 1.0)
    return _Calls(ts[keep], end[keep])


def _launched(scope: Scope, calls: _Calls) -> npt.NDArray[np.bool_]:
    """Per device op: launched inside one of `calls`."""
    dev = scope.dev
    if dev is None:
        return np.zeros(0, dtype=bool)
    return in_windows(dev.launch_ts, calls.ts, calls.end)


def _region(
    scope: Scope,
    name: str,
    calls: _Calls,
    ops: list[str] | None = None,
    inner: Coverage | None = None,
) -> CodeRegion:
    """Each call lasts from its start to the end of its host work and the device work it
    launched, cut at the next call's start (back-to-back calls overlap on the device): the
    region's time per call is their mean, whether the calls run back to back or once a
    step. `inner`: other code's host time inside the calls (compiled regions inside an eager
    call), left out of their time, with the kernels it launched."""
    n = calls.ts.size
    ends = calls.end.copy()
    device_s, kernels = 0.0, 0
    dev = scope.dev
    if dev is not None:
        mine = np.flatnonzero(_launched(scope, calls))
        owner = np.searchsorted(calls.ts, dev.launch_ts[mine], side="right") - 1
        np.maximum.at(ends, owner, dev.ops.end[mine])
        if inner is not None:
            mine = mine[inner.covered(dev.launch_ts[mine], dev.launch_ts[mine] + 1) == 0]
        kernels = int(mine.size)
        device_s = float(dev.ops.dur[mine].sum()) * NS
    ends[:-1] = np.minimum(ends[:-1], calls.ts[1:])
    held = 0.0 if inner is None else float(inner.covered(calls.ts, calls.end).mean())
    return CodeRegion(
        name=name,
        calls=n,
        time_per_call_s=max(float((ends - calls.ts).mean()) - held, 0.0) * NS,
        device_per_call_s=device_s / n,
        kernels_per_call=kernels / n,
        ops=ops or [],
    )


def _top_level(ops: Events) -> Events:
    """`ops` (one thread's, sorted by start) that no other of them holds."""
    reach = np.maximum.accumulate(ops.end)
    keep = np.ones(len(ops), dtype=bool)
    keep[1:] = ops.ts[1:] >= reach[:-1]
    return ops.take(keep)


def _eager(scope: Scope, regions: Events, compiles: Events) -> CodeRegion | None:
    """The eager code on the regions' thread: its top-level ops outside every region call
    and compile, when they repeat one sequence (its calls: the repetitions)."""
    trace = scope.trace
    thread = int(np.bincount(np.unique(regions.thread, return_inverse=True)[1]).argmax())
    thread_key = int(np.unique(regions.thread)[thread])
    ops = trace.on_thread((Kind.CPU_OP,), thread_key)
    ops = ops.take(np.argsort(ops.ts, kind="stable"))
    if len(ops) == 0:
        return None
    top = _top_level(ops)
    outside = Coverage.of(
        np.concatenate([regions.ts, compiles.ts]).astype(np.int64),
        np.concatenate([regions.end, compiles.end]).astype(np.int64),
    )
    # Tested once per distinct name, not once per op.
    marks = trace.names_matching(
        lambda s: runtime_range(s) or compile_range(s), kinds=(Kind.CPU_OP,)
    )
    marked = np.isin(top.name, marks)
    top = top.take(~_overlaps(outside, top.ts, top.end) & ~marked)
    period = _period(top.name)
    if period is None:
        return None
    calls = top.name.size // period
    starts = top.ts[::period][:calls].astype(np.int64)
    ends = np.array(
        [int(top.end[k * period : (k + 1) * period].max()) for k in range(calls)], np.int64
    )
    names = [_short(trace.strings[c]) for c in top.name[:period]]
    # A call that holds a compile (a training step that recompiled) is the compile's, a
    # one-off; the region calls inside an eager call (a training loop's compiled model inside
    # its step) are not eager: their time and kernels are left out of the eager call's.
    keep = ~_overlaps(Coverage.of(compiles.ts, compiles.end), starts, ends)
    if not keep.any():
        return None
    starts, ends = starts[keep], ends[keep]
    inner = Coverage.of(regions.ts.astype(np.int64), regions.end.astype(np.int64))
    return _region(scope, "eager", _Calls(starts, ends), names, inner)


def _period(names: npt.NDArray[np.int32]) -> int | None:
    """The shortest sequence `names` repeats whole, at least twice (None: none)."""
    n = names.size
    for p in range(1, n // 2 + 1):
        if n % p == 0 and np.array_equal(names[p:], names[:-p]):
            return p
    return None


def _short(name: str) -> str:
    return name.removeprefix("aten::").removeprefix("autograd::engine::evaluate_function: ")


def _fused_rows(scope: Scope) -> npt.NDArray[np.bool_]:
    """Per device op (per CPU op on the CPU): an Inductor kernel."""
    trace = scope.trace
    codes = trace.names_matching(lambda s: fused_kernel(s) is not None)
    names = scope.dev.ops.name if scope.dev is not None else trace.of_kind(Kind.CPU_OP).name
    return np.isin(names, codes)


def _merged(steady: list[_Calls]) -> _Calls:
    """The union of several regions' calls, disjoint and sorted (a resumed frame's calls run
    inside the call of the frame that broke)."""
    cover = Coverage.of(
        np.concatenate([c.ts for c in steady]), np.concatenate([c.end for c in steady])
    )
    return _Calls(cover.starts, cover.ends)


def _kernels(scope: Scope, fused: npt.NDArray[np.bool_], steady: list[_Calls]) -> list[FusedKernel]:
    """The Inductor kernels run in the steady compiled calls, by time (autotuning's runs
    during a compile are not theirs); with no region recorded (compiled code replayed from a
    CUDA graph, a serving engine's own runner), those of the steady steps."""
    trace = scope.trace
    calls = _merged(steady) if steady else _Calls(scope.window_start, scope.window_end)
    if scope.dev is not None:
        inside = _launched(scope, calls) if steady else scope.inside
        rows = fused & inside
        names, dur = scope.dev.ops.name[rows], scope.dev.ops.dur[rows]
    else:
        ops = trace.of_kind(Kind.CPU_OP)
        rows = fused & in_windows(ops.ts, calls.ts, calls.end)
        names, dur = ops.name[rows], ops.dur[rows]
    out: list[FusedKernel] = []
    for code in np.unique(names).tolist():
        here = names == code
        name = trace.strings[code]
        found = fused_kernel(name)
        assert found is not None  # (the rows were chosen by it)
        out.append(
            FusedKernel(
                name=name,
                kind=found[0],
                ops=found[1],
                calls=int(here.sum()),
                time_s=float(dur[here].sum()) * NS,
            )
        )
    out.sort(key=lambda k: -k.time_s)
    return out[:TOP_KERNELS]


def _share(scope: Scope, steady: list[_Calls]) -> float | None:
    """The steady steps' device time (host time on the CPU) in compiled calls."""
    if not steady:
        return None
    calls = _merged(steady)
    if scope.dev is not None:
        inside = scope.inside
        total = float(scope.dev.ops.dur[inside].sum())
        mine = float(scope.dev.ops.dur[inside & _launched(scope, calls)].sum())
        return mine / total if total > 0 else None
    total = float((scope.window_end - scope.window_start).sum())
    kept = in_windows(calls.ts, scope.window_start, scope.window_end)
    mine = float((calls.end[kept] - calls.ts[kept]).sum())
    return min(mine / total, 1.0) if total > 0 else None


def dynamo_record(raw: object) -> DynamoRecord | None:
    """What a trace's `wallfinder_dynamo` holds (None: none, or not a record this version
    reads: the trace is still a trace)."""
    if not isinstance(raw, dict):
        return None
    try:
        return msgspec.convert(raw, DynamoRecord)
    except msgspec.ValidationError:
        return None


RESUME_PREFIX = "torch_dynamo_resume_in_"
"""The name Dynamo gives the function that resumes a frame after a graph break."""


class BreakCost(msgspec.Struct, frozen=True):
    """The steady steps' eager stretches at graph breaks: inside the call of a frame that
    broke, from its start to the call of the frame that resumes it, the time in no compiled
    graph (the break's own code run eagerly, guard checks, the runtime's wrappers)."""

    seconds_per_step: float
    resumes_per_step: float


_GRAPH_CALL = ("## Call CompiledFxGraph", "CompiledFunction")


def break_cost(scope: Scope, record: DynamoRecord) -> BreakCost | None:
    """What the graph breaks `record` names cost the steady steps (None: no resumed frame
    is called in them)."""
    resumed = {
        c.compile_id.split("/", 1)[0]
        for c in record.compiles
        if c.function.startswith(RESUME_PREFIX)
    }
    if not resumed:
        return None
    trace = scope.trace
    regions = trace.named((Kind.CPU_OP, Kind.ANNOTATION), region_codes(trace))
    frames = np.array(
        [str(region_name(trace.strings[c])).split("/", 1)[0] in resumed for c in regions.name],
        dtype=bool,
    )
    resumes = regions.take(frames)
    if len(resumes) == 0:
        return None
    host = (Kind.CPU_OP, Kind.ANNOTATION)
    graphs = trace.named(host, trace.names_matching(lambda s: s.startswith(_GRAPH_CALL), host))
    graph_cover = Coverage.of(graphs.ts.astype(np.int64), graphs.end.astype(np.int64))
    outer = regions.take(~frames)
    compiles = trace.named((Kind.CPU_OP, Kind.ANNOTATION), compile_codes(trace))
    compiled = Coverage.of(compiles.ts.astype(np.int64), compiles.end.astype(np.int64))
    # (A call that compiled is the compile's, a one-off, not the break's.)
    outer = outer.take(~_overlaps(compiled, outer.ts.astype(np.int64), outer.end.astype(np.int64)))
    steady = in_windows(resumes.ts.astype(np.int64), scope.window_start, scope.window_end)
    total, count = 0, 0
    for ts, end, kept in zip(
        resumes.ts.tolist(), resumes.end.tolist(), steady.tolist(), strict=True
    ):
        # The call it resumes: a region call of another frame that holds it.
        holds = np.flatnonzero((outer.ts <= ts) & (outer.end >= end))
        if not kept or holds.size == 0:
            continue
        start = int(outer.ts[holds].max())
        total += ts - start - _inside(graph_cover, start, ts)
        count += 1
    if not count:
        return None
    steps = max(scope.count, 1)
    return BreakCost(seconds_per_step=total * NS / steps, resumes_per_step=count / steps)


def _inside(cover: Coverage, start: int, end: int) -> int:
    """Time of [start, end) that `cover` covers."""
    lo = np.clip(cover.starts, start, end)
    hi = np.clip(cover.ends, start, end)
    return int((hi - lo).sum())
