"""The diagnosis's tables as files for notebooks and spreadsheets (`analyze --export DIR`):
kernels, ops, modules, phases per step, and the device's roofs, each as CSV and, when pyarrow
is installed (the `parquet` extra), as Parquet. Every table is written, with its header, even
when the trace gives it no rows, so a script can read the same files from every run.

The columns are fixed per table (README, "Tables for notebooks and spreadsheets"): times in
seconds, as the diagnosis holds them (kernels and ops: totals over the steady-state steps;
modules: per step; phases: one row per step), shares as fractions, an empty cell (a Parquet
null) where the diagnosis has no figure. Nothing here computes a figure: each cell is one of the
diagnosis's, laid out flat."""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from wallfinder.analysis.classify import KernelClass
from wallfinder.analysis.phases import PHASES
from wallfinder.errors import WallfinderError

if TYPE_CHECKING:
    from wallfinder.diagnosis import Diagnosis

Cell = str | int | float | bool | None
Type = Literal["str", "int", "float", "bool"]

BOUNDS = ("compute", "bandwidth", "unknown")
"""The module table's roofline placement columns (`<bound>_bound_s`)."""

PARQUET_MISSING = "Parquet needs pyarrow: pip install 'wallfinder[parquet]'"


class Table(msgspec.Struct, frozen=True):
    """One exported table: its file stem, its typed columns and its rows."""

    name: str
    columns: tuple[tuple[str, Type], ...]
    rows: list[tuple[Cell, ...]]


class Exported(msgspec.Struct, frozen=True):
    """What `export_tables` wrote: the files, and a note when Parquet was left out."""

    files: list[Path]
    note: str | None


def tables(diagnosis: Diagnosis) -> list[Table]:
    """The diagnosis's tables, in the order they are written."""
    return [builder(diagnosis) for builder in _BUILDERS]


def export_tables(diagnosis: Diagnosis, folder: Path, *, parquet: bool = True) -> Exported:
    """Write every table of `diagnosis` into `folder` (made if missing) as `<name>.csv`, and
    as `<name>.parquet` when `parquet` is asked for and pyarrow is installed (else `note`
    says why not). Raises `WallfinderError` when the folder cannot be written."""
    pa = _pyarrow() if parquet else None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        written: list[Path] = []
        for table in tables(diagnosis):
            written.append(_write_csv(table, folder / f"{table.name}.csv"))
            if pa is not None:
                written.append(_write_parquet(pa, table, folder / f"{table.name}.parquet"))
    except OSError as exc:
        raise WallfinderError(f"{folder}: cannot write the tables ({exc.strerror})") from None
    note = PARQUET_MISSING if parquet and pa is None else None
    return Exported(files=written, note=note)


def _pyarrow() -> Any:
    """The pyarrow module, or None when it is not installed."""
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        return None
    return pyarrow


def _write_csv(table: Table, path: Path) -> Path:
    with path.open("w", encoding="utf-8", newline="") as f:
        out = csv.writer(f)
        out.writerow(name for name, _ in table.columns)
        out.writerows(tuple("" if c is None else c for c in row) for row in table.rows)
    return path


_ARROW_TYPES = {"str": "string", "int": "int64", "float": "float64", "bool": "bool_"}


def _write_parquet(pa: Any, table: Table, path: Path) -> Path:
    schema = pa.schema([(name, getattr(pa, _ARROW_TYPES[kind])()) for name, kind in table.columns])
    data = {name: [row[j] for row in table.rows] for j, (name, _) in enumerate(table.columns)}
    pa.parquet.write_table(pa.Table.from_pydict(data, schema=schema), str(path))
    return path


def _kernels(d: Diagnosis) -> Table:
    return Table(
        "kernels",
        (
            ("name", "str"),
            ("class", "str"),
            ("count", "int"),
            ("time_s", "float"),
            ("share", "float"),
            ("flops", "float"),
            ("bytes", "float"),
            ("ai", "float"),
            ("bound", "str"),
            ("pct_of_roof", "float"),
            ("bound_basis", "str"),
        ),
        [
            (
                k.name,
                k.cls,
                k.count,
                k.time_s,
                k.share,
                k.flops,
                k.bytes,
                k.ai,
                k.bound,
                k.pct_of_roof,
                k.bound_basis,
            )
            for k in d.kernels + d.more_kernels  # the whole table, not the top rows
        ],
    )


def _ops(d: Diagnosis) -> Table:
    rows = (d.roofline.ops + d.roofline.more_ops) if d.roofline is not None else []
    return Table(
        "ops",
        (
            ("name", "str"),
            ("shapes", "str"),
            ("dtype", "str"),
            ("class", "str"),
            ("calls", "int"),
            ("time_s", "float"),
            ("flops", "float"),
            ("bytes", "float"),
            ("ai", "float"),
            ("achieved_flops", "float"),
            ("achieved_bandwidth", "float"),
            ("ridge", "float"),
            ("bound", "str"),
            ("pct_of_roof", "float"),
        ),
        [
            (
                o.name,
                o.shapes,
                o.dtype,
                o.cls,
                o.calls,
                o.time_s,
                o.flops,
                o.bytes,
                o.ai,
                o.achieved_flops,
                o.achieved_bandwidth,
                o.ridge,
                o.bound,
                o.pct_of_roof,
            )
            for o in rows
        ],
    )


def _modules(d: Diagnosis) -> Table:
    classes = [c.value for c in KernelClass]
    rows: list[tuple[Cell, ...]] = []
    for m in d.modules.rows if d.modules is not None else []:
        s = m.spread
        rows.append(
            (
                m.path,
                m.parent,
                m.depth,
                m.instances,
                m.forward_s,
                m.backward_s,
                m.share,
                *(m.classes.get(c, 0.0) for c in classes),
                *(m.bound_s.get(b, 0.0) for b in BOUNDS),
                s.count if s else None,
                s.min_s if s else None,
                s.median_s if s else None,
                s.max_s if s else None,
                s.outlier if s else None,
            )
        )
    return Table(
        "modules",
        (
            ("path", "str"),
            ("parent", "str"),
            ("depth", "int"),
            ("instances", "int"),
            ("forward_s", "float"),
            ("backward_s", "float"),
            ("share", "float"),
            *((f"{c}_s", "float") for c in classes),
            *((f"{b}_bound_s", "float") for b in BOUNDS),
            ("spread_count", "int"),
            ("spread_min_s", "float"),
            ("spread_median_s", "float"),
            ("spread_max_s", "float"),
            ("spread_outlier", "str"),
        ),
        rows,
    )


def _phases(d: Diagnosis) -> Table:
    steps = d.phases.steps if d.phases is not None else []
    return Table(
        "phases",
        (
            ("step", "str"),
            ("warmup", "bool"),
            ("duration_s", "float"),
            *((f"{p}_exposed_s", "float") for p in PHASES),
            *((f"{p}_gpu_s", "float") for p in PHASES),
        ),
        [
            (
                s.step,
                s.warmup,
                s.duration_s,
                *(s.exposed_s.get(p, 0.0) for p in PHASES),
                *(s.gpu_s.get(p) for p in PHASES),
            )
            for s in steps
        ],
    )


def _roofline(d: Diagnosis) -> Table:
    peaks = d.device.peak_flops or {}
    ridges = d.roofline.ridge if d.roofline is not None else {}
    return Table(
        "roofline",
        (
            ("dtype", "str"),
            ("peak_flops", "float"),
            ("mem_bandwidth", "float"),
            ("ridge", "float"),
        ),
        [
            (dtype, peaks.get(dtype), d.device.mem_bandwidth, ridges.get(dtype))
            for dtype in sorted(peaks.keys() | ridges.keys())
        ],
    )


_BUILDERS: tuple[Callable[[Diagnosis], Table], ...] = (
    _kernels,
    _ops,
    _modules,
    _phases,
    _roofline,
)
