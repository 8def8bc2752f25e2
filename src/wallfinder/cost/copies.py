"""Copies and casts: no FLOPs; the source read and the destination written, each in its dtype.

`to` and `contiguous` return their input untouched when nothing changes, and then launch no
copy (in the trace: no `_to_copy` or `clone` under them); their cost here is that of the copy
they make when they make one. The destination dtype of a cast comes from the record; when it
is not recorded the copy is taken to keep the source's dtype. A copy between devices moves its
bytes over the host link, not DRAM: the model cannot tell from the arguments alone.
"""

from __future__ import annotations

from wallfinder.cost.base import Cost, Model, broadcast, make_cost
from wallfinder.dtypes import ELEMENT_BYTES
from wallfinder.trace import OpArgs, Tensor

MODEL = "copy"


def _copy(src: Tensor, dst_dtype: str, dst_numel: int | None = None) -> Cost | None:
    numel = src.numel if dst_numel is None else dst_numel
    return make_cost(0, src.nbytes + numel * ELEMENT_BYTES[dst_dtype], src.dtype, MODEL)


def copy_(args: OpArgs) -> Cost | None:
    """`copy_(self, src, non_blocking)`: `src` (broadcast to `self`) into `self`."""
    dst, src = args.tensor(0), args.tensor(1)
    if dst is None or src is None or broadcast([src.shape, dst.shape]) != dst.shape:
        return None
    return _copy(src, dst.dtype, dst.numel)


def copy_from(args: OpArgs) -> Cost | None:
    """`_copy_from(self, dst, non_blocking)`: `self` into `dst`."""
    src, dst = args.tensor(0), args.tensor(1)
    if dst is None or src is None:
        return None
    return _copy(src, dst.dtype, dst.numel)


def clone(args: OpArgs) -> Cost | None:
    """`clone(self, memory_format)`, `contiguous(self, memory_format)`."""
    src = args.tensor(0)
    return None if src is None else _copy(src, src.dtype)


def to(args: OpArgs) -> Cost | None:
    """`to`, by overload: `to.dtype(self, dtype, non_blocking, copy, memory_format)`,
    `to.other(self, other, ...)`, `to.device(self, device, dtype, ...)`,
    `to.dtype_layout(self, dtype, layout, device, pin_memory, non_blocking, copy, ...)`."""
    src = args.tensor(0)
    if src is None:
        return None
    other = args.tensor(1)
    if other is not None:
        dtype: str | None = other.dtype
    elif args.size == 6:
        dtype = args.dtype_arg(2)
    else:
        dtype = args.dtype_arg(1)
    return _copy(src, dtype or src.dtype)


def to_copy(args: OpArgs) -> Cost | None:
    """`_to_copy(self, dtype, layout, device, pin_memory, non_blocking, memory_format)`, or
    `_to_copy.out(self, non_blocking, memory_format, out)`."""
    src = args.tensor(0)
    if src is None:
        return None
    out = args.tensor(3) if args.size == 4 else None
    dtype = out.dtype if out is not None else args.dtype_arg(1)
    return _copy(src, dtype or src.dtype)


def type_as(args: OpArgs) -> Cost | None:
    """`type_as(self, other)`: `self` cast to `other`'s dtype; no copy (no cost) when the
    dtypes already agree."""
    src, other = args.tensor(0), args.tensor(1)
    if src is None or other is None or src.dtype == other.dtype:
        return None
    return _copy(src, other.dtype)


MODELS: dict[str, Model] = {
    "aten::copy_": copy_,
    "aten::_copy_from": copy_from,
    "aten::_copy_from_and_resize": copy_from,
    "aten::clone": clone,
    "aten::contiguous": clone,
    "aten::to": to,
    "aten::_to_copy": to_copy,
    "aten::type_as": type_as,
}
