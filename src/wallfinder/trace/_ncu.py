"""Read Nsight Compute exports (`ncu --csv`) into one typed record per kernel launch.

`ncu --csv` prints one of two pages, and real files carry what came before them:

- the **details page** (the default): one row per metric per launch, with `Section Name`,
  `Metric Name`, `Metric Unit` and `Metric Value` columns; sections' display names ("Duration",
  "DRAM Throughput", "Achieved Occupancy") or, with `--metrics`, the raw metric names under
  "Command line profiler metrics"; rule rows (`Rule Name`, `Rule Type`, `Rule Description`)
  carry no metric;
- the **raw page** (`--page raw`): one row per launch, one column per metric, and a second row
  that holds each column's unit.

Releases differ: older ones have no `Device`/`CC` columns, a `Kernel Time` column (the time of
day the launch was profiled, not its duration) and NVTX range columns; the program's own
output and `==PROF==` lines come before the header when stdout was captured; numbers are
written in the locale's form (`1,234.5`, `1.234,5`); missing values are `n/a`. Units are
normalised here, once (`_scale`): bytes, seconds, per second, fractions for `%`, cycles and
instruction counts as they are.

Which metric means what is declared once, as data (`FIELDS`): the raw metric names first, then
the details page's display names, each with the kind of unit it must have (the details page
calls both a % of peak and a byte rate "Memory Throughput").
"""

from __future__ import annotations

import csv
import functools
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from wallfinder.errors import WallfinderError
from wallfinder.trace._cache import exported_report
from wallfinder.trace._reader import UNREADABLE, gunzipped, read_errors

# The join keys of kernel names live with the other kernel names, in units; trace names them too.
from wallfinder.units import base_name as base_name
from wallfinder.units import normalised_name as normalised_name

REPORT_SUFFIX = ".ncu-rep"
EXPORT_HINT = "ncu --import FILE.ncu-rep --csv --page raw > FILE.csv"

# --- Units ----------------------------------------------------------------------------------

_PREFIX = {"n": 1e-9, "u": 1e-6, "\u00b5": 1e-6, "m": 1e-3, "": 1.0, "K": 1e3, "k": 1e3}
_PREFIX.update({"M": 1e6, "G": 1e9, "T": 1e12})
_BASES = {"byte": "byte", "B": "byte", "second": "second", "s": "second", "cycle": "cycle"}
_BASES.update({"inst": "inst", "sector": "sector", "request": "request"})
"""Base units as ncu spells them (`usecond` in older releases, `us` in newer; `Kbyte`) and
what they normalise to."""
_TIME = {"second": 1.0, "s": 1.0}


def _split_prefix(unit: str, bases: Sequence[str]) -> tuple[float, str] | None:
    """(the prefix's factor, the base's normal name) when `unit` is a prefix and a base."""
    for base in bases:
        if unit.endswith(base):
            prefix = unit[: -len(base)]
            if prefix in _PREFIX:
                return _PREFIX[prefix], _BASES.get(base, base)
    return None


@functools.cache
def _scale(unit: str) -> tuple[str, float]:
    """A unit's kind after normalisation and the factor that takes a value there: "byte",
    "second", "byte/second", "cycle/second", "fraction" (a % / 100), or the unit itself
    (cycle, inst, warp, register/thread: counts, as they are)."""
    u = unit.strip()
    if u == "%":
        return "fraction", 0.01
    if u == "":
        return "", 1.0
    if u.lower().endswith("hz"):  # SM frequency: Ghz, Mhz, hz
        p = _split_prefix(u[:-2] + "hz", ("hz",))
        return "cycle/second", p[0] if p else 1.0
    num, _, den = u.partition("/")
    factor = 1.0
    kind_num = num
    hit = _split_prefix(num, tuple(_BASES))
    if hit is not None:
        factor, kind_num = hit
    elif num.endswith("bytes"):
        kind_num = "byte"
    if not den:
        return kind_num, factor
    t = _split_prefix(den, ("second", "s"))
    if t is not None:
        return f"{kind_num}/second", factor / t[0]
    return f"{kind_num}/{den}", factor


# --- Numbers --------------------------------------------------------------------------------

_MISSING = {"", "n/a", "N/A", "na", "-", "nan", "NaN"}
_DECIMAL_COMMA = re.compile(r"^[+-]?\d{1,3}(\.\d{3})+,\d+$|^[+-]?\d+,(\d{1,2}|\d{4,})$")
_GROUPED_POINT = re.compile(r"^[+-]?\d{1,3}(\.\d{3}){2,}$")


def _decimal_comma(values: Iterable[str]) -> bool:
    """Whether the file writes numbers with a decimal comma (`1.234,5`): some value shows it
    (a comma followed by other than three digits, or points grouping thousands before a
    comma); a file without such evidence is read with a decimal point."""
    for v in values:
        s = "".join(v.split()).replace("'", "")  # spaces that group thousands (`1 234,5`)
        if _DECIMAL_COMMA.match(s) or _GROUPED_POINT.match(s):
            return True
        if "." in s and "," in s and s.rfind(",") < s.rfind("."):
            return False
    return False


def _number(text: str, comma: bool) -> float | None:
    """A value as ncu wrote it: locale digits, `n/a` (None), or a `(x, y, z)` launch size
    (its product)."""
    if not comma:
        try:  # the common case: plain digits with a decimal point
            value = float(text)
        except ValueError:
            pass
        else:
            return value if math.isfinite(value) else None
    s = text.strip().replace("\u202f", "").replace("\xa0", "").replace("'", "")
    if s in _MISSING:
        return None
    if s.startswith("(") and s.endswith(")"):
        parts = [_number(p, False) for p in s[1:-1].split(",")]
        if not parts or any(p is None for p in parts):
            return None
        return float(math.prod(p for p in parts if p is not None))
    s = s.replace(" ", "")
    s = s.replace(".", "").replace(",", ".") if comma else s.replace(",", "")
    try:
        value = float(s)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


# --- What each metric says, as data ---------------------------------------------------------


@dataclass(frozen=True)
class Field:
    """A figure of a launch: the metric names that hold it (raw names first, then the details
    page's display names), first present wins, and the unit kind it must have."""

    names: tuple[str, ...]
    kind: str


FIELDS: dict[str, Field] = {
    "duration_s": Field(
        ("gpu__time_duration.sum", "gpu__time_duration.avg", "Duration", "Kernel Duration"),
        "second",
    ),
    "cycles": Field(
        ("sm__cycles_elapsed.avg", "gpc__cycles_elapsed.max", "Elapsed Cycles", "SM Cycles"),
        "cycle",
    ),
    "clock_hz": Field(
        (
            "sm__cycles_elapsed.avg.per_second",
            "gpc__cycles_elapsed.avg.per_second",
            "SM Frequency",
        ),
        "cycle/second",
    ),
    "sm_pct": Field(
        (
            "sm__throughput.avg.pct_of_peak_sustained_elapsed",
            "Compute (SM) Throughput",
            "Compute (SM) [%]",
            "SM [%]",
        ),
        "fraction",
    ),
    "memory_pct": Field(
        (
            "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
            "Memory Throughput",
            "Memory [%]",
            "Mem Busy",
        ),
        "fraction",
    ),
    "dram_pct": Field(
        (
            "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
            "dram__throughput.avg.pct_of_peak_sustained_elapsed",
            "DRAM Throughput",
            "SOL DRAM",
        ),
        "fraction",
    ),
    "l1_pct": Field(
        (
            "l1tex__throughput.avg.pct_of_peak_sustained_active",
            "l1tex__throughput.avg.pct_of_peak_sustained_elapsed",
            "L1/TEX Cache Throughput",
            "SOL L1/TEX Cache",
        ),
        "fraction",
    ),
    "l2_pct": Field(
        (
            "lts__throughput.avg.pct_of_peak_sustained_elapsed",
            "L2 Cache Throughput",
            "SOL L2 Cache",
        ),
        "fraction",
    ),
    "dram_bytes": Field(("dram__bytes.sum", "DRAM Bytes"), "byte"),
    "dram_bytes_per_s": Field(
        ("dram__bytes.sum.per_second", "Memory Throughput", "DRAM Bandwidth"), "byte/second"
    ),
    "l2_bytes": Field(("lts__t_bytes.sum", "L2 Bytes"), "byte"),
    "l1_bytes": Field(("l1tex__t_bytes.sum", "L1/TEX Bytes"), "byte"),
    "tensor_pct": Field(
        (
            "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
            "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
            "sm__inst_executed_pipe_tensor.avg.pct_of_peak_sustained_active",
            "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed",
            "sm__inst_executed_pipe_tensor.avg.pct_of_peak_sustained_elapsed",
        ),
        "fraction",
    ),
    "tensor_inst": Field(
        ("sm__inst_executed_pipe_tensor.sum", "sm__inst_executed_pipe_tensor_op_hmma.sum"),
        "inst",
    ),
    "occupancy": Field(
        ("sm__warps_active.avg.pct_of_peak_sustained_active", "Achieved Occupancy"), "fraction"
    ),
    "grid": Field(("launch__grid_size", "Grid Size"), ""),
    "block": Field(("launch__block_size", "Block Size"), ""),
}
"""Each figure a launch may carry and where it is found; a field none of whose names is
present is None."""

_SASS_FLOPS = {
    # (precision, op): FLOPs per thread instruction. An FMA is a multiply and an add.
    (p, op): 2.0 if op == "fma" else 1.0
    for p in ("d", "f", "h")
    for op in ("add", "mul", "fma")
}
_FLOP_COUNTS = ("flop_count_dp", "flop_count_sp", "flop_count_hp")
"""nvprof-style FLOP counts (FMA already counted as two), for exports that carry them."""

COLLECT_METRICS = (
    "gpu__time_duration.sum",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    "l1tex__throughput.avg.pct_of_peak_sustained_active",
    "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "dram__bytes.sum",
    "lts__t_bytes.sum",
    "l1tex__t_bytes.sum",
    "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__inst_executed_pipe_tensor.sum",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "launch__grid_size",
    "launch__block_size",
    *(f"sm__sass_thread_inst_executed_op_{p}{op}_pred_on.sum" for p, op in _SASS_FLOPS),
)
"""What wallfinder reads from an export, as `ncu --metrics` names: one collection run gives
every figure of a kernel's row."""


def ncu_command(
    kernel_regex: str | None = None, *, launch_skip: int = 0, launch_count: int | None = None
) -> str:
    """The `ncu` command line that collects what wallfinder reads, for the kernels a regex
    names (all when None), as a raw-page CSV on stdout (`PROGRAM` is the user's)."""
    parts = ["ncu", "--csv", "--page", "raw", "--metrics", ",".join(COLLECT_METRICS)]
    if kernel_regex is not None:
        parts += ["--kernel-name-base", "function", "--kernel-name", f"'regex:{kernel_regex}'"]
    if launch_skip:
        parts += ["--launch-skip", str(launch_skip)]
    if launch_count is not None:
        parts += ["--launch-count", str(launch_count)]
    return " ".join([*parts, "PROGRAM", ">", "kernels.csv"])


# --- The records ----------------------------------------------------------------------------


@dataclass(frozen=True)
class NcuLaunch:
    """One profiled kernel launch: its identity and its figures, in base units (seconds,
    bytes, per second, fractions of peak); None where the export does not carry one."""

    id: int
    name: str
    figures: dict[str, float | None]
    flops: float | None = None
    flops_basis: str | None = None
    """"sass" (CUDA-core thread instructions, FMA as two), "flop_count", or None."""
    device: str | None = None
    capability: str | None = None
    """The device's compute capability as the export's `CC` column writes it ("8.0"); None
    in releases without the column."""
    nvtx: str | None = None
    metrics: frozenset[str] = frozenset()
    """The metric names this launch carried a value for."""
    invocations: int = 1
    """Launches this record stands for: 1, or a summary page's `Invocations` (its figures
    are their averages)."""

    def __getitem__(self, key: str) -> float | None:
        return self.figures.get(key)


@dataclass(frozen=True)
class NcuExport:
    """The launches of one or more `ncu --csv` exports, in the order they were profiled."""

    source: str
    launches: list[NcuLaunch]
    page: str
    """"details", "raw" or "summary" (`--print-summary per-kernel`); for several files, those
    they had ("details+raw")."""
    metrics: frozenset[str] = frozenset()
    """Every metric name the export carried a value for."""


_NAME_COLUMNS = ("Kernel Name", "Function Name", "Name")
_VALUE_COLUMNS = ("Metric Value", "Average")
"""Where the details page keeps a metric's value; `--print-summary per-kernel` writes one row
per kernel with its `Invocations` and the metric's Minimum, Maximum and Average."""
_IDENTITY = {
    "Block Size",
    "Grid Size",
    "ID",
    "Process ID",
    "Process Name",
    "Host Name",
    "Kernel Name",
    "Function Name",
    "Name",
    "Kernel Time",
    "Context",
    "Stream",
    "Device",
    "CC",
    "Section Name",
    "Metric Name",
    "Metric Unit",
    "Metric Value",
    "Invocations",
    "Minimum",
    "Maximum",
    "Average",
    "Rule Name",
    "Rule Type",
    "Rule Description",
    "Estimated Speedup Type",
    "Estimated Speedup",
}


def _is_nvtx_column(name: str) -> bool:
    return "Range" in name or "Domain" in name or name.startswith("NVTX")


def is_ncu_input(path: Path) -> bool:
    """Whether `path` is named as an Nsight Compute export (`*.ncu-rep`, `*.ncu.csv[.gz]`) or
    is a CSV whose header ncu wrote (checked in its first lines)."""
    name = path.name.lower()
    if name.endswith(REPORT_SUFFIX) or ".ncu." in name:
        return True
    if not (name.endswith(".csv") or name.endswith(".csv.gz") or name.endswith(".txt")):
        return False
    try:
        with path.open("rb") as raw:
            head = gunzipped(raw).read(1 << 16).decode("utf-8", "replace")
    except UNREADABLE:
        return False
    return any(_header(line) is not None for line in head.splitlines())


def _header(line: str) -> list[str] | None:
    """The header row, when `line` is one: it names the kernel and either the launch (`ID`)
    or the metric (`Metric Name`; exports trimmed to fewer columns keep these)."""
    if "Name" not in line:
        return None
    try:
        cells = next(csv.reader([line]))
    except (csv.Error, StopIteration):
        return None
    named = any(c in cells for c in _NAME_COLUMNS)
    if named and ("ID" in cells or "Metric Name" in cells):
        return cells
    return None


def _text(path: Path) -> str:
    with read_errors(path, "not an Nsight Compute CSV export"), path.open("rb") as raw:
        data = gunzipped(raw).read()
    return data.decode("utf-8-sig", "replace")


def read_csv_export(path: Path, source: str | None = None) -> NcuExport:
    """The launches of one `ncu --csv` file (details or raw page, plain or gzip)."""
    name = source or path.name
    lines = _text(path).splitlines()
    start = next((i for i, line in enumerate(lines) if _header(line) is not None), None)
    if start is None:
        raise WallfinderError(
            f'{name}: not an Nsight Compute CSV export (no header row with "ID" and '
            f'"Kernel Name"); export one with: {EXPORT_HINT}'
        )
    try:
        rows = [r for r in csv.reader(_body(lines[start:])) if r]
    except csv.Error as exc:  # a field past the csv module's size limit, a NUL byte
        raise WallfinderError(f"{name}: not readable as CSV ({exc})") from None
    header, body = rows[0], rows[1:]
    value = next((c for c in _VALUE_COLUMNS if c in header), None)
    details = "Metric Name" in header and value is not None
    # The details page leaves a metric row's empty rule cells out; the raw page writes all.
    width = header.index(value) + 1 if details and value else len(header)
    if body and len(body[-1]) < width:
        raise WallfinderError(
            f"{name}: truncated (its last row has {len(body[-1])} of {width} columns)"
        )
    body = [r for r in body if len(r) >= width]
    if details and value:
        launches = _details(name, header, body, value)
        page = "details" if value == "Metric Value" else "summary"
    else:
        launches = _raw(name, header, body)
        page = "raw"
    if not launches:
        raise WallfinderError(f"{name}: an Nsight Compute export with no kernel launches in it")
    if all(v is None for x in launches for v in x.figures.values()) and all(
        x.flops is None for x in launches
    ):
        raise WallfinderError(
            f"{name}: not an Nsight Compute CSV export (none of its columns is an ncu metric); "
            f"export one with: {EXPORT_HINT}"
        )
    metrics = frozenset(n for launch in launches for n in launch.metrics)
    return NcuExport(source=name, launches=launches, page=page, metrics=metrics)


def _body(lines: list[str]) -> list[str]:
    """The CSV's lines, less ncu's own `==PROF==`/`==WARNING==` lines (program output between
    rows is dropped later, as rows too short to be the export's)."""
    return [line for line in lines if line and not line.startswith("==")]


def _figures_from(
    values: dict[tuple[str, str], float],
) -> tuple[dict[str, float | None], float | None, str | None]:
    """The named figures of one launch from its (metric name, unit kind) → value table."""
    figures: dict[str, float | None] = {}
    for key, spec in FIELDS.items():
        figures[key] = next(
            (values[(n, spec.kind)] for n in spec.names if (n, spec.kind) in values), None
        )
        if figures[key] is None and spec.kind == "":  # launch sizes carry no unit
            figures[key] = next((v for (n, _k), v in values.items() if n in spec.names), None)
    if figures["duration_s"] is None and figures["cycles"] and figures["clock_hz"]:
        # Older collections name no duration: elapsed cycles over the SM clock is it.
        figures["duration_s"] = figures["cycles"] / figures["clock_hz"]
    flops, basis = _flops({n: v for (n, _k), v in values.items()})
    return figures, flops, basis


def _flops(values: dict[str, float]) -> tuple[float | None, str | None]:
    """FLOPs: the export's FLOP counts, else the SASS thread-instruction counters (an FMA is
    two FLOPs; `sm__` or `smsp__` spelling); None when it has neither."""
    counted = [values[n] for n in _FLOP_COUNTS if n in values]
    if counted:
        return float(sum(counted)), "flop_count"
    total = 0.0
    found = False
    for (p, op), per in _SASS_FLOPS.items():
        for unit in ("sm", "smsp"):
            n = f"{unit}__sass_thread_inst_executed_op_{p}{op}_pred_on.sum"
            if n in values:
                total += per * values[n]
                found = True
                break
    return (total, "sass") if found else (None, None)


def _details(name: str, header: list[str], body: list[list[str]], value: str) -> list[NcuLaunch]:
    col = {h: i for i, h in enumerate(header)}
    m_name, m_unit, m_value = col["Metric Name"], col.get("Metric Unit"), col[value]
    comma = _decimal_comma(r[m_value] for r in body if len(r) > m_value)
    order: list[str] = []
    per: dict[str, list[list[str]]] = {}

    def metric(r: list[str]) -> tuple[str, str] | None:
        # A metric by its name and unit kind: "Memory Throughput" is a % and a byte rate.
        if m_name >= len(r) or not r[m_name]:
            return None
        unit = r[m_unit] if m_unit is not None and m_unit < len(r) else ""
        return r[m_name], _scale(unit)[0]

    for r, lid in zip(body, _launch_ids(header, body, metric), strict=True):
        if len(r) <= m_value or not r[m_name]:
            continue  # a rule row, or a section's header row: no metric
        per.setdefault(lid, []).append(r)
        if len(per[lid]) == 1:
            order.append(lid)
    launches = []
    for lid in order:
        rows = per[lid]
        values: dict[tuple[str, str], float] = {}
        for r in rows:
            kind, factor = _scale(r[m_unit] if m_unit is not None else "")
            v = _number(r[m_value], comma)
            if v is not None:
                values.setdefault((r[m_name], kind), v * factor)
        launches.append(_launch(name, lid, header, rows[0], values))
    return launches


def _launch_ids(
    header: list[str], body: list[list[str]], metric: Callable[[list[str]], object] | None
) -> list[str]:
    """Each row's launch: its `ID`; in an export without that column, a new launch begins
    where the kernel's name changes or (details page) a `metric` comes round again."""
    if "ID" in header:
        at = header.index("ID")
        return [r[at] for r in body]
    at = next(header.index(c) for c in _NAME_COLUMNS if c in header)
    ids: list[str] = []
    launch, kernel = -1, None
    seen: set[object] = set()
    for r in body:
        key = metric(r) if metric is not None else None
        if key is None and metric is not None and r[at] == kernel:
            ids.append(str(launch))  # a rule row: no metric, the launch goes on
            continue
        if r[at] != kernel or metric is None or key in seen:
            launch, kernel, seen = launch + 1, r[at], set()
        seen.add(key)
        ids.append(str(launch))
    return ids


def _raw(name: str, header: list[str], body: list[list[str]]) -> list[NcuLaunch]:
    units: list[str] = [""] * len(header)
    kernel = next(header.index(c) for c in _NAME_COLUMNS if c in header)
    if body and body[0][kernel] == "":  # the units row: no kernel named
        units, body = body[0], body[1:]
    metric_cols = [i for i, h in enumerate(header) if h not in _IDENTITY and not _is_nvtx_column(h)]
    comma = _decimal_comma(r[i] for r in body for i in metric_cols if i < len(r))
    launches = []
    for r, lid in zip(body, _launch_ids(header, body, None), strict=True):
        values: dict[tuple[str, str], float] = {}
        for i in metric_cols:
            kind, factor = _scale(units[i] if i < len(units) else "")
            v = _number(r[i], comma)
            if v is not None:
                values[(header[i], kind)] = v * factor
        launches.append(_launch(name, lid, header, r, values))
    return launches


def _launch(
    source: str, lid: str, header: list[str], row: list[str], values: dict[tuple[str, str], float]
) -> NcuLaunch:
    col = {h: i for i, h in enumerate(header)}
    kernel = next((row[col[c]] for c in _NAME_COLUMNS if c in col and row[col[c]]), "")
    try:
        number = int(_number(lid, False) or 0)
    except (TypeError, ValueError):
        raise WallfinderError(f"{source}: launch ID {lid!r} is not a number") from None
    for column in ("Grid Size", "Block Size"):
        # Newer details pages name the launch's size in columns of their own.
        if column in col and (column, "") not in values:
            size = _number(row[col[column]], False)
            if size is not None:
                values[(column, "")] = size
    figures, flops, basis = _figures_from(values)
    device = row[col["Device"]] if "Device" in col and row[col["Device"]] else None
    capability = row[col["CC"]].strip() if "CC" in col and row[col["CC"]].strip() else None
    nvtx = " ".join(
        row[i].strip().strip('"')
        for i, h in enumerate(header)
        if _is_nvtx_column(h) and row[i].strip()
    )
    count = _number(row[col["Invocations"]], False) if "Invocations" in col else None
    return NcuLaunch(
        invocations=max(1, int(count or 1)),
        id=number,
        name=kernel,
        figures=figures,
        flops=flops,
        flops_basis=basis,
        device=device,
        capability=capability,
        nvtx=nvtx or None,
        metrics=frozenset(n for n, _ in values),
    )


# --- Reports (.ncu-rep): exported once, to a cache ---------------------------------------------


def _exported(report: Path) -> Path:
    """The raw-page CSV of an `.ncu-rep` report, made with `ncu --import` into the cache (never
    beside the report) and reused while the report is unchanged."""
    return exported_report(
        report,
        tool="ncu",
        product="Nsight Compute",
        suffix=".csv",
        args=lambda ncu, _: [ncu, "--import", str(report), "--csv", "--page", "raw"],
        step="ncu --import",
        hint=EXPORT_HINT,
        instead="pass the .csv",
        from_stdout=True,
    )


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and is_ncu_input(p))
        if not files:
            raise WallfinderError(f"{path}: no Nsight Compute exports (*.csv, *.ncu-rep) here")
        return files
    if not path.exists():
        raise WallfinderError(f"{path}: no such file or folder")
    return [path]


def load_ncu(path: str | Path) -> NcuExport:
    """The launches of an Nsight Compute export: an `ncu --csv` file (details or raw page,
    plain or gzip), an `.ncu-rep` report (with `ncu` on PATH), or a folder of them, in file
    order. Raises `WallfinderError` with one line for anything else."""
    p = Path(path)
    exports = []
    for f in _files(p):
        csv_file = _exported(f) if f.name.lower().endswith(REPORT_SUFFIX) else f
        exports.append(read_csv_export(csv_file, f.name))
    if len(exports) == 1:
        return exports[0]
    return NcuExport(
        source=p.name,
        launches=[launch for e in exports for launch in e.launches],
        page="+".join(sorted({e.page for e in exports})),
        metrics=frozenset().union(*(e.metrics for e in exports)),
    )
