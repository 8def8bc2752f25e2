"""Cost models: the FLOPs and bytes of one op call from the shapes and dtypes its trace event
recorded (`Input Dims`, `Input type`, `Concrete Inputs`), one small model per kind of op.

Nothing is invented: an op with no model, or whose record lacks what its model needs, has no
cost (None), never an estimate. Each model's constants and assumptions are in its module's
docstring. The cost of an op is that of the op as a whole: a composite op (`aten::linear`,
`aten::conv2d`, `aten::cross_entropy_loss`, `aten::to`) costs what its children together do,
so sum costs over the ops that launch kernels, not over every op in a call tree.

    >>> op_cost("aten::mm", b"[[64, 128], [128, 256]]", b'["c10::BFloat16", "c10::BFloat16"]')
    Cost(flops=4194304.0, bytes=114688.0, dtype='bf16', model='gemm')
"""

from __future__ import annotations

import functools

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
from wallfinder.cost.base import Cost, Model, parse_args
from wallfinder.cost.dtypes import ELEMENT_BYTES

__all__ = ["ELEMENT_BYTES", "Cost", "op_cost", "supported_ops"]

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

_CACHE_SIZE = 1 << 16


def op_cost(
    name: str, input_dims: bytes, input_type: bytes, concrete_inputs: bytes = b""
) -> Cost | None:
    """The cost of one call of op `name` (as Kineto names it, e.g. "aten::mm") from the raw
    JSON of its `Input Dims`, `Input type` and, when recorded, `Concrete Inputs`.

    None when the op has no model or the record does not say enough: missing or malformed
    shapes, shapes that do not fit the op, numbers too large for a float. Never raises.
    Results are cached, since traces repeat the same calls many times.
    """
    if not (
        isinstance(name, str)
        and isinstance(input_dims, bytes)
        and isinstance(input_type, bytes)
        and isinstance(concrete_inputs, bytes)
    ):
        return None
    return _cached_cost(name, input_dims, input_type, concrete_inputs)


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _cached_cost(name: str, input_dims: bytes, input_type: bytes, concrete: bytes) -> Cost | None:
    model = _MODELS.get(name)
    if model is None:
        return None
    args = parse_args(input_dims, input_type, concrete)
    if args is None:
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
