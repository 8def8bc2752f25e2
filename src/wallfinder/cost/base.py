"""The cost type, shared by every cost model, and the helpers the models share.

A model reads an op call's arguments as `wallfinder.trace.OpArgs` (shapes, dtype keys and
scalar inputs, decoded by the trace, or built from a user's shapes by the calculator).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

import msgspec

from wallfinder.trace import OpArgs


class Cost(msgspec.Struct, frozen=True):
    """The work one op call does, from the shapes and dtypes its trace event recorded.

    `flops` counts a multiply-add as 2, as `torch.utils.flop_counter` does. `bytes` is the
    minimum DRAM traffic: every input read once and every output written once. It is a lower
    bound: re-reads (tiles of a matmul, a second pass over a norm's input), caches and
    intermediates are ignored. `dtype` is the key of the dtype the op computes in, from its
    main inputs ("fp64", "fp32", "bf16", "fp16", "fp8", "int8" have datasheet peaks; integer
    and bool tensors give keys such as "int64"); a trace cannot show TF32, so fp32 matmuls say
    "fp32". `model` names the cost model that produced it: "gemm", "conv", "attention", "norm",
    "softmax", "elementwise", "reduction", "embedding", "loss", "optimizer", "copy", or
    "grouped_conv" (a grouped or depthwise convolution: no tensor-core matmul).
    """

    flops: float
    bytes: float
    dtype: str
    model: str


def make_cost(flops: float, nbytes: float, dtype: str, model: str) -> Cost | None:
    """A `Cost`, or None when either number does not fit a finite float."""
    try:
        f, b = float(flops), float(nbytes)
    except OverflowError:
        return None
    if not (math.isfinite(f) and math.isfinite(b)) or f < 0 or b < 0:
        return None
    return Cost(f, b, dtype, model)


def broadcast(shapes: Iterable[Sequence[int]]) -> tuple[int, ...] | None:
    """The broadcast of `shapes` (NumPy/PyTorch rules); None when they do not broadcast."""
    out: list[int] = []
    for shape in shapes:
        if len(shape) > len(out):
            out = [1] * (len(shape) - len(out)) + out
        offset = len(out) - len(shape)
        for j, d in enumerate(shape):
            o = out[offset + j]
            if o == 1:
                out[offset + j] = d
            elif d not in (1, o):
                return None
    return tuple(out)


Model = Callable[[OpArgs], Cost | None]
"""A cost model: the cost of one call from its arguments, or None when they do not say."""
