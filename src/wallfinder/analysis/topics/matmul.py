"""Matmuls and the roofline: fp32 without tensor cores, grids too small to fill the device,
and compute-bound matmuls below their roof."""

from __future__ import annotations

import re

import numpy as np
import numpy.typing as npt

from wallfinder.analysis.classify import MATMUL_CLASSES
from wallfinder.analysis.critpath import Change
from wallfinder.analysis.findings import NO_ROWS, Facts, amdahl, make_finding, ms_text
from wallfinder.analysis.gpu import CLASSES, COMM
from wallfinder.analysis.precision import lower_precisions, precision_fix
from wallfinder.analysis.rules import rule
from wallfinder.diagnosis import Finding
from wallfinder.trace import Kind
from wallfinder.units import short_kernel


def _fp32_rows(f: Facts) -> npt.NDArray[np.bool_]:
    """The steady steps' fp32 matmul kernels that skip the tensor cores."""
    if f.dev is None or f.attribution is None:
        return NO_ROWS
    rows: npt.NDArray[np.bool_] = f.inside & f.attribution.work.fp32_no_tc
    return rows


@rule(Facts, id="fp32-matmul", work=_fp32_rows)
def fp32_matmul(f: Facts) -> Finding | None:
    r = f.roofline
    if r is None or f.dev is None or f.step_s <= 0:
        return None
    share = r.fp32_matmul_without_tensor_cores_s / f.step_s
    # The advice and the bound name one dtype: the one the device's peaks say it has (no
    # TF32 advice on Volta/Turing, whose tensor cores take fp16 only).
    fix = precision_fix(f.scope.peak_flops)
    faster = f.scope.peak_flops.get(fix.dtype) if fix.dtype != "fp32" else None
    fp32 = f.scope.peak_flops.get("fp32")
    ratio = faster / fp32 if faster and fp32 else None
    # Bound: those matmuls run `ratio` times faster (the tensor-core peak over the fp32 one).
    remaining = share / ratio if ratio else 0.0
    speedup = 1.0 / max(1.0 - share + remaining, 1e-3)
    assumption = (
        f" (bound assumes they speed up {ratio:.0f}x, the device's tensor-core/fp32 peak ratio)"
        if ratio
        else ""
    )
    return make_finding(
        f,
        "fp32-matmul",
        "compute",
        "Matmuls run in fp32 without tensor cores",
        share,
        f"{ms_text(r.fp32_matmul_without_tensor_cores_s)} per step of matmul kernels use fp32 "
        f"CUDA cores{_where_fp32(f)}{assumption}",
        fix.fix,
        speedup=speedup,
    )


def _where_fp32(f: Facts) -> str:
    """Where the fp32 matmul kernels that skip the tensor cores sit."""
    a = f.attribution
    if a is None or f.dev is None:
        return ""
    return a.where(_fp32_rows(f), f.dev.ops.dur.astype(np.float64))


def _tiny_grid_rows(f: Facts) -> npt.NDArray[np.bool_]:
    """The steady steps' kernels launched with fewer blocks than the device has SMs."""
    if f.dev is None or not f.scope.sm_count:
        return NO_ROWS
    kernels, _, small = _tiny_grid_kernels(f, f.scope.sm_count)
    rows = np.zeros(len(f.dev.ops), dtype=bool)
    rows[kernels[small]] = True
    return rows


@rule(Facts, id="tiny-grids", work=_tiny_grid_rows)
def tiny_grids(f: Facts) -> Finding | None:
    """Kernels launched with fewer blocks than the device has SMs leave most of it idle."""
    if f.dev is None or not f.scope.sm_count or f.step_s <= 0:
        return None
    ops = f.dev.ops
    rows, blocks, small = _tiny_grid_kernels(f, f.scope.sm_count)
    if not small.any():
        return None
    dur = ops.dur[rows][small].astype(np.float64)
    # Bound: with enough blocks to fill the device, a kernel would take dur × blocks / SMs.
    saved = float((dur * (1.0 - blocks[small] / f.scope.sm_count)).sum()) * 1e-9
    steps = max(f.steps.count, 1)
    # Kernels on several streams overlap: filling the device removes at most the time it
    # computes.
    share = min(saved / steps / f.step_s, f.breakdown.compute)
    names = ops.name[rows][small]
    uniq, counts = np.unique(names, return_counts=True)
    # The most frequent, by their short names (instantiations of one template read alike).
    short = [short_kernel(f.trace.strings[int(c)]) for c in uniq[np.argsort(-counts)].tolist()]
    top = list(dict.fromkeys(short))[:2]
    return make_finding(
        f,
        "tiny-grids",
        "compute",
        "Kernels too small to fill the GPU",
        share,
        f"{f.per_step(int(small.sum())):.0f} kernels per step "
        f"({ms_text(float(dur.sum()) * 1e-9 / steps)}) launch fewer blocks than the device's "
        f"{f.scope.sm_count} SMs, e.g. "
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


def _below_roof_rows(f: Facts) -> npt.NDArray[np.bool_]:
    """The steady steps' compute-bound matmul-class kernels below the near-peak share of their
    roof."""
    a, dev = f.attribution, f.dev
    if a is None or dev is None:
        return NO_ROWS
    w = a.work
    matmul = np.isin(dev.cls, [CLASSES.index(c) for c in MATMUL_CLASSES])
    with np.errstate(invalid="ignore"):
        below: npt.NDArray[np.bool_] = (
            f.inside & matmul & (w.bound == 1) & (w.pct < f.thresholds.near_peak)
        )
    return below


@rule(Facts, id="matmul-below-roof", replay=Change(matmul=1.0), work=_below_roof_rows)
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
    return make_finding(
        f,
        "matmul-below-roof",
        "compute",
        "Matmuls run well below their roof",
        share,
        f"{listed} (the bound assumes each reached its roof)" + _where_below_roof(f),
        "make shapes tensor-core friendly (dimensions multiples of 8/16, avoid tiny or skinny "
        "GEMMs; batch small ones), use the lowest precision that trains "
        f"({lower_precisions(f.scope.peak_flops)}), try torch.compile(mode='max-autotune') for "
        "better kernels",
        speedup=amdahl(share),
    )


def _where_below_roof(f: Facts) -> str:
    """Where the compute-bound matmul kernels below their roof sit."""
    a = f.attribution
    if a is None or f.dev is None:
        return ""
    return a.where(_below_roof_rows(f), f.dev.ops.dur.astype(np.float64))
