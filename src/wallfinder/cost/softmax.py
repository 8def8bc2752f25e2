"""Softmax and log-softmax over one dimension, forward and backward: elements × a constant.

Bytes: the input (backward: the incoming gradient and the forward's output) read once, the
output written once, in the dtype the op is asked for when the record says it.
"""

from __future__ import annotations

from functools import partial

from wallfinder.cost.base import Cost, Model, make_cost
from wallfinder.cost.elementwise import TRANSCENDENTAL_FLOPS
from wallfinder.dtypes import ELEMENT_BYTES
from wallfinder.trace import OpArgs

MODEL = "softmax"

FORWARD_FLOPS = TRANSCENDENTAL_FLOPS + 4
"""Per element: the row max (1), subtracting it (1), exp, the row sum (1), and dividing by it
(softmax) or subtracting its log (log-softmax) (1)."""
SOFTMAX_BACKWARD_FLOPS = 4
"""Per element: y · (g - Σ g·y): a multiply and a sum for Σ g·y, a subtract, a multiply."""
LOG_SOFTMAX_BACKWARD_FLOPS = TRANSCENDENTAL_FLOPS + 3
"""Per element: g - exp(y) · Σ g: the sum, exp, a multiply, a subtract."""


def forward(args: OpArgs) -> Cost | None:
    """`_softmax(self, dim, half_to_float)`, `softmax(self, dim, dtype)` and the log forms."""
    x = args.tensor(0)
    if x is None:
        return None
    # The third argument is half_to_float ("True": fp32 output) or an output dtype.
    out = "fp32" if args.text(2) == "True" else args.dtype_arg(2) or x.dtype
    return make_cost(
        FORWARD_FLOPS * x.numel, x.nbytes + x.numel * ELEMENT_BYTES[out], x.dtype, MODEL
    )


def backward(per_element: int, args: OpArgs) -> Cost | None:
    """`_softmax_backward_data(grad_output, output, dim, input_dtype)` and the log form."""
    grad, y = args.tensor(0), args.tensor(1)
    if grad is None or y is None or grad.shape != y.shape:
        return None
    out = args.dtype_arg(3) or grad.dtype
    nbytes = grad.nbytes + y.nbytes + grad.numel * ELEMENT_BYTES[out]
    return make_cost(per_element * grad.numel, nbytes, grad.dtype, MODEL)


MODELS: dict[str, Model] = {
    "aten::softmax": forward,
    "aten::_softmax": forward,
    "aten::_safe_softmax": forward,
    "aten::log_softmax": forward,
    "aten::_log_softmax": forward,
    "aten::_softmax_backward_data": partial(backward, SOFTMAX_BACKWARD_FLOPS),
    "aten::_log_softmax_backward_data": partial(backward, LOG_SOFTMAX_BACKWARD_FLOPS),
}
