"""The built-in catalogue (specs.toml, read once) and matching a trace's device name to it.

Matching never guesses: a name matches a device when it is one of the device's names, when it
equals one after normalising spelling (case, separators, vendor prefixes, a virtual-function
suffix), or when it is one of them with a memory size added and that size is the device's.
Anything else — another board of the same family, a MIG slice, a name ROCm gives several
products — is no match, and the report says the device is unknown.
"""

from __future__ import annotations

import difflib
import functools
import re
from dataclasses import dataclass
from importlib import resources

from wallfinder.errors import WallfinderError
from wallfinder.hardware._spec import DeviceSpec
from wallfinder.hardware._toml import EntryError, parse_toml, spec_from_entry

_PACKAGE = "wallfinder.hardware"
_SPECS_FILE = "specs.toml"

# Words that say who made the device, not which device it is.
_VENDOR_WORDS = frozenset({"nvidia", "tesla", "geforce", "amd", "instinct"})
# SR-IOV virtual functions ("AMD Instinct MI300X VF") are the device itself.
_VIRTUAL_FUNCTION = "vf"
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)gb$")
_MEMORY_KIND = re.compile(r"^(hbm\d?e?|gddr\d+x?)$")
_SIZE_TOLERANCE = 0.05
_GIB = 2**30


@dataclass(frozen=True)
class _Ambiguous:
    why: str
    keys: tuple[str, ...]
    by_unit_count: bool
    """Whether the SM/CU count tells the candidates apart (only when the name already
    narrowed the device to these candidates)."""


# Names (normalised) that several products report. Never matched on the name alone.
_AMBIGUOUS: dict[str, _Ambiguous] = {
    "radeon graphics": _Ambiguous(
        "ROCm's generic name for an AMD GPU it has no product name for, e.g. a GCD of an "
        "MI250 or MI250X",
        ("mi250", "mi250x", "mi210"),
        by_unit_count=False,
    ),
    "mi250x mi250": _Ambiguous(
        "ROCm's name for a GCD of either an MI250 or an MI250X",
        ("mi250", "mi250x"),
        by_unit_count=True,
    ),
}


def normalize_name(name: str) -> str:
    """A device name in one spelling: lower case, one space between words, no vendor words,
    no virtual-function suffix, sizes as ``80gb``."""
    text = re.sub(r"[\s_\-/,]+", " ", name.strip().lower())
    text = re.sub(r"\b(\d+(?:\.\d+)?) gb\b", r"\1gb", text)
    words = text.split()
    while words and words[0] in _VENDOR_WORDS:
        words.pop(0)
    if len(words) > 1 and words[-1] == _VIRTUAL_FUNCTION:
        words.pop()
    return " ".join(words)


@dataclass(frozen=True)
class _Spelling:
    """A normalised name split into what identifies the board and its memory words."""

    base: tuple[str, ...]
    sizes: tuple[float, ...]
    kinds: tuple[str, ...]

    @classmethod
    def of(cls, normalized: str) -> _Spelling:
        base: list[str] = []
        sizes: list[float] = []
        kinds: list[str] = []
        for word in normalized.split():
            size = _SIZE.match(word)
            if size:
                sizes.append(float(size.group(1)))
            elif _MEMORY_KIND.match(word):
                kinds.append(word)
            else:
                base.append(word)
        return cls(tuple(base), tuple(sizes), tuple(kinds))


@dataclass(frozen=True)
class _Catalog:
    specs: tuple[DeviceSpec, ...]
    by_key: dict[str, DeviceSpec]
    by_name: dict[str, DeviceSpec]
    by_normalized: dict[str, DeviceSpec]
    spellings: tuple[tuple[_Spelling, DeviceSpec], ...]


@functools.cache
def _catalog() -> _Catalog:
    text = resources.files(_PACKAGE).joinpath(_SPECS_FILE).read_text(encoding="utf-8")
    devices = parse_toml(text, _SPECS_FILE).get("devices")
    if not isinstance(devices, dict):
        raise WallfinderError(f"{_SPECS_FILE}: no [devices.<key>] tables")
    specs = [_builtin(key, entry) for key, entry in devices.items()]
    by_name: dict[str, DeviceSpec] = {}
    by_normalized: dict[str, DeviceSpec] = {}
    spellings: list[tuple[_Spelling, DeviceSpec]] = []
    for spec in specs:
        if spec.vendor == "cpu":
            continue  # a trace's device name never means "some CPU"
        for name in spec.names:
            _add(by_name, name, spec)
        for spelling in {normalize_name(n) for n in (*spec.names, spec.name, spec.key)}:
            _add(by_normalized, spelling, spec)
            spellings.append((_Spelling.of(spelling), spec))
    return _Catalog(
        tuple(specs), {s.key: s for s in specs}, by_name, by_normalized, tuple(spellings)
    )


def _builtin(key: str, entry: object) -> DeviceSpec:
    try:
        if not isinstance(entry, dict):
            raise EntryError("must be a table")
        return spec_from_entry(entry, key=key, source=None)
    except EntryError as exc:
        raise WallfinderError(f"{_SPECS_FILE}: devices.{key}: {exc}") from exc


def _add(index: dict[str, DeviceSpec], name: str, spec: DeviceSpec) -> None:
    # Two devices answering to one name would make matching depend on file order.
    other = index.setdefault(name, spec)
    if other is not spec:
        raise WallfinderError(f"{_SPECS_FILE}: {name!r} names both {other.key} and {spec.key}")


def all_specs() -> list[DeviceSpec]:
    """Every built-in device spec, in catalogue order (the CPU profile last)."""
    return list(_catalog().specs)


def cpu_spec() -> DeviceSpec:
    """The generic CPU profile for CPU-only traces: nominal figures, `estimate` true."""
    return _catalog().by_key["cpu"]


def match_device(name: str, *, sm_count: int | None = None) -> DeviceSpec | None:
    """The built-in spec for a device name as `torch.cuda.get_device_properties().name`
    reports it (the `deviceProperties` of a trace), or None when no device is certain.

    `sm_count` (the trace's `numSms`) only tells apart the boards a name already narrows the
    device to, such as ROCm's "AMD Instinct MI250X/MI250" (110 compute units per MI250X GCD,
    104 per MI250 GCD); it never picks a device on its own.
    """
    catalog = _catalog()
    exact = catalog.by_name.get(name.strip())
    if exact is not None:
        return exact
    normalized = normalize_name(name)
    if not normalized:
        return None
    ambiguous = _AMBIGUOUS.get(normalized)
    if ambiguous is not None:
        if not ambiguous.by_unit_count or sm_count is None:
            return None
        fits = [catalog.by_key[k] for k in ambiguous.keys]
        fits = [s for s in fits if s.sm_count == sm_count]
        return fits[0] if len(fits) == 1 else None
    spec = catalog.by_normalized.get(normalized)
    return spec if spec is not None else _memory_variant(normalized, catalog)


def _memory_variant(normalized: str, catalog: _Catalog) -> DeviceSpec | None:
    """A known name with its memory size written in ("NVIDIA H200 141GB HBM3e"), when the
    size is the device's own; a size that is not the device's is another board."""
    asked = _Spelling.of(normalized)
    if len(asked.sizes) != 1:
        return None
    (size,) = asked.sizes
    found: set[str] = set()
    for spelling, spec in catalog.spellings:
        if spelling.base != asked.base:
            continue
        if asked.kinds and spelling.kinds and asked.kinds != spelling.kinds:
            continue
        own = spelling.sizes or ((spec.mem_bytes / _GIB,) if spec.mem_bytes else ())
        if any(abs(s - size) <= _SIZE_TOLERANCE * size for s in own):
            found.add(spec.key)
    return catalog.by_key[found.pop()] if len(found) == 1 else None


def get_spec(key_or_name: str) -> DeviceSpec:
    """The built-in spec for a catalogue key (``"a100-sxm4-80gb"``) or a device name
    (``"NVIDIA A100-SXM4-80GB"``); `WallfinderError` naming close keys when there is none."""
    catalog = _catalog()
    text = key_or_name.strip()
    spec = catalog.by_key.get(text.lower()) or match_device(text)
    if spec is not None:
        return spec
    normalized = normalize_name(text)
    ambiguous = _AMBIGUOUS.get(normalized)
    if ambiguous is not None:
        raise WallfinderError(
            f"device {text!r} is ambiguous ({ambiguous.why}); name it: {', '.join(ambiguous.keys)}"
        )
    close = _close_keys(normalized, catalog)
    hint = f"close: {', '.join(close)}" if close else f"known: {', '.join(catalog.by_key)}"
    raise WallfinderError(f"unknown device {text!r}; {hint} (or give a device spec file)")


def _close_keys(normalized: str, catalog: _Catalog, limit: int = 6) -> list[str]:
    """Keys that contain what was asked ("a100" → every A100), else the nearest spellings."""
    wanted = normalized.replace(" ", "-")
    keys = [k for k in catalog.by_key if wanted and wanted in k]
    if not keys:
        spellings = {normalize_name(k): k for k in catalog.by_key} | {
            n: s.key for n, s in catalog.by_normalized.items()
        }
        near = difflib.get_close_matches(normalized, list(spellings), n=limit, cutoff=0.6)
        keys = list(dict.fromkeys(spellings[n] for n in near))
    return keys[:limit]
