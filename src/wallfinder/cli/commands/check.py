"""`wallfinder check PATH`: a CI gate. Exit 0 when every bound holds, 1 when one is broken,
2 for input that cannot be checked."""

from __future__ import annotations

import argparse
import math
from dataclasses import fields
from pathlib import Path

from wallfinder.analysis.check import Bounds, check
from wallfinder.api import load_diagnosis
from wallfinder.cli.commands.analyze import add_device_options
from wallfinder.cli.commands.diff import options_from
from wallfinder.errors import WallfinderError
from wallfinder.hardware._toml import read_toml_file

HELP = (
    "check a run against bounds (step time, MFU, idle, exposed comm, regression); exit 1 if broken"
)

CONFIG_TABLE = "tool.wallfinder.check"
CONFIG_KEYS = {
    "max-step-ms": "max_step_ms",
    "min-mfu": "min_mfu",
    "max-idle": "max_idle",
    "max-exposed-comm": "max_exposed_comm",
    "max-regression": "max_regression",
    "baseline": "baseline",
}
"""The keys of `[tool.wallfinder.check]` (the flags' names) and the attributes they set."""

_INPUT = "a trace file, a folder of rank traces, or a saved diagnosis (analyze --format json)"


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", type=Path, help=f"the run to check: {_INPUT}")
    bounds = parser.add_argument_group(
        "bounds",
        "fractions as 0.05 or 5%; bounds may also be set in [tool.wallfinder.check] of the "
        "nearest pyproject.toml (keys as the flags, without the dashes in front); flags win",
    )
    bounds.add_argument("--max-step-ms", type=_milliseconds, metavar="MS", help="median step time")
    bounds.add_argument("--min-mfu", type=fraction, metavar="F", help="model FLOPs utilisation")
    bounds.add_argument("--max-idle", type=fraction, metavar="F", help="idle share of the step")
    bounds.add_argument(
        "--max-exposed-comm", type=fraction, metavar="F", help="exposed communication share"
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
    parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="a pyproject.toml to read bounds from (default: the nearest one from here up)",
    )
    add_device_options(parser)


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


def _milliseconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a positive number: {text!r}")
    return value


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


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
    file, data = read_toml_file(path, "config file")
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
        return CONFIG_KEYS[key], parse_fraction(value)
    except ValueError as exc:
        raise WallfinderError(f"{file}: [{CONFIG_TABLE}] {key}: {exc}") from None


def run(args: argparse.Namespace) -> int:
    config_file = args.config or find_config(Path.cwd())
    config = read_config(config_file) if config_file is not None else {}
    given: dict[str, float | None] = {}
    for f in fields(Bounds):
        flag, configured = getattr(args, f.name), config.get(f.name)
        given[f.name] = flag if flag is not None else _number(configured)
    bounds = Bounds(**given)
    baseline_path = args.baseline or config.get("baseline")
    if not bounds.given():
        raise WallfinderError(
            "no bound to check: give --max-step-ms, --min-mfu, --max-idle, --max-exposed-comm "
            f"or --baseline with --max-regression (or set them in [{CONFIG_TABLE}])"
        )
    if (baseline_path is None) != (bounds.max_regression is None):
        raise WallfinderError("--baseline and --max-regression go together: give both")
    options = options_from(args)
    diagnosis = load_diagnosis(args.path, options)
    baseline = None
    if isinstance(baseline_path, Path):
        baseline = load_diagnosis(baseline_path, options)
    results = check(diagnosis, bounds, baseline)
    broken = [r for r in results if not r.held]
    for r in broken:
        print(r.line)
    if broken:
        return 1
    print(f"all {len(results)} bounds hold: " + "; ".join(r.line for r in results))
    return 0
