"""What hardware counters say: each profiled kernel's bound from an Nsight Compute export, and
beside a trace, whether the roofline's estimate (shapes and datasheet peaks) holds.

The roofline is the prior, the counters are the ground truth: a unit (the SMs, or memory at
some level) at `CounterThresholds.busy` of its peak limits the kernel; the busier of the two is
its bound (memory at the level that is busiest: DRAM, or L2/L1 when the working set is cached;
compute on the tensor pipe or the CUDA cores); with neither busy the kernel is latency-bound
(too little work, low occupancy, launch-sized).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

import msgspec
import numpy as np
import numpy.typing as npt

from wallfinder.analysis.classify import MATMUL_CLASSES, KernelClass
from wallfinder.analysis.gpu import DeviceOps
from wallfinder.analysis.thresholds import CounterThresholds, Thresholds
from wallfinder.diagnosis import (
    CounterCheck,
    CounterKernel,
    CounterReport,
    Diagnosis,
    Finding,
    KernelRow,
)
from wallfinder.hardware import DeviceSpec, match_device
from wallfinder.trace import Kind, Trace
from wallfinder.units import base_name, duration, function_name, normalised_name, pct

if TYPE_CHECKING:
    from wallfinder.trace import NcuExport, NcuLaunch

__all__ = ["CounterPlacement", "classify", "collect_commands", "counter_report", "place_counters"]

_ESTIMATE_TO_COUNTER = {"compute": "compute", "bandwidth": "memory"}
_NEEDED = ("sm_pct", "memory_pct", "duration_s")
"""Figures without which a launch's bound cannot be decided: the export lacks its counters."""


def _int(x: float | None) -> int | None:
    return None if x is None else int(x)


def classify(launch: NcuLaunch, thresholds: Thresholds) -> CounterKernel:
    """One launch's figures and its bound by counters, with the numbers that decided it."""
    th = thresholds.counters
    f = launch.figures
    dur = f.get("duration_s")
    levels = {
        k: v for k, v in (("dram", f["dram_pct"]), ("l2", f["l2_pct"]), ("l1", f["l1_pct"])) if v
    }
    sm = f["sm_pct"]
    mem = f["memory_pct"]
    if mem is None and levels:
        mem = max(levels.values())
    dram_bytes = f["dram_bytes"]
    if dram_bytes is None and f["dram_bytes_per_s"] is not None and dur:
        dram_bytes = f["dram_bytes_per_s"] * dur
    flops = launch.flops
    ai = flops / dram_bytes if flops is not None and dram_bytes else None
    flops_per_s = flops / dur if flops is not None and dur else None
    bw = dram_bytes / dur if dram_bytes is not None and dur else None
    bound, unit, reason = _bound(launch, sm, mem, levels, th, thresholds.time.short_kernel_ns)
    return CounterKernel(
        id=launch.id,
        name=launch.name,
        grid=_int(f["grid"]),
        block=_int(f["block"]),
        duration_s=dur,
        sm_pct=sm,
        memory_pct=mem,
        dram_pct=f["dram_pct"],
        l1_pct=f["l1_pct"],
        l2_pct=f["l2_pct"],
        dram_bytes=dram_bytes,
        l2_bytes=f["l2_bytes"],
        flops=flops,
        flops_basis=launch.flops_basis,
        tensor_pct=f["tensor_pct"],
        tensor_instructions=f["tensor_inst"],
        ai=ai,
        flops_per_s=flops_per_s,
        dram_bytes_per_s=bw,
        occupancy=f["occupancy"],
        bound=bound,
        unit=unit,
        reason=reason,
        invocations=launch.invocations,
    )


def _levels_text(levels: dict[str, float]) -> str:
    return ", ".join(f"{k.upper()} {pct(v)}" for k, v in levels.items())


def _bound(
    launch: NcuLaunch,
    sm: float | None,
    mem: float | None,
    levels: dict[str, float],
    th: CounterThresholds,
    short_ns: int,
) -> tuple[Literal["compute", "memory", "latency"] | None, str | None, str]:
    if sm is None and mem is None:
        return None, None, "no SM or memory throughput in the export"
    s, m = sm or 0.0, mem or 0.0
    said = f"SM {pct(sm)}, memory {pct(mem)} of peak"
    if levels:
        said += f" ({_levels_text(levels)})"
    if max(s, m) < th.busy:
        why = []
        occ = launch.figures["occupancy"]
        if occ is not None and occ < th.low_occupancy:
            why.append(f"occupancy {pct(occ)}")
        dur = launch.figures["duration_s"]
        if dur is not None and dur * 1e9 < short_ns:
            why.append(f"launch-sized ({duration(dur)})")
        grid = launch.figures["grid"]
        if grid is not None and "occupancy" not in " ".join(why):
            why.append(f"grid {int(grid)} blocks")
        return (
            "latency",
            ", ".join(why) or None,
            f"neither unit busy: {said}, both under {pct(th.busy, 0)}",
        )
    if m >= s:
        unit = max(levels, key=lambda k: levels[k]) if levels else None
        where = f" at {unit.upper()}" if unit else ""
        return "memory", unit, f"memory{where}: {said}"
    tensor = launch.figures["tensor_pct"]
    inst = launch.figures["tensor_inst"]
    on_tensor = tensor >= th.tensor_active if tensor is not None else bool(inst)
    pipe = f"tensor pipe {pct(tensor)}" if tensor is not None else f"{inst or 0:.0f} tensor inst"
    return (
        "compute",
        "tensor" if on_tensor else "cuda cores",
        f"compute on {'the tensor pipe' if on_tensor else 'CUDA cores'}: {said}; {pipe}",
    )


def _lacking(export: NcuExport) -> list[str]:
    """The figures a bound needs that no launch of the export carries."""
    return [k for k in _NEEDED if all(launch.figures.get(k) is None for launch in export.launches)]


def _notes(lacking: list[str], kernels: list[CounterKernel]) -> list[str]:
    notes = []
    if lacking:
        notes.append(
            f"the export has no {', '.join(lacking)} for any launch: collect them with the "
            "command below"
        )
    if any(k.flops_basis == "sass" and (k.tensor_instructions or 0) > 0 for k in kernels):
        notes.append(
            "FLOPs are counted CUDA-core instructions (FMA as two): work on the tensor pipe "
            "is not in them, so a tensor-core kernel's FLOPs and AI read low"
        )
    if all(k.flops is None for k in kernels):
        notes.append("the export counts no FLOPs: no achieved AI or FLOP/s")
    return notes


def collect_commands(d: Diagnosis | None, thresholds: Thresholds) -> list[str]:
    """The `ncu` command lines that collect what wallfinder reads: one per top kernel by time
    of a diagnosis (its first step's launches skipped, then one launch), else one for all."""
    from wallfinder.trace import ncu_command  # (here: the Nsight Compute reader is lazy)

    if d is None or not d.kernels:
        return [ncu_command()]
    steps = max(1, d.steps.count)
    out = []
    for row in [r for r in d.kernels if r.cls != "communication"][: thresholds.counters.top]:
        name = function_name(row.name)
        per_step = max(1, round(row.count / steps))
        out.append(ncu_command(re.escape(name), launch_skip=per_step, launch_count=1))
    return out


_TIERS: tuple[tuple[str, Callable[[str], str]], ...] = (
    ("name", normalised_name),
    ("base name", base_name),
    ("function name", function_name),
)
"""How a trace's kernel and a profiled launch are matched by name, strictest first: the whole
normalised name, the qualified function name (`base_name`), the function name alone (what ncu
prints with `--print-kernel-base function`). Within each, launches whose grid agrees with the
kernel's are paired first ("name and grid"), then the rest by name; pairs are made in launch
order."""

TIER_NAMES: tuple[str, ...] = tuple(t for how, _ in _TIERS for t in (f"{how} and grid", how))
"""Every tier a kernel can be matched by, strictest first (`CounterPlacement.tier` indexes
it)."""

_LOOSE = 2
"""The first of `TIER_NAMES` that matches less than the whole name: from it on, a key that
stands for several of the trace's kernel names joins none of them."""

BOUND_CODE = {"compute": 1, "memory": 2, "latency": 3}
"""A counter bound as `CounterPlacement.bound` stores it (0: none)."""


class CounterPlacement(msgspec.Struct, frozen=True):
    """Per device op (`DeviceOps.ops`): the profiled launch it was joined to, how, and the
    bound the counters give it (`BOUND_CODE`; 0 where unmatched or undecided), with the
    counted % of peak of the unit that bounds it (NaN where none)."""

    launch: npt.NDArray[np.int64]
    """Index into `kernels` (-1: unmatched)."""
    tier: npt.NDArray[np.int8]
    """Index into `TIER_NAMES` (-1: unmatched)."""
    bound: npt.NDArray[np.int8]
    pct: npt.NDArray[np.float64]
    kernels: list[CounterKernel]
    """Every profiled launch, classified."""
    mismatch: str | None = None
    """Why the export is not shown to be the trace's program (`_same_program`), where it is
    not: then no kernel has a counted bound (`bound` is all 0) and the counters change
    nothing."""


def _counted_pct(k: CounterKernel) -> float:
    """How near its roof a kernel runs by counters: the throughput, as a fraction of peak, of
    the unit that bounds it (the busier of SM and memory for a latency-bound one)."""
    sm, mem = k.sm_pct, k.memory_pct
    value = sm if k.bound == "compute" else mem if k.bound == "memory" else max(sm or 0, mem or 0)
    return float("nan") if value is None else min(1.0, value)


def place_counters(
    trace: Trace,
    dev: DeviceOps,
    export: NcuExport,
    thresholds: Thresholds,
    spec: DeviceSpec | None = None,
) -> CounterPlacement:
    """Join the device's kernels to the export's launches and give each joined kernel the
    counters' bound. Per name tier (`_TIERS`), launches whose grid (blocks) agrees with the
    kernel's, and its block (threads) where the trace and the export both carry blocks, are
    paired first, then any left by name alone; within a key, kernels and launches
    pair in launch order, and kernels beyond the profiled launches (ncu profiled a sample:
    `--launch-skip`/`--launch-count`) cycle through them in order. By a part of the name (the
    base or function name), only a key that stands for one of the trace's kernel names
    joins. An export not shown to be the same program (`_same_program`: the device `spec`
    runs or the trace names) gives no kernel a bound, and says why."""
    kernels = [classify(launch, thresholds) for launch in export.launches]
    ops = dev.ops
    n = len(ops)
    launch_of = np.full(n, -1, dtype=np.int64)
    tier = np.full(n, -1, dtype=np.int8)
    rows = np.flatnonzero(ops.kind == Kind.KERNEL)
    rows = rows[np.argsort(ops.ts[rows], kind="stable")]
    # Per distinct name, grid and block code (not per launch): their keys and sizes.
    codes, name_of = np.unique(ops.name[rows], return_inverse=True)
    name_of = name_of.reshape(-1)
    texts = [trace.strings[int(c)] for c in codes.tolist()]
    op_size, with_block = _size_codes(trace, ops.grid[rows], ops.block[rows], kernels)
    l_size = np.array(
        [_size_code(_int(k.grid), _int(k.block) if with_block else None) for k in kernels],
        dtype=np.int64,
    )
    free = np.ones(len(kernels), dtype=bool)
    level = 0
    for _, key_of in _TIERS:
        ids: dict[str, int] = {}
        op_key = np.array([ids.setdefault(key_of(t), len(ids)) for t in texts], dtype=np.int64)
        l_key = np.array(
            [ids.setdefault(key_of(x.name), len(ids)) for x in export.launches], dtype=np.int64
        )
        for with_grid in (True, False):
            at = np.flatnonzero((tier[rows] < 0) & ((op_size > 0) | (not with_grid)))
            want = np.flatnonzero(free & ((l_size > 0) | (not with_grid)))
            if at.size and want.size:
                todo = rows[at]
                _pair(
                    todo,
                    op_key[name_of[at]] * _SIZES + (op_size[at] if with_grid else 0),
                    ops.name[todo],
                    want,
                    l_key[want] * _SIZES + (l_size[want] if with_grid else 0),
                    launch_of,
                    free,
                    loose=level >= _LOOSE,
                )
                tier[todo[launch_of[todo] >= 0]] = level
            level += 1
    bound = np.zeros(n, dtype=np.int8)
    pct = np.full(n, np.nan)
    per_launch = np.array([BOUND_CODE[k.bound] if k.bound else 0 for k in kernels], np.int8)
    counted = np.array([_counted_pct(k) for k in kernels], dtype=np.float64)
    joined = np.flatnonzero(launch_of >= 0)
    bound[joined] = per_launch[launch_of[joined]] if len(kernels) else 0
    pct[joined] = counted[launch_of[joined]] if len(kernels) else np.nan
    pct[bound == 0] = np.nan
    mismatch = _same_program(trace, spec, export, launch_of[rows], tier[rows], thresholds)
    if mismatch is not None:
        bound[:] = 0
        pct[:] = np.nan
    return CounterPlacement(launch_of, tier, bound, pct, kernels, mismatch)


def _capability(text: str | None) -> str | None:
    """A compute capability as "major.minor" ("8.0"), from the export's `CC` or a spec's
    `arch`; None for anything else (an AMD target)."""
    parts = (text or "").strip().split(".")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        return None
    return f"{int(parts[0])}.{int(parts[1])}"


def _trace_capability(trace: Trace | None, spec: DeviceSpec | None) -> str | None:
    """The compute capability of the trace's device: its `deviceProperties`, else its spec's."""
    for props in trace.device_properties if trace is not None else []:
        major, minor = props.get("computeMajor"), props.get("computeMinor")
        if isinstance(major, int) and isinstance(minor, int) and major > 0:
            return f"{major}.{minor}"
    return _capability(spec.arch) if spec is not None else None


def _other_device(export: NcuExport, trace: Trace | None, spec: DeviceSpec | None) -> str | None:
    """Why the export ran on another device than the trace, where the two say so: an AMD
    device (Nsight Compute profiles NVIDIA GPUs only), or another compute capability."""
    if spec is not None and spec.vendor == "amd":
        return f"Nsight Compute profiles NVIDIA GPUs and the trace's device is {spec.name}"
    theirs = sorted({c for x in export.launches if (c := _capability(x.capability))})
    mine = _trace_capability(trace, spec)
    if theirs and mine is not None and mine not in theirs:
        return f"it ran on compute capability {', '.join(theirs)} and the trace's device is {mine}"
    return None


def _same_program(
    trace: Trace,
    spec: DeviceSpec | None,
    export: NcuExport,
    launch_of: npt.NDArray[np.int64],
    tier: npt.NDArray[np.int8],
    thresholds: Thresholds,
) -> str | None:
    """None when the export is shown to be the trace's program, else why not (one line).

    Kernel names alone show nothing: every PyTorch program launches
    `vectorized_elementwise_kernel` and `reduce_kernel`. Shown means the same device (where
    both say theirs) and most profiled launches (`CounterThresholds.same_program`, by
    invocations) joined by evidence a name does not carry: a kernel of the launch's grid and
    block (a "... and grid" tier), or the launch order (a kernel joined to launch j followed
    at once, on the device, by one joined to launch j + 1: ncu numbers launches as they
    run). `launch_of` and `tier` are per kernel, in launch order."""
    device = _other_device(export, trace, spec)
    if device is not None:
        return device
    n = len(export.launches)
    joined = np.zeros(n, dtype=bool)
    shown = np.zeros(n, dtype=bool)
    hit = launch_of >= 0
    joined[launch_of[hit]] = True
    shown[launch_of[hit & (tier % 2 == 0)]] = True  # even tiers pair by grid and block
    follows = hit[:-1] & (launch_of[1:] == launch_of[:-1] + 1)
    shown[launch_of[:-1][follows]] = True
    shown[launch_of[1:][follows]] = True
    weight = np.array([x.invocations for x in export.launches], dtype=np.float64)
    total = float(weight.sum())
    if total > 0 and float(weight[shown].sum()) / total > thresholds.counters.same_program:
        return None
    return (
        f"of its {n} profiled launches, {int(shown.sum())} join the trace's kernels by launch "
        f"size (grid and block) or launch order, {int(joined.sum())} by kernel name alone "
        "(which any program may share)"
    )


_SIZES = np.int64(1) << np.int64(42)
"""Key codes are a name key times this plus a launch size code (below it)."""


def _size_code(grid: int | None, block: int | None) -> int:
    """A launch's size as one number: blocks × 2048 + threads per block (0: no grid)."""
    if not grid:
        return 0
    return min(grid, (1 << 31) - 1) * 2048 + min(block or 0, 2047)


def _size_codes(
    trace: Trace,
    grid: npt.NDArray[np.int32],
    block: npt.NDArray[np.int32],
    kernels: list[CounterKernel],
) -> tuple[npt.NDArray[np.int64], bool]:
    """Each kernel's `_size_code`, its block counted only where the trace and the export
    both carry blocks (and whether they do)."""
    grids, grid_of = np.unique(grid, return_inverse=True)
    blocks, block_of = np.unique(block, return_inverse=True)
    threads = np.array([trace.threads(int(b)) for b in blocks.tolist()], dtype=np.int64)
    with_block = bool(threads.any()) and any(k.block for k in kernels)
    n_blocks = np.array([trace.blocks(int(g)) for g in grids.tolist()], dtype=np.int64)
    op_blocks = n_blocks[grid_of.reshape(-1)] if grid.size else np.zeros(0, np.int64)
    op_threads = threads[block_of.reshape(-1)] if with_block and block.size else 0
    code = np.minimum(op_blocks, (1 << 31) - 1) * 2048 + np.minimum(op_threads, 2047)
    return np.where(op_blocks > 0, code, 0).astype(np.int64), with_block


def _pair(
    todo: npt.NDArray[np.int64],
    key: npt.NDArray[np.int64],
    name: npt.NDArray[np.int32],
    want: npt.NDArray[np.int64],
    l_key: npt.NDArray[np.int64],
    launch_of: npt.NDArray[np.int64],
    free: npt.NDArray[np.bool_],
    *,
    loose: bool,
) -> None:
    """Pair the kernels `todo` (in launch order) with the free launches `want` (in profile
    order) of the same key, in order; kernels beyond a key's launches cycle through them.
    With `loose`, a key that several kernel names share pairs with none."""
    if loose:
        pairs = np.unique(np.stack([key, name.astype(np.int64)]), axis=1)
        keys, names = np.unique(pairs[0], return_counts=True)
        key = np.where(np.isin(key, keys[names > 1]), -1, key)
    order = np.argsort(key, kind="stable")  # by key, launch order within each
    k_sorted = key[order]
    first = np.searchsorted(k_sorted, k_sorted, side="left")
    rank = np.empty(key.size, dtype=np.int64)
    rank[order] = np.arange(key.size) - first
    l_order = np.argsort(l_key, kind="stable")
    l_sorted = l_key[l_order]
    start = np.searchsorted(l_sorted, key, side="left")
    count = np.searchsorted(l_sorted, key, side="right") - start
    hit = (count > 0) & (key >= 0)
    chosen = l_order[start[hit] + rank[hit] % count[hit]]
    launch_of[todo[hit]] = want[chosen]
    # A launch is used by the kernel paired with it (not by those that cycle back to it).
    free[want[chosen[rank[hit] < count[hit]]]] = False


def _match(rows: list[KernelRow], launches: list[NcuLaunch]) -> dict[int, tuple[str, list[int]]]:
    """Trace kernel (index) → how it matched and the launches (indices), by the first tier of
    `_TIERS` that finds any; each launch joins one kernel at most, in launch order. For a
    diagnosis alone (a saved one): with the trace, `place_counters` joins each launch."""
    free = set(range(len(launches)))
    out: dict[int, tuple[str, list[int]]] = {}
    for how, key_of in _TIERS:
        keys = [key_of(x.name) for x in launches]
        for i, row in enumerate(rows):
            if i in out:
                continue
            key = key_of(row.name)
            hit = [j for j in sorted(free) if keys[j] == key]
            if hit:
                out[i] = (how, hit)
                free -= set(hit)
    return out


def _placed_match(
    rows: list[KernelRow], trace: Trace, dev: DeviceOps, placement: CounterPlacement
) -> dict[int, tuple[str, list[int]]]:
    """Trace kernel (index) → the tier most of its launches matched by and the launches they
    were joined to, from `place_counters`."""
    out: dict[int, tuple[str, list[int]]] = {}
    joined = placement.launch >= 0
    for i, row in enumerate(rows):
        code = trace.code_of(row.name)
        if code < 0:
            continue
        mine = joined & (dev.ops.name == code)
        if not mine.any():
            continue
        tiers = np.bincount(placement.tier[mine].astype(np.intp), minlength=len(TIER_NAMES))
        out[i] = (TIER_NAMES[int(np.argmax(tiers))], sorted(set(placement.launch[mine].tolist())))
    return out


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _check(
    row: KernelRow, how: str, ks: list[CounterKernel], th: CounterThresholds
) -> CounterCheck:
    by_time: dict[Literal["compute", "memory", "latency"], float] = {}
    for k in ks:
        if k.bound is not None:
            spent = (k.duration_s or 0.0) * k.invocations
            by_time[k.bound] = by_time.get(k.bound, 0.0) + spent
    bound = max(by_time.items(), key=lambda kv: kv[1])[0] if by_time else None
    units = [k.unit for k in ks if k.bound == bound and k.unit]
    # The most common unit; a tie goes to the first launch's (not to a set's order, which
    # changes with the process's string hashing: the report would change from run to run).
    unit = max(dict.fromkeys(units), key=units.count) if units else None
    counted_flops = _mean([k.flops for k in ks])
    counted_bytes = _mean([k.dram_bytes for k in ks])
    count = max(1, row.count)
    est_flops = row.flops / count if row.flops is not None else None
    est_bytes = row.bytes / count if row.bytes is not None else None
    flops_ratio = _ratio(est_flops, counted_flops)
    bytes_ratio = _ratio(est_bytes, counted_bytes)
    estimate = row.estimated_bound if row.bound_basis == "counters" else row.bound
    expected = _ESTIMATE_TO_COUNTER.get(estimate or "")
    status: Literal["confirmed", "refuted", "no estimate", "no counters"]
    if bound is None:
        status = "no counters"
    elif expected is None:
        status = "no estimate"
    else:
        status = "confirmed" if expected == bound else "refuted"
    detail = []
    if status in ("confirmed", "refuted"):
        detail.append(f"estimate {estimate}, counters {bound}" + (f" ({unit})" if unit else ""))
    for what, r in (("FLOPs", flops_ratio), ("bytes", bytes_ratio)):
        if r is not None and abs(r - 1) > th.model_tolerance:
            detail.append(f"cost model's {what} {r:.2f}x the counted")
    return CounterCheck(
        kernel=row.name,
        time_s=row.time_s,
        share=row.share,
        launches=sum(k.invocations for k in ks),
        matched_by=how,
        estimated_bound=estimate,
        estimated_flops=est_flops,
        estimated_bytes=est_bytes,
        pct_of_roof=row.pct_of_roof,
        counter_bound=bound,
        counter_unit=unit,
        counted_flops=counted_flops,
        counted_bytes=counted_bytes,
        flops_ratio=flops_ratio,
        bytes_ratio=bytes_ratio,
        status=status,
        detail="; ".join(detail),
    )


def _refuted_finding(checks: list[CounterCheck], th: CounterThresholds) -> Finding | None:
    judged = [c for c in checks if c.status in ("confirmed", "refuted")]
    total = sum(c.share for c in judged)
    wrong = [c for c in judged if c.status == "refuted"]
    share = sum(c.share for c in wrong)
    if not wrong or total <= 0 or share / total < th.refuted_share:
        return None
    names = "; ".join(
        f"{function_name(c.kernel)} (estimate {c.estimated_bound}, counters {c.counter_bound})"
        for c in sorted(wrong, key=lambda c: -c.share)[:3]
    )
    return Finding(
        id="roofline-refuted",
        wall=None,
        title="the roofline's bound is refuted by the counters for "
        f"{pct(share / total, 0)} of the matched kernels' time",
        share=0.0,
        max_speedup=1.0,
        evidence=f"{len(wrong)} of {len(judged)} matched kernels with an estimate, "
        f"{pct(share)} of the kernel time: "
        f"{names}",
        fix="trust the counters for these kernels: a latency-bound kernel needs more work per "
        "launch (batching, fusion, CUDA graphs), not a faster unit; a memory-bound one that the "
        "estimate called compute moves more bytes than its shapes say",
    )


def _verdict_notes(d: Diagnosis, checks: list[CounterCheck]) -> list[str]:
    """What the counters change in the verdict's fourth question (are the matmuls near peak?):
    matmul kernels it counted as compute-bound that the counters call otherwise."""
    matmul = {r.name for r in d.kernels if KernelClass(r.cls) in MATMUL_CLASSES}
    moved = [
        c
        for c in checks
        if c.kernel in matmul and c.estimated_bound == "compute" and c.status == "refuted"
    ]
    if not moved:
        return []
    share = sum(c.share for c in moved)
    names = ", ".join(f"{function_name(c.kernel)} ({c.counter_bound})" for c in moved[:3])
    return [
        f"the verdict's fourth question counts {len(moved)} matmul kernel(s) as compute-bound "
        f"({pct(share)} of kernel time) that the counters call otherwise: {names}; their % of "
        "roof measures a roof they do not reach for that reason"
    ]


def counter_report(
    export: NcuExport,
    thresholds: Thresholds | None = None,
    diagnosis: Diagnosis | None = None,
    placed: tuple[Trace, DeviceOps, CounterPlacement] | None = None,
) -> CounterReport:
    """Each profiled launch's bound by counters and, with a `diagnosis` of the same program,
    its top kernels' roofline estimates confirmed or refuted: joined by `placed` (the
    diagnosis's trace, device ops and `place_counters`) where given, else by name alone."""
    th = thresholds or Thresholds()
    if placed is not None:
        kernels = placed[2].kernels
    else:
        kernels = [classify(launch, th) for launch in export.launches]
    lacking = _lacking(export)
    notes = _notes(lacking, kernels)
    checks: list[CounterCheck] = []
    unmatched: list[str] = []
    unmatched_launches = 0
    findings: list[Finding] = []
    collect: list[str] = []
    mismatch = _mismatch(export, diagnosis, placed)
    if diagnosis is not None and mismatch is not None:
        # Nothing is joined: no estimate is confirmed or refuted, nothing is re-placed; what
        # would collect the counters of this trace's own kernels is said instead.
        unmatched = [row.name for row in diagnosis.kernels]
        unmatched_launches = len(export.launches)
        collect = collect_commands(diagnosis, th)
    elif diagnosis is not None:
        rows = diagnosis.kernels
        matched = (
            _placed_match(rows, *placed) if placed is not None else _match(rows, export.launches)
        )
        for i, row in enumerate(rows):
            if i not in matched:
                unmatched.append(row.name)
                continue
            how, idx = matched[i]
            checks.append(_check(row, how, [kernels[j] for j in idx], th.counters))
        used = {j for _, idx in matched.values() for j in idx}
        if placed is not None:  # every kernel launch was joined, not only the top kernels'
            used = set(np.unique(placed[2].launch[placed[2].launch >= 0]).tolist())
        unmatched_launches = len(export.launches) - len(used)
        finding = _refuted_finding(checks, th.counters)
        if finding is not None:
            findings.append(finding)
        if placed is None:
            notes.append(
                "joined by kernel name alone (a saved diagnosis keeps no launch sizes or "
                "order), so not shown to be the same program: give the trace to join launch "
                "by launch"
            )
            notes += _verdict_notes(diagnosis, checks)
        elif diagnosis.roofline is not None and diagnosis.roofline.by_counters:
            notes.append(
                "the verdict and findings place these kernels by their counters, not the "
                "estimate: " + "; ".join(diagnosis.roofline.by_counters)
            )
        if unmatched or lacking:
            collect = collect_commands(diagnosis, th)
    elif lacking:
        collect = collect_commands(None, th)
    return CounterReport(
        source=export.source,
        page=export.page,
        kernels=kernels,
        checks=checks,
        unmatched_kernels=unmatched,
        unmatched_launches=unmatched_launches,
        findings=findings,
        collect=collect,
        notes=notes,
        mismatch=mismatch,
    )


def _mismatch(
    export: NcuExport,
    diagnosis: Diagnosis | None,
    placed: tuple[Trace, DeviceOps, CounterPlacement] | None,
) -> str | None:
    """Why the export is not the diagnosed program's, in a line, or None. A saved diagnosis
    has no launch sizes or order to join by: only its device can show a mismatch."""
    if diagnosis is None:
        return None
    if placed is not None:
        why = placed[2].mismatch
    else:
        name = diagnosis.device.name
        why = _other_device(export, None, match_device(name) if name else None)
    if why is None:
        return None
    return f"the export does not match this trace: {why}; its counters change nothing"
