"""Losses: negative log-likelihood and cross-entropy over class scores, and pointwise losses.

`nll_loss` gathers one score per sample (one add per sample, two with class weights) and reads
only those scores. `cross_entropy_loss` is a log-softmax over the scores followed by the
gather (its log-softmax intermediate is not counted as traffic: a lower bound). Pointwise
losses (MSE, L1, BCE-with-logits, ...) cost a constant per element. The output is one value
unless `reduction` is recorded as 0 ("none").
"""

from __future__ import annotations

import math
from functools import partial

from wallfinder.cost.base import Cost, Model, broadcast, make_cost
from wallfinder.cost.elementwise import TRANSCENDENTAL_FLOPS
from wallfinder.cost.softmax import FORWARD_FLOPS as LOG_SOFTMAX_FLOPS
from wallfinder.dtypes import category
from wallfinder.trace import OpArgs, Tensor

MODEL = "loss"

POINTWISE_FLOPS: dict[str, int] = {
    "mse_loss": 3,  # subtract, square, accumulate
    "l1_loss": 3,  # subtract, absolute value, accumulate
    "smooth_l1_loss": 4,  # and a compare-select between the two branches
    "huber_loss": 4,
    # max(x, 0) - x·t + log(1 + exp(-|x|)), accumulated
    "binary_cross_entropy_with_logits": 2 * TRANSCENDENTAL_FLOPS + 5,
    "mse_loss_backward": 3,  # g · 2 · (x - t) / n
}
"""FLOPs per element of each pointwise loss."""

_REDUCTION_AT = {"binary_cross_entropy_with_logits": 4}  # 2 for the others


def _samples(scores: Tensor, target: Tensor) -> int | None:
    """Samples of a class-index target for `scores` [N, C, d...] (or [C] with a 0-d target)."""
    if scores.ndim == 1:
        return 1 if target.ndim == 0 else None
    if scores.ndim < 2 or target.shape != scores.shape[:1] + scores.shape[2:]:
        return None
    return target.numel


def nll_loss(args: OpArgs) -> Cost | None:
    """`nll_loss_forward(self, target, weight, reduction, ignore_index)` and its wrappers."""
    scores, target = args.tensor(0), args.tensor(1)
    if scores is None or target is None:
        return None
    samples = _samples(scores, target)
    if samples is None:
        return None
    weight = args.tensor(2)
    out = samples if args.integer(3) == 0 else 1
    gathered = samples * (scores.itemsize + (weight.itemsize if weight is not None else 0))
    nbytes = target.nbytes + gathered + out * scores.itemsize
    flops = samples * (2 if weight is not None else 1)
    return make_cost(flops, nbytes, scores.dtype, MODEL)


def nll_loss_backward(args: OpArgs) -> Cost | None:
    """`nll_loss_backward(grad_output, self, target, weight, reduction, ignore_index,
    total_weight)`: the gradient of the scores, zero but for one value per sample, written."""
    grad, scores, target = args.tensor(0), args.tensor(1), args.tensor(2)
    if grad is None or scores is None or target is None or not args.clean:
        return None
    samples = _samples(scores, target)
    if samples is None:
        return None
    weight = args.tensor(3)
    total_weight = args.tensor(6)
    reads = grad.nbytes + target.nbytes + (total_weight.nbytes if total_weight else 0)
    reads += samples * weight.itemsize if weight is not None else 0
    flops = samples * (2 if weight is not None else 1)
    return make_cost(flops, reads + scores.nbytes, scores.dtype, MODEL)


def cross_entropy(args: OpArgs) -> Cost | None:
    """`cross_entropy_loss(self, target, weight, reduction, ignore_index, label_smoothing)`,
    with class-index or class-probability targets."""
    scores, target = args.tensor(0), args.tensor(1)
    if scores is None or target is None or not args.clean:
        return None
    flops = LOG_SOFTMAX_FLOPS * scores.numel
    weight = args.tensor(2)
    if category(target.dtype) >= 2:
        # Probabilities: a multiply-accumulate with every log-probability.
        if target.shape != scores.shape:
            return None
        samples = scores.numel // scores.shape[1] if scores.ndim >= 2 else 1
        flops += 2 * scores.numel
    else:
        found = _samples(scores, target)
        if found is None:
            return None
        samples = found
        flops += samples * (2 if weight is not None else 1)
        smoothing = args.number(5)
        if smoothing is not None and smoothing > 0:
            flops += 2 * scores.numel  # the mean over classes of the log-probabilities
    out = samples if args.integer(3) == 0 else 1
    nbytes = sum(t.nbytes for t in args.tensors()) + out * scores.itemsize
    return make_cost(flops, nbytes, scores.dtype, MODEL)


def pointwise_loss(op: str, args: OpArgs) -> Cost | None:
    """`mse_loss(self, target, reduction)` and the other elementwise losses; backward
    (`mse_loss_backward(grad_output, self, target, reduction)`) writes the input's gradient."""
    backward = op.endswith("_backward")
    first = 1 if backward else 0
    x, target = args.tensor(first), args.tensor(first + 1)
    if x is None or target is None or not args.clean:
        return None
    shape = broadcast([x.shape, target.shape])
    if shape is None:
        return None
    n = math.prod(shape)
    # Backward writes the input's gradient; forward one value, or one per element when
    # reduction is "none" (0).
    none = args.integer(_REDUCTION_AT.get(op, 2)) == 0
    out = x.numel if backward else n if none else 1
    nbytes = sum(t.nbytes for t in args.tensors()) + out * x.itemsize
    return make_cost(POINTWISE_FLOPS[op] * n, nbytes, x.dtype, MODEL)


_NLL_LOSS = ("nll_loss", "nll_loss_nd", "nll_loss_forward", "nll_loss2d", "nll_loss2d_forward")

MODELS: dict[str, Model] = {
    **{f"aten::{op}": nll_loss for op in _NLL_LOSS},
    "aten::nll_loss_backward": nll_loss_backward,
    "aten::nll_loss2d_backward": nll_loss_backward,
    "aten::cross_entropy_loss": cross_entropy,
    **{f"aten::{op}": partial(pointwise_loss, op) for op in POINTWISE_FLOPS},
}
