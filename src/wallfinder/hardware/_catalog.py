"""The built-in catalogue (specs.toml, read once) and matching a trace's device name to it.

Matching never guesses: a name matches a device when it is one of the device's names, when it
equals one after normalising spelling (case, separators, vendor prefixes, a virtual-function
suffix), or when it is one of them with a memory size added and that size is the device's. A
MIG slice ("NVIDIA A100-SXM4-40GB MIG 1g.5gb") is its GPU's spec scaled to the slice, and says
so in `DeviceSpec.matched`. Anything else — another board of the same family, a name ROCm gives
several products — is no match here: `wallfinder.hardware._infer` may then infer the device from
what else the trace holds, and says that it did.

A family name a person types (`get_spec("A100")`) is taken as the variant the catalogue's
``[families]`` table names, and the spec's `matched` says so and names the other variants.
"""

from __future__ import annotations

import bisect
import functools
import pkgutil
import re
from dataclasses import replace

import msgspec

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
# "NVIDIA H100 80GB HBM3 MIG 1g.10gb", or with a compute instance, "MIG 1c.2g.10gb".
_MIG = re.compile(r"\s+MIG\s+(?:(\d+)c\.)?(\d+)g\.(\d+(?:\.\d+)?)gb\s*$", re.IGNORECASE)
_MIG_COMPUTE_SLICES = 7
"""A MIG GPU has 7 compute slices (NVIDIA MIG user guide): a 1g profile has 1/7 of them."""


class _Ambiguous(msgspec.Struct, frozen=True):
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


class _Spelling(msgspec.Struct, frozen=True):
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

    @property
    def model(self) -> str | None:
        """The word that names the model ("a100", "mi300x", "4090"): the first with a digit."""
        return next((w for w in self.base if any(c.isdigit() for c in w)), None)


class _Family(msgspec.Struct, frozen=True):
    key: str
    why: str


class _Catalog(msgspec.Struct, frozen=True):
    specs: tuple[DeviceSpec, ...]
    by_key: dict[str, DeviceSpec]
    by_name: dict[str, DeviceSpec]
    by_normalized: dict[str, DeviceSpec]
    spellings: tuple[tuple[_Spelling, DeviceSpec], ...]
    families: dict[str, _Family]


@functools.cache
def _specs_text() -> str:
    # Read through the package's loader: `importlib.resources` would import zipfile and its
    # readers, 8 ms and 2 MB on every analysis, to read one file.
    data = pkgutil.get_data(_PACKAGE, _SPECS_FILE)
    if data is None:  # pragma: no cover - a loader that cannot read package data
        raise WallfinderError(f"{_SPECS_FILE}: cannot be read from the installed package")
    return data.decode("utf-8")


def _matched_by_name(spec: DeviceSpec) -> bool:
    """Whether a trace's device name can mean `spec`: never a CPU's (a trace's device name
    never means "some CPU")."""
    return spec.vendor != "cpu"


@functools.cache
def _catalog() -> _Catalog:
    text = _specs_text()
    document = parse_toml(text, _SPECS_FILE)
    devices = document.get("devices")
    if not isinstance(devices, dict):
        raise WallfinderError(f"{_SPECS_FILE}: no [devices.<key>] tables")
    specs = [_builtin(key, entry) for key, entry in devices.items()]
    by_name: dict[str, DeviceSpec] = {}
    by_normalized: dict[str, DeviceSpec] = {}
    spellings: list[tuple[_Spelling, DeviceSpec]] = []
    for spec in specs:
        if not _matched_by_name(spec):
            continue
        for name in spec.names:
            _add(by_name, name, spec)
        for spelling in {normalize_name(n) for n in (*spec.names, spec.name, spec.key)}:
            _add(by_normalized, spelling, spec)
            spellings.append((_Spelling.of(spelling), spec))
    by_key = {s.key: s for s in specs}
    families = _families(document.get("families", {}), by_key)
    return _Catalog(tuple(specs), by_key, by_name, by_normalized, tuple(spellings), families)


def _families(table: object, by_key: dict[str, DeviceSpec]) -> dict[str, _Family]:
    if not isinstance(table, dict):
        raise WallfinderError(f"{_SPECS_FILE}: families must be a table")
    families: dict[str, _Family] = {}
    for name, entry in table.items():
        key = entry.get("device") if isinstance(entry, dict) else None
        why = entry.get("why") if isinstance(entry, dict) else None
        if not isinstance(key, str) or key not in by_key or not isinstance(why, str):
            raise WallfinderError(f"{_SPECS_FILE}: families.{name} needs a known device and why")
        families[normalize_name(name)] = _Family(key, why)
    return families


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
    104 per MI250 GCD); it never picks a device on its own. A MIG slice is its GPU's spec
    scaled to the slice (see `mig_slice`).
    """
    mig = _MIG.search(name)
    if mig is not None:
        whole = _match_name(name[: mig.start()], sm_count=None)
        if whole is None:
            return None
        compute = int(mig.group(1) or mig.group(2))
        return mig_slice(whole, compute, float(mig.group(3)), sm_count=sm_count)
    return _match_name(name, sm_count=sm_count)


def _match_name(name: str, *, sm_count: int | None) -> DeviceSpec | None:
    exact = _named(name.strip())
    if exact is not None:
        return exact
    catalog = _catalog()
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


def _named(name: str) -> DeviceSpec | None:
    """The device one of whose `names` is `name` exactly, as the catalogue's `by_name` has it.
    Before the catalogue is read, only the table that names it is parsed: the whole file is
    about 13 ms of TOML, read on every analysis for one name that real traces spell exactly."""
    if _catalog.cache_info().currsize:
        return _catalog().by_name.get(name)
    return _named_alone(name)


_TABLE = re.compile(r"^\[([^\]\n]*)\]", re.MULTILINE)
"""A TOML table header line (`[devices.t4]`, `[devices.t4.peak_flops]`, `[families]`)."""


@functools.lru_cache(maxsize=64)
def _named_alone(name: str) -> DeviceSpec | None:
    """`_named` from the device tables the quoted name appears in: the one of them that lists
    it in its `names` (a `names` entry is a quoted string, so no other table can list it).
    Anything else (none or several list it, a name that needs escapes, a table that is not an
    entry alone) is answered by the whole catalogue, which says what is wrong with it."""
    text = _specs_text()
    if not name or '"' in name or "\\" in name or f"'{name}'" in text:
        return _catalog().by_name.get(name)
    quoted = f'"{name}"'
    found: list[DeviceSpec] = []
    try:
        for start, end, key in _tables_around(text, quoted):
            devices = parse_toml(text[start:end], _SPECS_FILE).get("devices")
            entry = devices.get(key) if isinstance(devices, dict) else None
            if not (isinstance(devices, dict) and len(devices) == 1 and isinstance(entry, dict)):
                return _catalog().by_name.get(name)
            spec = _builtin(key, entry)
            if _matched_by_name(spec) and name in spec.names:
                found.append(spec)
    except WallfinderError:
        return _catalog().by_name.get(name)
    return found[0] if len(found) == 1 else _catalog().by_name.get(name)


def _tables_around(text: str, quoted: str) -> list[tuple[int, int, str]]:
    """Where each device's tables ([devices.KEY] and its subtables) that hold `quoted` run:
    (start, end, KEY), from its first header to the next header of another table."""
    starts: list[int] = []
    owners: list[str | None] = []
    for header in _TABLE.finditer(text):
        path = header.group(1).strip().split(".")
        owner = path[1] if len(path) > 1 and path[0] == "devices" else None
        if owner is None or not owners or owners[-1] != owner:
            starts.append(header.start())
            owners.append(owner)
    out: list[tuple[int, int, str]] = []
    at = text.find(quoted)
    while at >= 0:
        i = bisect.bisect_right(starts, at) - 1
        key = owners[i] if i >= 0 else None
        if key is not None:
            table = (starts[i], starts[i + 1] if i + 1 < len(starts) else len(text), key)
            if table not in out:
                out.append(table)
        at = text.find(quoted, at + 1)
    return out


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


def mig_slice(
    whole: DeviceSpec, compute_slices: int, memory_gb: float, *, sm_count: int | None = None
) -> DeviceSpec:
    """The spec of a MIG slice of `whole` ("1g.10gb": 1 compute slice, 10 GB): its peaks are
    its share of the GPU's — the slice's SMs over the GPU's when `sm_count` (the trace's
    `numSms`) says it, else `compute_slices` of the GPU's 7 — and its bandwidth the share of
    the GPU's memory it owns (memory bandwidth follows the memory slices). Whole-GPU peaks
    would promise a slice several times the speed it can reach."""
    if sm_count and whole.sm_count and sm_count < whole.sm_count:
        compute = sm_count / whole.sm_count
        how = f"{sm_count} of its {whole.sm_count} SMs"
    else:
        compute = min(1.0, compute_slices / _MIG_COMPUTE_SLICES)
        how = f"{compute_slices} of its {_MIG_COMPUTE_SLICES} compute slices"
    size = f"{memory_gb:g}"
    memory = 1.0
    if whole.mem_bytes:
        memory = min(1.0, memory_gb * _GIB / whole.mem_bytes)
        how += (
            f", {size} of its {whole.mem_bytes / _GIB:g} GB of memory and that share of bandwidth"
        )
    profile = f"{compute_slices}g.{size}gb"
    return replace(
        whole,
        key=f"{whole.key}-mig-{profile}",
        name=f"{whole.name} MIG {profile}",
        peak_flops={k: v * compute for k, v in whole.peak_flops.items()},
        mem_bandwidth=whole.mem_bandwidth * memory,
        mem_bytes=memory_gb * _GIB,
        sm_count=round(whole.sm_count * compute) if whole.sm_count else None,
        l2_bytes=whole.l2_bytes * memory if whole.l2_bytes else None,
        l2_bandwidth=whole.l2_bandwidth * memory if whole.l2_bandwidth else None,
        names=(),
        matched=f"a MIG {profile} slice: {whole.name}'s peaks scaled to the slice ({how})",
    )


def family_members(word: str) -> list[DeviceSpec]:
    """The catalogue's devices whose model starts with `word` ("a100" → the four A100s)."""
    wanted = normalize_name(word)
    found: dict[str, DeviceSpec] = {}
    for spelling, spec in _catalog().spellings:
        model = spelling.model
        if model is not None and wanted and model.startswith(wanted):
            found.setdefault(spec.key, spec)
    return list(found.values())


def get_spec(key_or_name: str) -> DeviceSpec:
    """The built-in spec for a catalogue key (``"a100-sxm4-80gb"``), a device name
    (``"NVIDIA A100-SXM4-80GB"``) or a family name a person types (``"A100"``: the variant the
    catalogue's ``[families]`` table names, with `matched` saying so and naming the others);
    `WallfinderError` naming close keys when there is none."""
    catalog = _catalog()
    text = key_or_name.strip()
    spec = catalog.by_key.get(text.lower()) or match_device(text)
    if spec is not None:
        return spec
    normalized = normalize_name(text)
    family = catalog.families.get(normalized)
    if family is not None:
        chosen = catalog.by_key[family.key]
        others = [s.key for s in family_members(normalized) if s.key != chosen.key]
        also = f"; also {', '.join(others)} (name one to use it)" if others else ""
        return replace(
            chosen,
            matched=f"{text!r} is a family: took {chosen.key}, {family.why}{also}",
        )
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
        import difflib  # (here: only a name that matches no device asks for the nearest)

        near = difflib.get_close_matches(normalized, list(spellings), n=limit, cutoff=0.6)
        keys = list(dict.fromkeys(spellings[n] for n in near))
    return keys[:limit]
