"""Turn a chunk of event text into columns, and assemble chunks into one table.

`decode_chunk` is a pure function of the chunk's bytes, so chunks can be decoded in worker
processes; its string tables are local to the chunk, and `Assembler` maps them onto the
trace-wide tables. Each column is built with one C-level pass (`map` + `operator.attrgetter`
into `np.fromiter`); per-kind fields (correlation ids, shapes, bytes) are read only for the rows
of the kinds that carry them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from itertools import compress, count, repeat
from operator import attrgetter, is_not, itemgetter
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from wallfinder.errors import WallfinderError
from wallfinder.trace._heap import release_free_memory
from wallfinder.trace._joins import Links, join_launches
from wallfinder.trace._schema import Args, Event, Scalar
from wallfinder.trace.model import (
    MEMORY_COLUMNS,
    NONE,
    Events,
    Kind,
    MemoryEvents,
    kind_of,
    thread_key,
)

_GPU_KINDS = (Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET, Kind.GPU_SYNC, Kind.GPU_ANNOTATION)
_CORRELATED = (Kind.RUNTIME, Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET, Kind.GPU_SYNC)
_EXTERNAL = (Kind.CPU_OP, Kind.ANNOTATION, Kind.GPU_ANNOTATION, *_CORRELATED)
_SHAPED = (Kind.CPU_OP, Kind.ANNOTATION)
_SIZED = (Kind.MEMCPY, Kind.MEMSET)
_TIMED = (
    Kind.CPU_OP,
    Kind.ANNOTATION,
    Kind.PYTHON,
    Kind.RUNTIME,
    Kind.KERNEL,
    Kind.MEMCPY,
    Kind.MEMSET,
    Kind.GPU_ANNOTATION,
    Kind.GPU_SYNC,
)

_decode_events = msgspec.json.Decoder(list[Event]).decode


class Interner(dict[Any, int]):
    """Maps each distinct value to a dense code, in order of first appearance."""

    def __missing__(self, key: Any) -> int:
        code = len(self)
        self[key] = code
        return code


def _text(value: Scalar) -> str:
    return value if isinstance(value, str) else ("" if value is None else str(value))


_INT64 = range(-(2**63), 2**63)


def _as_int(value: Scalar) -> int:
    """An id or a byte count as an int64; NONE for anything that is not one."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float):
        value = int(value) if math.isfinite(value) else NONE
    elif isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            return NONE
    if isinstance(value, int):
        return value if value in _INT64 else NONE
    return NONE


def _ints(rows: Any, path: str) -> npt.NDArray[np.int64]:
    """Integers of the field at `path` of each event in `rows`; absent or non-numeric values
    become NONE. The common case (all ints) takes one C-level pass; anything else is read
    again on the per-value path."""
    get = attrgetter(path)
    try:
        return np.fromiter(map(get, rows), dtype=np.int64, count=len(rows))
    except (TypeError, ValueError, OverflowError):
        return np.fromiter(map(_as_int, map(get, rows)), dtype=np.int64, count=len(rows))


def _pick(events: Sequence[Event], rows: npt.NDArray[np.intp]) -> Any:
    """The events at `rows`, gathered in C."""
    if rows.size == len(events):
        return events
    if rows.size == 1:
        return (events[int(rows[0])],)
    return itemgetter(*rows.tolist())(events)


def _is(kind: npt.NDArray[np.int8], kinds: tuple[Kind, ...]) -> npt.NDArray[np.bool_]:
    """Whether each row's kind is one of `kinds` (a table lookup, not a set search)."""
    table = np.zeros(len(Kind), dtype=bool)
    table[list(kinds)] = True
    return table[kind]


def _rows(kind: npt.NDArray[np.int8], kinds: tuple[Kind, ...]) -> npt.NDArray[np.intp]:
    return np.flatnonzero(_is(kind, kinds))


@dataclass
class Chunk:
    """The columns of one chunk of events, with chunk-local string tables.

    `count` rows were kept of the `seen` events decoded: flow and metadata events are
    dropped (metadata after its process labels are read).
    `ts_us`/`dur_us` stay float microseconds until the assembler knows the trace's origin
    (its earliest timestamp, known once every chunk is in).
    `problem` is set instead of columns when the chunk's text did not decode: ("json", message)
    for text that is not JSON (or a false cut), ("event", local index, message) for an event of
    the wrong shape.
    """

    count: int = 0
    seen: int = 0
    flows: int = 0
    metadata: int = 0
    kind: npt.NDArray[np.int8] = field(default_factory=lambda: np.empty(0, np.int8))
    name: npt.NDArray[np.int32] = field(default_factory=lambda: np.empty(0, np.int32))
    cat: npt.NDArray[np.int32] = field(default_factory=lambda: np.empty(0, np.int32))
    ts_us: npt.NDArray[np.float64] = field(default_factory=lambda: np.empty(0))
    dur_us: npt.NDArray[np.float64] = field(default_factory=lambda: np.empty(0))
    pid: npt.NDArray[np.int32] = field(default_factory=lambda: np.empty(0, np.int32))
    tid: npt.NDArray[np.int32] = field(default_factory=lambda: np.empty(0, np.int32))
    ints: dict[str, npt.NDArray[np.int64]] = field(default_factory=dict)
    input_dims: npt.NDArray[np.int32] = field(default_factory=lambda: np.empty(0, np.int32))
    input_type: npt.NDArray[np.int32] = field(default_factory=lambda: np.empty(0, np.int32))
    concrete_inputs: npt.NDArray[np.int32] = field(default_factory=lambda: np.empty(0, np.int32))
    grid: npt.NDArray[np.int32] = field(default_factory=lambda: np.empty(0, np.int32))
    block: npt.NDArray[np.int32] = field(default_factory=lambda: np.empty(0, np.int32))
    comm: npt.NDArray[np.int32] = field(default_factory=lambda: np.empty(0, np.int32))
    strings: list[Scalar] = field(default_factory=list)
    ids: list[Scalar] = field(default_factory=list)
    raw: list[bytes] = field(default_factory=list)
    labels: dict[int, str] = field(default_factory=dict)
    memory: dict[str, npt.NDArray[Any]] = field(default_factory=dict)
    begins: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    links: dict[str, npt.NDArray[Any]] = field(default_factory=dict)
    """`ac2g` flow endpoints (id, start, pid, tid, ts_us): kept for traces whose launches and
    kernels carry no correlation id (see `_joins`)."""
    problem: tuple[Any, ...] | None = None


def decode_chunk(framed: bytes | bytearray | memoryview) -> Chunk:
    """Decode `framed`, a JSON array of events (`[` + events text + `]`), into a `Chunk`.
    Never raises for bad input: problems are returned in the chunk."""
    try:
        events = _decode_events(framed)
    except msgspec.ValidationError as exc:
        return Chunk(problem=("event", str(exc)))
    except msgspec.DecodeError as exc:
        return Chunk(problem=("json", str(exc)))
    except UnicodeDecodeError as exc:  # msgspec lets invalid UTF-8 in a string through
        return Chunk(problem=("json", f"invalid UTF-8 in a string ({exc.reason})"))
    return columns_of(events)


def columns_of(decoded: list[Event]) -> Chunk:
    """Build the columns of decoded events.

    Flow events (`ph` s/t/f) are counted and dropped here: they repeat the correlation and
    sequence ids that runtime calls, kernels and ops carry in their args, and they are a
    quarter of a typical trace's events. Metadata events (`ph` M) are dropped too once the
    process labels are read from them (some traces carry hundreds of thousands).
    """
    seen = len(decoded)
    strings = Interner({"": 0})
    ids = Interner()
    raw = Interner({b"": 0})
    pair_codes = Interner()
    pair = np.fromiter(
        map(pair_codes.__getitem__, map(attrgetter("ph", "cat"), decoded)), np.int32, seen
    )
    kind_table = np.array([kind_of(p, _text(c), "") for p, c in pair_codes], dtype=np.int8)
    kind = kind_table[pair] if seen else np.empty(0, np.int8)
    original: npt.NDArray[np.intp] | None = None
    events: Any = decoded
    flows = kind == Kind.FLOW
    metadata = kind == Kind.METADATA
    labels = _labels(_pick(decoded, np.flatnonzero(metadata))) if metadata.any() else {}
    flow_pair = pair
    dropped = flows | metadata
    if dropped.any():
        original = np.flatnonzero(~dropped)
        events = _pick(decoded, original) if original.size else ()
        pair, kind = pair[original], kind[original]
    n = len(events)
    # A non-string name (a number, null) is interned as is and made text by the assembler.
    name = np.fromiter(map(strings.__getitem__, map(attrgetter("name"), events)), np.int32, n)
    cat_of_pair = np.array([strings[c] for _, c in pair_codes], dtype=np.int32)
    cat = cat_of_pair[pair] if n else np.empty(0, np.int32)
    memory_name = strings.get("[memory]")
    if memory_name is not None:
        kind[(kind == Kind.INSTANT) & (name == memory_name)] = Kind.MEMORY

    chunk = Chunk(
        count=n,
        seen=seen,
        flows=int(flows.sum()),
        metadata=int(metadata.sum()),
        kind=kind,
        name=name,
        cat=cat,
    )
    chunk.ts_us = np.fromiter(map(attrgetter("ts"), events), np.float64, n)
    chunk.dur_us = np.fromiter(map(attrgetter("dur"), events), np.float64, n)
    problem = _check_times(events, kind, pair, pair_codes, chunk)
    if problem is not None:
        if original is not None:  # report the event's index in the file
            problem = (problem[0], int(original[problem[1]]), *problem[2:])
        return Chunk(problem=problem)
    chunk.pid = np.fromiter(map(ids.__getitem__, map(attrgetter("pid"), events)), np.int32, n)
    chunk.tid = np.fromiter(map(ids.__getitem__, map(attrgetter("tid"), events)), np.int32, n)
    args_of = _ArgsOf(events, kind)
    chunk.ints = {
        "external_id": _sparse_ints(args_of, _EXTERNAL, "external_id"),
        "correlation": _sparse_ints(args_of, _CORRELATED, "correlation"),
        "device": _sparse_ints(args_of, _GPU_KINDS, "device"),
        "stream": _sparse_ints(args_of, _GPU_KINDS, "stream"),
        "nbytes": _bytes(args_of),
        "seq": _sparse_ints(args_of, (Kind.CPU_OP,), "sequence"),
        "fwd_thread": _sparse_ints(args_of, (Kind.CPU_OP,), "fwd_thread"),
    }
    chunk.input_dims = _sparse_raw(args_of, raw, "input_dims")
    chunk.input_type = _sparse_raw(args_of, raw, "input_type")
    chunk.concrete_inputs = _sparse_raw(args_of, raw, "concrete_inputs")
    chunk.grid = _sparse_raw(args_of, raw, "grid", (Kind.KERNEL,))
    chunk.block = _sparse_raw(args_of, raw, "block", (Kind.KERNEL,))
    chunk.comm = _comm(args_of, raw)
    chunk.labels = {ids[pid]: label for pid, label in labels.items()}
    correlated = _is(kind, _CORRELATED)
    ids_here = chunk.ints["correlation"][correlated]
    if flows.any() and (ids_here.size == 0 or not (ids_here >= 0).all()):
        # Some launches or device ops carry no correlation id (or none is in this chunk):
        # keep the flows that join them instead.
        chunk.links = _links(decoded, flows, flow_pair, pair_codes, ids)
    chunk.memory = _memory(args_of, chunk)
    for phase, rows_seen in (("B", chunk.begins), ("E", chunk.ends)):
        codes = [i for i, (p, _) in enumerate(pair_codes) if p == phase]
        if codes:
            rows_seen.extend(np.flatnonzero(np.isin(pair, codes)).tolist())
    chunk.strings = list(strings)
    chunk.ids = list(ids)
    chunk.raw = list(raw)
    return chunk


def _links(
    decoded: Sequence[Event],
    flows: npt.NDArray[np.bool_],
    pair: npt.NDArray[np.int32],
    pair_codes: Interner,
    ids: Interner,
) -> dict[str, npt.NDArray[Any]]:
    """The `ac2g` (CPU launch to GPU op) flow endpoints among the flow events."""
    ac2g = [i for i, (p, c) in enumerate(pair_codes) if p in ("s", "f") and c == "ac2g"]
    rows = np.flatnonzero(flows & np.isin(pair, ac2g))
    if rows.size == 0:
        return {}
    events = _pick(decoded, rows)
    flow_id = _ints(events, "id")
    known = flow_id >= 0
    if not known.any():
        return {}
    events = [e for e, ok in zip(events, known.tolist(), strict=True) if ok]
    n = len(events)
    return {
        "id": flow_id[known],
        "start": np.array([e.ph == "s" for e in events], dtype=bool),
        "pid": np.fromiter(map(ids.__getitem__, map(attrgetter("pid"), events)), np.int32, n),
        "tid": np.fromiter(map(ids.__getitem__, map(attrgetter("tid"), events)), np.int32, n),
        "ts_us": np.fromiter(map(attrgetter("ts"), events), np.float64, n),
    }


def _check_times(
    events: Any,
    kind: npt.NDArray[np.int8],
    pair: npt.NDArray[np.int32],
    pair_codes: Interner,
    chunk: Chunk,
) -> tuple[Any, ...] | None:
    bad_ts = (kind != Kind.METADATA) & ~np.isfinite(chunk.ts_us)
    complete = [i for i, (p, _) in enumerate(pair_codes) if p == "X"]
    is_complete = _is(kind, _TIMED) & np.isin(pair, complete)
    bad_dur = is_complete & ~np.isfinite(chunk.dur_us)
    for bad, what in ((bad_ts, "a 'ts' (start time)"), (bad_dur, "a 'dur' (duration)")):
        if bad.any():
            first = int(np.flatnonzero(bad)[0])
            ev = events[first]
            detail = f"({ev.ph!r} {_text(ev.name)[:60]!r}) has no {what}"
            return ("missing", first, detail, int(bad.sum()))
    return None


class _ArgsOf:
    """The `args` of the rows of some kinds of event, gathered once for each set of kinds:
    several columns read the same rows (the shaped ops' three argument texts, a GPU op's
    device and stream)."""

    def __init__(self, events: Sequence[Event], kind: npt.NDArray[np.int8]) -> None:
        self.events = events
        self.kind = kind
        self._gathered: dict[tuple[Kind, ...], tuple[npt.NDArray[np.intp], list[Args]]] = {}

    def __call__(self, kinds: tuple[Kind, ...]) -> tuple[npt.NDArray[np.intp], list[Args]]:
        """The rows of `kinds` and their args, in row order."""
        gathered = self._gathered.get(kinds)
        if gathered is None:
            rows = _rows(self.kind, kinds)
            args = list(map(_ARGS, _pick(self.events, rows))) if rows.size else []
            gathered = self._gathered[kinds] = (rows, args)
        return gathered


_ARGS = attrgetter("args")


def _sparse_ints(args_of: _ArgsOf, kinds: tuple[Kind, ...], key: str) -> npt.NDArray[np.int64]:
    out = np.full(len(args_of.events), NONE, dtype=np.int64)
    rows, args = args_of(kinds)
    if rows.size:
        out[rows] = _ints(args, key)
    return out


def _sparse_raw(
    args_of: _ArgsOf, raw: Interner, key: str, kinds: tuple[Kind, ...] = _SHAPED
) -> npt.NDArray[np.int32]:
    out = np.zeros(len(args_of.events), dtype=np.int32)
    rows, args = args_of(kinds)
    if rows.size:
        values = map(bytes, map(attrgetter(key), args))
        out[rows] = np.fromiter(map(raw.__getitem__, values), np.int32, rows.size)
    return out


_COMM_FIELDS = attrgetter(
    "collective",
    "in_nelems",
    "out_nelems",
    "dtype",
    "group_size",
    "pg_name",
    "pg_ranks",
    "seq",
)
_COMM_KINDS = (Kind.KERNEL, Kind.CPU_OP)
_encode = msgspec.json.encode


def _comm(args_of: _ArgsOf, raw: Interner) -> npt.NDArray[np.int32]:
    """A collective's arguments (name, element counts, dtype, group, sequence number) as a
    compact JSON array interned in the raw table; 0 for events that carry none. Only the few
    rows with a `Collective name` are encoded (found in one C-level pass)."""
    out = np.zeros(len(args_of.events), dtype=np.int32)
    rows, args = args_of(_COMM_KINDS)
    names = map(attrgetter("collective"), args)
    for i in compress(count(), map(is_not, names, repeat(None))):
        out[rows[i]] = raw[_encode(_COMM_FIELDS(args[i]))]
    return out


def _bytes(args_of: _ArgsOf) -> npt.NDArray[np.int64]:
    # Kineto wrote "bytes" for memcpy/memset; some versions and tools write "Bytes".
    out = np.full(len(args_of.events), NONE, dtype=np.int64)
    rows, args = args_of(_SIZED)
    for i, a in zip(rows.tolist(), args, strict=True):
        out[i] = _as_int(a.bytes_lower if a.bytes_lower != NONE else a.bytes_upper)
    return out


def _labels(metadata: Sequence[Event]) -> dict[Scalar, str]:
    """Process labels ("GPU 0", "CPU") keyed by pid, from `process_labels` metadata events:
    the only ones with `args.labels`. Read in C-level passes: some traces carry hundreds of
    thousands of metadata events."""
    values = list(map(attrgetter("args.labels"), metadata))
    pids = list(map(attrgetter("pid"), metadata))
    return dict(compress(zip(pids, values, strict=True), map(_is_str, values)))


def _is_str(value: Scalar) -> bool:
    return isinstance(value, str)


_MEMORY_ARGS = (
    "device_type",
    "device_id",
    "addr",
    "bytes_upper",
    "total_allocated",
    "total_reserved",
)


def _memory(args_of: _ArgsOf, chunk: Chunk) -> dict[str, Any]:
    """The `[memory]` events' columns: time (float us), the chunk's pid/tid codes, and their
    args as int64 (NONE where absent)."""
    rows, args = args_of((Kind.MEMORY,))
    if rows.size == 0:
        return {}
    out: dict[str, Any] = {
        "ts_us": chunk.ts_us[rows],
        "pid": chunk.pid[rows],
        "tid": chunk.tid[rows],
    }
    for key in _MEMORY_ARGS:
        out[key] = _ints(args, key)
    return out


_MAX_NS = 100 * 365 * 86400 * 1e9
"""Times this far from the trace's origin cannot be a profile: refused, not wrapped around."""


class Assembler:
    """Maps chunks onto trace-wide string tables and stacks their columns."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.strings = Interner({"": 0})
        self.ids = Interner()
        self.raw = Interner({b"": 0})
        self.first_us: float | None = None
        self.last_us: float | None = None
        self.origin_us = 0.0
        self.process_labels: dict[int, str] = {}
        self.memory: list[dict[str, npt.NDArray[Any]]] = []
        self.begins: list[int] = []
        self.ends: list[int] = []
        self.count = 0
        self.seen = 0
        self.flows = 0
        self.metadata = 0
        self._parts: list[dict[str, npt.NDArray[Any]]] = []
        self._links: list[dict[str, npt.NDArray[Any]]] = []
        self.join_note: str | None = None
        """How launches were joined to device ops when the trace has no correlation ids."""

    def add(self, chunk: Chunk) -> None:
        if chunk.problem is not None:
            raise self.error(chunk.problem)
        # Tables and labels first, so that they do not depend on where chunks end: a chunk may
        # hold metadata events alone.
        ids = _remap(self.ids, chunk.ids)
        strings = _remap(self.strings, chunk.strings)
        for local, label in chunk.labels.items():
            self.process_labels[int(ids[local])] = label
        self.seen += chunk.seen
        self.flows += chunk.flows
        self.metadata += chunk.metadata
        if chunk.links:
            links = chunk.links
            self._links.append({**links, "pid": ids[links["pid"]], "tid": ids[links["tid"]]})
        if chunk.count == 0:
            return
        # Times stay float microseconds until every chunk is in: the origin is the earliest
        # timestamp, which only then is known (times must not go negative: they are compared
        # with 0 and NONE, and must not depend on where chunks end).
        ts_us = np.nan_to_num(chunk.ts_us)
        if ts_us.size:
            low, high = float(ts_us.min()), float(ts_us.max())
            self.first_us = low if self.first_us is None else min(self.first_us, low)
            self.last_us = high if self.last_us is None else max(self.last_us, high)
        raw = _remap(self.raw, chunk.raw)
        dur_ns = np.nan_to_num(chunk.dur_us) * 1000.0
        if np.abs(dur_ns).max(initial=0.0) > _MAX_NS:
            raise WallfinderError(f"{self.source}: durations out of range (over 100 years)")
        dur = np.rint(dur_ns).astype(np.int64)
        np.maximum(dur, 0, out=dur)
        pid = ids[chunk.pid]
        self._parts.append(
            dict(
                kind=chunk.kind,
                name=strings[chunk.name],
                cat=strings[chunk.cat],
                ts=ts_us,
                dur=dur,
                pid=pid,
                tid=ids[chunk.tid],
                input_dims=raw[chunk.input_dims],
                input_type=raw[chunk.input_type],
                concrete_inputs=raw[chunk.concrete_inputs],
                grid=raw[chunk.grid],
                block=raw[chunk.block],
                comm=raw[chunk.comm],
                **chunk.ints,
            )
        )
        if chunk.memory:
            self.memory.append(
                {**chunk.memory, "pid": ids[chunk.memory["pid"]], "tid": ids[chunk.memory["tid"]]}
            )
        self.begins.extend(i + self.count for i in chunk.begins)
        self.ends.extend(i + self.count for i in chunk.ends)
        self.count += chunk.count

    def error(self, problem: tuple[Any, ...]) -> WallfinderError:
        if problem[0] == "missing":
            _, first, detail, count = problem
            return WallfinderError(
                f"{self.source}: event #{self.seen + first} {detail}"
                + (f" (and {count - 1} more events)" if count > 1 else "")
            )
        if problem[0] == "event":
            message = re.sub(
                r"\$\[(\d+)\]",
                lambda m: f"event #{self.seen + int(m.group(1))}",
                problem[1],
                count=1,
            )
            return WallfinderError(f"{self.source}: malformed event: {message}")
        text = str(problem[1])
        if "truncated" in text.lower():
            return WallfinderError(f"{self.source}: the JSON ends early (truncated file?)")
        return WallfinderError(f"{self.source}: not valid JSON ({text})")

    def finish(self) -> tuple[Events, MemoryEvents]:
        if not self._parts:
            if self.metadata:
                raise WallfinderError(
                    f"{self.source}: the trace has only metadata, no timed events"
                )
            raise WallfinderError(f"{self.source}: the trace has no events")
        parts = self._parts
        first, last = self.first_us or 0.0, self.last_us or 0.0
        if (last - first) * 1000.0 > _MAX_NS:
            raise WallfinderError(f"{self.source}: timestamps out of range (over 100 years apart)")
        self.origin_us = origin = float(math.floor(first))
        # The chunks' text and decoded objects were freed into the C heap below the columns
        # kept from them: their pages go back before the table is stacked on top. (Not after
        # every chunk: the next chunk faults them in again, 2 ms a chunk on an 87 MB trace.)
        release_free_memory()
        for p in parts:
            p["ts"] = np.rint((p["ts"] - origin) * 1000.0).astype(np.int64)
        keep = None
        if self.begins or self.ends:
            keep = _pair_begin_end(parts, self.begins, self.ends)
        events = _sorted_by_kind_and_time(parts, keep)
        self.join_note = join_launches(events, self._flow_links(origin), self.string_table)
        return events, self._memory_events(origin)

    def _flow_links(self, origin: float) -> Links:
        if not self._links:
            return Links.empty()
        cols = {k: np.concatenate([m[k] for m in self._links]) for k in self._links[0]}
        ts = np.rint((np.nan_to_num(cols["ts_us"]) - origin) * 1000.0).astype(np.int64)
        return Links(cols["id"], cols["start"], thread_key(cols["pid"], cols["tid"]), ts)

    def _memory_events(self, origin: float) -> MemoryEvents:
        if not self.memory:
            return MemoryEvents.empty()
        cols = {k: np.concatenate([m[k] for m in self.memory]) for k in self.memory[0]}
        ts = np.rint((np.nan_to_num(cols["ts_us"]) - origin) * 1000.0).astype(np.int64)
        order = np.argsort(ts, kind="stable")
        table = {
            "ts": ts,
            "thread": thread_key(cols["pid"], cols["tid"]),
            "bytes": cols["bytes_upper"],
            **{k: cols[k] for k in MEMORY_COLUMNS if k in cols},
        }
        return MemoryEvents(**{k: table[k][order] for k in MEMORY_COLUMNS})

    def string_table(self) -> list[str]:
        return [k if isinstance(k, str) else _text(k) for k in self.strings]


def _remap(table: Interner, local: list[Any]) -> npt.NDArray[np.int32]:
    return np.fromiter(map(table.__getitem__, local), np.int32, len(local))


def _column(parts: list[dict[str, npt.NDArray[Any]]], name: str) -> npt.NDArray[Any]:
    return parts[0][name] if len(parts) == 1 else np.concatenate([p[name] for p in parts])


def _sorted_by_kind_and_time(
    parts: list[dict[str, npt.NDArray[Any]]], keep: npt.NDArray[np.bool_] | None
) -> Events:
    """Stack the chunks' columns in (kind, start time) order, so that each kind is one
    contiguous, time-sorted slice. Columns are stacked and reordered one at a time, each
    chunk's copy dropped as soon as it is used: peak memory is the table plus two columns."""
    kind = _column(parts, "kind")
    ts = _column(parts, "ts")
    rows = np.arange(kind.size) if keep is None else np.flatnonzero(keep)
    # Stable sorts: by time (nearly sorted already within a kind), then by kind (radix sort).
    by_time = rows[np.argsort(ts[rows], kind="stable")]
    order = by_time[np.argsort(kind[by_time], kind="stable")]
    columns: dict[str, npt.NDArray[Any]] = {"kind": kind[order], "ts": ts[order]}
    del kind, ts
    for name in [f.name for f in fields(Events)]:
        if name in columns:
            continue
        columns[name] = _column(parts, name)[order]
        for p in parts:
            del p[name]
        # The chunks' small columns were freed into the C heap, the new one placed above
        # them or mapped apart: give the freed pages back as we go, or the process holds
        # both tables (a 54 MB trace's parse peaked 14 MiB higher; 0.2-0.8 ms a column).
        release_free_memory()
    parts.clear()
    return Events(**columns)


def _pair_begin_end(
    parts: list[dict[str, npt.NDArray[Any]]], begins: list[int], ends: list[int]
) -> npt.NDArray[np.bool_]:
    """Turn Chrome-format B/E pairs into complete events: each B takes the time to its matching
    E on the same thread (a stack per thread; durations are written into the chunks' columns).
    Returns which rows to keep: the E rows are dropped. Unmatched B events keep no duration."""
    ts, pid, tid = (_column(parts, c) for c in ("ts", "pid", "tid"))
    offsets = np.cumsum([0] + [p["ts"].size for p in parts])
    keep = np.ones(ts.size, dtype=bool)
    is_begin = set(begins)
    # File order breaks ties: back to back, an E and the next B share a timestamp, and the E
    # must close the event that is open, not the one beginning at that instant.
    rows = np.sort(np.array(begins + ends, dtype=np.int64))
    stacks: dict[tuple[int, int], list[int]] = {}
    for i in rows[np.argsort(ts[rows], kind="stable")].tolist():
        key = (int(pid[i]), int(tid[i]))
        if i in is_begin:
            stacks.setdefault(key, []).append(i)
            continue
        keep[i] = False
        stack = stacks.get(key)
        if stack:
            start = stack.pop()
            part = int(np.searchsorted(offsets, start, side="right")) - 1
            parts[part]["dur"][start - offsets[part]] = ts[i] - ts[start]
    return keep
