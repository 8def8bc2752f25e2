"""Which device a trace ran on when its name does not say: inference from what else it holds,
always said as inference (`DeviceSpec.matched` starts "inferred from").

The name comes first (`match_device`). Where it is missing, generic ("AMD Radeon Graphics",
"AMD Instinct MI250X/MI250", a bare PCI id) or a model the catalogue knows in several variants
("NVIDIA H100" with no form factor), the candidates are narrowed by:

- deviceProperties: SM/CU count (`numSms`), memory (`totalGlobalMem`), compute capability
  (`computeMajor`.`computeMinor`; ROCm reports gfx942 as 9.4), warp size (64: an AMD CDNA GPU);
- architecture tags in kernel names: AMD's Tensile/hipBLASLt kernels carry the exact target
  (`ISA942`, `gfx90a`); NVIDIA's carry the architecture they were built for (`sm80_xmma`,
  `sm90_xmma`, `sm100`), which is a floor — an sm80 kernel runs on a Hopper — except from sm90
  on, where the kernels use instructions of that architecture only (wgmma, tcgen05).

One candidate left: that device. Several: the one with the lowest peaks (the conservative
choice: it never promises headroom the device may not have), the others named. Nothing left, or
nothing to narrow by: no device, and the report says it is unknown.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import TYPE_CHECKING

import msgspec

from wallfinder.hardware._catalog import (
    _AMBIGUOUS,
    _MIG,
    _Spelling,
    all_specs,
    match_device,
    normalize_name,
)
from wallfinder.hardware._spec import DeviceSpec

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

_GIB = 2**30
_MEMORY_FIT = (0.90, 1.02)
"""The share of the datasheet's memory a driver may report (reserved memory, ECC, GB vs GiB)."""
_AMD_TAG = re.compile(
    r"(?<![A-Za-z0-9])(?:ISA|gfx)(9[0-9][0-9a-f]|1[0-2][0-9][0-9a-f])(?![0-9a-z])"
)
_NVIDIA_TAG = re.compile(r"(?<![A-Za-z0-9])sm_?([1-9][0-9]{1,2})[af]?(?![0-9])", re.IGNORECASE)
_NVIDIA_EXACT_FROM = 90
"""From sm90 on, an arch-tagged NVIDIA kernel runs only on that architecture (wgmma, tcgen05)."""
_NOT_A_BOARD = ("laptop", "mobile", "max q", "max-q")
"""Words of a name whose board runs at other clocks than the catalogue's: no model inference."""
_GENERIC = re.compile(r"^(?:graphics device|device [0-9a-f]{4}|gpu|cuda gpu|radeon graphics)$")


class DeviceEvidence(msgspec.Struct, frozen=True):
    """What a trace says about its device, as far as it says it."""

    name: str | None = None
    sm_count: int | None = None
    mem_bytes: float | None = None
    compute_capability: tuple[int, int] | None = None
    warp_size: int | None = None
    amd_targets: tuple[str, ...] = ()
    """gfx targets named in kernel names ("gfx942")."""
    nvidia_arch: int | None = None
    """The highest NVIDIA architecture named in kernel names (80 for sm80)."""


def evidence_of(
    name: str | None, properties: Mapping[str, object], kernel_names: Iterable[str]
) -> DeviceEvidence:
    """The device evidence of a trace: its device name, one device's `deviceProperties` and
    its distinct kernel names (for the architecture tags they carry)."""
    amd: set[str] = set()
    nvidia: list[int] = []
    for kernel in kernel_names:
        amd.update(m.lower() for m in _AMD_TAG.findall(kernel))
        nvidia.extend(int(m) for m in _NVIDIA_TAG.findall(kernel))
    major, minor = properties.get("computeMajor"), properties.get("computeMinor")
    return DeviceEvidence(
        name=name,
        sm_count=_positive_int(properties.get("numSms")),
        mem_bytes=_positive_int(properties.get("totalGlobalMem")),
        compute_capability=(major, minor)
        if isinstance(major, int) and isinstance(minor, int) and major > 0
        else None,
        warp_size=_positive_int(properties.get("warpSize")),
        amd_targets=tuple(f"gfx{t}" for t in sorted(amd)),
        nvidia_arch=max(nvidia) if nvidia else None,
    )


def _positive_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def identify_device(evidence: DeviceEvidence) -> DeviceSpec | None:
    """The spec for the device `evidence` describes: by its name when the name says which
    device it is (`match_device`), else inferred as this module's docstring says, with
    `DeviceSpec.matched` saying from what. None when neither is possible."""
    name = (evidence.name or "").strip()
    if name:
        spec = match_device(name, sm_count=evidence.sm_count)
        if spec is not None:
            return spec
    normalized = normalize_name(name)
    lowered = name.lower()
    if any(word in lowered for word in _NOT_A_BOARD) or _MIG.search(name):
        return None  # other clocks, or a slice of a GPU the catalogue does not know
    model = _Spelling.of(normalized).model
    generic = not normalized or normalized in _AMBIGUOUS or bool(_GENERIC.match(normalized))
    if generic:
        candidates = [s for s in all_specs() if s.vendor in ("nvidia", "amd")]
        said = f"{name!r} names no one product; " if name else "the trace names no device; "
    elif model is not None:
        candidates = _of_model(model)
        said = f"{name!r} is not a name in the catalogue; "
    else:
        return None
    e = evidence
    # An sm80 kernel runs on every NVIDIA GPU since Ampere: alone, too weak to name one.
    exact_tag = e.nvidia_arch is not None and e.nvidia_arch >= _NVIDIA_EXACT_FROM
    strong = e.compute_capability or e.amd_targets or exact_tag or e.sm_count
    if not candidates or (generic and not strong):
        return None
    kept, clues = _narrow(candidates, evidence)
    if not kept:
        return None
    if not generic:
        clues.insert(0, f"its model {model.upper() if model else '?'}")
    return _choose(kept, said, clues)


def _of_model(model: str) -> list[DeviceSpec]:
    found: dict[str, DeviceSpec] = {}
    for spec in all_specs():
        if spec.vendor == "cpu":
            continue
        spellings = {normalize_name(n) for n in (*spec.names, spec.name, spec.key)}
        if any(_Spelling.of(s).model == model for s in spellings):
            found.setdefault(spec.key, spec)
    return list(found.values())


def _narrow(candidates: list[DeviceSpec], e: DeviceEvidence) -> tuple[list[DeviceSpec], list[str]]:
    """The candidates every clue fits, and the clues used, in words."""
    clues: list[str] = []
    kept = candidates
    vendor = _vendor(e)
    if vendor is not None:
        kept = [s for s in kept if s.vendor == vendor]
    if e.warp_size is not None and vendor == "amd":
        # ROCm reports wave64 on Instinct (CDNA, gfx9) and wave32 on Radeon (RDNA).
        cdna = e.warp_size == 64
        kept = [s for s in kept if (s.arch or "").startswith("gfx9") == cdna]
        clues.append(f"warp size {e.warp_size}")
    if e.compute_capability is not None:
        major, minor = e.compute_capability
        kept = [s for s in kept if _capability(s) == (major, minor)]
        word = "gfx" if vendor == "amd" else "compute capability "
        clues.append(f"{word}{major}.{minor}")
    if e.amd_targets:
        kept = [s for s in kept if s.arch in e.amd_targets]
        clues.append(f"kernel names built for {', '.join(e.amd_targets)}")
    elif e.nvidia_arch is not None and vendor != "amd":
        floor = (e.nvidia_arch // 10, e.nvidia_arch % 10)
        exact = e.nvidia_arch >= _NVIDIA_EXACT_FROM
        kept = [
            s
            for s in kept
            if (c := _capability(s)) is not None
            and (c[0] == floor[0] if exact else c >= floor)
            and s.vendor == "nvidia"
        ]
        clues.append(f"kernel names built for sm_{e.nvidia_arch}" + ("" if exact else " or later"))
    if e.sm_count is not None:
        unit = "compute units" if vendor == "amd" else "SMs"
        kept = _prefer_known(kept, lambda s: s.sm_count, lambda n: n == e.sm_count)
        clues.append(f"{e.sm_count} {unit}")
    if e.mem_bytes is not None and kept:
        low, high = _MEMORY_FIT
        mem = e.mem_bytes
        kept = _prefer_known(kept, lambda s: s.mem_bytes, lambda m: low <= mem / m <= high)
        clues.append(f"{mem / _GIB:.1f} GiB of memory")
    return kept, clues


def _prefer_known(
    specs: list[DeviceSpec],
    figure: Callable[[DeviceSpec], float | None],
    fits: Callable[[float], bool],
) -> list[DeviceSpec]:
    """The specs whose figure fits; a spec that does not publish the figure is kept only when
    none that publishes it fits (it cannot be ruled out, nor preferred)."""
    fitting = [s for s in specs if (v := figure(s)) is not None and fits(v)]
    return fitting or [s for s in specs if figure(s) is None]


def _vendor(e: DeviceEvidence) -> str | None:
    words = set(re.split(r"[\s/_-]+", (e.name or "").lower()))
    if e.warp_size == 64 or e.amd_targets or words & {"amd", "radeon", "instinct"}:
        return "amd"
    if e.nvidia_arch is not None or words & {"nvidia", "tesla", "geforce", "quadro"}:
        return "nvidia"
    return None


def _capability(spec: DeviceSpec) -> tuple[int, int] | None:
    """A spec's architecture as deviceProperties report it: (8, 0) for "8.0", (9, 4) for
    "gfx942" (ROCm: the gfx major, then the first digit after it)."""
    arch = spec.arch or ""
    nvidia = re.fullmatch(r"(\d+)\.(\d+)", arch)
    if nvidia:
        return int(nvidia.group(1)), int(nvidia.group(2))
    amd = re.fullmatch(r"gfx(\d{1,2})([0-9a-f])[0-9a-f]", arch)
    if amd:
        return int(amd.group(1)), int(amd.group(2), 16)
    return None


def _headline_peak(spec: DeviceSpec) -> float:
    for dtype in ("bf16", "fp16", "fp32"):
        peak = spec.peak(dtype)
        if peak is not None:
            return peak
    return max(spec.peak_flops.values())


def _choose(kept: list[DeviceSpec], said: str, clues: list[str]) -> DeviceSpec:
    ordered = sorted(kept, key=lambda s: (_headline_peak(s), s.mem_bandwidth, s.key))
    chosen = ordered[0]
    why = f"{said}inferred from {', '.join(clues) if clues else 'the name alone'}"
    if len(ordered) > 1:
        others = ", ".join(s.key for s in ordered[1:])
        why += f"; also fit: {others} — took {chosen.key}, the lowest peaks"
    return replace(chosen, matched=why)
