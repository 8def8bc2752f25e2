"""The device spec record, the dtypes it has peaks for, and dtype names as traces spell them."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

Vendor = Literal["nvidia", "amd", "cpu", "other"]
VENDORS: tuple[Vendor, ...] = ("nvidia", "amd", "cpu", "other")

DTYPES: tuple[str, ...] = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8")
"""The dtypes a device has peaks for. fp32 is the rate without tensor cores; tf32, bf16, fp16,
fp8 and int8 are tensor-core (matrix-core) rates; int8 is in OP/s."""

_DTYPE_NAMES: dict[str, str] = {
    # fp64
    "double": "fp64",
    "float64": "fp64",
    "fp64": "fp64",
    "f64": "fp64",
    # fp32: "float" is how the profiler's `Input type` spells it
    "float": "fp32",
    "float32": "fp32",
    "fp32": "fp32",
    "f32": "fp32",
    # tf32 is never a tensor dtype, only a math mode a user names
    "tf32": "tf32",
    "tensorfloat32": "tf32",
    "tensorfloat-32": "tf32",
    # bf16
    "bfloat16": "bf16",
    "bf16": "bf16",
    # fp16
    "half": "fp16",
    "float16": "fp16",
    "fp16": "fp16",
    "f16": "fp16",
    # int8: torch's int8 is C++ `signed char`; `unsigned char` (uint8) has no int8 peak
    "signed char": "int8",
    "int8": "int8",
    "i8": "int8",
}

# Every float8 variant (e4m3fn, e5m2, the fnuz ones, e8m0fnu) runs on the same fp8 units.
_FP8_PREFIXES = ("float8", "fp8", "e4m3", "e5m2")

_NAMESPACES = ("c10::", "at::", "torch.")


def normalize_dtype(text: str) -> str | None:
    """The canonical dtype (one of `DTYPES`) for a name seen in a trace or typed by a user:
    ``"float"`` → ``"fp32"``, ``"c10::BFloat16"`` → ``"bf16"``, ``"c10::Half"`` → ``"fp16"``,
    ``"c10::Float8_e4m3fn"`` → ``"fp8"``, ``"signed char"`` → ``"int8"``; None for anything
    else (integers other than int8, complex, bool, empty)."""
    name = " ".join(text.strip().lower().split())
    for namespace in _NAMESPACES:
        if name.startswith(namespace):
            name = name[len(namespace) :]
    if name.startswith(_FP8_PREFIXES):
        return "fp8"
    return _DTYPE_NAMES.get(name)


@dataclass(frozen=True, kw_only=True, repr=False)
class DeviceSpec:
    """What one device can do: dense peak rates per dtype, memory, caches and links.

    Rates are per second: `peak_flops` in FLOP/s (int8 in OP/s), `mem_bandwidth` and
    `interconnect` in bytes/s (aggregate bidirectional, as vendors quote links). `source` says
    where the figures come from: ``"datasheet: ..."``, ``"estimate: ..."``, ``"user file:
    NAME"`` or ``"calibrated"``; `estimate` is true when they are not a datasheet's.
    """

    key: str
    name: str
    vendor: Vendor
    peak_flops: Mapping[str, float]
    mem_bandwidth: float
    mem_bytes: float | None = None
    sm_count: int | None = None
    """Streaming multiprocessors (NVIDIA) or compute units (AMD)."""
    l2_bytes: float | None = None
    interconnect: Mapping[str, float] = field(default_factory=dict)
    tensor_cores: bool = False
    """Whether the device has matrix units (NVIDIA tensor cores, AMD matrix cores)."""
    source: str
    estimate: bool = False
    pcie_gen: int | None = None
    names: tuple[str, ...] = ()
    """The names `torch.cuda.get_device_properties().name` reports for this device."""

    def __post_init__(self) -> None:
        # Read-only copies: the catalogue's specs are shared by every caller.
        object.__setattr__(self, "peak_flops", MappingProxyType(dict(self.peak_flops)))
        object.__setattr__(self, "interconnect", MappingProxyType(dict(self.interconnect)))
        object.__setattr__(self, "names", tuple(self.names))
        unknown = sorted(set(self.peak_flops) - set(DTYPES))
        if unknown:
            raise ValueError(f"unknown dtypes {unknown} in peak_flops (known: {DTYPES})")
        rates = [self.mem_bandwidth, *self.peak_flops.values(), *self.interconnect.values()]
        if not all(math.isfinite(r) and r > 0 for r in rates):
            raise ValueError(f"{self.key}: rates must be positive and finite")

    def __hash__(self) -> int:
        return hash((self.key, self.source, tuple(sorted(self.peak_flops.items()))))

    def __repr__(self) -> str:
        return f"DeviceSpec(key={self.key!r}, name={self.name!r}, source={self.source!r})"

    def peak(self, dtype: str) -> float | None:
        """Dense peak rate for `dtype` (any name `normalize_dtype` knows), or None when the
        device has no published peak for it."""
        canonical = normalize_dtype(dtype)
        return None if canonical is None else self.peak_flops.get(canonical)

    def ridge(self, dtype: str) -> float | None:
        """The roofline's ridge point for `dtype`: peak / memory bandwidth, in FLOP per byte.
        Kernels with a lower arithmetic intensity are bound by memory bandwidth."""
        peak = self.peak(dtype)
        return None if peak is None else peak / self.mem_bandwidth

    def attainable(self, ai: float, dtype: str) -> float | None:
        """The roofline: attainable FLOP/s at arithmetic intensity `ai` (FLOP per byte),
        min(peak, ai × bandwidth); None when the device has no peak for `dtype`."""
        if not ai >= 0:  # also refuses NaN
            raise ValueError(f"arithmetic intensity must be >= 0, got {ai}")
        peak = self.peak(dtype)
        return None if peak is None else min(peak, ai * self.mem_bandwidth)
