"""Read Nsight Systems exports (`nsys export --type sqlite`) into the trace model.

An export is a SQLite database with one table per kind of record, created lazily (a table that
would be empty is absent) and with columns added and renamed across nsys releases. Which table
and column says what is declared once, as data, in `_TABLES`, `_DEVICE_COLUMNS` and the name
tables below; the reader asks the database which of them exist and reads what is there, one
query per table, into numpy columns (`_rows`), so an export of a million kernels is a few C-level
passes, never a Python loop per row.

What maps to what:

- `CUPTI_ACTIVITY_KIND_KERNEL` / `_MEMCPY` / `_MEMSET`: device ops (pid = device, tid = stream,
  as Kineto writes them); kernel names from `StringIds` (the demangled name, as Kineto's), the
  grid as Kineto's `grid` argument; copy names in Kineto's form (`Memcpy HtoD (Pageable ->
  Device)`), so every rule that reads them reads both formats.
- `CUPTI_ACTIVITY_KIND_RUNTIME` (and `_DRIVER` where a release wrote one): runtime calls, their
  names without nsys's version suffix (`cudaLaunchKernel_v7000` is `cudaLaunchKernel`); the
  `correlationId` joins a launch to its device ops as Kineto's `correlation` does.
- `CUPTI_ACTIVITY_KIND_SYNCHRONIZATION`: device-side syncs (Kineto's `cuda_sync`).
- `NVTX_EVENTS`: push/pop and start/end ranges are annotations (the domain is their category);
  `torch.autograd.profiler.emit_nvtx` ranges (`aten::mm, seq = 3, ...`) are CPU ops; marks are
  instants. A range that repeats once per iteration marks the steps (`Trace.step_range`).
- `OSRT_API`: OS runtime calls, kept as other host activity.
- `TARGET_INFO_GPU` (newer) or `TARGET_INFO_CUDA_DEVICE` (older): the device, as Kineto's
  `deviceProperties`.
- Each process with GPU activity is a rank (its host threads and its device ops).

Secrets: an export carries the profiled process's environment and command line
(`TARGET_INFO_SYSTEM_ENV`, `META_DATA_CAPTURE`, `ProcessStreams`, process arguments, and the
`StringIds` rows they reference). The reader never reads those tables, and reads from
`StringIds` only the rows that the records above name; no message it raises quotes a value
from the database.
"""

from __future__ import annotations

import os
import re
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
import numpy.typing as npt

from wallfinder.errors import WallfinderError
from wallfinder.trace._cache import exported_report
from wallfinder.trace.model import NONE, Events, Kind, Trace, step_key
from wallfinder.trace.readers.nsys import REPORT_SUFFIXES

I64 = npt.NDArray[np.int64]

EXPORT_HINT = "nsys export --type sqlite --output FILE.sqlite FILE.nsys-rep"


# --- What the export's tables say, as data -------------------------------------------------


@dataclass(frozen=True)
class Table:
    """How one kind of record is read: its table names (newest first), the kind it becomes,
    and for each column of the model the export's column names that hold it (first present
    wins; none present reads as NONE)."""

    names: tuple[str, ...]
    kind: Kind
    columns: dict[str, tuple[str, ...]]
    name: tuple[str, ...] = ()
    """Columns that hold the record's name, a `StringIds` id or the text itself: per row, the
    first that has a value."""


_GPU_COLUMNS = {
    "start": ("start",),
    "end": ("end",),
    "device": ("deviceId",),
    "stream": ("streamId",),
    "correlation": ("correlationId",),
    "process": ("globalPid",),
}
_HOST_COLUMNS = {
    "start": ("start",),
    "end": ("end",),
    "thread": ("globalTid",),
    "correlation": ("correlationId",),
}

KERNEL = Table(
    ("CUPTI_ACTIVITY_KIND_KERNEL",),
    Kind.KERNEL,
    {
        **_GPU_COLUMNS,
        "grid_x": ("gridX",),
        "grid_y": ("gridY",),
        "grid_z": ("gridZ",),
        "block_x": ("blockX",),
        "block_y": ("blockY",),
        "block_z": ("blockZ",),
    },
    name=("demangledName", "shortName", "name", "mangledName"),
)
MEMCPY = Table(
    ("CUPTI_ACTIVITY_KIND_MEMCPY",),
    Kind.MEMCPY,
    {
        **_GPU_COLUMNS,
        "nbytes": ("bytes",),
        "copy_kind": ("copyKind",),
        "src_kind": ("srcKind",),
        "dst_kind": ("dstKind",),
    },
)
MEMSET = Table(
    ("CUPTI_ACTIVITY_KIND_MEMSET",),
    Kind.MEMSET,
    {**_GPU_COLUMNS, "nbytes": ("bytes",), "mem_kind": ("memKind",)},
)
SYNC = Table(
    ("CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",),
    Kind.GPU_SYNC,
    {**_GPU_COLUMNS, "sync_type": ("syncType",)},
)
RUNTIME = Table(
    ("CUPTI_ACTIVITY_KIND_RUNTIME",),
    Kind.RUNTIME,
    {**_HOST_COLUMNS, "event_class": ("eventClass",)},
    name=("nameId", "name"),
)
DRIVER = Table(
    ("CUPTI_ACTIVITY_KIND_DRIVER",),
    Kind.RUNTIME,
    {**_HOST_COLUMNS, "event_class": ()},
    name=("nameId", "name"),
)
NVTX = Table(
    ("NVTX_EVENTS",),
    Kind.ANNOTATION,
    {
        "start": ("start",),
        "end": ("end",),
        "thread": ("globalTid",),
        "event_type": ("eventType",),
        "domain": ("domainId",),
    },
    name=("textId", "text"),
)
OSRT = Table(
    ("OSRT_API",),
    Kind.OTHER,
    {"start": ("start",), "end": ("end",), "thread": ("globalTid",)},
    name=("nameId",),
)

_DEVICE_OPS = (KERNEL, MEMCPY, MEMSET)
_RECORDS = (*_DEVICE_OPS, SYNC, RUNTIME, DRIVER, NVTX, OSRT)

_DEVICE_TABLES = ("TARGET_INFO_GPU", "TARGET_INFO_CUDA_DEVICE")
_DEVICE_COLUMNS = {
    "id": ("id", "cuDevice", "cudaId", "deviceId"),
    "name": ("name",),
    "totalGlobalMem": ("totalMemory", "totalGlobalMemory", "globalMemorySize"),
    "numSms": ("smCount", "numMultiprocessors", "multiProcessorCount"),
    "computeMajor": ("computeMajor", "computeCapabilityMajor"),
    "computeMinor": ("computeMinor", "computeCapabilityMinor"),
    "l2CacheSize": ("l2CacheSize",),
}
"""The device's properties under Kineto's `deviceProperties` keys, and the export's columns
that hold each."""

# NVTX event types (ENUM_NSYS_EVENT_TYPE, stable across releases).
_NVTX_MARK = (34, 65)
_NVTX_RANGES = (59, 60, 70, 71)
_NVTX_DOMAIN = 75

_COPY_KINDS = {
    1: "HtoD",
    2: "DtoH",
    3: "HtoA",
    4: "AtoH",
    5: "AtoA",
    6: "AtoD",
    7: "DtoA",
    8: "DtoD",
    9: "HtoH",
    10: "PtoP",
    11: "HtoD",
    12: "DtoH",
    13: "DtoD",
}
_MEMORY_KINDS = {
    0: "Pageable",
    1: "Pinned",
    2: "Device",
    3: "Array",
    4: "Managed",
    5: "Device Static",
    6: "Managed Static",
}
_SYNC_TYPES = {1: "Event Sync", 2: "Stream Wait Event", 3: "Stream Sync", 4: "Context Sync"}
"""CUPTI's synchronisation types, under the names Kineto gives them."""

_VERSION_SUFFIX = re.compile(r"_v\d{4,}$")
_ANONYMOUS = re.compile(r"<unnamed>")
_EMIT_NVTX = re.compile(r"^(\w+::[\w.]+)(?:, (?:seq|op_id|sizes|input_op_ids|stashed seq) = .*)?$")
_STEP_WORDS = re.compile(r"step|iter|batch", re.IGNORECASE)

_STRING_BATCH = 500
"""`StringIds` rows asked for per query (SQLite allows 999 parameters in old builds)."""


# --- Opening --------------------------------------------------------------------------------


@contextmanager
def _database(path: Path, source: str) -> Iterator[sqlite3.Connection]:
    """`path` opened read-only (never written: no journal, no WAL file beside it)."""
    uri = f"file:{quote(str(path.absolute()))}?mode=ro&immutable=1"
    try:
        con = sqlite3.connect(uri, uri=True)
    except sqlite3.Error:
        raise WallfinderError(f"{source}: cannot be opened as a SQLite database") from None
    with closing(con):
        yield con


class _DamagedError(WallfinderError):
    """A database that opened but could not be read through."""


def _damaged(source: str) -> WallfinderError:
    return _DamagedError(f"{source}: not a readable SQLite database (truncated or damaged file?)")


class _Schema:
    """The tables of the export and their columns."""

    def __init__(self, con: sqlite3.Connection, source: str) -> None:
        try:
            names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
            self.columns = {
                t: {r[1]: str(r[2]).upper() for r in con.execute(f'PRAGMA table_info("{t}")')}
                for t in names
            }
        except sqlite3.DatabaseError:
            raise _damaged(source) from None

    def table(self, spec: Table) -> str | None:
        return next((t for t in spec.names if t in self.columns), None)

    def column(self, table: str, names: Sequence[str]) -> str | None:
        return next((c for c in names if c in self.columns[table]), None)

    @property
    def is_nsys(self) -> bool:
        return "StringIds" in self.columns and any(
            t.startswith(("CUPTI_ACTIVITY_KIND_", "NVTX_EVENTS", "TARGET_INFO_"))
            for t in self.columns
        )


# --- Reading columns ------------------------------------------------------------------------


@dataclass
class _Part:
    """The rows of one table, as columns of the model (times absolute ns; `pid`/`tid` raw
    values; `process` the OS pid a row belongs to)."""

    kind: npt.NDArray[np.int8]
    name: npt.NDArray[np.int32]
    cat: npt.NDArray[np.int32]
    ts: I64
    dur: I64
    pid: I64
    tid: I64
    process: I64
    correlation: I64
    device: I64
    stream: I64
    nbytes: I64
    grid: npt.NDArray[np.int32]
    block: npt.NDArray[np.int32]

    def take(self, rows: npt.NDArray[Any]) -> _Part:
        return _Part(**{k: v[rows] for k, v in vars(self).items()})


class _Strings:
    """The trace's string table (names and categories), and its argument records."""

    def __init__(self) -> None:
        self.codes: dict[str, int] = {"": 0}
        self.raw: dict[bytes, int] = {b"": 0}

    def code(self, text: str) -> int:
        return self.codes.setdefault(text, len(self.codes))

    def codes_of(self, texts: Sequence[str]) -> npt.NDArray[np.int32]:
        return np.fromiter(map(self.code, texts), np.int32, len(texts))

    def table(self) -> list[str]:
        return list(self.codes)


def _serial_pid(global_id: I64) -> I64:
    """The OS pid in a serialized GlobalId (`globalPid`/`globalTid`: bits 24-47)."""
    out: I64 = np.where(global_id >= 0, (global_id >> 24) & 0xFFFFFF, NONE)
    return out


def _serial_tid(global_id: I64) -> I64:
    """The OS tid in a serialized `globalTid` (its low 24 bits)."""
    out: I64 = np.where(global_id >= 0, global_id & 0xFFFFFF, NONE)
    return out


class _Reader:
    def __init__(self, con: sqlite3.Connection, schema: _Schema, source: str) -> None:
        self.con = con
        self.schema = schema
        self.source = source
        self.strings = _Strings()
        self.notes: list[str] = []

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        try:
            return self.con.execute(sql, params).fetchall()
        except sqlite3.DatabaseError:
            raise _damaged(self.source) from None

    def ints(self, table: str, spec: Table) -> dict[str, I64]:
        """The integer columns of `spec` in `table`, one query, NULL and absent as NONE."""
        present = {k: self.schema.column(table, v) for k, v in spec.columns.items()}
        names = [k for k, c in present.items() if c is not None]
        sql = ", ".join(f'COALESCE(CAST("{present[k]}" AS INTEGER), {NONE})' for k in names)
        try:
            cursor = self.con.execute(f'SELECT {sql} FROM "{table}"')
            flat = np.fromiter(chain.from_iterable(cursor), np.int64)
        except (sqlite3.DatabaseError, OverflowError):
            raise _damaged(self.source) from None
        block = flat.reshape(-1, len(names))
        n = block.shape[0]
        out = {k: np.full(n, NONE, np.int64) for k in spec.columns}
        for i, k in enumerate(names):
            out[k] = np.ascontiguousarray(block[:, i])
        missing = [spec.columns[k][0] for k, c in present.items() if c is None and spec.columns[k]]
        if missing and n:
            self.notes.append(f"{table} has no {', '.join(missing)} column")
        return out

    def names(self, table: str, spec: Table, n: int) -> npt.NDArray[np.int32]:
        """The trace's string code of each row's name: per row, from the first of the name
        columns that has a value (NVTX writes a range's name as a registered string id or as
        text, row by row). Id columns are read as integers in one pass."""
        out = np.zeros(n, np.int32)
        todo = np.ones(n, bool)
        for column in spec.name:
            declared = self.schema.columns[table].get(column)
            if declared is None or not todo.any():
                continue
            if "INT" in declared:
                ids = self.column(table, column)
                have = todo & (ids >= 0)
                out[have] = self.string_ids(ids[have])
            else:
                values = [r[0] for r in self.query(f'SELECT "{column}" FROM "{table}"')]
                have = todo & np.fromiter(map(_is_text, values), bool, n)
                rows = np.flatnonzero(have).tolist()
                out[rows] = self.strings.codes_of([values[i] for i in rows])
            todo &= ~have
        return out

    def column(self, table: str, column: str) -> I64:
        """One integer column, NULL as NONE."""
        sql = f'SELECT COALESCE(CAST("{column}" AS INTEGER), {NONE}) FROM "{table}"'
        try:
            return np.fromiter(chain.from_iterable(self.con.execute(sql)), np.int64)
        except (sqlite3.DatabaseError, OverflowError):
            raise _damaged(self.source) from None

    def string_ids(self, ids: I64) -> npt.NDArray[np.int32]:
        """The codes of the `StringIds` rows `ids` names: only those rows are read."""
        unique, inverse = np.unique(ids, return_inverse=True)
        found: dict[int, str] = {}
        wanted = unique.tolist()
        for i in range(0, len(wanted), _STRING_BATCH):
            batch = wanted[i : i + _STRING_BATCH]
            marks = ",".join("?" * len(batch))
            found.update(
                self.query(f"SELECT id, value FROM StringIds WHERE id IN ({marks})", batch)
            )
        local = self.strings.codes_of([_text(found.get(i)) for i in wanted])
        codes: npt.NDArray[np.int32] = local[inverse.reshape(-1)]
        return codes

    def part(self, spec: Table) -> _Part | None:
        table = self.schema.table(spec)
        if table is None:
            return None
        cols = self.ints(table, spec)
        n = cols["start"].size
        if n == 0:
            return None
        name = self.names(table, spec, n)
        start, end = cols["start"], cols["end"]
        kind = np.full(n, spec.kind, np.int8)
        none = np.full(n, NONE, np.int64)
        if "thread" in cols:
            pid, tid = _serial_pid(cols["thread"]), _serial_tid(cols["thread"])
            process, device, stream = pid, none, none
        else:
            device, stream = cols["device"], cols["stream"]
            pid, tid, process = device, stream, _serial_pid(cols["process"])
        part = _Part(
            kind=kind,
            name=name,
            cat=np.zeros(n, np.int32),
            ts=start,
            dur=np.maximum(np.where(end >= 0, end - start, 0), 0),
            pid=pid,
            tid=tid,
            process=process,
            correlation=cols.get("correlation", none),
            device=device,
            stream=stream,
            nbytes=cols.get("nbytes", none),
            grid=np.zeros(n, np.int32),
            block=np.zeros(n, np.int32),
        )
        return self.finish(spec, part, cols, end)

    def finish(self, spec: Table, part: _Part, cols: dict[str, I64], end: I64) -> _Part | None:
        """What each kind of record needs beyond the common columns."""
        codes = self.strings.code
        if spec is KERNEL:
            part.cat[:] = codes("kernel")
            # nsys demangles an anonymous namespace as Kineto's demangler does not.
            part.name = self.rename(part.name, _ANONYMOUS.sub, "(anonymous namespace)")
            part.grid = self.grids(cols, ("grid_x", "grid_y", "grid_z"))
            part.block = self.grids(cols, ("block_x", "block_y", "block_z"))
        elif spec is MEMCPY:
            part.cat[:] = codes("gpu_memcpy")
            part.name = self.labels(
                (cols["copy_kind"], cols["src_kind"], cols["dst_kind"]), _copy_name
            )
        elif spec is MEMSET:
            part.cat[:] = codes("gpu_memset")
            part.name = self.labels((cols["mem_kind"],), _set_name)
        elif spec is SYNC:
            part.cat[:] = codes("cuda_sync")
            part.name = self.labels((cols["sync_type"],), _sync_name)
        elif spec in (RUNTIME, DRIVER):
            part.name = self.rename(part.name, _VERSION_SUFFIX.sub, "")
            driver = (cols["event_class"] == 1) | (spec is DRIVER)
            part.cat = np.where(driver, codes("cuda_driver"), codes("cuda_runtime")).astype(
                np.int32
            )
        elif spec is NVTX:
            return self.nvtx(part, cols, end)
        elif spec is OSRT:
            part.cat[:] = codes("osrt")
        return part

    def labels(self, keys: tuple[I64, ...], label: Any) -> npt.NDArray[np.int32]:
        """Names made from enum columns: one label per distinct combination."""
        unique, inverse = _unique_rows(keys)
        local = self.strings.codes_of([label(*row) for row in unique.tolist()])
        out: npt.NDArray[np.int32] = local[inverse]
        return out

    def rename(self, name: npt.NDArray[np.int32], sub: Any, repl: str) -> npt.NDArray[np.int32]:
        table = self.strings.table()
        unique, inverse = np.unique(name, return_inverse=True)
        local = self.strings.codes_of([sub(repl, table[c]) for c in unique.tolist()])
        out: npt.NDArray[np.int32] = local[inverse.reshape(-1)]
        return out

    def grids(self, cols: dict[str, I64], keys: tuple[str, str, str]) -> npt.NDArray[np.int32]:
        """Each row's (x, y, z) of a grid or a block as Kineto writes it, interned."""
        unique, inverse = _unique_rows(tuple(cols[k] for k in keys))
        raw = self.strings.raw
        local = np.array(
            [
                raw.setdefault(f"[{x}, {y}, {z}]".encode(), len(raw)) if x > 0 else 0
                for x, y, z in unique.tolist()
            ],
            np.int32,
        )
        out: npt.NDArray[np.int32] = local[inverse]
        return out

    def nvtx(self, part: _Part, cols: dict[str, I64], end: I64) -> _Part | None:
        """Ranges become annotations (emit_nvtx op ranges CPU ops), marks instants; domain
        records name the categories; open ranges (no end) are dropped and counted."""
        etype = cols["event_type"]
        domain = cols["domain"]
        creates = etype == _NVTX_DOMAIN
        table = self.strings.table()
        domains = {
            int(d): table[int(c)]
            for d, c in zip(domain[creates].tolist(), part.name[creates].tolist(), strict=True)
        }
        ranges = np.isin(etype, _NVTX_RANGES) | (etype < 0)
        open_ranges = ranges & (end < 0)
        if open_ranges.any():
            self.notes.append(f"{int(open_ranges.sum())} NVTX ranges never ended: left out")
        keep = (ranges & ~open_ranges) | np.isin(etype, _NVTX_MARK)
        part = part.take(np.flatnonzero(keep))
        etype, domain = etype[keep], domain[keep]
        part.kind[np.isin(etype, _NVTX_MARK)] = Kind.INSTANT
        unique_domains, inverse = np.unique(domain, return_inverse=True)
        cats = self.strings.codes_of(
            [domains.get(int(d), "nvtx") or "nvtx" for d in unique_domains.tolist()]
        )
        part.cat = cats[inverse.reshape(-1)]
        # torch.autograd.profiler.emit_nvtx names each op's range "aten::mm, seq = 3, ...".
        table = self.strings.table()
        unique, inverse = np.unique(part.name, return_inverse=True)
        ops = [_EMIT_NVTX.match(table[c]) for c in unique.tolist()]
        is_op = np.array([m is not None for m in ops], bool)
        renamed = self.strings.codes_of(
            [m.group(1) if m else table[c] for m, c in zip(ops, unique.tolist(), strict=True)]
        )
        op_rows = is_op[inverse.reshape(-1)] & (part.kind == Kind.ANNOTATION)
        part.kind[op_rows] = Kind.CPU_OP
        part.name = renamed[inverse.reshape(-1)]
        return part

    def devices(self) -> list[dict[str, object]]:
        """The devices as Kineto's `deviceProperties` (id, name, memory, SMs, capability)."""
        table = next((t for t in _DEVICE_TABLES if t in self.schema.columns), None)
        if table is None:
            self.notes.append("the export has no TARGET_INFO_GPU table: the device is unknown")
            return []
        present = {k: self.schema.column(table, v) for k, v in _DEVICE_COLUMNS.items()}
        keys = [k for k, c in present.items() if c is not None]
        if not keys:
            return []
        sql = ", ".join(f'"{present[k]}"' for k in keys)
        rows = self.query(f'SELECT {sql} FROM "{table}"')
        out = []
        for row in rows:
            props = {k: v for k, v in zip(keys, row, strict=True) if v is not None}
            if isinstance(props.get("name"), str):
                props["name"] = str(props["name"]).strip()
            out.append(props)
        return out

    def process_names(self) -> dict[int, str]:
        """Process names by OS pid: the executable's name only (the first word, no folder),
        never arguments."""
        if "PROCESSES" not in self.schema.columns:
            return {}
        if not {"pid", "name"} <= self.schema.columns["PROCESSES"].keys():
            return {}
        out = {}
        for pid, name in self.query('SELECT "pid", "name" FROM PROCESSES'):
            if isinstance(pid, int) and isinstance(name, str) and name.split():
                out[pid] = os.path.basename(name.split()[0])[:40]
        return out


def _is_text(value: object) -> bool:
    return isinstance(value, str)


def _text(value: object) -> str:
    return value if isinstance(value, str) else ("" if value is None else str(value))


def _copy_name(kind: int, src: int, dst: int) -> str:
    what = _COPY_KINDS.get(kind, "Unknown")
    if src < 0 or dst < 0:
        return f"Memcpy {what}"
    source, target = _MEMORY_KINDS.get(src, "Unknown"), _MEMORY_KINDS.get(dst, "Unknown")
    return f"Memcpy {what} ({source} -> {target})"


def _set_name(kind: int) -> str:
    return f"Memset ({_MEMORY_KINDS.get(kind, 'Unknown')})" if kind >= 0 else "Memset"


def _sync_name(kind: int) -> str:
    return _SYNC_TYPES.get(kind, "Sync")


# --- Building the traces --------------------------------------------------------------------


def read_export(path: Path, source: str, step_range: str | None = None) -> list[Trace]:
    """The traces of an nsys SQLite export: one per process with GPU activity (its rank)."""
    with _database(path, source) as con:
        schema = _Schema(con, source)
        if not schema.is_nsys:
            raise WallfinderError(
                f"{source}: a SQLite database but not an Nsight Systems export (no StringIds "
                f"or CUPTI/NVTX tables); export a report with: {EXPORT_HINT}"
            )
        reader = _Reader(con, schema, source)
        parts = [p for spec in _RECORDS if (p := reader.part(spec)) is not None]
        devices = reader.devices()
        names = reader.process_names()
    missing = [spec.names[0] for spec in (KERNEL, RUNTIME, NVTX) if schema.table(spec) is None]
    gpu = [p for p in parts if p.kind[0] in (Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET)]
    if not gpu:
        raise WallfinderError(
            f"{source}: the export has no GPU activity (no CUDA kernels, copies or sets): was "
            "it captured with CUDA tracing on (nsys profile -t cuda,nvtx)?"
        )
    whole = _concat(parts)
    notes = [*reader.notes]
    if missing:
        notes.append(
            f"the export has no {', '.join(missing)} table"
            + ("s" if len(missing) > 1 else "")
            + " (not traced: nsys profile -t cuda,nvtx,osrt records them)"
        )
    ranks = _ranks(_concat(gpu))
    traces = []
    for rank, (process, own_devices) in enumerate(ranks):
        mine = whole.take(np.flatnonzero(whole.process == process))
        label = source if len(ranks) == 1 else f"{source} (pid {process})"
        trace = _trace(mine, reader.strings, label, devices, own_devices)
        trace.process_labels.update(_labels(trace, process, names))
        trace.warnings.extend(notes)
        if len(ranks) > 1:
            trace.distributed = {"rank": rank, "world_size": len(ranks)}
            trace.warnings.append(
                f"one of {len(ranks)} GPU processes in the export, numbered by device: "
                "rank numbers are wallfinder's, not the job's"
            )
        if len(own_devices) > 1:
            trace.warnings.append(
                f"the process drives {len(own_devices)} GPUs: the busiest is analysed"
            )
        if step_range is not None:
            trace.use_step_range(step_range)
        else:
            _default_step_range(trace)
        traces.append(trace)
    return traces


_FIELD = 21
"""Bits per value when a row of small integers is packed into one int64 key."""


def _unique_rows(columns: tuple[I64, ...]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.intp]]:
    """The distinct rows of some integer columns (as a 2-D array) and each row's index among
    them. Rows of up to three values in [-1, 2**21 - 2] (enums, grids, pids and devices) are
    packed into one int64 each, so a million rows take one 1-D `np.unique`."""
    stacked = np.stack(columns, axis=1)
    low, high = (int(stacked.min()), int(stacked.max())) if stacked.size else (0, 0)
    if len(columns) <= 3 and low >= -1 and high < (1 << _FIELD) - 1:
        key = np.zeros(stacked.shape[0], np.int64)
        for column in columns:
            key = (key << _FIELD) | (column + 1)
        packed, first, inverse = np.unique(key, return_index=True, return_inverse=True)
        del packed
        return stacked[first], inverse.reshape(-1)
    unique, inverse = np.unique(stacked, axis=0, return_inverse=True)
    return unique, inverse.reshape(-1)


def _concat(parts: list[_Part]) -> _Part:
    return _Part(**{k: np.concatenate([vars(p)[k] for p in parts]) for k in vars(parts[0])})


def _ranks(gpu: _Part) -> list[tuple[int, list[int]]]:
    """The processes with GPU activity and their devices, ordered by their first device."""
    pairs, _ = _unique_rows((gpu.process, gpu.device))
    by_process: dict[int, list[int]] = {}
    for process, device in pairs.tolist():
        by_process.setdefault(process, []).append(device)
    return sorted(by_process.items(), key=lambda item: (min(item[1]), item[0]))


def _trace(
    part: _Part,
    strings: _Strings,
    source: str,
    devices: list[dict[str, object]],
    own: list[int],
) -> Trace:
    origin_ns = int(part.ts.min()) // 1000 * 1000
    ids, codes = np.unique(np.concatenate([part.pid, part.tid]), return_inverse=True)
    codes = codes.reshape(-1).astype(np.int32)
    n = part.ts.size
    pid, tid = codes[:n], codes[n:]
    ts = part.ts - origin_ns
    order = np.lexsort((ts, part.kind))
    zeros = np.zeros(n, np.int32)
    columns: dict[str, npt.NDArray[Any]] = {
        "kind": part.kind,
        "name": part.name,
        "cat": part.cat,
        "ts": ts,
        "dur": part.dur,
        "pid": pid,
        "tid": tid,
        "external_id": np.full(n, NONE, np.int64),
        "correlation": part.correlation,
        "device": part.device,
        "stream": part.stream,
        "nbytes": part.nbytes,
        "seq": np.full(n, NONE, np.int64),
        "fwd_thread": np.full(n, NONE, np.int64),
        "input_dims": zeros,
        "input_type": zeros,
        "concrete_inputs": zeros,
        "grid": part.grid,
        "block": part.block,
        "comm": zeros,
    }
    events = Events(**{k: np.ascontiguousarray(v[order]) for k, v in columns.items()})
    mine = [d for d in devices if d.get("id") in own]
    return Trace(
        source=source,
        events=events,
        strings=strings.table(),
        ids=[int(v) for v in ids.tolist()],
        raw=list(strings.raw),
        origin_us=origin_ns / 1000.0,
        device_properties=mine + [d for d in devices if d not in mine],
        format="nsys",
    )


def _labels(trace: Trace, process: int, names: dict[int, str]) -> dict[int, str]:
    out = {}
    for code, value in enumerate(trace.ids):
        if value == process and process in names:
            out[code] = names[process]
    gpu = trace.of_kind(Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET)
    for code, device in set(zip(gpu.pid.tolist(), gpu.device.tolist(), strict=True)):
        out[code] = f"GPU {device}"
    return out


def _default_step_range(trace: Trace) -> None:
    """Take as the steps the NVTX range that repeats like an iteration: of the ranges named
    like one (step, iteration, batch) that occur at least twice, the one covering most time.
    Said in the warnings either way."""
    ann = trace.of_kind(Kind.ANNOTATION)
    if len(ann) == 0:
        return
    codes, counts = np.unique(ann.name, return_counts=True)
    totals: dict[str, list[int]] = {}
    for code, count in zip(codes.tolist(), counts.tolist(), strict=True):
        name = trace.strings[code]
        key = step_key(name)
        if _STEP_WORDS.search(key):
            got = totals.setdefault(key, [0, 0])
            got[0] += count
            got[1] += int(ann.dur[ann.name == code].sum())
    found = [k for k, (count, _) in totals.items() if count >= 2]
    if found:
        best = max(found, key=lambda k: totals[k][1])
        trace.step_range = best
        trace.warnings.append(
            f"steps from the NVTX range {best!r} (repeated {totals[best][0]} times); "
            "--step-range NAME picks another"
        )
        return
    trace.warnings.append(
        "no NVTX range repeats like a step (named step, iteration or batch): the whole "
        "capture is one window; --step-range NAME marks the steps by a range"
    )


# --- Reports (.nsys-rep): exported once, to a cache --------------------------------------------


def exported(report: Path) -> Path:
    """The SQLite export of an `.nsys-rep` report, made with `nsys export` into the cache
    (never beside the report) on first use and reused while the report is unchanged."""
    return exported_report(
        report,
        tool="nsys",
        product="Nsight Systems",
        suffix=".sqlite",
        args=lambda nsys, partial: [
            *(nsys, "export", "--type", "sqlite", "--force-overwrite", "true"),
            *("--output", str(partial), str(report)),
        ],
        step="nsys export",
        hint=EXPORT_HINT,
        instead="analyse the .sqlite file",
    )


def load_nsys(path: Path, step_range: str | None = None) -> list[Trace]:
    """The traces of an Nsight Systems capture: a SQLite export, or an `.nsys-rep` report
    exported to the cache first. A cached export that cannot be read is made again."""
    if path.suffix.lower() not in REPORT_SUFFIXES:
        return read_export(path, path.name, step_range)
    db = exported(path)
    try:
        return read_export(db, path.name, step_range)
    except _DamagedError:
        if not db.is_file():
            raise
        db.unlink(missing_ok=True)  # a stale or damaged cache entry: made again, once
        return read_export(exported(path), path.name, step_range)
