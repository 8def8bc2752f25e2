"""Embedding lookups: a gather, so bytes only (the rows gathered, the indices, the output).

The backward scatters the incoming gradient into the weight's gradient: one add per gradient
element, and the whole gradient table written when its row count (`num_weights`) is recorded,
else only the rows the gradient touches (a lower bound).
"""

from __future__ import annotations

import math

from wallfinder.cost.base import Cost, Model, make_cost
from wallfinder.trace import OpArgs

MODEL = "embedding"


def embedding(args: OpArgs) -> Cost | None:
    """`embedding(weight[V, D], indices, padding_idx, scale_grad_by_freq, sparse)`."""
    weight, indices = args.tensor(0), args.tensor(1)
    if weight is None or indices is None or weight.ndim != 2:
        return None
    rows = indices.numel * weight.shape[1] * weight.itemsize
    return make_cost(0, indices.nbytes + 2 * rows, weight.dtype, MODEL)


def backward(args: OpArgs) -> Cost | None:
    """`embedding_dense_backward(grad_output, indices, num_weights, padding_idx, ...)`, and
    `embedding_backward` (the same first three arguments)."""
    grad, indices = args.tensor(0), args.tensor(1)
    if grad is None or indices is None or grad.ndim == 0:
        return None
    width = grad.shape[-1]
    if math.prod(grad.shape[:-1]) != indices.numel:
        return None
    num_weights = args.integer(2)
    if num_weights is not None and num_weights >= 0:
        written = num_weights * width * grad.itemsize
    else:
        written = grad.nbytes
    return make_cost(grad.numel, grad.nbytes + indices.nbytes + written, grad.dtype, MODEL)


MODELS: dict[str, Model] = {
    "aten::embedding": embedding,
    "aten::embedding_dense_backward": backward,
    "aten::embedding_backward": backward,
}
