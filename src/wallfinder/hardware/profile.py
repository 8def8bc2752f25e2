"""Calibrated device profiles: the roofs `wallfinder calibrate` measured on the user's own
device, saved as a TOML file and laid over the datasheet when a trace is analysed.

A profile is a device spec file (see `wallfinder.hardware`) whose ``[peak_flops]`` holds only
the dtypes that were measured and whose ``mem_bandwidth`` is the measured copy bandwidth, plus
a ``[calibration]`` table saying how and against which datasheet they were measured::

    key = "cpu-calibrated"
    name = "AMD EPYC (calibrated)"
    vendor = "cpu"
    source = "wallfinder calibrate 2025-06-01T12:00:00Z, torch 2.13.0"
    mem_bandwidth = 4.2e10

    [peak_flops]
    fp32 = 2.1e11
    bf16 = 8.8e11

    [calibration]
    device = "AMD EPYC"            # the device's name as torch reports it
    datasheet = "cpu"              # the catalogue key measured against (absent: none known)
    date = "2025-06-01T12:00:00Z"  # UTC
    torch = "2.13.0"
    backend = "cpu"                # "cuda 12.4", "rocm 6.2" or "cpu"
    threads = 2                    # CPU threads torch used (CPU only)
    copy_bytes = 268435456         # size of the copied tensor
    repetitions = 5                # timed repetitions (the best is kept), after `warmup` ones
    warmup = 2
    launch_ops = 5000              # tiny ops in the launch-latency loop
    launch_latency = 2.0e-6        # seconds per tiny op
    launch_latency_kind = "CPU op dispatch"
    [calibration.matmul_sizes]     # n of the n×n matmuls, per dtype
    fp32 = 2048

Every calibration field is optional; a wrong one is a `WallfinderError` naming it. The file
loads with `load_spec_file` too (as the measured roofs alone).

    >>> profile = load_device_profile("wallfinder-device.toml")
    >>> spec = profile.over(None)     # measured roofs over the datasheet it was measured against
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from wallfinder.errors import WallfinderError
from wallfinder.hardware._catalog import get_spec, normalize_name
from wallfinder.hardware._spec import DTYPES, DeviceSpec
from wallfinder.hardware._toml import (
    CALIBRATION,
    EntryError,
    read_toml_file,
    spec_from_document,
)

__all__ = [
    "Calibration",
    "DeviceProfile",
    "load_device_profile",
    "profile_toml",
    "write_device_profile",
]

_WHAT = "device profile"


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """How a profile's roofs were measured (the ``[calibration]`` table). No machine paths,
    host names or environment: a profile may be shared."""

    device: str = ""
    """The device's name as torch reports it (a CPU: its model name)."""
    datasheet: str | None = None
    """The catalogue key of the spec measured against; None when the device is not in it."""
    date: str = ""
    """When it was measured: ISO 8601, UTC."""
    torch: str = ""
    backend: str = ""
    """``"cuda 12.4"``, ``"rocm 6.2"`` or ``"cpu"``."""
    threads: int | None = None
    """CPU threads torch used (a CPU's roofs depend on them)."""
    matmul_sizes: Mapping[str, int] = field(default_factory=dict)
    """n of the n×n matmuls timed, per dtype."""
    copy_bytes: int | None = None
    repetitions: int | None = None
    warmup: int | None = None
    launch_ops: int | None = None
    launch_latency: float | None = None
    """Seconds per tiny op in a synchronised loop: kernel launch latency on a GPU, op
    dispatch overhead on a CPU (`launch_latency_kind` says which)."""
    launch_latency_kind: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "matmul_sizes", MappingProxyType(dict(self.matmul_sizes)))


@dataclass(frozen=True)
class DeviceProfile:
    """A calibrated profile: the measured roofs (`spec`: measured dtypes only), how they were
    measured, and the file's name."""

    spec: DeviceSpec
    calibration: Calibration
    file: str

    def datasheet(self) -> DeviceSpec | None:
        """The built-in spec the profile was measured against, if any."""
        key = self.calibration.datasheet
        return None if key is None else get_spec(key)

    def check_device(self, spec: DeviceSpec | None, name: str | None) -> None:
        """Refuse a trace from another device than the one measured: `spec` is the trace's
        device as matched or named, `name` the name the trace gives it."""
        cal = self.calibration
        if spec is not None and cal.datasheet is not None:
            same = spec.key == cal.datasheet
        elif name and cal.device:
            same = normalize_name(name) == normalize_name(cal.device)
        else:
            return  # nothing says which device the trace is from
        if not same:
            measured = cal.device or cal.datasheet or self.spec.name
            trace = spec.name if spec is not None else name
            raise WallfinderError(
                f"{self.file} was measured on {measured}, but the trace is from {trace}: "
                "calibrate on that device, or leave out --device-profile"
            )

    def over(self, base: DeviceSpec | None) -> DeviceSpec:
        """The measured roofs laid over `base` (None: the datasheet measured against): the
        measured dtypes' peaks and the measured bandwidth replace `base`'s, its other peaks,
        memory, caches and links remain. `source` starts with ``"calibrated"``."""
        if base is None:
            base = self.datasheet()
        measured = self.spec
        cal = self.calibration
        when = f"{cal.date[:10]}, " if cal.date else ""
        source = (
            f"calibrated: {', '.join(measured.peak_flops)} peaks and memory bandwidth "
            f"measured ({when}{self.file})"
        )
        if base is None:
            return dataclasses.replace(measured, source=source, estimate=False)
        kept = [d for d in DTYPES if d in base.peak_flops and d not in measured.peak_flops]
        if kept:
            kind = "estimate" if base.estimate else "datasheet"
            source += f"; {', '.join(kept)} from {base.key} ({kind})"
        return DeviceSpec(
            key=measured.key,
            name=measured.name,
            vendor=base.vendor,
            peak_flops={**base.peak_flops, **measured.peak_flops},
            mem_bandwidth=measured.mem_bandwidth,
            mem_bytes=base.mem_bytes or measured.mem_bytes,
            sm_count=base.sm_count or measured.sm_count,
            l2_bytes=base.l2_bytes or measured.l2_bytes,
            l2_bandwidth=base.l2_bandwidth or measured.l2_bandwidth,
            interconnect=base.interconnect or measured.interconnect,
            tensor_cores=base.tensor_cores or measured.tensor_cores,
            source=source,
            estimate=False,
            pcie_gen=base.pcie_gen or measured.pcie_gen,
            names=base.names or measured.names,
        )


def load_device_profile(path: str | os.PathLike[str]) -> DeviceProfile:
    """The calibrated profile in a TOML file written by `wallfinder calibrate` (or by hand, in
    the format of this module's docstring). Any problem is a `WallfinderError` of one line
    naming the file."""
    file, data = read_toml_file(path, _WHAT)
    table = data.get(CALIBRATION)
    if table is None:
        raise WallfinderError(
            f"{file.name}: not a calibrated device profile (no [{CALIBRATION}] table); make one "
            "with `wallfinder calibrate`, or give a plain spec file with --spec"
        )
    if not isinstance(table, dict):
        raise WallfinderError(f"{file.name}: {CALIBRATION} must be a table")
    spec = spec_from_document(data, file.name)
    try:
        calibration = _calibration(table)
    except EntryError as exc:
        raise WallfinderError(f"{file.name}: {CALIBRATION}.{exc}") from exc
    if calibration.datasheet is not None:
        try:
            get_spec(calibration.datasheet)
        except WallfinderError as exc:
            raise WallfinderError(f"{file.name}: {CALIBRATION}.datasheet: {exc}") from exc
    return DeviceProfile(spec, calibration, file.name)


_FIELDS = (
    "device",
    "datasheet",
    "date",
    "torch",
    "backend",
    "threads",
    "matmul_sizes",
    "copy_bytes",
    "repetitions",
    "warmup",
    "launch_ops",
    "launch_latency",
    "launch_latency_kind",
)


def _calibration(table: Mapping[str, object]) -> Calibration:
    unknown = [k for k in table if k not in _FIELDS]
    if unknown:
        raise EntryError(f"{unknown[0]}: unknown key (known: {', '.join(_FIELDS)})")
    datasheet = _string(table, "datasheet")
    sizes = table.get("matmul_sizes", {})
    if not isinstance(sizes, dict):
        raise EntryError(f"matmul_sizes must be a table of dtype = n, got {_shown(sizes)}")
    for dtype in sizes:
        if dtype not in DTYPES:
            raise EntryError(f"matmul_sizes: unknown dtype {dtype!r} (known: {', '.join(DTYPES)})")
    latency = table.get("launch_latency")
    if latency is not None and not (
        isinstance(latency, (int, float))
        and not isinstance(latency, bool)
        and 0 < float(latency) < float("inf")
    ):
        raise EntryError(f"launch_latency must be a positive number (seconds), got {latency!r}")
    return Calibration(
        device=_string(table, "device") or "",
        datasheet=datasheet or None,
        date=_date(table),
        torch=_string(table, "torch") or "",
        backend=_string(table, "backend") or "",
        threads=_count(table, "threads"),
        matmul_sizes={d: _count(sizes, d, f"matmul_sizes.{d}") or 0 for d in sizes},
        copy_bytes=_count(table, "copy_bytes"),
        repetitions=_count(table, "repetitions"),
        warmup=_count(table, "warmup", zero=True),
        launch_ops=_count(table, "launch_ops"),
        launch_latency=None if latency is None else float(latency),
        launch_latency_kind=_string(table, "launch_latency_kind") or "",
    )


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _string(table: Mapping[str, object], name: str) -> str | None:
    value = table.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise EntryError(f"{name} must be a string, got {_shown(value)}")
    return value.strip()


def _date(table: Mapping[str, object]) -> str:
    value = table.get("date")
    # A TOML date or date-time (unquoted) is as good as the string this module writes.
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    return _string(table, "date") or ""


def _count(
    table: Mapping[str, object], name: str, what: str | None = None, *, zero: bool = False
) -> int | None:
    value = table.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < (0 if zero else 1):
        kind = "a whole number ≥ 0" if zero else "a positive whole number"
        raise EntryError(f"{what or name} must be {kind}, got {_shown(value)}")
    return value


# --- writing ---------------------------------------------------------------------------------


def profile_toml(spec: DeviceSpec, calibration: Calibration) -> str:
    """The profile file's text: `spec` holds the measured roofs (its `key`, `name`, `vendor`,
    `peak_flops`, `mem_bandwidth`, `tensor_cores` and `names` are written), `calibration` how
    they were measured."""
    lines = [
        "# A wallfinder device profile: roofs measured on this device by `wallfinder calibrate`.",
        "# Use it with `wallfinder analyze TRACE --device-profile FILE`: the measured peaks and",
        "# bandwidth replace the datasheet's; the datasheet's other dtypes remain.",
        f"key = {_toml_string(spec.key)}",
        f"name = {_toml_string(spec.name)}",
        f"vendor = {_toml_string(spec.vendor)}",
        f"source = {_toml_string(_source(calibration))}",
        f"tensor_cores = {'true' if spec.tensor_cores else 'false'}",
    ]
    if spec.names:
        lines.append(f"names = [{', '.join(_toml_string(n) for n in spec.names)}]")
    lines.append(f"mem_bandwidth = {_toml_float(spec.mem_bandwidth)}  # bytes/s, measured")
    lines += ["", "[peak_flops]  # FLOP/s, measured"]
    lines += [f"{d} = {_toml_float(spec.peak_flops[d])}" for d in DTYPES if d in spec.peak_flops]
    lines += ["", f"[{CALIBRATION}]"]
    cal = calibration
    strings = {
        "device": cal.device,
        "datasheet": cal.datasheet or "",
        "date": cal.date,
        "torch": cal.torch,
        "backend": cal.backend,
    }
    lines += [f"{k} = {_toml_string(v)}" for k, v in strings.items() if v]
    counts = {
        "threads": cal.threads,
        "copy_bytes": cal.copy_bytes,
        "repetitions": cal.repetitions,
        "warmup": cal.warmup,
        "launch_ops": cal.launch_ops,
    }
    lines += [f"{k} = {v}" for k, v in counts.items() if v is not None]
    if cal.launch_latency is not None:
        lines.append(f"launch_latency = {_toml_float(cal.launch_latency)}  # seconds per op")
    if cal.launch_latency_kind:
        lines.append(f"launch_latency_kind = {_toml_string(cal.launch_latency_kind)}")
    if cal.matmul_sizes:
        lines += ["", f"[{CALIBRATION}.matmul_sizes]  # n of the n×n matmuls"]
        lines += [f"{d} = {n}" for d, n in cal.matmul_sizes.items()]
    return "\n".join(lines) + "\n"


def write_device_profile(
    path: str | os.PathLike[str], spec: DeviceSpec, calibration: Calibration
) -> Path:
    """Write the profile (`profile_toml`) to `path`; a file that cannot be written is a
    `WallfinderError`."""
    file = Path(path)
    try:
        file.write_text(profile_toml(spec, calibration), encoding="utf-8")
    except OSError as exc:
        raise WallfinderError(f"{file}: cannot write the device profile ({exc.strerror})") from None
    return file


def _source(cal: Calibration) -> str:
    parts = ["wallfinder calibrate"]
    if cal.date:
        parts.append(cal.date)
    text = " ".join(parts)
    return f"{text}, torch {cal.torch}" if cal.torch else text


def _toml_string(text: str) -> str:
    # A JSON string is a TOML basic string, except that TOML wants DEL escaped too.
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def _toml_float(value: float) -> str:
    return repr(float(value))  # always with a "." or an exponent: a TOML float, never an int
