"""Cost models: the FLOPs and bytes of one op call from its arguments' shapes and dtypes (as
its trace event recorded them, decoded by `Trace.op_args`, or as a user gives them), one small
model per kind of op.

Nothing is invented: an op with no model, or whose record lacks what its model needs, has no
cost (None), never an estimate. Each model's constants and assumptions are in its module's
docstring. The cost of an op is that of the op as a whole: a composite op (`aten::linear`,
`aten::conv2d`, `aten::cross_entropy_loss`, `aten::to`) costs what its children together do,
so sum costs over the ops that launch kernels, not over every op in a call tree.

    >>> op_cost("aten::mm", OpArgs.of([[64, 128], [128, 256]], ["bf16", "bf16"]))
    Cost(flops=4194304.0, bytes=114688.0, dtype='bf16', model='gemm')
"""

from __future__ import annotations

from wallfinder.cost import (
    attention,
    conv,
    copies,
    elementwise,
    embedding,
    gemm,
    loss,
    norm,
    optimizer,
    reduction,
    softmax,
)
from wallfinder.cost.base import Cost, Model
from wallfinder.dtypes import ELEMENT_BYTES
from wallfinder.trace import OpArgs

__all__ = ["ELEMENT_BYTES", "Cost", "OpArgs", "op_cost", "supported_ops"]

_MODELS: dict[str, Model] = {
    **elementwise.MODELS,
    **reduction.MODELS,
    **copies.MODELS,
    **optimizer.MODELS,
    **loss.MODELS,
    **embedding.MODELS,
    **softmax.MODELS,
    **norm.MODELS,
    **attention.MODELS,
    **conv.MODELS,
    **gemm.MODELS,
}


def op_cost(name: str, args: OpArgs | None) -> Cost | None:
    """The cost of one call of op `name` (as Kineto names it, e.g. "aten::mm") on `args`: its
    arguments' shapes and dtypes, from `Trace.op_args` or `OpArgs.of`.

    None when the op has no model or the arguments do not say enough (None, shapes that do
    not fit the op, numbers too large for a float). Never raises. Callers cost each distinct
    record once (a trace's records are decoded once each), so nothing is cached here.
    """
    if not isinstance(name, str) or not isinstance(args, OpArgs):
        return None
    model = _MODELS.get(name)
    if model is None:
        return None
    try:
        return model(args)
    except (ArithmeticError, LookupError, ValueError, TypeError):
        # A record that is well-formed JSON yet nonsense for its op (a zero-sized group,
        # sizes whose product no float holds) means no cost; the models guard against the
        # cases they know, and this keeps a trace's analysis alive through the ones they miss.
        return None


def supported_ops() -> frozenset[str]:
    """The op names `op_cost` has a model for."""
    return frozenset(_MODELS)
