"""The device spec record and the dtypes it has peaks for."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from wallfinder.dtypes import PEAK_DTYPES, peak_dtype

Vendor = Literal["nvidia", "amd", "cpu", "other"]
VENDORS: tuple[Vendor, ...] = ("nvidia", "amd", "cpu", "other")

DTYPES = PEAK_DTYPES
"""The dtypes a device has peaks for (see `wallfinder.dtypes.PEAK_DTYPES`)."""

normalize_dtype = peak_dtype
"""The canonical dtype (one of `DTYPES`) of a name seen in a trace or typed by a user, or None
(`wallfinder.dtypes.peak_dtype`)."""


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
    l2_bandwidth: float | None = None
    """L2 read bandwidth, bytes/s: derived from a whitepaper's bytes per clock × boost clock
    (the catalogue says so per entry); None where not published (`l2_roof` estimates it)."""
    interconnect: Mapping[str, float] = field(default_factory=dict)
    tensor_cores: bool = False
    """Whether the device has matrix units (NVIDIA tensor cores, AMD matrix cores)."""
    source: str
    estimate: bool = False
    pcie_gen: int | None = None
    names: tuple[str, ...] = ()
    """The names `torch.cuda.get_device_properties().name` reports for this device."""
    arch: str | None = None
    """NVIDIA's compute capability ("9.0") or AMD's LLVM target ("gfx942")."""
    matched: str | None = None
    """How this spec was chosen for a trace or a request when the device's own name did not
    say it: a family name taken as its common variant, a MIG slice, or inference from the
    trace ("inferred from ..."). None when the name is the device's own."""

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

    def l2_roof(self) -> tuple[float, bool] | None:
        """The bandwidth a working set that fits in L2 sees, and whether it is an estimate
        (twice the memory bandwidth, where no L2 bandwidth is known); None without an L2
        size."""
        if not self.l2_bytes:
            return None
        if self.l2_bandwidth:
            return self.l2_bandwidth, False
        return 2.0 * self.mem_bandwidth, True

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
