"""Convolutions, 1-D to 3-D, grouped and transposed, as flop_counter counts them.

Forward: 2 · N · (output positions) · (kernel positions) · C_out · C_in/groups; for a transposed
convolution the positions are the input's, and the weight is [C_in, C_out/groups, k...]. The
output size of a forward convolution needs stride, padding and dilation, which only `Concrete
Inputs` records: without them a forward convolution has no cost. A bias is read, not counted.

Backward (`convolution_backward`): the gradient of the input and the gradient of the weight
each cost one forward convolution, so both together (the usual output mask) are 2× forward.
flop_counter counts the weight gradient of a grouped convolution `groups` times too high (it
multiplies by the full C_in·C_out); this model does not.

A grouped or depthwise convolution's cost says model "grouped_conv": not a tensor-core matmul.
"""

from __future__ import annotations

import math
from functools import partial

import msgspec

from wallfinder.cost.base import Cost, Model, make_cost
from wallfinder.trace import OpArgs, Tensor

MODEL = "conv"
GROUPED = "grouped_conv"


class Signature(msgspec.Struct, frozen=True):
    """Where a convolution op keeps its arguments (None: the op has no such argument)."""

    bias: int | None
    stride: int
    padding: int
    dilation: int | None  # None: the op has no such argument (dilation 1, one group)
    groups: int | None
    output_padding: int | None = None
    transposed: int | bool = False  # a position, or the fixed answer for this op
    depthwise: bool = False  # one group per input channel, which the op does not record


_CONVOLUTION = Signature(
    bias=2, stride=3, padding=4, dilation=5, transposed=6, output_padding=7, groups=8
)
_CONV_ND = Signature(bias=2, stride=3, padding=4, dilation=5, groups=6)
_CONV_TRANSPOSE_ND = Signature(
    bias=2, stride=3, padding=4, output_padding=5, groups=6, dilation=7, transposed=True
)
_CUDNN = Signature(bias=None, padding=2, stride=3, dilation=4, groups=5)
_CUDNN_TRANSPOSE = Signature(
    bias=None, padding=2, output_padding=3, stride=4, dilation=5, groups=6, transposed=True
)
_MIOPEN = Signature(bias=2, padding=3, stride=4, dilation=5, groups=6)  # also mkldnn
_SLOW = Signature(bias=3, stride=4, padding=5, dilation=None, groups=None)
# `_conv_depthwise2d(self, weight, kernel_size, bias, stride, padding, dilation)`, the native
# CUDA depthwise kernels' op (`conv_depthwise3d` likewise): groups = C_in.
_DEPTHWISE = Signature(bias=3, stride=4, padding=5, dilation=6, groups=None, depthwise=True)
_MIOPEN_TRANSPOSE = Signature(
    bias=2, padding=3, output_padding=4, stride=5, dilation=6, groups=7, transposed=True
)


def _spatial(args: OpArgs, i: int | None, n: int, default: int | None) -> tuple[int, ...] | None:
    """A per-dimension parameter (stride, padding, ...), a one-element list expanded to `n`."""
    values = args.ints(i) if i is not None else None
    if values is None:
        return None if default is None else (default,) * n
    if len(values) == 1:
        values = values * n
    return values if len(values) == n else None


def _batched(x: Tensor, w: Tensor) -> tuple[int, int, tuple[int, ...]] | None:
    """(N, C, spatial) of the input; an unbatched input (one dimension fewer) has N = 1."""
    if w.ndim < 3:
        return None
    if x.ndim == w.ndim:
        return x.shape[0], x.shape[1], x.shape[2:]
    if x.ndim == w.ndim - 1:
        return 1, x.shape[0], x.shape[1:]
    return None


def forward_flops(n: int, positions: tuple[int, ...], w: Tensor) -> int:
    """flop_counter's convolution count: 2 · N · positions · prod(weight shape)."""
    return 2 * n * math.prod(positions) * math.prod(w.shape)


def convolution(sig: Signature, args: OpArgs) -> Cost | None:
    x, w = args.tensor(0), args.tensor(1)
    if x is None or w is None:
        return None
    shape = _batched(x, w)
    if shape is None:
        return None
    n, c_in, spatial = shape
    kernel = w.shape[2:]
    rank = len(kernel)
    transposed = sig.transposed if isinstance(sig.transposed, bool) else args.flag(sig.transposed)
    stride = _spatial(args, sig.stride, rank, None)
    padding = _spatial(args, sig.padding, rank, None)
    dilation = _spatial(args, sig.dilation, rank, None) if sig.dilation is not None else (1,) * rank
    groups = args.integer(sig.groups) if sig.groups is not None else c_in if sig.depthwise else 1
    if transposed is None or stride is None or dilation is None or padding is None:
        return None
    if groups is None or groups < 1 or min(stride) < 1 or min(dilation) < 1:
        return None
    if not transposed:
        if c_in != w.shape[1] * groups:
            return None
        out = tuple(
            (size + 2 * p - d * (k - 1) - 1) // s + 1
            for size, p, d, k, s in zip(spatial, padding, dilation, kernel, stride, strict=True)
        )
        if min(out) < 0:
            return None
        flops = forward_flops(n, out, w)
        out_numel = n * w.shape[0] * math.prod(out)
    else:
        if c_in != w.shape[0]:
            return None
        output_padding = _spatial(args, sig.output_padding, rank, 0)
        if output_padding is None:
            return None
        out = tuple(
            (size - 1) * s - 2 * p + d * (k - 1) + op + 1
            for size, s, p, d, k, op in zip(
                spatial, stride, padding, dilation, kernel, output_padding, strict=True
            )
        )
        if min(out) < 0:
            return None
        flops = forward_flops(n, spatial, w)
        out_numel = n * w.shape[1] * groups * math.prod(out)
    bias = args.tensor(sig.bias) if sig.bias is not None else None
    reads = x.nbytes + w.nbytes + (bias.nbytes if bias is not None else 0)
    return make_cost(flops, reads + out_numel * x.itemsize, x.dtype, _model(groups))


def _model(groups: int) -> str:
    """A grouped (or depthwise) convolution is "grouped_conv": each group is a matmul too
    narrow for the tensor cores (a depthwise one has AI ≈ k²/(2·itemsize), about 2 for a 3×3 in
    fp32), so neither its FLOPs nor TF32 advice are a matmul's."""
    return MODEL if groups == 1 else GROUPED


def convolution_backward(args: OpArgs) -> Cost | None:
    """`convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
    transposed, output_padding, groups, output_mask)`. The FLOPs need only the three shapes;
    without a recorded output mask, the input and weight gradients are assumed (every layer but
    the first). Without the transposed flag it is read from the shapes."""
    grad, x, w = args.tensor(0), args.tensor(1), args.tensor(2)
    if grad is None or x is None or w is None:
        return None
    go, xi = _batched(grad, w), _batched(x, w)
    if go is None or xi is None or go[0] != xi[0]:
        return None
    n, c_out, out_spatial = go
    _, c_in, in_spatial = xi
    if len(out_spatial) != w.ndim - 2 or len(in_spatial) != w.ndim - 2:
        return None
    w0, w1 = w.shape[:2]
    plain = c_out == w0 and w1 > 0 and c_in % w1 == 0
    flipped = c_in == w0 and w1 > 0 and c_out % w1 == 0
    transposed = args.flag(7)
    if transposed is None:
        if plain and flipped:
            # Both readings fit (C_in == C_out): a convolution shrinks or keeps its input.
            transposed = math.prod(out_spatial) > math.prod(in_spatial)
        else:
            transposed = flipped
    if not (flipped if transposed else plain):
        return None
    fwd = forward_flops(n, in_spatial if transposed else out_spatial, w)
    mask = args.flags(10)
    if mask is None or len(mask) != 3:
        mask = (True, True, False)
    grad_input, grad_weight, grad_bias = mask
    flops = fwd * (int(grad_input) + int(grad_weight))
    reads = grad.nbytes
    writes = 0
    if grad_input:
        reads += w.nbytes
        writes += x.nbytes
    if grad_weight:
        reads += x.nbytes
        writes += w.nbytes
    if grad_bias:
        writes += c_out * grad.itemsize
    # The weight's channel count against the input's gives the groups.
    groups = (c_out if transposed else c_in) // w1
    return make_cost(flops, reads + writes, grad.dtype, _model(groups))


_FORWARD: dict[str, Signature] = {
    "aten::convolution": _CONVOLUTION,
    "aten::_convolution": _CONVOLUTION,
    "aten::conv1d": _CONV_ND,
    "aten::conv2d": _CONV_ND,
    "aten::conv3d": _CONV_ND,
    "aten::conv_transpose1d": _CONV_TRANSPOSE_ND,
    "aten::conv_transpose2d": _CONV_TRANSPOSE_ND,
    "aten::conv_transpose3d": _CONV_TRANSPOSE_ND,
    "aten::cudnn_convolution": _CUDNN,
    "aten::cudnn_convolution_transpose": _CUDNN_TRANSPOSE,
    "aten::miopen_convolution": _MIOPEN,
    "aten::miopen_depthwise_convolution": _MIOPEN,
    "aten::miopen_convolution_transpose": _MIOPEN_TRANSPOSE,
    "aten::mkldnn_convolution": _MIOPEN,
    "aten::_conv_depthwise2d": _DEPTHWISE,
    "aten::conv_depthwise3d": _DEPTHWISE,
    "aten::thnn_conv2d": _SLOW,
    "aten::_slow_conv2d_forward": _SLOW,
}

MODELS: dict[str, Model] = {name: partial(convolution, sig) for name, sig in _FORWARD.items()}
MODELS["aten::convolution_backward"] = convolution_backward
