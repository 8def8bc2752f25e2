"""The trace model: every event parsed once into columns, plus the trace's metadata.

Times are int64 nanoseconds relative to `Trace.origin_us` (the trace's first timestamp), so
interval arithmetic is exact integer arithmetic. Strings (names, categories) are stored once in
`Trace.strings` and referenced by int32 codes. Argument records (`Input Dims`, `Input type`,
`Concrete Inputs`, a kernel's `grid`, a collective's arguments) are stored once each as their
JSON text in `Trace.raw`, referenced by codes too, and read through the trace's typed
accessors (`Trace.op_args`, `Trace.grid`, `Trace.collective`, ...), which decode each distinct
record once, on first use: parsing stays one pass of C-level work per column.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from enum import IntEnum
from functools import cached_property
from typing import TYPE_CHECKING, Any, TypeVar, cast

import numpy as np
import numpy.typing as npt

from wallfinder.errors import WallfinderError

if TYPE_CHECKING:
    from wallfinder.trace.args import ArgsTable, CollectiveArgs, OpArgs
    from wallfinder.trace.readers import Reader

I64 = npt.NDArray[np.int64]
_T = TypeVar("_T")
I32 = npt.NDArray[np.int32]
I8 = npt.NDArray[np.int8]
Mask = npt.NDArray[np.bool_]

NONE = -1
"""The value of an integer column where the event has no such field."""


def thread_key(pid: npt.NDArray[np.integer[Any]], tid: npt.NDArray[np.integer[Any]]) -> I64:
    """One int64 per (pid, tid) code pair: the thread an event ran on."""
    key: I64 = pid.astype(np.int64)
    key <<= 32  # (in place: the rows may be most of a large trace)
    key |= tid
    return key


def thread_codes(key: int) -> tuple[int, int]:
    """The (pid, tid) codes of one `thread_key`."""
    return key >> 32, key & 0xFFFFFFFF


def thread_mask(
    pid: npt.NDArray[np.integer[Any]], tid: npt.NDArray[np.integer[Any]], key: int
) -> npt.NDArray[np.bool_]:
    """Which rows (their pid and tid codes) ran on the thread `key` (a `thread_key`), without
    making every row's key."""
    p, q = thread_codes(key)
    mask: npt.NDArray[np.bool_] = (pid == p) & (tid == q)
    return mask


class Kind(IntEnum):
    """What an event is, from its phase and category (see `kind_of`)."""

    OTHER = 0
    CPU_OP = 1
    ANNOTATION = 2
    PYTHON = 3
    RUNTIME = 4
    KERNEL = 5
    MEMCPY = 6
    MEMSET = 7
    GPU_ANNOTATION = 8
    GPU_SYNC = 9
    FLOW = 10
    MEMORY = 11
    INSTANT = 12
    METADATA = 13


_CATEGORY_KINDS = {
    "cpu_op": Kind.CPU_OP,
    "operator": Kind.CPU_OP,
    "user_annotation": Kind.ANNOTATION,
    "python_function": Kind.PYTHON,
    "python": Kind.PYTHON,
    "kernel": Kind.KERNEL,
    "gpu_memcpy": Kind.MEMCPY,
    "memcpy": Kind.MEMCPY,
    "gpu_memset": Kind.MEMSET,
    "memset": Kind.MEMSET,
    "gpu_user_annotation": Kind.GPU_ANNOTATION,
    "cuda_sync": Kind.GPU_SYNC,
    "runtime": Kind.RUNTIME,
    "driver": Kind.RUNTIME,
}


def kind_of(ph: str, cat: str, name: str) -> Kind:
    """Classify an event. Old PyTorch wrote capitalised categories ("Kernel", "Runtime"), HIP
    and MTIA builds write their own runtime categories: all are folded here."""
    if ph == "M":
        return Kind.METADATA
    if ph in ("s", "t", "f"):
        return Kind.FLOW
    if ph in ("i", "I", "n"):
        return Kind.MEMORY if name == "[memory]" else Kind.INSTANT
    if ph not in ("X", "B"):
        return Kind.OTHER
    c = cat.lower()
    found = _CATEGORY_KINDS.get(c)
    if found is not None:
        return found
    if c.endswith(("_runtime", "_driver")):
        return Kind.RUNTIME
    return Kind.OTHER


@dataclass(frozen=True, eq=False)
class Events:
    """A columnar table of events: every array has one entry per event."""

    kind: I8
    name: I32
    cat: I32
    ts: I64
    dur: I64
    pid: I32
    tid: I32
    external_id: I64
    correlation: I64
    device: I64
    stream: I64
    nbytes: I64
    seq: I64
    """A CPU op's autograd `Sequence number` (NONE: none recorded)."""
    fwd_thread: I64
    """A CPU op's `Fwd thread id`: 0 on forward ops, on backward ops the profiler's id of the
    thread that ran their forward op (NONE: none recorded)."""
    input_dims: I32
    """Code of an op's `Input Dims` (0: none); `input_type` and `concrete_inputs` likewise.
    Read them with `Trace.op_args`."""
    input_type: I32
    concrete_inputs: I32
    grid: I32
    """Code of a kernel's `grid` (0: none); read with `Trace.grid`."""
    block: I32
    """Code of a kernel's `block` (threads in x, y, z; 0: none); read with `Trace.threads`."""
    comm: I32
    """Code of a collective's arguments (0: none); read with `Trace.collective`."""

    def __len__(self) -> int:
        return int(self.ts.shape[0])

    @property
    def end(self) -> I64:
        return self.ts + self.dur

    def take(self, index: npt.NDArray[Any] | slice) -> Events:
        """The rows at `index` (an index array, a boolean mask, or a slice: a view)."""
        return Events(**{f.name: getattr(self, f.name)[index] for f in fields(self)})

    @property
    def thread(self) -> I64:
        """Each event's thread, as one key (`thread_key`). Made anew on each call: kept,
        the host ops' keys alone would raise a 1 GB trace's peak memory by 17 MB."""
        return thread_key(self.pid, self.tid)


ALLOC, FREE, OTHER, OOM = 1, -1, 0, 2
"""What an event of a memory history does: allocate, free (the sign of a profiler memory
event's bytes, so both memory sources replay alike), something else, or run out of memory."""


@dataclass(frozen=True, eq=False)
class MemoryEvents:
    """The `[memory]` events of a trace recorded with `profile_memory=True`, as columns sorted
    by time: one allocation (`bytes` > 0) or free (`bytes` < 0) of the block at `addr` on
    device `device_type`:`device_id` (c10's device type: 0 CPU, 1 CUDA, ...; id -1 for the
    CPU), by `thread` (a `thread_key`), with the allocator's totals after it."""

    ts: I64
    thread: I64
    device_type: I64
    device_id: I64
    addr: I64
    bytes: I64
    total_allocated: I64
    total_reserved: I64

    @classmethod
    def empty(cls) -> MemoryEvents:
        return cls(**{c: np.empty(0, np.int64) for c in MEMORY_COLUMNS})

    def __len__(self) -> int:
        return int(self.ts.shape[0])

    def take(self, index: npt.NDArray[Any] | slice) -> MemoryEvents:
        return MemoryEvents(**{c: getattr(self, c)[index] for c in MEMORY_COLUMNS})


MEMORY_COLUMNS = tuple(f.name for f in fields(MemoryEvents))
"""`MemoryEvents`' columns, in order."""


_NUMBERED = re.compile(r"[\s_#:.-]*\d+")


def step_key(name: str) -> str:
    """A range's name without its numbers: the instances of one step range ("step 3",
    "step_4", "ProfilerStep#5") share it."""
    return _NUMBERED.sub("", name).strip()


@dataclass(eq=False)
class Trace:
    """One profiler trace (one rank), loaded into columns.

    `events` holds every event, sorted by kind and then by start time; `of_kind` gives the
    rows of some kinds, sorted by start time. `strings[code]` is the text of a `name`/`cat`
    code, `ids[code]` the original pid/tid value, `raw[code]` the recorded JSON text of an
    `input_dims`/`input_type`/`concrete_inputs`/`grid`/`comm` code: read those through the
    typed accessors (`op_args`, `input_dtypes`, `shapes_text`, `grid`, `blocks`, `collective`).
    """

    source: str
    events: Events
    strings: list[str]
    ids: list[int | float | str | None]
    raw: list[bytes]
    origin_us: float
    device_properties: list[dict[str, object]] = field(default_factory=list)
    distributed: dict[str, object] = field(default_factory=dict)
    base_time_ns: int | None = None
    process_labels: dict[int, str] = field(default_factory=dict)
    memory: MemoryEvents = field(default_factory=MemoryEvents.empty)
    warnings: list[str] = field(default_factory=list)
    cut_step: str | None = None
    """The `ProfilerStep#N` the program stopped inside, when wallfinder's capture says so."""
    module_step: str | None = None
    """The `ProfilerStep#N` wallfinder's capture recorded with module ranges after the timed
    steps: the module view's step, never a timed one."""
    dynamo: dict[str, object] | None = None
    """What Dynamo counted in the program, when `wallfinder run` recorded it (the JSON
    object as written: `analysis.compiled` reads it as a `diagnosis.DynamoRecord`)."""
    format: str = "kineto"
    """What wrote the trace: the name of its reader (`trace.readers`), "kineto"
    (torch.profiler) or "nsys" (an Nsight Systems export)."""
    step_range: str | None = None
    """The name of the annotation (an NVTX range, a `record_function`) that marks each step,
    when one does in place of `ProfilerStep#N`: chosen by the reader or by the user
    (`use_step_range`). Instances match by `step_key`, so "train_step 3" and "train_step 4"
    are one range."""

    @property
    def reader(self) -> Reader:
        """The reader of the trace's format: what its format is and records
        (`Reader.profiler_steps`, `Reader.trace_events`)."""
        from wallfinder.trace.readers import reader_named  # (the readers import this module)

        reader = reader_named(self.format)
        if reader is None:
            raise ValueError(f"no reader of the format {self.format!r}")
        return reader

    def use_step_range(self, name: str) -> None:
        """Take the annotations named `name` (or `name` with another number) as the steps.
        Raises `WallfinderError` when no annotation of the trace has that name."""
        self.step_range = name
        if len(self.step_rows()):
            return
        kinds = (Kind.ANNOTATION, Kind.CPU_OP)
        names = self.columns_of_kinds(kinds, "name")[0]
        codes, counts = np.unique(names, return_counts=True)
        seen = [self.strings[c][:40] for c in codes[np.argsort(-counts, kind="stable")][:8]]
        raise WallfinderError(
            f"{self.source}: no range or annotation is named {name[:60]!r}"
            + (f" (the most frequent: {', '.join(map(repr, seen))})" if seen else "")
        )

    def step_rows(self) -> Events:
        """The annotations that mark the steps by `step_range` (none when it is unset)."""
        if self.step_range is None:
            return self.events.take(slice(0, 0))
        key = step_key(self.step_range)
        codes = self.names_matching(lambda s: s == self.step_range or step_key(s) == key)
        return self.named((Kind.ANNOTATION, Kind.CPU_OP), codes)

    def of_kind(self, *kinds: Kind) -> Events:
        """Rows of the given kinds, sorted by start time. One kind is a zero-copy slice of
        `events` (which is sorted by kind, then time), kept; several are merged into a copy
        for the caller alone, not kept: each combination's copy would stay for the whole
        analysis (on a 1 GB trace the host ops with the runtime calls are 190 MB)."""
        key = tuple(sorted(set(kinds)))
        cache = self._kind_cache
        if key in cache:
            return cache[key]
        slices = self._slices(key)
        if len(slices) == 1:
            cache[key] = self.events.take(slices[0])
            return cache[key]
        rows = np.concatenate([np.arange(s.start, s.stop) for s in slices])
        rows = rows[np.argsort(self.events.ts[rows], kind="stable")]
        return self.events.take(rows)

    def distinct_names(self, *kinds: Kind) -> I32:
        """The name codes the rows of the given kinds use, each once, sorted (each kind's
        kept: small, and asked by several views)."""
        cache = self._names_cache
        key = tuple(sorted(set(kinds)))
        if key not in cache:
            for kind in key:
                if (kind,) not in cache:
                    cache[(kind,)] = np.unique(self.of_kind(kind).name).astype(np.int32)
            # (Several kinds' union is kept too: the views ask for the same ones again.)
            parts = [cache[(kind,)] for kind in key]
            both: I32 = np.unique(np.concatenate(parts)) if parts else np.empty(0, np.int32)
            cache[key] = both
        out = cache[key]
        out.flags.writeable = False  # (shared by every caller)
        return out

    def named(self, kinds: tuple[Kind, ...], codes: I32) -> Events:
        """Rows of the given kinds whose name is one of `codes`, sorted by start time. Only
        the matching rows are copied."""
        ev = self.events
        return self._where(kinds, lambda s: np.isin(ev.name[s], codes))

    def on_thread(self, kinds: tuple[Kind, ...], thread: int) -> Events:
        """Rows of the given kinds on one thread (`thread_key`), sorted by start time. Only
        the matching rows are copied."""
        ev = self.events
        return self._where(kinds, lambda s: thread_mask(ev.pid[s], ev.tid[s], thread))

    def _where(
        self, kinds: tuple[Kind, ...], keep: Callable[[slice], npt.NDArray[np.bool_]]
    ) -> Events:
        """Rows of the given kinds that `keep` (a mask of each kind's rows) picks, by start."""
        ev = self.events
        parts = [s.start + np.flatnonzero(keep(s)) for s in self._slices(kinds)]
        if len(parts) == 1:  # one kind's rows: by start already (a stable sort keeps them)
            return ev.take(parts[0])
        rows = np.concatenate(parts) if parts else np.empty(0, np.intp)
        return ev.take(rows[np.argsort(ev.ts[rows], kind="stable")])

    def _slices(self, kinds: tuple[int, ...]) -> list[slice]:
        wanted = np.array(sorted(set(kinds)), np.int8)
        lo = np.searchsorted(self.events.kind, wanted, "left")
        hi = np.searchsorted(self.events.kind, wanted, "right")
        return [slice(int(a), int(b)) for a, b in zip(lo, hi, strict=True)]

    def extent(self, *kinds: Kind) -> tuple[int, int] | None:
        """The earliest start and the latest end among the rows of `kinds` (None: no such
        rows), read in place: each kind's rows are sorted by start."""
        ev = self.events
        spans = [s for s in self._slices(tuple(kinds)) if s.stop > s.start]
        if not spans:
            return None
        return (
            min(int(ev.ts[s.start]) for s in spans),
            max(int((ev.ts[s] + ev.dur[s]).max()) for s in spans),
        )

    def columns_of_kinds(
        self,
        kinds: tuple[Kind, ...],
        *names: str,
        overlapping: tuple[int, int] | None = None,
    ) -> list[npt.NDArray[Any]]:
        """Some columns of the rows of some kinds, stacked (not sorted): for analyses that
        need a few columns of many rows, without copying the whole table. `overlapping`
        (lo, hi): only the rows that start at or before `hi` and end at or after `lo`."""
        ev = self.events
        slices = self._slices(kinds)
        picks: list[slice | npt.NDArray[np.intp]] = list(slices)
        if overlapping is not None:
            lo, hi = overlapping
            picks = []
            for s in slices:
                # Each kind is sorted by start: cut at `hi` by search, then keep what ends late.
                cut = slice(s.start, s.start + int(np.searchsorted(ev.ts[s], hi, "right")))
                picks.append(s.start + np.flatnonzero(ev.ts[cut] + ev.dur[cut] >= lo))
        out = []
        for name in names:
            column = getattr(ev, name)
            out.append(np.concatenate([column[s] for s in picks]))
        return out

    @cached_property
    def _kind_cache(self) -> dict[tuple[int, ...], Events]:
        return {}

    @cached_property
    def _names_cache(self) -> dict[tuple[Kind, ...], I32]:
        return {}

    def code_of(self, text: str) -> int:
        """The code of a string, or NONE when no event uses it."""
        return self._string_codes.get(text, NONE)

    def codes_of(self, names: Iterable[str]) -> I32:
        """The codes of those of `names` that the trace uses (each string is one code: the
        table is built from distinct strings)."""
        codes = self._string_codes
        return np.array([codes[n] for n in names if n in codes], dtype=np.int32)

    @cached_property
    def _string_codes(self) -> dict[str, int]:
        return {s: i for i, s in enumerate(self.strings)}

    def op_args(self, dims: int, types: int, concrete: int = 0) -> OpArgs | None:
        """The arguments of an op call, from its `input_dims`, `input_type` and
        `concrete_inputs` codes: shapes, dtype keys and scalar inputs, decoded once per
        distinct record. None when the record has no usable shapes and types."""
        return self._args.op_args(dims, types, concrete)

    def input_dtypes(self, types: int) -> tuple[str | None, ...] | None:
        """The dtype key of each argument of an `input_type` code (None where the argument is
        no tensor); None when the op recorded no types."""
        return self._args.dtypes(types)

    def shapes_text(self, dims: int) -> str:
        """An `input_dims` code's shapes as the trace wrote them, for display."""
        return self._args.text(dims)

    def grid(self, code: int) -> tuple[int, ...] | None:
        """A kernel's grid (blocks in x, y, z) from its `grid` code; None when unrecorded or
        not positive integers."""
        return self._args.grid(code)

    def blocks(self, code: int) -> int:
        """Blocks in a kernel's grid (x·y·z) from its `grid` code; 0 when unknown."""
        grid = self.grid(code)
        return 0 if grid is None else math.prod(grid)

    def threads(self, code: int) -> int:
        """Threads in a kernel's block (x·y·z) from its `block` code; 0 when unknown."""
        block = self._args.grid(code)  # decoded as a grid is: a list of positive integers
        return 0 if block is None else math.prod(block)

    def collective(self, code: int) -> CollectiveArgs | None:
        """A collective's arguments (name, message size, dtype, process group) from its
        `comm` code; None for 0 (none recorded) or an unreadable record."""
        return self._args.collective(code)

    @cached_property
    def _args(self) -> ArgsTable:
        # Imported here: `trace.args` reads this module's constants.
        from wallfinder.trace.args import ArgsTable

        return ArgsTable(self.raw)

    def once(self, compute: Callable[[Trace], _T]) -> _T:
        """`compute(self)`, computed on the first call and kept for every later one with the
        same function: for what several analyses derive from the trace alone (the codes of
        the communication ops, the host rows' categories), each of them a module-level
        function of the trace and nothing else, never a closure."""
        memo = self._once
        if compute not in memo:
            memo[compute] = compute(self)
        return cast(_T, memo[compute])

    @cached_property
    def _once(self) -> dict[Callable[[Trace], object], object]:
        return {}

    def names_matching(self, predicate: Any, kinds: tuple[Kind, ...] | None = None) -> I32:
        """Codes of all strings for which `predicate(text)` is true (evaluated once per
        distinct string, never per event), sorted; with `kinds`, only of the names the rows of
        those kinds use (`distinct_names`): what `named(kinds, ...)` keeps is the same, and
        the test is not run over every other kind's names (on a trace of long kernel names,
        most of the time)."""
        strings = self.strings
        if kinds is not None:
            codes = self.distinct_names(*kinds).tolist()
            return np.array([c for c in codes if predicate(strings[c])], dtype=np.int32)
        hits = [i for i, s in enumerate(strings) if predicate(s)]
        return np.array(hits, dtype=np.int32)

    @property
    def rank(self) -> int | None:
        value = self.distributed.get("rank")
        return value if isinstance(value, int) else None

    @property
    def world_size(self) -> int | None:
        value = self.distributed.get("world_size")
        return value if isinstance(value, int) else None

    @property
    def device_name(self) -> str | None:
        """The accelerator's name from `deviceProperties` (first named device), if any."""
        for props in self.device_properties:
            name = props.get("name")
            if isinstance(name, str) and name.strip():
                return name.strip()
        return None
