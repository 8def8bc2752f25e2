"""Pointwise ops, unary to ternary, with broadcasting: FLOPs per output element × outputs.

The output's shape is the broadcast of the tensor arguments' shapes (an in-place op writes its
first argument); each tensor argument is read once at its own size and the output written once.
Arithmetic, comparisons and selections count 1 FLOP per element. A transcendental function
(exp, log, erf, tanh, sqrt, ...) counts `TRANSCENDENTAL_FLOPS`: the special-function units that
evaluate them issue at a quarter of the FP32 rate on NVIDIA GPUs since Volta. Composite
activations add up their parts (`FLOPS_PER_ELEMENT`). Any such constant is a convention: these
ops are bound by memory bandwidth by a wide margin either way.

Random ops count `RANDOM_FLOPS` per number drawn (a counter-based generator's output turned
into a float) plus their transform; dropout in training writes its output and a one-byte
mask; in evaluation it returns its input: no work, no cost.
"""

from __future__ import annotations

import math
from functools import partial

from wallfinder.cost.base import Cost, Model, broadcast, make_cost
from wallfinder.dtypes import ELEMENT_BYTES, category, promote
from wallfinder.trace import OpArgs, Tensor

MODEL = "elementwise"

TRANSCENDENTAL_FLOPS = 4
"""FLOPs counted for one exp, log, erf, tanh, sin, sqrt, rsqrt."""
RANDOM_FLOPS = 1
"""FLOPs counted for one random number drawn (a uniform float from the generator's bits)."""

_T = TRANSCENDENTAL_FLOPS
_SIGMOID = _T + 2  # 1 / (1 + exp(-x)): exp, add, divide
_GELU = _T + 4  # x/2 · (1 + erf(x/√2)): scale, erf, add, two multiplies

# fmt: off
_ONE_FLOP = (
    "add", "sub", "rsub", "mul", "div", "true_divide", "floor_divide", "remainder", "fmod",
    "neg", "abs", "reciprocal", "square", "sign", "sgn", "floor", "ceil", "round", "trunc",
    "frac", "relu", "relu6", "hardtanh", "threshold", "clamp", "clamp_min", "clamp_max", "clip",
    "maximum", "minimum", "fmax", "fmin", "where", "masked_fill", "eq", "ne", "lt", "le", "gt",
    "ge", "logical_and", "logical_or", "logical_xor", "logical_not", "bitwise_and",
    "bitwise_or", "bitwise_xor", "bitwise_not", "nan_to_num", "isnan", "isinf",
    "threshold_backward", "copysign", "heaviside", "hardshrink",
)
_TRANSCENDENTAL = (
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "erf", "erfc",
    "erfinv", "sqrt", "rsqrt", "tanh", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh",
    "atanh", "atan2", "lgamma", "digamma",
)
# fmt: on

FLOPS_PER_ELEMENT: dict[str, int] = {
    **dict.fromkeys(_ONE_FLOP, 1),
    **dict.fromkeys(_TRANSCENDENTAL, _T),
    "pow": 2 * _T + 1,  # exp(y · log(x)); a small integer exponent is refined in `_pow_flops`
    "leaky_relu": 2,  # compare, multiply
    "addcmul": 3,  # self + value · a · b
    "addcdiv": 3,  # self + value · a / b
    "lerp": 3,  # self + weight · (end - self)
    "hardsigmoid": 3,  # clamp(x + 3, 0, 6) / 6
    "hardswish": 4,  # x · hardsigmoid(x)
    "sigmoid": _SIGMOID,
    "silu": _SIGMOID + 1,  # x · sigmoid(x)
    "gelu": _GELU,
    "elu": _T + 3,  # x > 0 ? x : α(exp(x) - 1)
    "softplus": 2 * _T + 1,  # log(1 + exp(x))
    "mish": 3 * _T + 2,  # x · tanh(softplus(x))
    "logit": _T + 2,  # log(x / (1 - x))
    "softshrink": 2,  # compare, subtract
    "selu": _T + 4,  # scale · (x > 0 ? x : α(exp(x) - 1))
    "celu": _T + 4,  # max(0, x) + min(0, α(exp(x/α) - 1))
    "log_sigmoid": 2 * _T + 2,  # -softplus(-x)
    "log_sigmoid_forward": 2 * _T + 2,
    "xlogy": _T + 1,  # x · log(y)
    "hypot": _T + 3,  # sqrt(x² + y²)
    "logaddexp": 2 * _T + 3,  # max + log1p(exp(-|x - y|))
    # x > 0 ? x : weight · x. Not `prelu` itself: it records its weight as [C], which only
    # broadcasts once reshaped to [C, 1, ...] for the kernel.
    "_prelu_kernel": 2,
    # Backward of activations, from the forward's input or output.
    "sigmoid_backward": 3,  # g · y · (1 - y)
    "tanh_backward": 3,  # g · (1 - y²)
    "silu_backward": _SIGMOID + 5,  # s = sigmoid(x); g · s · (1 + x · (1 - s))
    "gelu_backward": 2 * _T + 8,  # the normal CDF (erf) and PDF (exp) at x, then g · (Φ + x·φ)
    "leaky_relu_backward": 2,
    "hardtanh_backward": 2,
    "hardsigmoid_backward": 2,
    "hardswish_backward": 4,
    "elu_backward": 3,
    "softplus_backward": _T + 3,
    "mish_backward": 3 * _T + 6,
    "logit_backward": 4,
    "native_dropout_backward": 2,  # g · mask · scale
}
"""FLOPs per output element of each pointwise op (by base name: no `aten::`, no trailing `_`)."""

# fmt: off
_COMPARISONS = frozenset((
    "eq", "ne", "lt", "le", "gt", "ge", "isnan", "isinf", "logical_and", "logical_or",
    "logical_xor", "logical_not",
))
# fmt: on
# Pointwise ops with no in-place variant (`aten::where_` does not exist).
# fmt: off
_NO_INPLACE = frozenset((
    "where", "maximum", "minimum", "fmax", "fmin", "isnan", "isinf", "_prelu_kernel",
    "log_sigmoid", "log_sigmoid_forward", "softshrink", "hardshrink", "logaddexp",
))
# fmt: on


def result_dtype(tensors: list[Tensor], floating_scalar: bool = False) -> str:
    """The dtype PyTorch computes in: dimensioned tensors promote among themselves; a 0-d
    tensor or a Python float only when its category is higher (then as the default float,
    fp32)."""
    dimensioned = [t.dtype for t in tensors if t.ndim] or [t.dtype for t in tensors]
    dtype = dimensioned[0]
    for other in dimensioned[1:]:
        dtype = promote(dtype, other)
    for t in tensors:
        if not t.ndim and category(t.dtype) > category(dtype):
            dtype = t.dtype if category(t.dtype) == 3 else "fp32"
    if floating_scalar and category(dtype) < 2:
        dtype = "fp32"
    return dtype


def pointwise(
    args: OpArgs, flops_per_element: int, inplace: bool, out_dtype: str | None = None
) -> tuple[int, int, str] | None:
    """(FLOPs, bytes, compute dtype) of a pointwise op on `args`' tensors."""
    tensors = args.tensors()
    if not tensors or not args.clean:
        return None
    shape = broadcast(t.shape for t in tensors)
    if shape is None or (inplace and shape != tensors[0].shape):
        return None
    dtype = result_dtype(tensors, args.floating_scalar())
    written = tensors[0].dtype if inplace else out_dtype or dtype
    n = math.prod(shape)
    nbytes = sum(t.nbytes for t in tensors) + n * ELEMENT_BYTES[written]
    return flops_per_element * n, nbytes, dtype


def elementwise(op: str, inplace: bool, args: OpArgs) -> Cost | None:
    flops = FLOPS_PER_ELEMENT[op]
    if op == "pow":
        flops = _pow_flops(args)
    result = pointwise(args, flops, inplace, "bool" if op in _COMPARISONS else None)
    return None if result is None else make_cost(*result, MODEL)


def _pow_flops(args: OpArgs) -> int:
    # A small integer exponent is a few multiplies; anything else is exp(y · log(x)).
    exponent = args.number(1) if args.tensor(1) is None else None
    if exponent is not None and exponent.is_integer() and abs(exponent) <= 4:
        return max(1, int(abs(exponent)) - 1)
    return 2 * _T + 1


def fill(args: OpArgs) -> Cost | None:
    """`fill_(self, value)`, `zero_(self)`: the tensor written, nothing read (a tensor value
    is read)."""
    tensors = args.tensors()
    if not tensors or not args.clean:
        return None
    self_ = tensors[0]
    return make_cost(0, self_.nbytes + sum(t.nbytes for t in tensors[1:]), self_.dtype, MODEL)


DROPOUT_FLOPS = RANDOM_FLOPS + 2
"""Per element: a random draw, the compare with p, and the scale by 1 / (1 - p)."""


def dropout(args: OpArgs) -> Cost | None:
    """`native_dropout(input, p, train)`: a random draw, a compare and a scale per element;
    reads the input, writes the output and a one-byte mask (`bool`, kept for the backward)."""
    x = args.tensor(0)
    if x is None or not args.clean:
        return None
    return make_cost(DROPOUT_FLOPS * x.numel, 2 * x.nbytes + x.numel, x.dtype, MODEL)


def dropout_call(args: OpArgs) -> Cost | None:
    """`dropout(input, p, train)` with `train` recorded True: what the fused kernel it calls
    on a GPU (`native_dropout`) costs. In evaluation it returns its input, no work, so no
    cost; and so when `train` is not recorded, since the record cannot tell (an inference
    trace's dropout takes a microsecond and launches nothing). A trace costs the ops that
    launch the kernels in any case (`native_dropout`, or on a CPU `bernoulli_`, `div_`, `mul`:
    the CPU draws its noise in the input's dtype, not as a one-byte mask)."""
    return dropout(args) if args.flag(2) is True else None


def feature_dropout(args: OpArgs) -> Cost | None:
    """`feature_dropout(input, p, train)` (`Dropout1d/2d/3d`) with `train` recorded True (as
    `dropout_call`): one draw per channel into a noise tensor of shape [N, C, 1, ...] in the
    input's dtype, then the input times the noise: reads the input, writes the output, and
    writes then reads the noise."""
    x = args.tensor(0)
    if x is None or not args.clean or args.flag(2) is not True or x.ndim < 2:
        return None
    channels = x.shape[0] * x.shape[1]
    noise = channels * ELEMENT_BYTES[x.dtype]
    flops = DROPOUT_FLOPS * channels + x.numel
    return make_cost(flops, 2 * x.nbytes + 2 * noise, x.dtype, MODEL)


_RANDOM_TRANSFORM = {
    "uniform_": 1,  # scale and shift into [from, to)
    "bernoulli_": 1,  # compare with p
    "random_": 1,  # a range reduction
    "normal_": 3 * _T + 2,  # Box-Muller: log, sqrt, cos, then scale and shift
    "log_normal_": 4 * _T + 2,  # a normal draw, then exp
    "exponential_": _T + 1,  # -log(u) / λ
    "cauchy_": _T + 2,  # median + σ · tan(π(u - ½))
    "geometric_": 2 * _T + 2,  # ceil(log(u) / log(1 - p))
}
"""FLOPs per element of each in-place random fill beyond the draw itself."""


def random_fill(op: str, args: OpArgs) -> Cost | None:
    """An in-place random fill (`normal_(self, mean, std)`, `uniform_`, `bernoulli_(self, p)`,
    ...): one draw and its transform per element; the tensor written, nothing read (a tensor
    `p` is read)."""
    tensors = args.tensors()
    if not tensors or not args.clean:
        return None
    self_ = tensors[0]
    flops = (RANDOM_FLOPS + _RANDOM_TRANSFORM[op]) * self_.numel
    return make_cost(flops, self_.nbytes + sum(t.nbytes for t in tensors[1:]), self_.dtype, MODEL)


def bernoulli(args: OpArgs) -> Cost | None:
    """`bernoulli(self)`: a draw per element against the probability in `self`; reads `self`,
    writes a tensor of its shape and dtype."""
    x = args.tensor(0)
    if x is None or not args.clean:
        return None
    return make_cost((RANDOM_FLOPS + 1) * x.numel, 2 * x.nbytes, x.dtype, MODEL)


def glu(args: OpArgs) -> Cost | None:
    """`glu(self, dim)`: the input split in two halves along `dim`, a · sigmoid(b): reads the
    input, writes an output half its size."""
    x = args.tensor(0)
    if x is None or not args.clean or x.numel % 2:
        return None
    half = x.numel // 2
    return make_cost(half * (_SIGMOID + 1), x.nbytes + x.nbytes // 2, x.dtype, MODEL)


def _models() -> dict[str, Model]:
    models: dict[str, Model] = {}
    for op in FLOPS_PER_ELEMENT:
        models[f"aten::{op}"] = partial(elementwise, op, False)
        if not op.endswith("_backward") and op not in _NO_INPLACE:
            models[f"aten::{op}_"] = partial(elementwise, op, True)
    models["aten::fill_"] = fill
    models["aten::zero_"] = fill
    models["aten::native_dropout"] = dropout
    models["aten::dropout"] = dropout_call
    models["aten::dropout_"] = dropout_call
    models["aten::feature_dropout"] = feature_dropout
    models["aten::feature_dropout_"] = feature_dropout
    for op in _RANDOM_TRANSFORM:
        models[f"aten::{op}"] = partial(random_fill, op)
    models["aten::bernoulli"] = bernoulli
    models["aten::glu"] = glu
    return models


MODELS: dict[str, Model] = _models()
