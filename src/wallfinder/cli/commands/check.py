"""`wallfinder check PATH`: a CI gate. Exit 0 when every bound holds, 1 when one is broken,
2 for input that cannot be checked."""

from __future__ import annotations

import argparse
import math
import re
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

from wallfinder.api import Bounds, baseline_warning, check, load_diagnosis, read_toml
from wallfinder.cli.commands.analyze import add_device_options, add_trace_options
from wallfinder.cli.commands.diff import options_from
from wallfinder.errors import WallfinderError

CONFIG_TABLE = "tool.wallfinder.check"
CONFIG_KEYS = {
    "max-step-ms": "max_step_ms",
    "min-mfu": "min_mfu",
    "max-idle": "max_idle",
    "max-exposed-comm": "max_exposed_comm",
    "max-regression": "max_regression",
    "baseline": "baseline",
    "max-peak-memory": "max_peak_memory",
    "max-peak-memory-share": "max_peak_memory_share",
    "no-memory-leak": "no_memory_leak",
}
"""The keys of `[tool.wallfinder.check]` (the flags' names) and the attributes they set."""
_SHARES = ("min-mfu", "max-idle", "max-exposed-comm", "max-peak-memory-share")
"""The bounds that are shares of a whole (0 to 1); `max-regression` may exceed 1 (2x)."""

_INPUT = "a trace file, a folder of rank traces, or a saved diagnosis (analyze --format json)"


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", type=Path, help=f"the run to check: {_INPUT}")
    bounds = parser.add_argument_group(
        "bounds",
        "fractions as 0.05 or 5%; bounds may also be set in [tool.wallfinder.check] of the "
        "nearest pyproject.toml (keys as the flags, without the dashes in front); flags win",
    )
    bounds.add_argument("--max-step-ms", type=_milliseconds, metavar="MS", help="median step time")
    bounds.add_argument("--min-mfu", type=_share, metavar="F", help="model FLOPs utilisation")
    bounds.add_argument("--max-idle", type=_share, metavar="F", help="idle share of the step")
    bounds.add_argument(
        "--max-exposed-comm", type=_share, metavar="F", help="exposed communication share"
    )
    bounds.add_argument(
        "--baseline", type=Path, metavar="FILE", help=f"the run to compare with: {_INPUT}"
    )
    bounds.add_argument(
        "--max-regression",
        type=fraction,
        metavar="F",
        help="how much the median step may grow over --baseline's",
    )
    bounds.add_argument(
        "--max-peak-memory",
        type=_size,
        metavar="SIZE",
        help='peak allocated memory on the device: bytes, or with a unit ("20GiB", "512 MB")',
    )
    bounds.add_argument(
        "--max-peak-memory-share",
        type=_share,
        metavar="F",
        help="peak allocated memory as a share of the device's capacity (0 to 1)",
    )
    bounds.add_argument(
        "--no-memory-leak",
        action="store_true",
        default=None,
        help="fail if allocated memory grows step over step (a leak)",
    )
    parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="a pyproject.toml to read bounds from (default: the nearest one from here up)",
    )
    add_device_options(parser)
    add_trace_options(parser)


def fraction(text: str) -> float:
    """An argparse type: "5%" or "0.05" → 0.05 (a fraction ≥ 0)."""
    try:
        return parse_fraction(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_fraction(value: object) -> float:
    """A fraction from "5%", "0.05" or a number; ValueError with the reason otherwise."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f'not a fraction: {value!r} (e.g. 0.05 or "5%")')
    text = str(value).strip()
    scale = 0.01 if text.endswith("%") else 1.0
    try:
        number = float(text.removesuffix("%")) * scale
    except ValueError:
        raise ValueError(f'not a fraction: {value!r} (e.g. 0.05 or "5%")') from None
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"must be a fraction ≥ 0: {value!r}")
    return number


def parse_share(value: object) -> float:
    """A fraction from 0 to 1 (as `parse_fraction` reads it); ValueError otherwise."""
    number = parse_fraction(value)
    if number > 1:
        raise ValueError(f'must be a share from 0 to 1: {value!r} (e.g. 0.9 or "90%")')
    return number


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_UNITS |= {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
_SIZE = re.compile(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*", re.IGNORECASE)


def parse_size(value: object) -> int:
    """Bytes from a number or a string with a unit: "20GiB", "512 MB", "1e9" (KiB, MiB,
    GiB, TiB are powers of 1024; kB, MB, GB, TB of 1000); ValueError with the reason
    otherwise."""
    bad = f'not a size: {value!r} (bytes, or with a unit: "20GiB", "512 MB")'
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(bad)
    match = _SIZE.fullmatch(str(value))
    if match is None or match[2].lower() not in _UNITS:
        raise ValueError(bad)
    number = float(match[1]) * _UNITS[match[2].lower()]
    if not math.isfinite(number) or number < 1:
        raise ValueError(f"must be a positive size: {value!r}")
    return round(number)


def _share(text: str) -> float:
    try:
        return parse_share(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _milliseconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a positive number: {text!r}")
    return value


def find_config(start: Path) -> Path | None:
    """The nearest pyproject.toml in `start` or its parents."""
    for folder in (start, *start.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def read_config(path: Path) -> dict[str, object]:
    """The `[tool.wallfinder.check]` table of `path`, keys as attribute names (`baseline` as a
    path relative to the file); {} when it has none. Unknown keys and bad values are errors."""
    file, data = read_toml(path, "config file")
    table: object = data
    for key in CONFIG_TABLE.split("."):
        table = table.get(key, {}) if isinstance(table, dict) else None
    if not isinstance(table, dict):
        raise WallfinderError(f"{file}: [{CONFIG_TABLE}] must be a table")
    unknown = [k for k in table if k not in CONFIG_KEYS]
    if unknown:
        raise WallfinderError(
            f"{file}: unknown key {unknown[0]!r} in [{CONFIG_TABLE}] "
            f"(known: {', '.join(CONFIG_KEYS)})"
        )
    return dict(_config_value(file, str(k), v) for k, v in table.items())


def _config_value(file: Path, key: str, value: object) -> tuple[str, object]:
    """One config entry as (attribute, value); a bad value is an error naming the key."""
    try:
        if key == "baseline":
            if not isinstance(value, str) or not value:
                raise ValueError("must be a path (a string)")
            return "baseline", file.parent / value
        if key == "max-step-ms":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"must be a positive number of milliseconds: {value!r}")
            return "max_step_ms", float(value)
        if key == "max-peak-memory":
            return "max_peak_memory", parse_size(value)
        if key in _SHARES:
            # A share of the step, of peak or of capacity: 150% cannot be reached or broken.
            return CONFIG_KEYS[key], parse_share(value)
        if key == "no-memory-leak":
            if not isinstance(value, bool):
                raise ValueError(f"must be true or false: {value!r}")
            return "no_memory_leak", value
        return CONFIG_KEYS[key], parse_fraction(value)
    except ValueError as exc:
        raise WallfinderError(f"{file}: [{CONFIG_TABLE}] {key}: {exc}") from None


def run(args: argparse.Namespace) -> int:
    config_file = args.config or find_config(Path.cwd())
    config = read_config(config_file) if config_file is not None else {}
    # The config's values are checked and converted by read_config: each has its field's type.
    given: dict[str, Any] = {}
    for f in fields(Bounds):
        flag = getattr(args, f.name)
        given[f.name] = flag if flag is not None else config.get(f.name)
    bounds = Bounds(**given)
    baseline_path = args.baseline or config.get("baseline")
    if not bounds.given():
        raise WallfinderError(
            "no bound to check: give --max-step-ms, --min-mfu, --max-idle, --max-exposed-comm, "
            "--max-peak-memory, --max-peak-memory-share, --no-memory-leak or --baseline with "
            f"--max-regression (or set them in [{CONFIG_TABLE}])"
        )
    if (baseline_path is None) != (bounds.max_regression is None):
        raise WallfinderError("--baseline and --max-regression go together: give both")
    options = options_from(args)
    diagnosis = load_diagnosis(args.path, options)
    baseline = None
    if isinstance(baseline_path, Path):
        baseline = load_diagnosis(baseline_path, options)
    warning = baseline_warning(diagnosis, baseline)
    if warning is not None:
        print(f"wallfinder: warning: {warning}", file=sys.stderr)
    results = check(diagnosis, bounds, baseline)
    broken = [r for r in results if not r.held]
    for r in broken:
        print(r.line)
    if broken:
        return 1
    print(f"all {len(results)} bounds hold: " + "; ".join(r.line for r in results))
    return 0
