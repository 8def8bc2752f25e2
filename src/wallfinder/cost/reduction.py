"""Reductions (sum, mean, max, var, norms, ...): input elements × a per-element constant.

Bytes: the input read once and the output written once. The output's size needs the reduced
dimensions from `Concrete Inputs`; when they are not recorded it is left out (a lower bound:
a reduction's output is usually far smaller than its input).
"""

from __future__ import annotations

import math
from functools import partial

from wallfinder.cost.base import Cost, Model, make_cost
from wallfinder.cost.elementwise import FLOPS_PER_ELEMENT, TRANSCENDENTAL_FLOPS, pointwise
from wallfinder.dtypes import ELEMENT_BYTES, category
from wallfinder.trace import OpArgs, Tensor

MODEL = "reduction"

FLOPS_PER_ELEMENT_REDUCED: dict[str, int] = {
    **dict.fromkeys(("sum", "nansum", "mean", "nanmean", "prod", "any", "all"), 1),
    **dict.fromkeys(("amax", "amin", "max", "min", "argmax", "argmin"), 1),
    **dict.fromkeys(["var", "std"], 3),  # subtract the mean, square, accumulate
    **dict.fromkeys(["var_mean", "std_mean"], 4),  # and the mean's own accumulate
    **dict.fromkeys(["norm", "linalg_vector_norm"], 2),  # |x|^p and accumulate
    "logsumexp": TRANSCENDENTAL_FLOPS + 3,  # max, subtract, exp, accumulate
}
"""FLOPs per input element of each reduction."""

_TWO_OUTPUTS = frozenset(["var_mean", "std_mean"])
# Overloads whose second argument, when there are only two, is a dtype or a flag, not dims.
_DTYPE_SECOND = frozenset(["sum", "nansum", "mean", "prod", "var", "std", "var_mean", "std_mean"])
_DIM_AT = {"norm": 2, "linalg_vector_norm": 2}  # where `dim` is; 1 for the others


def _out_numel(x: Tensor, dims: tuple[int, ...] | None, full: bool) -> int | None:
    """Elements of the output; None when the dimensions are not known or out of range."""
    if full or dims == ():
        return 1
    if dims is None:
        return None
    kept = list(x.shape) if x.ndim else [1]
    for d in dims:
        if not -len(kept) <= d < len(kept):
            return None
        kept[d] = 1
    return math.prod(kept)


def reduction(op: str, args: OpArgs) -> Cost | None:
    x = args.tensor(0)
    if x is None:
        return None
    at = _DIM_AT.get(op, 1)
    # No dim argument (max(self), sum(self, dtype), var(self, unbiased)) or dim=None: a full
    # reduction.
    full = (
        args.size <= at
        or (args.size == 2 and op in _DTYPE_SECOND)
        or (args.has_concrete() and args.text(at) in (None, "True", "False"))
    )
    if op in ("max", "min") and not full and args.integer(at) is not None:
        # max.dim(self, dim, keepdim) also returns the indices.
        outputs = [x.dtype, "int64"]
    elif op in _TWO_OUTPUTS:
        outputs = [x.dtype, x.dtype]
    elif op in ("argmax", "argmin"):
        outputs = ["int64"]
    elif op in ("any", "all"):
        outputs = ["bool"]
    elif op in ("sum", "prod", "nansum") and category(x.dtype) < 2:
        outputs = ["int64"]  # integer and bool sums accumulate in int64
    else:
        outputs = [x.dtype]
    n = _out_numel(x, args.ints(at), full)
    if n is None and args.has_concrete():
        return None  # the dims were recorded but make no sense for this input
    writes = (n or 0) * sum(ELEMENT_BYTES[d] for d in outputs)
    flops = FLOPS_PER_ELEMENT_REDUCED[op] * x.numel
    return make_cost(flops, x.nbytes + writes, x.dtype, MODEL)


def max_min(op: str, args: OpArgs) -> Cost | None:
    """`max`/`min`: a reduction, or with a second tensor (`max.other`) a pointwise maximum."""
    if args.tensor(1) is not None:
        result = pointwise(args, FLOPS_PER_ELEMENT["maximum"], inplace=False)
        return None if result is None else make_cost(*result, "elementwise")
    return reduction(op, args)


MODELS: dict[str, Model] = {
    f"aten::{op}": partial(max_min if op in ("max", "min") else reduction, op)
    for op in FLOPS_PER_ELEMENT_REDUCED
}
