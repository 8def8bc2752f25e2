"""What moves fp32 matmuls onto a device's tensor cores (matrix cores), from the dtypes the
device has peaks for: enabling TF32 is advice only where the device has TF32 (Ampere and
later, CDNA3); Volta and Turing tensor cores take fp16 only (autocast with a GradScaler), and
CDNA1/2 matrix cores have bf16 but no xf32. The catalogue's `peak_flops` says which a device
has, so no list of architecture names is kept here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple


class PrecisionFix(NamedTuple):
    """The dtype fp32 matmuls would run in on the tensor cores, and the fix that gets them
    there: `fix` in full (a finding's), `short` for a one-line note."""

    dtype: str
    fix: str
    short: str


# In order of preference: TF32 keeps fp32 tensors (one line of code, no loss scaling), bf16 needs
# no loss scaling, fp16 does.
_FIXES = (
    PrecisionFix(
        "tf32",
        "torch.backends.cuda.matmul.allow_tf32 = True (or torch.set_float32_matmul_precision"
        "('high')), or torch.autocast(dtype=torch.bfloat16); fp16 autocast with GradScaler on "
        "devices without TF32/bf16",
        "allow TF32 (torch.backends.cuda.matmul.allow_tf32 = True) or use bf16 autocast",
    ),
    PrecisionFix(
        "bf16",
        "bf16 autocast, torch.autocast(device_type, dtype=torch.bfloat16) (the device has no "
        "TF32; fp16 autocast with a GradScaler works too)",
        "use bf16 autocast",
    ),
    PrecisionFix(
        "fp16",
        "fp16 autocast with a GradScaler, torch.autocast(device_type, dtype=torch.float16) "
        "and torch.amp.GradScaler (the device's tensor cores take fp16 only: it has no TF32 "
        "or bf16)",
        "use fp16 autocast with a GradScaler (the device has no TF32 or bf16)",
    ),
)
_NO_PEAKS_FIX = PrecisionFix(
    "fp32",
    "use the tensor cores' dtype with torch.autocast (the device's spec names no tensor-core "
    "dtype: check its datasheet)",
    "use torch.autocast with the tensor cores' dtype",
)


def precision_fix(peak_flops: Mapping[str, float] | None) -> PrecisionFix:
    """The fix for fp32 matmuls that skip the tensor cores on a device with these peaks (the
    first of TF32, bf16, fp16 it has); `dtype` "fp32" when it has none of them."""
    have = peak_flops or {}
    return next((f for f in _FIXES if f.dtype in have), _NO_PEAKS_FIX)


def lower_precisions(peak_flops: Mapping[str, float] | None) -> str:
    """The lower precisions a matmul could train in on a device with these peaks, in words:
    bf16 where it has bf16 (else fp16, which needs a GradScaler), and fp8 (through
    `torch._scaled_mm`) only where it has fp8 peaks (Hopper, Ada, Blackwell, MI300 and later)."""
    have = peak_flops or {}
    words = ["bf16" if "bf16" in have else "fp16 with a GradScaler"]
    if "fp8" in have:
        words.append("fp8 with _scaled_mm")
    return ", ".join(words)
