"""Scaled-dot-product attention, forward and backward, as flop_counter counts it, with the
causal mask taken into account.

Forward: two batched matmuls, Q·Kᵀ and P·V: 2·B·Hq·Sq·Sk·(D + Dv), i.e. 4·B·H·Sq·Sk·D.
Backward: five (the scores recomputed, then dV, dP, dQ, dK): 2·B·Hq·Sq·Sk·(3·D + 2·Dv), 2.5×
forward. Grouped-query attention (K and V with fewer heads than Q) costs as many heads as Q has.
A causal mask halves both (flop_counter ignores it; the kernels skip the masked blocks). The
causal flag comes from `Concrete Inputs`; without it the attention counts as full.

Variable-length calls (`cum_seq_q` given: packed sequences whose lengths live in a tensor's
values, not its shape) have no cost: their FLOPs cannot be known from the record.
"""

from __future__ import annotations

import math
from functools import partial

import msgspec

from wallfinder.cost.base import Cost, Model, make_cost
from wallfinder.trace import OpArgs, Tensor

MODEL = "attention"


class Signature(msgspec.Struct, frozen=True):
    """How an attention op lays out its arguments."""

    backward: bool
    causal: int  # position of is_causal (or of custom_mask_type when `mask_type`)
    heads_first: bool = True  # [B, H, S, D]; False: [B, S, H, D] (the flash/xformers kernels)
    mask_type: bool = False  # causal is an int mask type (0: none, 1-2: causal)
    varlen: int | None = None  # position of the cumulative sequence lengths, when the op has it
    quantized: tuple[int, int] | None = None  # (argument count, causal position) of an overload


class Dims(msgspec.Struct, frozen=True):
    batch: int  # B, times any extra leading dimensions
    heads: int  # query heads
    kv_heads: int
    sq: int
    sk: int
    d: int
    dv: int


def _dims(sig: Signature, q: Tensor, k: Tensor, v: Tensor) -> Dims | None:
    if sig.heads_first:
        if q.ndim < 3 or not q.ndim == k.ndim == v.ndim:
            return None
        lead = q.shape[:-3]
        if k.shape[:-3] != lead or v.shape[:-3] != lead:
            return None
        (hq, sq, d), (hk, sk, dk), (hv, sv, dv) = q.shape[-3:], k.shape[-3:], v.shape[-3:]
    else:
        if not q.ndim == k.ndim == v.ndim == 4 or not q.shape[0] == k.shape[0] == v.shape[0]:
            return None
        lead = q.shape[:1]
        (sq, hq, d), (sk, hk, dk), (sv, hv, dv) = q.shape[1:], k.shape[1:], v.shape[1:]
    if d != dk or sk != sv or hk != hv or hk == 0 or hq % hk != 0:
        return None
    return Dims(math.prod(lead), hq, hk, sq, sk, d, dv)


def attention(sig: Signature, args: OpArgs) -> Cost | None:
    first = 1 if sig.backward else 0
    q, k, v = args.tensor(first), args.tensor(first + 1), args.tensor(first + 2)
    if q is None or k is None or v is None or not args.clean:
        return None
    if sig.varlen is not None and args.tensor(sig.varlen) is not None:
        return None
    dims = _dims(sig, q, k, v)
    if dims is None:
        return None
    scores = dims.batch * dims.heads * dims.sq * dims.sk
    if sig.backward:
        flops = 2 * scores * (3 * dims.d + 2 * dims.dv)
        writes = q.nbytes + k.nbytes + v.nbytes  # dQ, dK, dV
    else:
        flops = 2 * scores * (dims.d + dims.dv)
        writes = dims.batch * dims.heads * dims.sq * dims.dv * q.itemsize
    at = sig.causal
    if sig.quantized is not None and args.size == sig.quantized[0]:
        at = sig.quantized[1]
    if sig.mask_type:
        mask_type = args.integer(at)
        causal = mask_type is not None and mask_type != 0
    else:
        causal = args.flag(at) is True
    reads = sum(t.nbytes for t in args.tensors())
    return make_cost(flops / 2 if causal else flops, reads + writes, q.dtype, MODEL)


_SIGNATURES: dict[str, Signature] = {
    # Positions from the ops' schemas in native_functions.yaml.
    "aten::scaled_dot_product_attention": Signature(backward=False, causal=5),
    "aten::_scaled_dot_product_flash_attention": Signature(
        backward=False, causal=4, quantized=(10, 7)
    ),
    "aten::_scaled_dot_product_flash_attention_for_cpu": Signature(backward=False, causal=4),
    "aten::_scaled_dot_product_efficient_attention": Signature(backward=False, causal=6),
    "aten::_scaled_dot_product_cudnn_attention": Signature(backward=False, causal=6),
    "aten::_scaled_dot_product_fused_attention_overrideable": Signature(backward=False, causal=5),
    "aten::_flash_attention_forward": Signature(
        backward=False, causal=8, heads_first=False, varlen=3
    ),
    "aten::_efficient_attention_forward": Signature(
        backward=False, causal=9, heads_first=False, mask_type=True, varlen=4
    ),
    "aten::_scaled_dot_product_flash_attention_backward": Signature(backward=True, causal=11),
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": Signature(
        backward=True, causal=7
    ),
    "aten::_scaled_dot_product_efficient_attention_backward": Signature(backward=True, causal=11),
    "aten::_scaled_dot_product_cudnn_attention_backward": Signature(backward=True, causal=14),
    "aten::_scaled_dot_product_fused_attention_overrideable_backward": Signature(
        backward=True, causal=13
    ),
    "aten::_flash_attention_backward": Signature(
        backward=True, causal=11, heads_first=False, varlen=6
    ),
    "aten::_efficient_attention_backward": Signature(
        backward=True, causal=14, heads_first=False, mask_type=True, varlen=6
    ),
}

MODELS: dict[str, Model] = {name: partial(attention, sig) for name, sig in _SIGNATURES.items()}
