"""Optimizer steps: the fused kernels (`_fused_adam_`, `_fused_adamw_`, `_fused_sgd_`) and the
`_foreach_*` ops that foreach optimizers, gradient clipping and AMP's unscaling are built of.

A fused step costs a constant per parameter element and moves every list it reads and writes
once: Adam reads params, grads and both moment estimates and writes params and both moments.
A `_foreach_` op is its pointwise op applied to each list position. Kineto records no dtype for
TensorList elements: they are taken as fp32 (`TENSOR_LIST_DTYPE`).
"""

from __future__ import annotations

import math
from functools import partial

from wallfinder.cost.base import Cost, Model, broadcast, make_cost
from wallfinder.cost.elementwise import FLOPS_PER_ELEMENT, TRANSCENDENTAL_FLOPS
from wallfinder.trace import OpArgs, Tensor
from wallfinder.trace.args import TENSOR_LIST_DTYPE

MODEL = "optimizer"

ADAM_FLOPS = 3 + 4 + (TRANSCENDENTAL_FLOPS + 2) + 3 + 2
"""Per parameter element: first moment (3: two scales, an add), second moment (4: a square,
two scales, an add), the denominator (a square root, a bias correction, + eps), the update (3:
divide, scale by the step size, subtract) and weight decay (2). amsgrad adds a max (1)."""
SGD_FLOPS = 2
"""Per parameter element: scale the gradient by the learning rate and subtract it."""
SGD_MOMENTUM_FLOPS = 3
"""Per parameter element with momentum: update the buffer (scale, scale, add)."""


def _same_shapes(*lists: list[Tensor]) -> bool:
    shapes = [t.shape for t in lists[0]]
    return all([t.shape for t in other] == shapes for other in lists[1:])


def adam(args: OpArgs) -> Cost | None:
    """`_fused_adam_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr,
    beta1, beta2, weight_decay, eps, amsgrad, maximize, grad_scale, found_inf)`."""
    lists = [args.tensor_list(i) for i in range(4)]
    maxima = args.tensor_list(4) or []
    if any(not lst for lst in lists):
        return None
    params, grads, exp_avgs, exp_avg_sqs = (lst or [] for lst in lists)
    if not _same_shapes(params, grads, exp_avgs, exp_avg_sqs):
        return None
    if maxima and not _same_shapes(params, maxima):
        return None
    n = sum(t.numel for t in params)
    # Read params, grads, both moments (and the max); write params and the moments (and max).
    streams = 4 + 3 + (2 if maxima else 0)
    flops = n * (ADAM_FLOPS + (1 if maxima else 0))
    return make_cost(flops, n * streams * params[0].itemsize, TENSOR_LIST_DTYPE, MODEL)


def sgd(args: OpArgs) -> Cost | None:
    """`_fused_sgd_(params, grads, momentum_buffer_list, weight_decay, momentum, lr, ...)`."""
    params, grads = args.tensor_list(0), args.tensor_list(1)
    buffers = args.tensor_list(2) or []
    if not params or not grads or not _same_shapes(params, grads):
        return None
    if buffers and not _same_shapes(params, buffers):
        return None
    n = sum(t.numel for t in params)
    streams = 3 + (2 if buffers else 0)  # read params, grads (buffer); write params (buffer)
    flops = n * (SGD_FLOPS + (SGD_MOMENTUM_FLOPS if buffers else 0))
    return make_cost(flops, n * streams * params[0].itemsize, TENSOR_LIST_DTYPE, MODEL)


def foreach(op: str, inplace: bool, args: OpArgs) -> Cost | None:
    """`_foreach_<op>(self, other...)`: the pointwise `op` at every position of the lists.
    `norm` reduces each tensor to one value; `copy_` and `zero_` compute nothing."""
    if not args.clean or not args.lists:
        return None
    lists = list(args.lists.values())
    first = lists[0]
    if not first or any(len(lst) != len(first) for lst in lists):
        return None
    singles = args.tensors()  # a Tensor argument (a 0-d scale) broadcast to every position
    flops = 0
    nbytes = sum(t.nbytes for t in singles)
    for i, target in enumerate(first):
        operands = [lst[i] for lst in lists]
        shape = broadcast([t.shape for t in operands] + [t.shape for t in singles])
        if shape is None or (inplace and shape != target.shape):
            return None
        n = math.prod(shape)
        if op == "norm":
            flops += 2 * target.numel
            nbytes += target.nbytes + target.itemsize
        elif op == "zero":
            nbytes += target.nbytes
        elif op == "copy":
            nbytes += sum(t.nbytes for t in operands)
        else:
            flops += FLOPS_PER_ELEMENT[op] * n
            nbytes += sum(t.nbytes for t in operands) + n * target.itemsize
    return make_cost(flops, nbytes, TENSOR_LIST_DTYPE, MODEL)


# fmt: off
_FOREACH_OPS = (
    "add", "sub", "mul", "div", "addcmul", "addcdiv", "lerp", "maximum", "minimum", "clamp_min",
    "clamp_max", "neg", "abs", "sign", "sqrt", "rsqrt", "exp", "log", "log1p", "reciprocal",
    "sigmoid", "tanh", "pow",
)
# fmt: on


def _models() -> dict[str, Model]:
    models: dict[str, Model] = {
        "aten::_fused_adam_": adam,
        "aten::_fused_adamw_": adam,
        "aten::_fused_sgd_": sgd,
        "aten::_foreach_norm": partial(foreach, "norm", False),
        "aten::_foreach_zero_": partial(foreach, "zero", True),
        "aten::_foreach_copy_": partial(foreach, "copy", True),
    }
    for op in _FOREACH_OPS:
        models[f"aten::_foreach_{op}"] = partial(foreach, op, False)
        models[f"aten::_foreach_{op}_"] = partial(foreach, op, True)
    return models


MODELS: dict[str, Model] = _models()
