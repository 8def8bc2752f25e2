"""The roofline calculator: AI, ridge, bound, attainable rate and time floor for an op, a
shape and a dtype on a device, and what fusing a chain of pointwise ops saves.

Ops are costed by the same cost models as traces, fed the shapes and dtypes the profiler
would record, so the calculator and the report can never disagree about an op's FLOPs or bytes.
"""

from __future__ import annotations

import math

from wallfinder.cost import ELEMENT_BYTES, Cost, OpArgs, op_cost
from wallfinder.diagnosis import Calculation
from wallfinder.dtypes import PEAK_DTYPES, storage_dtype
from wallfinder.errors import WallfinderError
from wallfinder.hardware import DeviceSpec

_MATMUL_OPS = {"matmul": "aten::mm", "mm": "aten::mm", "gemm": "aten::mm", "linear": "aten::mm"}


def _op_name(op: str) -> str:
    return op if "::" in op else f"aten::{op}"


def _same(shape: tuple[int, ...], dtype: str, n: int) -> OpArgs:
    """`n` tensors of one shape and dtype: a pointwise op's arguments."""
    return OpArgs.of([shape] * n, [storage_dtype(dtype)] * n)


def _check_sizes(values: tuple[int, ...], what: str) -> None:
    if not values or any(v <= 0 for v in values):
        raise WallfinderError(f"{what} must be positive integers, got {list(values)}")


def cost_of(
    op: str,
    dtype: str,
    *,
    shape: tuple[int, ...] = (),
    mnk: tuple[int, int, int] | None = None,
    flops_per_element: float | None = None,
) -> Cost:
    """The cost of one op: a matmul from (M, N, K), a pointwise op from its shape (with an
    explicit FLOPs-per-element when the op has no model)."""
    if dtype not in PEAK_DTYPES:
        raise WallfinderError(f"unknown dtype {dtype!r} (one of {', '.join(PEAK_DTYPES)})")
    if mnk is not None or op in _MATMUL_OPS:
        if mnk is None:
            raise WallfinderError(f"--op {op} needs --mnk M,N,K")
        _check_sizes(mnk, "--mnk")
        m, n, k = mnk
        tensors = storage_dtype(dtype)
        cost = op_cost("aten::mm", OpArgs.of([(m, k), (k, n)], [tensors, tensors]))
    else:
        _check_sizes(shape, "--shape")
        if flops_per_element is not None:
            if not math.isfinite(flops_per_element) or flops_per_element < 0:
                raise WallfinderError("--flops-per-element must be a non-negative number")
            numel = math.prod(shape)
            size = _element_size(dtype)
            cost = Cost(flops_per_element * numel, 2.0 * numel * size, dtype, "elementwise")
        else:
            cost = op_cost(_op_name(op), _same(shape, dtype, 1))
            if cost is None:
                cost = op_cost(_op_name(op), _same(shape, dtype, 2))
    if cost is None:
        raise WallfinderError(
            f"no cost model for {op!r} on this shape: give --flops-per-element, or --flops "
            "and --bytes"
        )
    return cost


def _element_size(dtype: str) -> int:
    return ELEMENT_BYTES[storage_dtype(dtype)]


def calculate(
    spec: DeviceSpec,
    dtype: str,
    flops: float,
    nbytes: float,
    *,
    what: str,
    fused_bytes: float | None = None,
) -> Calculation:
    """The roofline of `flops` and `nbytes` on `spec` for `dtype`."""
    if not (math.isfinite(flops) and math.isfinite(nbytes)) or flops < 0 or nbytes < 0:
        raise WallfinderError("FLOPs and bytes must be non-negative numbers")
    if flops == 0 and nbytes == 0:
        raise WallfinderError("nothing to compute: FLOPs and bytes are both 0")
    peak = spec.peak(dtype)
    if peak is None:
        have = ", ".join(spec.peak_flops)
        raise WallfinderError(f"{spec.name} has no {dtype} peak (it has: {have})")
    bandwidth = spec.mem_bandwidth
    ai = flops / nbytes if nbytes > 0 else math.inf
    ridge = peak / bandwidth
    attainable = min(peak, ai * bandwidth)
    floor = max(flops / peak, nbytes / bandwidth)
    saved = None
    if fused_bytes is not None:
        fused_floor = max(flops / peak, fused_bytes / bandwidth)
        saved = floor - fused_floor
    return Calculation(
        what=what,
        device=spec.name,
        source=spec.source + (f"; {spec.matched}" if spec.matched else ""),
        dtype=dtype,
        flops=flops,
        bytes=nbytes,
        ai=ai if math.isfinite(ai) else None,
        ridge=ridge,
        bound="compute" if ai >= ridge else "bandwidth",
        peak_flops=peak,
        mem_bandwidth=bandwidth,
        attainable_flops=attainable,
        time_floor_s=floor,
        utilisation_of_peak=attainable / peak,
        fused_bytes=fused_bytes,
        fused_time_floor_s=None if saved is None else floor - saved,
        time_saved_s=saved,
    )


def fusion(spec: DeviceSpec, dtype: str, ops: list[str], shape: tuple[int, ...]) -> Calculation:
    """A chain of pointwise ops on one tensor shape, unfused (each op reads and writes its
    tensors) against fused (the chain's inputs read once, its output written once). Each op
    is costed as the profiler would record it with one tensor input: a binary op such as
    `mul` takes a scalar second operand."""
    if len(ops) < 2:
        raise WallfinderError("--fuse needs at least two ops, e.g. --fuse gelu,mul")
    costs = [cost_of(op, dtype, shape=shape) for op in ops]
    numel = math.prod(shape)
    size = _element_size(dtype)
    # Fused, a binary op in the chain still reads its other operand once.
    extra_inputs = sum(1 for c in costs if c.bytes > 2.0 * numel * size * 1.01)
    fused = (2 + extra_inputs) * numel * size
    return calculate(
        spec,
        dtype,
        sum(c.flops for c in costs),
        sum(c.bytes for c in costs),
        what=" → ".join(ops) + f" on {list(shape)}",
        fused_bytes=float(fused),
    )
