"""Matrix multiplies: 2·M·N·K FLOPs per product (a multiply-add is 2), as flop_counter counts.

A bias or `beta·self` added to the product is read but not counted as FLOPs, as in
flop_counter. Backward passes appear in traces as plain `aten::mm`/`aten::bmm` calls; the
autograd nodes (`MmBackward0`, `AddmmBackward0`) have no model, so they get no cost.
"""

from __future__ import annotations

import math

from wallfinder.cost.base import Cost, Model, broadcast, make_cost
from wallfinder.dtypes import ELEMENT_BYTES
from wallfinder.trace import OpArgs, Tensor

MODEL = "gemm"


def _product(
    batch: int, m: int, n: int, k: int, reads: int, out_dtype: str, dtype: str
) -> Cost | None:
    flops = 2 * batch * m * n * k
    return make_cost(flops, reads + batch * m * n * ELEMENT_BYTES[out_dtype], dtype, MODEL)


def _matrices(args: OpArgs, i: int) -> tuple[Tensor, Tensor] | None:
    a, b = args.tensor(i), args.tensor(i + 1)
    if a is None or b is None or a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        return None
    return a, b


def _mm(args: OpArgs, out_dtype: str | None) -> Cost | None:
    """`a[M,K] @ b[K,N]`, written in `out_dtype` (None: a's dtype)."""
    ab = _matrices(args, 0)
    if ab is None:
        return None
    a, b = ab
    (m, k), n = a.shape, b.shape[1]
    return _product(1, m, n, k, a.nbytes + b.nbytes, out_dtype or a.dtype, a.dtype)


def mm(args: OpArgs) -> Cost | None:
    """`mm(a[M,K], b[K,N])`."""
    return _mm(args, None)


def int_mm(args: OpArgs) -> Cost | None:
    """`_int_mm(a[M,K] int8, b[K,N] int8) -> int32`."""
    return _mm(args, "int32")


def addmm(args: OpArgs) -> Cost | None:
    """`addmm(self, a[M,K], b[K,N], beta, alpha)`, also `addmm_` and `_addmm_activation`."""
    bias = args.tensor(0)
    ab = _matrices(args, 1)
    if bias is None or ab is None:
        return None
    a, b = ab
    (m, k), n = a.shape, b.shape[1]
    if broadcast([bias.shape, (m, n)]) != (m, n):
        return None
    return _product(1, m, n, k, bias.nbytes + a.nbytes + b.nbytes, a.dtype, a.dtype)


def bmm(args: OpArgs) -> Cost | None:
    """`bmm(a[B,M,K], b[B,K,N])`."""
    a, b = args.tensor(0), args.tensor(1)
    if a is None or b is None or a.ndim != 3 or b.ndim != 3:
        return None
    (batch, m, k), (batch2, k2, n) = a.shape, b.shape
    if batch != batch2 or k != k2:
        return None
    return _product(batch, m, n, k, a.nbytes + b.nbytes, a.dtype, a.dtype)


def baddbmm(args: OpArgs) -> Cost | None:
    """`baddbmm(self, a[B,M,K], b[B,K,N], beta, alpha)`, also `baddbmm_`."""
    bias, a, b = args.tensor(0), args.tensor(1), args.tensor(2)
    if bias is None or a is None or b is None or a.ndim != 3 or b.ndim != 3:
        return None
    (batch, m, k), (batch2, k2, n) = a.shape, b.shape
    if batch != batch2 or k != k2 or broadcast([bias.shape, (batch, m, n)]) != (batch, m, n):
        return None
    reads = bias.nbytes + a.nbytes + b.nbytes
    return _product(batch, m, n, k, reads, a.dtype, a.dtype)


def matmul(args: OpArgs) -> Cost | None:
    """`matmul(a, b)` with NumPy semantics: a 1-D operand is a vector, leading dimensions
    broadcast. Each operand is read once at its own size, before broadcasting."""
    a, b = args.tensor(0), args.tensor(1)
    if a is None or b is None or a.ndim == 0 or b.ndim == 0:
        return None
    m, k = (1, a.shape[0]) if a.ndim == 1 else a.shape[-2:]
    k2, n = (b.shape[0], 1) if b.ndim == 1 else b.shape[-2:]
    batch = broadcast([a.shape[:-2], b.shape[:-2]])
    if k != k2 or batch is None:
        return None
    return _product(math.prod(batch), m, n, k, a.nbytes + b.nbytes, a.dtype, a.dtype)


def linear(args: OpArgs) -> Cost | None:
    """`linear(x[..., in], weight[out, in], bias[out]?)`."""
    x, w, bias = args.tensor(0), args.tensor(1), args.tensor(2)
    if x is None or w is None or x.ndim == 0 or w.ndim not in (1, 2):
        return None
    k = x.shape[-1]
    n = w.shape[0] if w.ndim == 2 else 1
    if w.shape[-1] != k:
        return None
    reads = x.nbytes + w.nbytes + (bias.nbytes if bias is not None else 0)
    return _product(1, math.prod(x.shape[:-1]), n, k, reads, x.dtype, x.dtype)


def scaled_mm(args: OpArgs) -> Cost | None:
    """`_scaled_mm(a, b, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum)`:
    an fp8 matmul. The output dtype is `out_dtype` when recorded, else the inputs' (the
    op's default, and the smallest, so a lower bound either way)."""
    ab = _matrices(args, 0)
    if ab is None:
        return None
    a, b = ab
    (m, k), n = a.shape, b.shape[1]
    reads = sum(t.nbytes for t in args.tensors())
    out_dtype = args.dtype_arg(6) or a.dtype
    return _product(1, m, n, k, reads, out_dtype, a.dtype)


def _mv(args: OpArgs, i: int, reads: int) -> Cost | None:
    a, x = args.tensor(i), args.tensor(i + 1)
    if a is None or x is None or a.ndim != 2 or x.ndim != 1 or a.shape[1] != x.shape[0]:
        return None
    m, k = a.shape
    return _product(1, m, 1, k, reads + a.nbytes + x.nbytes, a.dtype, a.dtype)


def mv(args: OpArgs) -> Cost | None:
    """`mv(a[M,K], x[K])`."""
    return _mv(args, 0, 0)


def addmv(args: OpArgs) -> Cost | None:
    """`addmv(self[M], a[M,K], x[K], beta, alpha)`, also `addmv_`."""
    bias = args.tensor(0)
    return None if bias is None else _mv(args, 1, bias.nbytes)


def dot(args: OpArgs) -> Cost | None:
    """`dot(x[K], y[K])`."""
    x, y = args.tensor(0), args.tensor(1)
    if x is None or y is None or x.ndim != 1 or x.shape != y.shape:
        return None
    return _product(1, 1, 1, x.shape[0], x.nbytes + y.nbytes, x.dtype, x.dtype)


MODELS: dict[str, Model] = {
    "aten::mm": mm,
    "aten::_int_mm": int_mm,
    "aten::addmm": addmm,
    "aten::addmm_": addmm,
    "aten::_addmm_activation": addmm,
    "aten::bmm": bmm,
    "aten::baddbmm": baddbmm,
    "aten::baddbmm_": baddbmm,
    "aten::matmul": matmul,
    "aten::linear": linear,
    "aten::_scaled_mm": scaled_mm,
    "aten::mv": mv,
    "aten::addmv": addmv,
    "aten::addmv_": addmv,
    "aten::dot": dot,
    "aten::vdot": dot,
}
