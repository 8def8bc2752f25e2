"""Device entries read from TOML and checked field by field, so that a wrong figure in a user's
spec file is one line naming the field, never a traceback or a silently wrong roofline."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from wallfinder.errors import WallfinderError
from wallfinder.hardware._spec import DTYPES, VENDORS, DeviceSpec, normalize_dtype

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, from PyPI
    import tomli as tomllib  # type: ignore[import-not-found,unused-ignore]

ENTRY_FIELDS = (
    "name",
    "vendor",
    "names",
    "source",
    "estimate",
    "tensor_cores",
    "peak_flops",
    "mem_bandwidth",
    "mem_bytes",
    "sm_count",
    "l2_bytes",
    "l2_bandwidth",
    "interconnect",
    "pcie_gen",
    "arch",
)
"""The keys of a device entry (a user's spec file may also give `key`)."""

CALIBRATION = "calibration"
"""The table of a calibrated profile's metadata; a spec file may carry it (it is ignored)."""


class EntryError(Exception):
    """A device entry that is wrong; the message is one line naming the field."""


def parse_toml(text: str, label: str) -> dict[str, object]:
    """The TOML document in `text`; `label` names it in the error."""
    try:
        data: dict[str, object] = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise WallfinderError(f"{label}: not valid TOML: {_one_line(str(exc))}") from exc
    return data


def spec_from_entry(entry: Mapping[str, object], *, key: str, source: str | None) -> DeviceSpec:
    """The spec an entry describes. `source` labels a user's file (``"user file: NAME"``);
    None means the built-in catalogue, whose entries must name their own source."""
    unknown = [k for k in entry if k not in ENTRY_FIELDS]
    if unknown:
        raise EntryError(f"unknown key {unknown[0]!r} (known: {', '.join(ENTRY_FIELDS)})")
    estimate = _flag(entry, "estimate")
    text = _text(entry, "source", required=source is None)
    if source is None:
        label = f"{'estimate' if estimate else 'datasheet'}: {text}"
    else:
        label = f"{source} ({text})" if text else source
    vendor = _text(entry, "vendor", required=False) or "other"
    if vendor not in VENDORS:
        raise EntryError(f"vendor must be one of {', '.join(VENDORS)}, got {vendor!r}")
    return DeviceSpec(
        key=key,
        name=_text(entry, "name", required=False) or key,
        vendor=vendor,
        peak_flops=_peaks(entry),
        mem_bandwidth=_required_rate(entry, "mem_bandwidth", "bytes/s, e.g. 2.039e12"),
        mem_bytes=_optional_amount(entry, "mem_bytes", "bytes"),
        sm_count=_optional_count(entry, "sm_count"),
        l2_bytes=_optional_amount(entry, "l2_bytes", "bytes"),
        l2_bandwidth=_optional_amount(entry, "l2_bandwidth", "bytes/s"),
        interconnect=_rates(entry, "interconnect", "bytes/s"),
        tensor_cores=_flag(entry, "tensor_cores"),
        source=label,
        estimate=estimate,
        pcie_gen=_optional_count(entry, "pcie_gen"),
        names=_names(entry),
        arch=_text(entry, "arch", required=False) or None,
    )


def read_spec_file(path: str | os.PathLike[str]) -> DeviceSpec:
    """One device entry from a user's TOML file; any problem is a `WallfinderError`."""
    file, data = read_toml_file(path, "device spec file")
    return spec_from_document(data, file.name)


def read_toml_file(path: str | os.PathLike[str], what: str) -> tuple[Path, dict[str, object]]:
    """The file and its TOML document; `what` names the kind of file in the error."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise WallfinderError(f"{what} not found: {file}") from exc
    except UnicodeDecodeError as exc:
        raise WallfinderError(f"{file.name}: not a TOML text file (not UTF-8)") from exc
    except OSError as exc:
        raise WallfinderError(f"cannot read {what} {file}: {exc.strerror}") from exc
    return file, parse_toml(text, file.name)


def spec_from_document(data: Mapping[str, object], label: str) -> DeviceSpec:
    """The device entry a spec file's document holds; `label` (the file name) names it in the
    source and in errors. A calibrated profile's ``[calibration]`` table is metadata, not part
    of the entry: `wallfinder.hardware.profile` reads it."""
    key = Path(label).stem
    devices = data.get("devices")
    # An entry copied with its `[devices.<key>]` header from the built-in catalogue works too.
    if set(data) == {"devices"} and isinstance(devices, dict) and len(devices) == 1:
        ((key, entry),) = devices.items()
        if not isinstance(entry, dict):
            raise WallfinderError(f"{label}: devices.{key} must be a table")
        data = entry
    fields = dict(data)
    if not isinstance(fields.pop(CALIBRATION, {}), dict):
        raise WallfinderError(f"{label}: {CALIBRATION} must be a table")
    given_key = fields.pop("key", key)
    if not isinstance(given_key, str) or not given_key.strip():
        raise WallfinderError(f"{label}: key must be a non-empty string")
    try:
        return spec_from_entry(fields, key=given_key.strip(), source=f"user file: {label}")
    except EntryError as exc:
        raise WallfinderError(f"{label}: {exc}") from exc


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _positive(value: object, what: str, unit: str) -> float:
    # TOML booleans are Python bools, which are ints: `true` is not a figure.
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
        if math.isfinite(number) and number > 0:
            return number
    raise EntryError(f"{what} must be a positive number ({unit}), got {_shown(value)}")


def _required_rate(entry: Mapping[str, object], name: str, unit: str) -> float:
    if name not in entry:
        raise EntryError(f"{name} is missing ({unit})")
    return _positive(entry[name], name, unit)


def _optional_amount(entry: Mapping[str, object], name: str, unit: str) -> float | None:
    return None if name not in entry else _positive(entry[name], name, unit)


def _optional_count(entry: Mapping[str, object], name: str) -> int | None:
    if name not in entry:
        return None
    value = entry[name]
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise EntryError(f"{name} must be a positive whole number, got {_shown(value)}")
    return value


def _flag(entry: Mapping[str, object], name: str) -> bool:
    value = entry.get(name, False)
    if not isinstance(value, bool):
        raise EntryError(f"{name} must be true or false, got {_shown(value)}")
    return value


def _text(entry: Mapping[str, object], name: str, *, required: bool) -> str:
    value = entry.get(name, "")
    if not isinstance(value, str):
        raise EntryError(f"{name} must be a string, got {_shown(value)}")
    if required and not value.strip():
        raise EntryError(f"{name} is missing (where the figures come from)")
    return value.strip()


def _names(entry: Mapping[str, object]) -> tuple[str, ...]:
    value = entry.get("names", [])
    names = value if isinstance(value, list) else [value]
    strings = tuple(n.strip() for n in names if isinstance(n, str) and n.strip())
    if not isinstance(value, list) or len(strings) != len(names):
        raise EntryError(f"names must be a list of non-empty strings, got {_shown(value)}")
    return strings


def _table(entry: Mapping[str, object], name: str) -> dict[str, object]:
    value = entry.get(name, {})
    if not isinstance(value, dict):
        raise EntryError(f"{name} must be a table, got {_shown(value)}")
    return value


def _rates(entry: Mapping[str, object], name: str, unit: str) -> dict[str, float]:
    return {k: _positive(v, f"{name}.{k}", unit) for k, v in _table(entry, name).items()}


def _peaks(entry: Mapping[str, object]) -> dict[str, float]:
    if "peak_flops" not in entry:
        raise EntryError("peak_flops is missing (a table of dtype = FLOP/s, e.g. bf16 = 312e12)")
    table = _table(entry, "peak_flops")
    for dtype in table:
        if dtype not in DTYPES:
            canonical = normalize_dtype(dtype)
            hint = f"did you mean {canonical}? " if canonical else ""
            raise EntryError(
                f"unknown dtype {dtype!r} in peak_flops ({hint}known: {', '.join(DTYPES)})"
            )
    if not table:
        raise EntryError("peak_flops is empty (give at least one dtype, e.g. fp32 = 19.5e12)")
    return _rates(entry, "peak_flops", "FLOP/s")
