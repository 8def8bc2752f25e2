"""Roofline: each costed op's kernels against the device's roofs, and MFU.

An op's kernels are found by External id (a kernel carries the id of the innermost CPU op that
launched it). Ops are grouped by signature (name, input shapes, dtypes, scalar inputs): a group's
GPU time is the union of its kernels' intervals, its FLOPs and bytes are the cost model's per
call times the calls. Kernels take their op's cost in proportion to their duration when an op
launches several. Nothing is invented: an op with no cost model, or no shapes, has unknown
FLOPs, and its kernels get the bound of their class, said so.
"""

from __future__ import annotations

import msgspec
import numpy as np
import numpy.typing as npt

from wallfinder.analysis.classify import (
    MATMUL_CLASSES,
    KernelClass,
    classify_op,
    streams_operands,
)
from wallfinder.analysis.gpu import CLASSES, DeviceOps

# The containment search lives with the other interval arithmetic (the one-off costs read it
# below the device's ops); imported here, where its callers find it.
from wallfinder.analysis.intervals import MAX_STEPS_BACK as MAX_STEPS_BACK
from wallfinder.analysis.intervals import Coverage, in_windows
from wallfinder.analysis.intervals import Spans as Spans
from wallfinder.analysis.intervals import enclosing as enclosing
from wallfinder.analysis.intervals import enclosing_of as enclosing_of
from wallfinder.analysis.scope import Scope
from wallfinder.analysis.steps import NO_LAUNCH
from wallfinder.cost import Cost, op_cost
from wallfinder.diagnosis import KernelRow, Mfu, OpRoofRow, Roofline
from wallfinder.hardware import DeviceSpec
from wallfinder.trace import NONE, Events, Kind, Trace
from wallfinder.units import short_kernel

NS = 1e-9
TOP_OPS = 15
MORE_OPS = 2000
"""Costed op signatures kept beyond the top `TOP_OPS` (the roofline plot's other points)."""
_CLASS_BOUND = {KernelClass.ATTENTION: "compute"} | {
    c: "bandwidth"
    for c in KernelClass
    if c not in MATMUL_CLASSES and c not in (KernelClass.COMMUNICATION, KernelClass.OTHER)
}
"""The bound a kernel class has when its op has no cost model. A GEMM's or a convolution's
is unknown: the same kernel family is compute-bound on a training batch and streams its
weights in a decode step (small M), and a convolution's groups, channels and kernel size
decide its AI (a depthwise one is about 2), and only shapes tell; communication and other
have none. A matmul-class kernel whose name says it is built for skinny shapes
(`streams_operands`) is bandwidth-bound; a depthwise kernel (its own class) is too."""
_MATMUL_MODELS = ("gemm", "conv", "attention")
"""The cost models of matmul-class ops (the FLOPs MFU counts)."""
_MATMUL = np.array([c in MATMUL_CLASSES for c in CLASSES])
_BOUND_CODE = {None: 0, "compute": 1, "bandwidth": 2}


def class_bound(cls: KernelClass, name: str, skinny_tile: int) -> str | None:
    """The bound of a kernel with no cost: its name's (skinny matmul kernels stream their
    operands, `Thresholds.skinny_tile`), else its class's."""
    if cls in MATMUL_CLASSES and streams_operands(name, cls, skinny_tile):
        return "bandwidth"
    return _CLASS_BOUND.get(cls)


def _class_bounds(trace: Trace, dev: DeviceOps, skinny_tile: int) -> npt.NDArray[np.int8]:
    """Per device op: the code (0 unknown, 1 compute, 2 bandwidth) of its `class_bound`,
    decided once per distinct name."""
    codes, first, inverse = np.unique(dev.ops.name, return_index=True, return_inverse=True)
    per_name = np.array(
        [
            _BOUND_CODE[class_bound(CLASSES[int(dev.cls[i])], trace.strings[int(c)], skinny_tile)]
            for c, i in zip(codes.tolist(), first.tolist(), strict=True)
        ],
        dtype=np.int8,
    )
    return per_name[inverse.reshape(-1)] if codes.size else np.zeros(0, dtype=np.int8)


# Kernel names that show tensor-core (matrix unit) use for fp32 inputs, i.e. TF32 or a
# lower-precision path: Ampere+ "tensorop"/"xmma" kernels, cuBLASLt nvjet, the s1688/s16816
# TF32 tiles, hipBLASLt/Tensile xf32, CUTLASS tf32.
_TENSOR_CORE_HINTS = ("tf32", "tensorop", "xmma", "nvjet", "s1688", "s16816", "xf32", "wmma", "mma")


class Costed(msgspec.Struct, frozen=True):
    """Per device op (row of `DeviceOps.ops`): its share of its launching op's cost."""

    flops: npt.NDArray[np.float64]  # NaN where unknown
    bytes: npt.NDArray[np.float64]
    group: npt.NDArray[np.int64]  # op signature group, NONE where unknown
    dtype: list[str]  # per group: the dtype whose peak applies (TF32 on tensor cores)
    costs: list[Cost]  # per group (the cost of one call)
    names: list[str]  # per group: op name
    shapes: list[str]  # per group: input dims as recorded
    launcher: npt.NDArray[np.int64]  # per device op: row of its launching CPU op, or NONE


def cost_device_ops(scope: Scope, launcher: npt.NDArray[np.int64]) -> Costed:
    """Each kernel's share of its launching op's cost (`launcher`: from `launching_ops`)."""
    trace, dev, spec = scope.trace, scope.gpu, scope.spec
    ops = dev.ops
    n = len(ops)
    flops = np.full(n, np.nan)
    nbytes = np.full(n, np.nan)
    group = np.full(n, NONE, dtype=np.int64)
    cpu = trace.of_kind(Kind.CPU_OP)
    if not (cpu.input_dims > 0).any() or n == 0:
        return Costed(flops, nbytes, group, [], [], [], [], launcher)
    op_row = launcher.copy()
    op_row[ops.kind != Kind.KERNEL] = NONE
    hit = op_row >= 0
    hit[hit] = cpu.input_dims[op_row[hit]] > 0
    op_row[~hit] = NONE

    # Cost each distinct signature once: traces repeat the same shapes thousands of times.
    rows = op_row[hit]
    signature = np.ascontiguousarray(
        np.stack(
            [cpu.name[rows], cpu.input_dims[rows], cpu.input_type[rows], cpu.concrete_inputs[rows]],
            axis=1,
        ).astype(np.int32)
    )
    # One 16-byte key per signature: a 1-D unique is far cheaper than a row-wise one.
    keys = signature.view(np.dtype((np.void, signature.shape[1] * 4))).ravel()
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    uniq = signature[first]
    inverse = inverse.reshape(-1)
    costs: list[Cost] = []
    names: list[str] = []
    shapes: list[str] = []
    group_of_sig = np.full(uniq.shape[0], NONE, dtype=np.int64)
    for i, (name, dims, types, concrete) in enumerate(uniq.tolist()):
        cost = op_cost(trace.strings[name], trace.op_args(dims, types, concrete))
        if cost is None:
            continue
        group_of_sig[i] = len(costs)
        costs.append(cost)
        names.append(trace.strings[name])
        shapes.append(trace.shapes_text(dims))
    hit_rows = np.flatnonzero(hit)
    group[hit_rows] = group_of_sig[inverse]
    known = group >= 0
    if not known.any():
        return Costed(flops, nbytes, group, [], [], [], [], launcher)
    # Split each op call's cost over its kernels by duration.
    call = np.where(known, op_row, NONE)
    dur = ops.dur.astype(np.float64)
    call_ids, call_inverse = np.unique(call[known], return_inverse=True)
    call_time = np.bincount(call_inverse, weights=dur[known])
    share = np.divide(
        dur[known],
        call_time[call_inverse],
        out=np.zeros(int(known.sum())),
        where=call_time[call_inverse] > 0,
    )
    del call_ids
    per_group_flops = np.array([c.flops for c in costs])
    per_group_bytes = np.array([c.bytes for c in costs])
    flops[known] = per_group_flops[group[known]] * share
    nbytes[known] = per_group_bytes[group[known]] * share
    # The dtype whose peak applies, judged from each group's longest kernel.
    dtypes = []
    for g, cost in enumerate(costs):
        rows_g = np.flatnonzero(group == g)
        longest = rows_g[np.argmax(ops.dur[rows_g])] if rows_g.size else None
        kernel = trace.strings[int(ops.name[longest])] if longest is not None else ""
        dtypes.append(effective_dtype(cost.dtype, kernel, spec))
    return Costed(flops, nbytes, group, dtypes, costs, names, shapes, launcher)


def launching_ops(cpu: Events, dev: DeviceOps) -> tuple[npt.NDArray[np.int64], int]:
    """For each device op, the row in `cpu` (CPU ops sorted by start) of the op that launched
    it, or NONE; and how many were joined by time.

    Kineto gives a kernel the External id of the innermost CPU op around its launch, which
    joins them directly, when that op encloses the launch call (re-numbered ids do not). Older
    traces reuse the correlation id as the External id of kernels and runtime calls; there,
    and wherever the External id does not hold, the launching op is found by time instead:
    the innermost CPU op on the launching thread that encloses the launch call.
    """
    ops = dev.ops
    rows = np.full(len(ops), NONE, dtype=np.int64)
    known = cpu.external_id >= 0
    launched = dev.launch_ts != NO_LAUNCH
    if known.any():
        ext = cpu.external_id[known]
        order = np.argsort(ext, kind="stable")
        ext, where = ext[order], np.flatnonzero(known)[order]
        pos = np.clip(np.searchsorted(ext, ops.external_id), 0, ext.size - 1)
        hit = (ops.external_id >= 0) & (ext[pos] == ops.external_id)
        op = where[pos]
        encloses = (
            (cpu.thread[op] == dev.launch_thread)
            & (cpu.ts[op] <= dev.launch_ts)
            & (dev.launch_ts <= cpu.end[op])
        )
        hit &= ~launched | encloses
        rows[hit] = op[hit]
    missing = np.flatnonzero((rows == NONE) & launched)
    if missing.size and len(cpu):
        rows[missing] = enclosing(cpu, dev.launch_thread[missing], dev.launch_ts[missing])
    return rows, int((rows[missing] != NONE).sum()) if missing.size else 0


def effective_dtype(dtype: str, kernel_name: str, spec: DeviceSpec | None) -> str:
    """The dtype whose peak applies: an fp32 matmul on a tensor-core kernel runs as TF32."""
    if dtype == "fp32" and spec is not None and spec.tensor_cores:
        lowered = kernel_name.lower()
        if any(h in lowered for h in _TENSOR_CORE_HINTS) and spec.peak("tf32") is not None:
            return "tf32"
    return dtype


class Placement(msgspec.Struct, frozen=True):
    """Per device op: its place on the roofline (`bound` 0 unknown, 1 compute, 2 bandwidth;
    `pct` of roof, NaN where unknown), with the costed op rows behind it."""

    rows: list[OpRoofRow]
    bound: npt.NDArray[np.int8]
    pct: npt.NDArray[np.float64]
    fp32_no_tc_s: float
    fp32_no_tc: npt.NDArray[np.bool_]
    """Per device op: an fp32 matmul on a device with tensor cores that does not use them."""
    costed: npt.NDArray[np.bool_]
    """Per device op: placed by a cost model (its FLOPs and bytes)."""
    by_counters: npt.NDArray[np.bool_]
    """Per device op: its estimated bound (or its unknown one) replaced by the counters'."""
    latency: npt.NDArray[np.bool_]
    """Per device op: latency-bound by counters (`bound` 0: neither compute nor bandwidth)."""
    replaced: list[str]
    """The kernels the counters re-placed, one line each, costliest first."""


def roofline(scope: Scope, costed: Costed, placed: Placement | None = None) -> Roofline:
    """Where the busy time sits on the roofline, over the device ops in the steady-state
    steps (`placed`: `place(scope, costed)`, when the caller already has it)."""
    dev, inside = scope.gpu, scope.inside
    ops = dev.ops
    placed = placed or place(scope, costed)
    dur = ops.dur.astype(np.float64) * inside
    is_kernel = ops.kind == Kind.KERNEL
    busy = float(dur[is_kernel].sum())
    return _summary(
        scope.spec,
        placed.rows,
        busy * NS,
        dur * is_kernel * NS,
        placed.bound,
        placed.pct,
        # A matmul the counters call memory-bound streams its operands: the third question's,
        # not the fourth's.
        matmul=_MATMUL[dev.cls] & ~(placed.by_counters & (placed.bound == 2)),
        costed=placed.costed,
        fp32_no_tc_s=placed.fp32_no_tc_s,
        steps=scope.count,
        latency=placed.latency,
        replaced=placed.replaced,
        streaming=_MATMUL[dev.cls],
    )


def place(scope: Scope, costed: Costed) -> Placement:
    """Each device op's bound and % of roof: its costed op group's over the steady-state
    steps, else its class's (or its name's)."""
    dev, inside, spec = scope.gpu, scope.inside, scope.spec
    ops = dev.ops
    dur = ops.dur.astype(np.float64) * inside
    is_kernel = ops.kind == Kind.KERNEL
    groups = costed.group
    rows: list[OpRoofRow] = []
    row_group: list[int] = []
    kernel_bound = np.zeros(len(ops), dtype=np.int8)  # 0 unknown, 1 compute, 2 bandwidth
    pct = np.full(len(ops), np.nan)
    fp32_no_tc = 0.0
    fp32_rows = np.zeros(len(ops), dtype=bool)
    sel = inside & is_kernel & (groups >= 0)
    if costed.costs:
        # Union of each group's kernel intervals: groups shifted apart on one time axis.
        g = groups[sel]
        base = int(ops.ts.min())
        span = int(ops.end.max()) - base + 1
        shift = g * span - base  # group g's times land in [g * span, (g + 1) * span)
        cov = Coverage.of(ops.ts[sel] + shift, ops.end[sel] + shift)
        merged_group = (cov.starts // span).astype(np.int64)
        union = np.bincount(
            merged_group, weights=(cov.ends - cov.starts), minlength=len(costed.costs)
        )
        calls = _calls_per_group(costed.launcher, sel, groups)
        for gi, cost in enumerate(costed.costs):
            t = float(union[gi]) * NS
            if t <= 0:
                continue
            in_group = sel & (groups == gi)
            dtype = costed.dtype[gi]
            n_calls = int(calls[gi])
            flops = cost.flops * n_calls
            nbytes = cost.bytes * n_calls
            by_class = np.bincount(dev.cls[in_group], weights=dur[in_group], minlength=len(CLASSES))
            row = _roof_row(
                costed.names[gi],
                costed.shapes[gi],
                dtype,
                n_calls,
                t,
                flops,
                nbytes,
                spec,
                CLASSES[int(np.argmax(by_class))].value,
                kernels=_kernels_of(scope, in_group, dur),
            )
            rows.append(row)
            row_group.append(gi)
            b = 1 if row.bound == "compute" else 2 if row.bound == "bandwidth" else 0
            kernel_bound[in_group] = b
            if row.pct_of_roof is not None:
                pct[in_group] = row.pct_of_roof
            if (
                cost.model in _MATMUL_MODELS
                and cost.dtype == "fp32"
                and dtype == "fp32"
                and spec is not None
                and spec.tensor_cores
            ):
                fp32_no_tc += float(dur[in_group].sum()) * NS
                fp32_rows |= in_group
    # Kernels with no cost: the bound of their class, or their name's.
    unknown = is_kernel & (kernel_bound == 0)
    kernel_bound[unknown] = _class_bounds(scope.trace, dev, scope.thresholds.skinny_tile)[unknown]
    costed_ops = np.isfinite(pct)
    by_counters = np.zeros(len(ops), dtype=bool)
    latency = np.zeros(len(ops), dtype=bool)
    replaced: list[str] = []
    if scope.counters is not None:
        # The counters are the ground truth: where they decide a kernel's bound, it is theirs.
        counted = scope.counters.bound
        by_counters = is_kernel & (counted > 0) & (counted != kernel_bound)
        latency = is_kernel & (counted == _LATENCY)
        replaced = _replaced(scope, by_counters, kernel_bound, counted, dur)
        kernel_bound[by_counters] = np.where(counted == _LATENCY, 0, counted)[by_counters]
        pct[by_counters] = scope.counters.pct[by_counters]
        for i, gi in enumerate(row_group):
            in_group = sel & (groups == gi)
            moved = float(dur[in_group & by_counters].sum())
            if moved > 0.5 * float(dur[in_group].sum()):
                code = np.bincount(counted[in_group & by_counters], minlength=4).argmax()
                rows[i] = msgspec.structs.replace(
                    rows[i],
                    bound=COUNTED_BOUND[int(code)],
                    pct_of_roof=_weighted(pct, dur, in_group & by_counters),
                    bound_basis="counters",
                )
    return Placement(
        rows, kernel_bound, pct, fp32_no_tc, fp32_rows, costed_ops, by_counters, latency, replaced
    )


_LATENCY = 3
"""`CounterPlacement.bound`'s code for latency-bound."""
COUNTED_BOUND = {1: "compute", 2: "bandwidth", 3: "latency"}
"""A `CounterPlacement.bound` code in the roofline's words."""
_BOUND_WORD = {0: "unknown", 1: "compute", 2: "bandwidth"}


def _replaced(
    scope: Scope,
    moved: npt.NDArray[np.bool_],
    estimate: npt.NDArray[np.int8],
    counted: npt.NDArray[np.int8],
    dur: npt.NDArray[np.float64],
) -> list[str]:
    """One line per kernel name the counters re-placed: the estimate, the counted bound and
    the share of the steady-state kernel time it moved (costliest first)."""
    ops = scope.gpu.ops
    busy = float(dur[ops.kind == Kind.KERNEL].sum()) or 1.0
    moved_time: dict[tuple[int, int, int], float] = {}
    for r in np.flatnonzero(moved & (dur > 0)).tolist():
        key = (int(ops.name[r]), int(estimate[r]), int(counted[r]))
        moved_time[key] = moved_time.get(key, 0.0) + float(dur[r])
    lines = []
    for (name, was, now), t in sorted(moved_time.items(), key=lambda kv: -kv[1]):
        lines.append(
            f"{short_kernel(scope.trace.strings[name])}: estimate {_BOUND_WORD[was]}, counters "
            f"{COUNTED_BOUND[now]} ({t / busy:.1%} of kernel time)"
        )
    return lines


def _summary(
    spec: DeviceSpec | None,
    rows: list[OpRoofRow],
    busy_s: float,
    time_s: npt.NDArray[np.float64],
    bound: npt.NDArray[np.int8],
    pct: npt.NDArray[np.float64],
    *,
    matmul: npt.NDArray[np.bool_],
    costed: npt.NDArray[np.bool_],
    fp32_no_tc_s: float,
    steps: int,
    latency: npt.NDArray[np.bool_] | None = None,
    replaced: list[str] | None = None,
    streaming: npt.NDArray[np.bool_] | None = None,
) -> Roofline:
    """The roofline over the device's units of work (kernels, or a CPU's ops): `time_s`,
    `bound` (0 unknown, 1 compute, 2 bandwidth) and `pct` (of its roof, NaN when unknown)
    per unit; `busy_s` the device's busy time over the steady-state steps."""
    busy = busy_s or 1.0
    every_matmul = matmul if streaming is None else streaming
    slow = latency if latency is not None else np.zeros(len(time_s), dtype=bool)
    compute_t = float(time_s[bound == 1].sum())
    bandwidth_t = float(time_s[bound == 2].sum())
    costed_t = float(time_s[costed].sum())
    # Ties broken by signature: the order must not depend on how the strings were numbered.
    rows.sort(key=lambda r: (-r.time_s, r.name, r.shapes, r.dtype))
    l2 = spec.l2_roof() if spec else None
    fitting = [r for r in rows if r.fits_l2]
    fit_share = min(1.0, sum(r.time_s for r in fitting) / busy)
    return Roofline(
        device=spec.name if spec else None,
        ridge=_ridges(spec),
        compute_bound_share=compute_t / busy,
        bandwidth_bound_share=bandwidth_t / busy,
        unknown_bound_share=max(0.0, 1.0 - (compute_t + bandwidth_t) / busy),
        costed_share=min(1.0, costed_t / busy),
        pct_of_roof_compute=_weighted(pct, time_s, bound == 1),
        pct_of_roof_bandwidth=_weighted(pct, time_s, bound == 2),
        pct_of_roof_matmul=_weighted(pct, time_s, matmul),
        matmul_bandwidth_share=float(time_s[every_matmul & (bound == 2)].sum()) / busy,
        matmul_unknown_share=float(time_s[every_matmul & (bound == 0) & ~slow].sum()) / busy,
        latency_bound_share=float(time_s[slow].sum()) / busy,
        by_counters=replaced or [],
        l2_bandwidth=l2[0] if l2 else None,
        l2_bandwidth_estimate=bool(l2 and l2[1]),
        l2_fit_share=fit_share,
        l2_note=_l2_note(spec, fitting, fit_share),
        fp32_matmul_without_tensor_cores_s=fp32_no_tc_s / max(steps, 1),
        fp32_matmul_without_tensor_cores_share=fp32_no_tc_s / busy,
        ops=rows[:TOP_OPS],
        more_ops=rows[TOP_OPS : TOP_OPS + MORE_OPS],
    )


OP_KERNELS = 5
"""The kernels an op's roofline row names (`OpRoofRow.kernels`), the longest first."""


def _kernels_of(
    scope: Scope, rows: npt.NDArray[np.bool_], dur: npt.NDArray[np.float64]
) -> list[str]:
    """The names of the kernels at `rows`, by their time there, the longest first."""
    names, index = np.unique(scope.gpu.ops.name[rows], return_inverse=True)
    time = np.bincount(index, weights=dur[rows], minlength=names.size)
    order = np.argsort(-time, kind="stable")[:OP_KERNELS]
    return [scope.trace.strings[int(names[i])] for i in order.tolist()]


def _calls_per_group(
    launcher: npt.NDArray[np.int64], sel: npt.NDArray[np.bool_], groups: npt.NDArray[np.int64]
) -> npt.NDArray[np.int64]:
    """Op calls per group: distinct launching ops among the group's kernels."""
    calls = launcher[sel]
    g = groups[sel]
    if g.size == 0:
        return np.zeros(0, dtype=np.int64)
    # Distinct (group, call) pairs: sorted in place and deduplicated (a hash unique is
    # several times slower on these many distinct keys).
    pairs = g * (int(calls.max()) + 1) + calls
    pairs.sort()
    pairs = pairs[np.r_[True, pairs[1:] != pairs[:-1]]]
    return np.bincount(pairs // (int(calls.max()) + 1), minlength=int(groups.max()) + 1)


def _roof_row(
    name: str,
    shapes: str,
    dtype: str,
    calls: int,
    time_s: float,
    flops: float,
    nbytes: float,
    spec: DeviceSpec | None,
    cls: str | None = None,
    kernels: list[str] | None = None,
) -> OpRoofRow:
    ai = flops / nbytes if nbytes > 0 else None
    l2 = spec.l2_roof() if spec else None
    fits = (
        None
        if l2 is None or spec is None or spec.l2_bytes is None
        else calls > 0 and 0 < nbytes / calls <= spec.l2_bytes
    )
    peak = spec.peak(dtype) if spec else None
    bandwidth = spec.mem_bandwidth if spec else None
    ridge = spec.ridge(dtype) if spec else None
    bound = None
    pct = None
    if ai is not None and ridge is not None:
        bound = "compute" if ai >= ridge else "bandwidth"
    elif flops == 0 and nbytes > 0:
        bound = "bandwidth"
    if peak and bandwidth:
        floor = max(flops / peak, nbytes / bandwidth)
        pct = min(1.0, floor / time_s) if time_s > 0 else None
    elif bandwidth and flops == 0:
        pct = min(1.0, (nbytes / bandwidth) / time_s) if time_s > 0 else None
    return OpRoofRow(
        name=name,
        shapes=shapes,
        dtype=dtype,
        calls=calls,
        time_s=time_s,
        flops=flops,
        bytes=nbytes,
        ai=ai,
        achieved_flops=flops / time_s,
        achieved_bandwidth=nbytes / time_s,
        ridge=ridge,
        bound=bound,
        pct_of_roof=pct,
        cls=cls,
        kernels=kernels or [],
        fits_l2=fits,
        pct_of_l2_roof=_l2_pct(flops, nbytes, time_s, peak, l2[0]) if fits and l2 else None,
    )


def _l2_note(spec: DeviceSpec | None, fitting: list[OpRoofRow], share: float) -> str | None:
    """The L2 roof in words: which share of the busy time moves working sets that fit in L2,
    and how near they run to the L2 roof and to memory's."""
    l2 = spec.l2_roof() if spec else None
    if spec is None or l2 is None or spec.l2_bytes is None or not fitting:
        return None
    bw, estimate = l2
    basis = "estimate: twice the memory bandwidth" if estimate else "derived from the whitepaper"
    time = sum(r.time_s for r in fitting)
    at_l2 = sum(r.time_s * (r.pct_of_l2_roof or 0.0) for r in fitting) / time
    at_mem = sum(r.time_s * (r.pct_of_roof or 0.0) for r in fitting) / time
    return (
        f"{len(fitting)} op signature(s), {share:.1%} of busy time, move a working set (one "
        f"call's bytes) that fits in the {spec.l2_bytes / 2**20:g} MiB L2: against the L2 roof "
        f"({bw / 1e12:.2f} TB/s, {basis}) they run at {at_l2:.0%}, against memory's at "
        f"{at_mem:.0%} (time-weighted); the L2 roof holds while their operands stay resident "
        "between kernels"
    )


def _l2_pct(
    flops: float, nbytes: float, time_s: float, peak: float | None, l2_bandwidth: float
) -> float | None:
    """Time against the L2 roof: the floor of peak FLOP/s and bytes at L2's bandwidth."""
    if time_s <= 0:
        return None
    floor = max(flops / peak if peak else 0.0, nbytes / l2_bandwidth)
    return min(1.0, floor / time_s)


def _weighted(
    values: npt.NDArray[np.float64], weights: npt.NDArray[np.float64], mask: npt.NDArray[np.bool_]
) -> float | None:
    ok = mask & np.isfinite(values) & (weights > 0)
    total = float(weights[ok].sum())
    return float((values[ok] * weights[ok]).sum() / total) if total > 0 else None


def _ridges(spec: DeviceSpec | None) -> dict[str, float]:
    if spec is None:
        return {}
    out = {}
    for dtype in spec.peak_flops:
        ridge = spec.ridge(dtype)
        if ridge is not None:
            out[dtype] = ridge
    return out


KernelCost = tuple[float, float, float, str]
"""FLOPs, bytes, time (ns) and dtype of a kernel name's costed instances."""


def kernel_costs(scope: Scope, costed: Costed) -> dict[int, KernelCost]:
    """Per kernel name code, over its costed instances in `inside`; the dtype is that of the
    op group that gives it most FLOPs."""
    dev = scope.gpu
    ok = scope.inside & np.isfinite(costed.flops)
    names = dev.ops.name[ok]
    if names.size == 0:
        return {}
    uniq, inverse = np.unique(names, return_inverse=True)
    f = np.bincount(inverse, weights=costed.flops[ok])
    b = np.bincount(inverse, weights=costed.bytes[ok])
    t = np.bincount(inverse, weights=dev.ops.dur[ok].astype(np.float64))
    # Each name's first instance of its most FLOPs (a stable sort by name, then by FLOPs
    # down, keeps the earliest of equals first): its op group gives the dtype.
    order = np.lexsort((-costed.flops[ok], inverse))
    by_name = inverse[order]
    first = order[np.r_[True, by_name[1:] != by_name[:-1]]]
    top = costed.group[ok][first]
    return {
        int(c): (float(f[i]), float(b[i]), float(t[i]), costed.dtype[int(top[i])])
        for i, c in enumerate(uniq.tolist())
    }


def mfu(scope: Scope, costed: Costed) -> Mfu:
    """MFU = model FLOPs per step / step time / peak of the dtype in use."""
    dev = scope.gpu
    matmul = scope.inside & _MATMUL[dev.cls] & np.isfinite(costed.flops)
    return _mfu(
        scope,
        float(costed.flops[matmul].sum()),
        _main_dtype(costed, matmul),
        counted_basis="FLOPs of the matmul-class ops counted from the trace (recomputation "
        "included, so closer to hardware FLOPs utilisation)",
    )


def _mfu(
    scope: Scope, counted: float, dtype: str | None, *, counted_basis: str, cite_peak: bool = False
) -> Mfu:
    """MFU from the matmul FLOPs counted over the steady-state steps (`counted`, in `dtype`),
    unless the user gave the model's; `cite_peak`: say where the peak comes from."""
    spec, step_time_s = scope.spec, scope.step_time_s
    given = scope.model.per_step()
    if given is not None:
        flops, basis = given
    elif counted > 0:
        flops, basis = counted / max(scope.count, 1), counted_basis
    else:
        return Mfu(value=None, basis="unknown: no matmul op with recorded shapes in the trace")
    if spec is not None and cite_peak:
        basis += f"; peak from {spec.source}"
    peak = spec.peak(dtype) if spec and dtype else None
    if peak is None or step_time_s <= 0:
        why = "the device is unknown" if spec is None else f"no {dtype} peak for the device"
        return Mfu(
            value=None,
            basis=f"{basis}; not computed: {why}",
            flops_per_step=flops,
            dtype=dtype,
        )
    achieved = flops / step_time_s
    return Mfu(
        value=achieved / peak,
        basis=basis,
        flops_per_step=flops,
        achieved_flops=achieved,
        peak_flops=peak,
        dtype=dtype,
    )


def _main_dtype(costed: Costed, rows: npt.NDArray[np.bool_]) -> str | None:
    """The dtype carrying most of the matmul FLOPs."""
    if not rows.any():
        return None
    by_dtype: dict[str, float] = {}
    for g, f in zip(costed.group[rows].tolist(), costed.flops[rows].tolist(), strict=True):
        d = costed.dtype[g]
        by_dtype[d] = by_dtype.get(d, 0.0) + f
    return max(by_dtype, key=lambda d: by_dtype[d])


def kernel_roof(
    row: KernelRow,
    cls: KernelClass,
    cost: KernelCost | None,
    spec: DeviceSpec | None,
    skinny_tile: int,
) -> KernelRow:
    """`row` with its roofline fields: from its ops' cost when known (FLOPs, bytes and time of
    its costed instances), else only the bound of its class (`skinny_tile`:
    `Thresholds.skinny_tile`)."""
    if cost is None or cost[2] <= 0:
        bound = class_bound(cls, row.name, skinny_tile)
        return msgspec.structs.replace(row, bound=bound, bound_basis="class" if bound else None)
    flops, nbytes, time_ns, dtype = cost
    roof = _roof_row(row.name, "", dtype, 1, time_ns * NS, flops, nbytes, spec)
    return msgspec.structs.replace(
        row,
        flops=flops,
        bytes=nbytes,
        ai=roof.ai,
        bound=roof.bound or class_bound(cls, row.name, skinny_tile),
        pct_of_roof=roof.pct_of_roof,
        bound_basis="cost model" if roof.bound else "class",
    )


def cpu_roofline(scope: Scope, ops: Events) -> tuple[Roofline, Mfu]:
    """The roofline of a CPU-only trace: the CPU is the device and its ops are its units of
    work. `ops`: the main thread's CPU ops, sorted by start. Each outermost costed op (a
    costed op inside another, mm inside linear, counts once) is measured by its CPU time over
    the steady-state steps; the busy time is that of the outermost ops."""
    trace, spec = scope.trace, scope.spec
    ops = ops.take(np.flatnonzero(in_windows(ops.ts, scope.window_start, scope.window_end)))
    busy_ns = float(ops.dur[outermost(ops)].sum())
    shaped = np.flatnonzero(ops.input_dims > 0)
    signature = np.stack(
        [ops.name, ops.input_dims, ops.input_type, ops.concrete_inputs], axis=1
    ).astype(np.int64)
    costs: dict[tuple[int, ...], Cost | None] = {}
    row_cost: dict[int, Cost] = {}
    for i in shaped.tolist():
        key = tuple(signature[i].tolist())
        if key not in costs:
            costs[key] = op_cost(trace.strings[key[0]], trace.op_args(key[1], key[2], key[3]))
        cost = costs[key]
        if cost is not None:
            row_cost[i] = cost
    costed = np.array(sorted(row_cost), dtype=np.int64)
    if costed.size:
        costed = costed[outermost(ops.take(costed))]
    groups: dict[tuple[int, ...], list[int]] = {}
    for i in costed.tolist():
        groups.setdefault(tuple(signature[i].tolist()), []).append(i)
    rows = []
    matmul: list[bool] = []
    matmul_flops = 0.0
    dtypes: dict[str, float] = {}
    for key, members in groups.items():
        cost = row_cost[members[0]]
        t = float(ops.dur[members].sum()) * NS
        if t <= 0:
            continue
        row = _roof_row(
            trace.strings[key[0]],
            trace.shapes_text(key[1]),
            cost.dtype,
            len(members),
            t,
            cost.flops * len(members),
            cost.bytes * len(members),
            spec,
            classify_op(trace.strings[key[0]]).value,
        )
        rows.append(row)
        matmul.append(cost.model in _MATMUL_MODELS)
        if matmul[-1]:
            matmul_flops += row.flops
            dtypes[cost.dtype] = dtypes.get(cost.dtype, 0.0) + row.flops
    bound = np.array(
        [1 if r.bound == "compute" else 2 if r.bound == "bandwidth" else 0 for r in rows],
        dtype=np.int8,
    )
    pct = np.array([np.nan if r.pct_of_roof is None else r.pct_of_roof for r in rows])
    roof = _summary(
        spec,
        rows,
        busy_ns * NS,
        np.array([r.time_s for r in rows]),
        bound,
        pct,
        matmul=np.array(matmul, dtype=bool),
        costed=np.ones(len(rows), dtype=bool),
        fp32_no_tc_s=0.0,
        steps=scope.count,
    )
    dtype = max(dtypes, key=lambda d: dtypes[d]) if dtypes else None
    return roof, _mfu(
        scope,
        matmul_flops,
        dtype,
        counted_basis="FLOPs of the matmul-class ops counted from the trace, on the CPU",
        cite_peak=True,
    )


def outermost(events: Spans) -> npt.NDArray[np.bool_]:
    """Events not nested in an earlier one on the same thread (input sorted by start)."""
    if len(events) == 0:
        return np.zeros(0, dtype=bool)
    reach = np.maximum.accumulate(events.end)
    top = np.ones(len(events), dtype=bool)
    top[1:] = events.ts[1:] >= reach[:-1]
    return top
