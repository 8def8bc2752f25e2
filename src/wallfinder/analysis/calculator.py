"""The roofline calculator: AI, ridge, bound, attainable rate and time floor for an op, a
shape and a dtype on a device, and what fusing a chain of ops saves.

Ops are costed by the same cost models as traces, fed the arguments the profiler would record
(`layer_norm` with its weight and bias, `dropout` in training, `bias_add` with a bias of the
last dimension), so the calculator and the report can never disagree about an op's FLOPs or
bytes.

A chain (`fusion`) is a sequence of ops, each taking the previous one's output as its first
input: unfused, each op is its own kernel, writes its output to memory and the next reads it
back; fused, one kernel keeps the intermediates on chip and moves only the chain's inputs, its
output and what an op must keep (dropout's mask). The difference, two passes over each
intermediate, is the chain's extra traffic. A matmul may start a chain: its output is the
chain's tensor (`shape`), so M is the product of the leading dimensions and N the last; K is
`mnk`'s, else taken equal to N (a square projection, hidden → hidden) and said so: the extra
bytes do not depend on K, only the matmul's own cost does. A single matmul (`cost_of`) needs
its K, because every figure does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import msgspec

from wallfinder.cost import ELEMENT_BYTES, Cost, OpArgs, op_cost
from wallfinder.diagnosis import CalculatedOp, Calculation
from wallfinder.dtypes import PEAK_DTYPES, dtype_of_name, storage_dtype
from wallfinder.errors import WallfinderError
from wallfinder.hardware import DeviceSpec

_MATMUL_OPS = frozenset(["matmul", "mm", "gemm", "linear"])
_RESHAPING = frozenset(["glu"])  # ops whose output is not their input's shape
_CASTS = ("to", "cast")
_SCALAR_OPERAND = frozenset(
    ["add", "sub", "rsub", "mul", "div", "true_divide", "pow", "maximum", "minimum", "where"]
)


def _op_name(op: str) -> str:
    return op if "::" in op else f"aten::{op}"


def _same(shape: tuple[int, ...], dtype: str, n: int) -> OpArgs:
    """`n` tensors of one shape and dtype: a pointwise op's arguments."""
    return OpArgs.of([shape] * n, [storage_dtype(dtype)] * n)


def _check_sizes(values: tuple[int, ...], what: str) -> None:
    if not values or any(v <= 0 for v in values):
        raise WallfinderError(f"{what} must be positive integers, got {list(values)}")


def _check_dtype(dtype: str) -> None:
    if dtype not in PEAK_DTYPES:
        raise WallfinderError(f"unknown dtype {dtype!r} (one of {', '.join(PEAK_DTYPES)})")


class _Call(msgspec.Struct, frozen=True):
    """An op as the profiler would record it: its aten name, arguments, the dtype of its
    output and its tensors in words."""

    name: str
    args: OpArgs
    out_dtype: str
    what: str


def _tensors(shapes: Sequence[Sequence[int]], dtypes: Sequence[str]) -> str:
    return ", ".join(f"{list(s)} {d}" for s, d in zip(shapes, dtypes, strict=True) if d)


def _record(
    name: str,
    shapes: list[list[int]],
    dtypes: list[str],
    out: str,
    concrete: list[str | None] | None = None,
) -> _Call:
    return _Call(name, OpArgs.of(shapes, dtypes, concrete), out, _tensors(shapes, dtypes))


def _channels(op: str, shape: tuple[int, ...]) -> int:
    if len(shape) < 2:
        raise WallfinderError(f"{op} normalises over channels: give --shape N,C,... (2+ sizes)")
    return shape[1]


def _call(op: str, shape: tuple[int, ...], dtype: str) -> _Call | None:
    """`op` on one tensor of `shape` and `dtype` (a storage dtype), with the other arguments
    its layer passes; None for an op this table does not know (costed as a pointwise op)."""
    x, n = list(shape), shape[-1]
    if op in ("layer_norm", "rms_norm"):
        # layer_norm(input, normalized_shape, weight, bias, eps, cudnn_enable);
        # rms_norm(input, normalized_shape, weight, eps): over the last dimension.
        if op == "rms_norm":
            return _record("aten::rms_norm", [x, [], [n], []], [dtype, "", dtype, ""], dtype)
        shapes = [x, [], [n], [n], [], []]
        return _record("aten::layer_norm", shapes, [dtype, "", dtype, dtype, "", ""], dtype)
    if op == "group_norm":
        # group_norm(input, num_groups, weight, bias, eps, cudnn_enabled)
        c = _channels(op, shape)
        return _record(
            "aten::group_norm", [x, [], [c], [c], [], []], [dtype, "", dtype, dtype, "", ""], dtype
        )
    if op in ("batch_norm", "instance_norm"):
        # batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps,
        # cudnn_enabled); instance_norm likewise: in training.
        c = _channels(op, shape)
        return _record(
            f"aten::{op}",
            [x, [c], [c], [c], [c], [], [], [], []],
            [dtype, dtype, dtype, dtype, dtype, "", "", "", ""],
            dtype,
            ["", "", "", "", "", "True", "", "", ""],
        )
    if op in ("softmax", "log_softmax"):
        return _record(f"aten::{op}", [x, [], []], [dtype, "", ""], dtype)  # (self, dim, dtype)
    if op in ("dropout", "feature_dropout"):
        # (input, p, train): in training, the only mode in which it does any work.
        return _record(f"aten::{op}", [x, [], []], [dtype, "", ""], dtype, ["", "", "True"])
    if op == "residual_add":
        return _record("aten::add", [x, x, []], [dtype, dtype, ""], dtype)  # (self, other, alpha)
    if op == "bias_add":
        return _record("aten::add", [x, [n], []], [dtype, dtype, ""], dtype)
    cast, _, target = op.partition(":")
    if cast in _CASTS:
        to = dtype_of_name(target) if target else None
        if to is None:
            raise WallfinderError(f"say the dtype to cast to, e.g. {cast}:fp32 (got {op!r})")
        # A cast is a copy into a tensor of the new dtype: copy_(self, src).
        return _record("aten::copy_", [x, x], [to, dtype], to)
    return None


def _pointwise(op: str, shape: tuple[int, ...], dtype: str) -> tuple[Cost, _Call] | None:
    """An op outside `_call`'s table, as a pointwise op on one tensor (a binary op then takes
    a scalar second operand), else on two tensors of the shape."""
    for n in (1, 2):
        args = _same(shape, dtype, n)
        cost = op_cost(_op_name(op), args)
        if cost is not None:
            what = _tensors([shape] * n, [dtype] * n)
            return cost, _Call(_op_name(op), args, cost.dtype, what)
    return None


def _costed(op: str, shape: tuple[int, ...], dtype: str) -> tuple[Cost, _Call]:
    """The cost of `op` on one tensor of `shape` and `dtype` (a storage dtype)."""
    call = _call(op, shape, dtype)
    if call is None:
        found = _pointwise(op, shape, dtype)
    else:
        cost = op_cost(call.name, call.args)
        found = None if cost is None else (cost, call)
    if found is None:
        raise WallfinderError(
            f"no cost model for {op!r} on this shape: give --flops-per-element, or --flops "
            "and --bytes"
        )
    return found


def cost_of(
    op: str,
    dtype: str,
    *,
    shape: tuple[int, ...] = (),
    mnk: tuple[int, int, int] | None = None,
    flops_per_element: float | None = None,
) -> Cost:
    """The cost of one op: a matmul from (M, N, K), another op from its shape (with an
    explicit FLOPs-per-element when the op has no model)."""
    _check_dtype(dtype)
    if mnk is not None or op in _MATMUL_OPS:
        if mnk is None:
            raise WallfinderError(
                f"--op {op} needs --mnk M,N,K: every figure of a matmul depends on its K, "
                "which its output shape does not give"
            )
        return _matmul(mnk, dtype)
    _check_sizes(shape, "--shape")
    if flops_per_element is not None:
        if not math.isfinite(flops_per_element) or flops_per_element < 0:
            raise WallfinderError("--flops-per-element must be a non-negative number")
        numel = math.prod(shape)
        size = _element_size(dtype)
        return Cost(flops_per_element * numel, 2.0 * numel * size, dtype, "elementwise")
    return _costed(op, shape, storage_dtype(dtype))[0]


def _matmul(mnk: tuple[int, int, int], dtype: str) -> Cost:
    _check_sizes(mnk, "--mnk")
    m, n, k = mnk
    tensors = storage_dtype(dtype)
    cost = op_cost("aten::mm", OpArgs.of([(m, k), (k, n)], [tensors, tensors]))
    if cost is None:
        raise WallfinderError(f"no cost for a matmul of M,N,K = {m},{n},{k}")
    return cost


def _element_size(dtype: str) -> int:
    return ELEMENT_BYTES[storage_dtype(dtype)]


def _peak(spec: DeviceSpec, dtype: str) -> float:
    peak = spec.peak(dtype)
    if peak is None:
        have = ", ".join(spec.peak_flops)
        raise WallfinderError(f"{spec.name} has no {dtype} peak (it has: {have})")
    return peak


def _floor(flops: float, nbytes: float, peak: float, bandwidth: float) -> float:
    """The least time `flops` and `nbytes` take in one kernel: the slower of the two roofs."""
    return max(flops / peak, nbytes / bandwidth)


DEFAULT_DTYPE = "bf16"
"""The dtype a calculation takes when none is named: what training runs in on the devices
people train on today (said in the result's notes, `dtype_defaulted`)."""


def dtype_defaulted(c: Calculation) -> Calculation:
    """`c`, computed in `DEFAULT_DTYPE` because no dtype was named, saying so first in its
    notes: every peak and byte count in it depends on that choice."""
    note = f"no dtype named: {c.dtype} assumed (the default; --dtype names another)"
    return msgspec.structs.replace(c, notes=[note, *c.notes])


def calculate(
    spec: DeviceSpec,
    dtype: str,
    flops: float,
    nbytes: float,
    *,
    what: str,
    fused_bytes: float | None = None,
) -> Calculation:
    """The roofline of `flops` and `nbytes` on `spec` for `dtype`, as one kernel (with
    `fused_bytes`: the same work moving fewer bytes, and the time that saves)."""
    if not (math.isfinite(flops) and math.isfinite(nbytes)) or flops < 0 or nbytes < 0:
        raise WallfinderError(
            f"FLOPs and bytes must be non-negative numbers, not {flops:g} FLOPs and "
            f"{nbytes:g} bytes"
        )
    if flops == 0 and nbytes == 0:
        raise WallfinderError("nothing to compute: FLOPs and bytes are both 0")
    peak = _peak(spec, dtype)
    bandwidth = spec.mem_bandwidth
    ai = flops / nbytes if nbytes > 0 else math.inf
    ridge = peak / bandwidth
    attainable = min(peak, ai * bandwidth)
    floor = _floor(flops, nbytes, peak, bandwidth)
    fused_floor = None if fused_bytes is None else _floor(flops, fused_bytes, peak, bandwidth)
    extra = None if fused_bytes is None else nbytes - fused_bytes
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
        fused_time_floor_s=fused_floor,
        time_saved_s=None if fused_floor is None else floor - fused_floor,
        extra_bytes=extra,
        extra_bytes_time_s=None if extra is None else extra / bandwidth,
    )


class _Link(msgspec.Struct, frozen=True):
    """One op of a chain, costed: its output tensor's bytes are the intermediate it hands on."""

    op: str
    cost: Cost
    what: str
    out_bytes: float


def _chain_shape(
    ops: list[str], shape: tuple[int, ...], mnk: tuple[int, int, int] | None
) -> tuple[tuple[int, ...], tuple[int, int, int] | None, list[str]]:
    """The chain's tensor shape, the matmul's (M, N, K) when it starts the chain, and the
    assumptions made to get them."""
    reshaping = sorted(set(ops) & _RESHAPING)
    if reshaping:
        raise WallfinderError(
            f"{', '.join(reshaping)} changes the tensor's shape: a --fuse chain keeps one shape"
        )
    matmuls = [i for i, op in enumerate(ops) if op in _MATMUL_OPS]
    if matmuls and matmuls != [0]:
        raise WallfinderError(
            "a matmul can only start a --fuse chain: its output is the chain's tensor "
            "(fusing ops into a matmul's inputs is not modelled)"
        )
    if not matmuls:
        if mnk is not None:
            raise WallfinderError("--mnk sizes a matmul, and this --fuse chain has none")
        _check_sizes(shape, "--shape")
        return shape, None, []
    if mnk is not None:
        _check_sizes(mnk, "--mnk")
        m, n, k = mnk
        if not shape:
            return (m, n), mnk, []
        _check_sizes(shape, "--shape")
        rows = math.prod(shape[:-1])
        if (rows, shape[-1]) != (m, n):
            lead = "·".join(str(s) for s in shape[:-1]) or "1"
            raise WallfinderError(
                f"--mnk {m},{n},{k} writes an output of [M, N] = [{m}, {n}], not --shape "
                f"{list(shape)}: that needs M = {lead} = {rows} and N = {shape[-1]}"
            )
        return shape, mnk, []
    if not shape:
        raise WallfinderError(
            f"--fuse {ops[0]},... needs the matmul's output shape: --shape (e.g. 32,2048,4096), "
            "or --mnk M,N,K"
        )
    _check_sizes(shape, "--shape")
    m, n = math.prod(shape[:-1]), shape[-1]
    note = (
        f"{ops[0]}: K not given, taken as N = {n} (a square projection, hidden → hidden); "
        f"the extra bytes do not depend on K, the matmul's own cost does: give --mnk {m},{n},K"
    )
    return shape, (m, n, n), [note]


def fusion(
    spec: DeviceSpec,
    dtype: str,
    ops: list[str],
    shape: tuple[int, ...],
    *,
    mnk: tuple[int, int, int] | None = None,
) -> Calculation:
    """A chain of ops on one tensor shape, unfused (each op its own kernel: it reads its
    inputs and writes its output) against fused (one kernel: the chain's inputs read once, its
    output written once, the intermediates kept on chip). Each op takes the previous one's
    output as its first input. A binary op such as `mul` takes a scalar second operand;
    `residual_add` adds a tensor of the same shape, `bias_add` one of the last dimension;
    `to:fp32` (or `cast:fp32`) casts. A matmul may start the chain: its output has `shape`, its
    M, N, K come from `mnk` or, without it, K is taken equal to N and said so in `notes`."""
    if len(ops) < 2:
        raise WallfinderError("--fuse needs at least two ops, e.g. --fuse gelu,mul")
    _check_dtype(dtype)
    shape, mm_sizes, notes = _chain_shape(ops, shape, mnk)
    peak, bandwidth = _peak(spec, dtype), spec.mem_bandwidth
    numel = math.prod(shape)
    current = storage_dtype(dtype)
    links: list[_Link] = []
    for op in ops:
        if op in _MATMUL_OPS and mm_sizes is not None:
            m, n, k = mm_sizes
            cost = _matmul(mm_sizes, dtype)
            what = f"[{m}, {k}] · [{k}, {n}] {current} → {list(shape)}"
            links.append(_Link(op, cost, what, float(numel * ELEMENT_BYTES[current])))
            continue
        cost, call = _costed(op, shape, current)
        current = call.out_dtype
        links.append(_Link(op, cost, call.what, float(numel * ELEMENT_BYTES[current])))
    notes += _chain_notes(ops)
    # Unfused, each intermediate is written by one op and read back by the next.
    extra = sum(2 * link.out_bytes for link in links[:-1])
    calculation = calculate(
        spec,
        dtype,
        sum(link.cost.flops for link in links),
        sum(link.cost.bytes for link in links),
        what=" → ".join(ops) + f" on {list(shape)}",
        fused_bytes=sum(link.cost.bytes for link in links) - extra,
    )
    rows = [_row(link, peak, bandwidth) for link in links]
    unfused = sum(r.time_floor_s for r in rows)
    fused = calculation.fused_time_floor_s
    assert fused is not None
    return msgspec.structs.replace(
        calculation, time_floor_s=unfused, time_saved_s=unfused - fused, ops=rows, notes=notes
    )


def _row(link: _Link, peak: float, bandwidth: float) -> CalculatedOp:
    c = link.cost
    ai = c.flops / c.bytes if c.bytes > 0 else None
    return CalculatedOp(
        op=link.op,
        what=link.what,
        flops=c.flops,
        bytes=c.bytes,
        ai=ai,
        bound="compute" if ai is None or ai >= peak / bandwidth else "bandwidth",
        time_floor_s=_floor(c.flops, c.bytes, peak, bandwidth),
    )


def _chain_notes(ops: list[str]) -> list[str]:
    notes = []
    if any(op in ("dropout", "feature_dropout") for op in ops):
        notes.append(
            "dropout as in training: it also writes a one-byte mask for the backward, "
            "fused or not (in evaluation it does nothing)"
        )
    scalar = sorted({op for op in ops if op in _SCALAR_OPERAND})
    if scalar:
        notes.append(
            f"{', '.join(scalar)}: a scalar second operand; say residual_add (a tensor of the "
            "same shape) or bias_add (one of the last dimension) for a tensor"
        )
    return notes
