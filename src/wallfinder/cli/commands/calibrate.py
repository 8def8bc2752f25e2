"""`wallfinder calibrate`: measure this device's real roofs, print them against the datasheet
and save a profile for `analyze --device-profile`."""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from wallfinder.capture.calibrate import CalibrationResult, Figure, Settings, calibrate
from wallfinder.cli.commands.analyze import positive_int
from wallfinder.units import duration

DEFAULT_OUTPUT = Path("wallfinder-device.toml")
WIDTH = 100


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        default=DEFAULT_OUTPUT,
        metavar="FILE",
        help=f"where to save the profile (default: {DEFAULT_OUTPUT})",
    )
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument(
        "--quick", action="store_true", help="small sizes and few repetitions: seconds, rougher"
    )
    parser.add_argument("--size", type=positive_int, metavar="N", help="n of the n×n matmuls")
    parser.add_argument("--copy-mib", type=positive_int, metavar="MIB", help="size of the copy")
    parser.add_argument("--repetitions", type=positive_int, metavar="R", help="timed repetitions")
    device = parser.add_argument_group("device (default: the current GPU, else the CPU)")
    device.add_argument("--device-index", type=int, metavar="I", help="the GPU to measure")
    device.add_argument("--cpu", action="store_true", help="measure the CPU even with a GPU")


def run(args: argparse.Namespace) -> int:
    settings = Settings(
        quick=args.quick,
        matmul_size=args.size,
        copy_bytes=args.copy_mib << 20 if args.copy_mib else None,
        repetitions=args.repetitions,
        device_index=args.device_index,
        cpu=args.cpu,
    )
    progress = _progress if sys.stderr.isatty() else None
    result = calibrate(settings, progress)
    path = result.save(args.output)
    if args.format == "json":
        sys.stdout.write(json.dumps({**result.to_dict(), "profile": str(path)}, indent=2) + "\n")
    else:
        sys.stdout.write(render(result, path))
    return 0


def _progress(what: str) -> None:
    print(f"wallfinder: measuring {what}", file=sys.stderr, flush=True)


def render(result: CalibrationResult, path: Path, *, width: int = WIDTH) -> str:
    """The measured figures against the datasheet's, and where the profile went."""
    ds = result.datasheet
    where = f"CPU, {result.threads} threads" if result.kind == "cpu" else result.backend
    head = Text()
    head.append("wallfinder calibrate", style="bold")
    head.append(f" · {result.device} · {where} · torch {result.torch} · {result.date}")
    if ds is None:
        head.append("\nno datasheet: this device is not in the catalogue")
    else:
        head.append(f"\ncompared with: {ds.name} — {ds.source}")
    reference = "estimate" if ds is not None and ds.estimate else "datasheet"
    table = Table(box=None, pad_edge=False, show_edge=False)
    table.add_column("figure")
    table.add_column("measured", justify="right")
    table.add_column(reference, justify="right")
    table.add_column(f"% of {reference}", justify="right")
    table.add_column("how", overflow="fold")
    for f in result.figures:
        ratio = f.of_datasheet
        table.add_row(
            f.label,
            _value(f),
            "—" if f.datasheet is None else _si(f.datasheet, f.unit),
            "—" if ratio is None else f"{ratio:.0%}",
            f.method,
        )
    notes = Text("\n".join(result.notes), style="dim")
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, no_color=True, highlight=False, soft_wrap=False)
    for part in (head, table, notes):
        console.print(part)
        console.print()
    return buffer.getvalue() + (
        f"saved {path}: use it with `wallfinder analyze TRACE --device-profile {path}`\n"
    )


def _value(f: Figure) -> str:
    if f.value is None:
        return "—"
    if f.unit == "s":
        return duration(f.value)
    return _si(f.value, f.unit)


def _si(value: float, unit: str) -> str:
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"
