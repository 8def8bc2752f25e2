"""Normalisation layers: input elements × a per-element constant, as fvcore counts them.

Forward, per input element: computing the statistics and normalising (mean, subtract, square,
sum, scale) costs `STATS_FLOPS`, plus `AFFINE_FLOPS` when the layer has a weight; RMS norm
skips the mean (`RMS_FLOPS`); batch norm in eval mode only applies its folded scale and shift
(`EVAL_FLOPS`). Backward costs `BACKWARD_FACTOR` × forward. Bytes: every tensor argument read
once, the output (or, backward, the gradients the output mask asks for) written once; the
small per-row statistics that some forwards also write are left out.
"""

from __future__ import annotations

from functools import partial

import msgspec

from wallfinder.cost.base import Cost, Model, make_cost
from wallfinder.trace import OpArgs

MODEL = "norm"

STATS_FLOPS = 4
"""Per element: the mean (1), subtracting it (1), the variance (1: a square-accumulate counted
once, as fvcore does) and scaling by the reciprocal deviation (1)."""
RMS_FLOPS = 3
"""Per element: the square-accumulate of the mean square (1) and the scaling (1), and one for
the reduction tree and the reciprocal square root amortised over the row."""
EVAL_FLOPS = 1
"""Per element: batch norm in eval mode applies running statistics folded into one scale."""
AFFINE_FLOPS = 1
"""Per element: the weight and bias, one multiply-add (counted 1, as fvcore does)."""
BACKWARD_FACTOR = 2
"""Backward over forward: the input gradient needs the statistics again plus two row
reductions of the incoming gradient; the weight gradient one more reduction."""


class Signature(msgspec.Struct, frozen=True):
    kind: str  # "stats", "rms" or "batch" (stats when training, eval otherwise)
    input: int
    weight: int | None
    training: int | bool = True  # a position, or the fixed answer
    backward: bool = False
    mask: int | None = None  # position of the output mask
    grads: int = 2  # parameter gradients when the weight is present: weight (and bias)


def _per_element(sig: Signature, args: OpArgs, affine: bool) -> int:
    if sig.kind == "rms":
        base = RMS_FLOPS
    elif sig.kind == "batch":
        training = sig.training if isinstance(sig.training, bool) else args.flag(sig.training)
        # Unrecorded, training is assumed: batch norm layers mostly run in training steps.
        base = EVAL_FLOPS if training is False else STATS_FLOPS
    else:
        base = STATS_FLOPS
    return base + (AFFINE_FLOPS if affine else 0)


def norm(sig: Signature, args: OpArgs) -> Cost | None:
    x = args.tensor(sig.input)
    if x is None or not args.clean:
        return None
    weight = args.tensor(sig.weight) if sig.weight is not None else None
    flops = x.numel * _per_element(sig, args, weight is not None)
    reads = sum(t.nbytes for t in args.tensors())
    if not sig.backward:
        return make_cost(flops, reads + x.nbytes, x.dtype, MODEL)
    mask = args.flags(sig.mask) if sig.mask is not None else None
    writes = x.nbytes if mask is None or mask[:1] != (False,) else 0
    if weight is not None:
        # Without a mask every parameter gradient is assumed (the weights are trained).
        grads = sum(mask[1 : 1 + sig.grads]) if mask is not None else sig.grads
        writes += grads * weight.nbytes
    return make_cost(BACKWARD_FACTOR * flops, reads + writes, x.dtype, MODEL)


_BATCH = Signature("batch", input=0, weight=1, training=5)
_SIGNATURES: dict[str, Signature] = {
    # Positions from the ops' schemas in native_functions.yaml.
    "aten::layer_norm": Signature("stats", input=0, weight=2),
    "aten::native_layer_norm": Signature("stats", input=0, weight=2),
    "aten::native_layer_norm_backward": Signature(
        "stats", input=1, weight=5, backward=True, mask=7
    ),
    "aten::rms_norm": Signature("rms", input=0, weight=2),
    "aten::_fused_rms_norm": Signature("rms", input=0, weight=2),
    "aten::_fused_rms_norm_backward": Signature(
        "rms", input=1, weight=4, backward=True, mask=5, grads=1
    ),
    "aten::batch_norm": _BATCH,
    "aten::_batch_norm_impl_index": _BATCH,
    "aten::native_batch_norm": _BATCH,
    "aten::cudnn_batch_norm": _BATCH,
    "aten::miopen_batch_norm": _BATCH,
    "aten::_native_batch_norm_legit": _BATCH,
    "aten::_native_batch_norm_legit_no_training": Signature(
        "batch", input=0, weight=1, training=False
    ),
    # `_batch_norm_with_update(input, weight, bias, running_mean, running_var, momentum,
    # eps)`: the training form that torch.export and torch.compile record.
    "aten::_batch_norm_with_update": Signature("batch", input=0, weight=1, training=True),
    "aten::native_batch_norm_backward": Signature(
        "batch", input=1, weight=2, training=7, backward=True, mask=9
    ),
    "aten::cudnn_batch_norm_backward": Signature(
        "batch", input=0, weight=2, training=True, backward=True
    ),
    "aten::miopen_batch_norm_backward": Signature(
        "batch", input=0, weight=2, training=True, backward=True
    ),
    "aten::group_norm": Signature("stats", input=0, weight=2),
    "aten::native_group_norm": Signature("stats", input=0, weight=1),
    "aten::native_group_norm_backward": Signature(
        "stats", input=1, weight=4, backward=True, mask=9
    ),
    "aten::instance_norm": Signature("batch", input=0, weight=1, training=5),
}


def _legit(args: OpArgs) -> Cost | None:
    # `_native_batch_norm_legit.no_stats` has no running statistics: `training` moves to 3.
    sig = _BATCH if args.size in (8, 11) else Signature("batch", input=0, weight=1, training=3)
    return norm(sig, args)


MODELS: dict[str, Model] = {name: partial(norm, sig) for name, sig in _SIGNATURES.items()}
MODELS["aten::_native_batch_norm_legit"] = _legit
