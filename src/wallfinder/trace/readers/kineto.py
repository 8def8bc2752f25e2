"""The PyTorch profiler's trace (Kineto's Chrome trace-event JSON, plain or gzip): read in
chunks, decoded in worker processes when large, and kept in the cache when asked.

Every quirk of the JSON lives in this package: gzip or plain text, the object or bare-array
form, B/E pairs, int or string pids, `bytes`/`Bytes`, capitalised categories, HIP and MTIA
runtime names, missing `deviceProperties`; and the text of event arguments (shapes, dtypes,
scalar inputs, grids, collective arguments), decoded into types (`trace.args`).
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from wallfinder.errors import WallfinderError
from wallfinder.trace import _cache
from wallfinder.trace._columns import _TIMED, Assembler, Chunk, decode_chunk
from wallfinder.trace._heap import release_free_memory
from wallfinder.trace._reader import (
    GZIP_MAGIC,
    ChunkReader,
    Cut,
    Progress,
    Region,
    Remainder,
    merge_tail,
    split_remainder,
    text_size,
)
from wallfinder.trace._schema import Header
from wallfinder.trace.model import Events, Kind, MemoryEvents, Trace
from wallfinder.trace.readers import Load, Reader, register

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from multiprocessing.context import BaseContext


def _recognises(path: Path, head: bytes) -> bool:
    """gzip, or JSON text that opens an object or an array."""
    return head.startswith(GZIP_MAGIC) or head.lstrip(b"\xef\xbb\xbf \t\r\n")[:1] in (b"{", b"[")


def _read(path: Path, load: Load) -> list[Trace]:
    trace = load_kineto(path, load.progress, workers=load.workers, cache=load.cache)
    if load.step_range is not None:
        trace.use_step_range(load.step_range)
    return [trace]


KINETO = register(
    Reader(
        name="kineto",
        title="a torch.profiler trace",
        recognises=_recognises,
        read=_read,
        profiler_steps=True,
        trace_events=True,
        cached=True,
        fallback=True,
    )
)


PARALLEL_FROM_BYTES = 16 << 20
"""Traces with more JSON text than this are decoded by this process and forked helper
processes beside it (`_decoder`). Measured on 2 cores, parse alone, median of 3 fresh
processes: 20-35 MB gzip traces 0.23-0.38 -> 0.17-0.26 s, a 54 MB one 0.49 -> 0.39 s, an 87
MB one 0.67 -> 0.59 s (two workers before), a 203 MB plain one 1.28 -> 1.13 s; at 14-15 MB
one helper gained on one trace and lost on two (0.12 -> 0.14 s, 0.15 -> 0.20 s), as the
helper inflates the whole gzip stream itself. A helper's memory is a few MB of its own
beside the pages it shares with this process."""

SPAWNED_FROM_BYTES = 64 << 20
"""The same where this process cannot fork (it runs other threads): each spawned worker
starts a new interpreter and imports wallfinder first."""


def load_kineto(
    p: Path,
    progress: Progress | None = None,
    *,
    workers: int | None = None,
    cache: bool = False,
) -> Trace:
    """Parse one Kineto/PyTorch profiler trace file (`.json` or `.json.gz`) into a `Trace`.

    Large files are decoded in `workers` processes (default: one per available core). With
    `cache`, a large file's parse is kept in wallfinder's cache folder and read from there
    while the file is unchanged (`trace._cache`).
    Raises `WallfinderError` with a one-line reason for anything that is not a readable trace.
    """
    size = text_size(p)
    cache = cache and _cache.keeps(size)
    if cache:
        cached = _cache.read(p, p.name)
        if cached is not None:
            if progress is not None:
                progress(1, 1)
            return cached
    workers = _processes(size, workers)
    reader = ChunkReader(p, progress, regions=workers > 1)
    assembler = Assembler(p.name)
    # Decoding creates millions of short-lived objects with no cycles: the cyclic collector
    # would only rescan them over and over, so it is paused while parsing.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        tail = _assemble(reader, assembler, workers)
        events, memory = assembler.finish()
    finally:
        if was_enabled:
            gc.enable()
    header = reader.document.header
    if tail is not None and not reader.document.bare:
        header = merge_tail(header, tail, p.name)
    trace = _build(p.name, events, memory, assembler, header)
    if cache:
        _cache.write(p, trace)
    # The decoded chunks were freed into the C heap, which keeps their pages: the analysis
    # would stack its own peak on top of them.
    release_free_memory()
    return trace


def _processes(size: int, workers: int | None) -> int:
    """How many processes decode a trace of `size` bytes of text: `workers` when given, else
    one per core from PARALLEL_FROM_BYTES (where this process can fork; a process that can
    only spawn pays a new interpreter per worker: SPAWNED_FROM_BYTES), and one inside a
    worker of another pool (its siblings have the other cores; a daemonic one may not start
    processes at all)."""
    if workers == 1 or (workers is None and size <= PARALLEL_FROM_BYTES):
        return 1  # without importing multiprocessing (5 ms): most traces, where startup counts
    import multiprocessing

    if multiprocessing.current_process().daemon:
        return 1
    if workers is not None:
        return workers
    if multiprocessing.parent_process() is not None:
        return 1
    forks = process_context().get_start_method() == "fork"
    return _available_cores() if forks or size > SPAWNED_FROM_BYTES else 1


def _available_cores() -> int:
    try:
        return max(1, min(len(os.sched_getaffinity(0)), 8))
    except AttributeError:  # pragma: no cover - not on Linux
        return max(1, min(os.cpu_count() or 1, 8))


def _assemble(reader: ChunkReader, assembler: Assembler, workers: int) -> bytes | None:
    """Decode the reader's pieces (in worker processes when `workers` > 1) in file order and
    add them to `assembler`; returns the text after the event array (None for a document that
    was decoded whole).

    A piece whose text is not JSON was cut at a false boundary (a `},{` inside a string or a
    nested object): it is joined with the next piece and decoded again, so a wrong cut can cost
    time but never change the result.
    """
    pending: Cut | Region | None = None
    tail: bytes | None = None
    with _decoder(workers, reader.path) as decode_all:
        for piece, chunk in decode_all(reader.chunks()):
            if isinstance(piece, Remainder):
                text = pending.join(piece.text) if pending else piece.text
                final, tail = split_remainder(
                    Remainder(text, piece.bare), decode_chunk, assembler.source
                )
                pending = None
                if final is not None:
                    assembler.add(final)
                continue
            if pending is not None:
                piece = pending.merge(piece)  # type: ignore[arg-type]
                chunk = piece.decode()
            if chunk.problem is not None and chunk.problem[0] == "json":
                pending = piece
                continue
            pending = None
            assembler.add(chunk)
    whole = reader.document.whole
    if whole is not None:
        assembler.add(decode_chunk(whole))
        reader.document.whole = None
        return None
    if tail is None:
        raise WallfinderError(f"{assembler.source}: the JSON ends early (truncated file?)")
    return tail


Piece = Cut | Region | Remainder
Decoded = Iterator[tuple[Piece, Chunk]]


@contextmanager
def _decoder(workers: int, path: Path) -> Iterator[Callable[[Iterator[Piece]], Decoded]]:
    """A function from pieces of the event array to (piece, decoded chunk) pairs in input
    order. With `workers` > 1, this process decodes beside `workers` - 1 helper processes
    (`_Helper`): each piece is decoded by whichever reaches it first, so each side's share
    follows its speed (this one also reads, cuts and assembles). A `Remainder` passes through
    undecoded: it needs the pieces before it."""
    if workers <= 1:
        yield lambda pieces: ((p, _decode(p)) for p in pieces)
        return
    context = process_context()
    claims = _Claims(context)
    helpers: list[_Helper] = []
    finished = False
    try:
        helpers.extend(_Helper(context, path, claims, n) for n in range(1, workers))

        def run(pieces: Iterator[Piece]) -> Decoded:
            window: deque[_Entry] = deque()
            pace: float | None = None  # seconds per byte, once this process timed a decode
            for index, piece in enumerate(pieces):
                entry = _Entry(piece)
                if isinstance(piece, Remainder):
                    entry.chunk = Chunk()
                else:
                    owner = claims.claim(index, 0)
                    if owner == 0 or not helpers[owner - 1].owe(entry):
                        started = time.perf_counter()
                        entry.chunk = piece.decode()
                        pace = (time.perf_counter() - started) / max(_size(piece), 1)
                window.append(entry)
                for helper in helpers:
                    helper.collect()
                while window and (len(window) > _LEAD + 2 or window[0].chunk is not None):
                    yield _take(window.popleft(), helpers, pace)
            while window:
                yield _take(window.popleft(), helpers, pace)
            nonlocal finished
            finished = True

        yield run
    finally:
        claims.close()
        for helper in helpers:
            helper.close(finished)


_LEAD = 4
"""How many pieces a helper may claim ahead of the piece this process reads: bounds the
chunks in flight (memory stays flat)."""


class _Claims:
    """Who decodes each piece, shared by this process and its helpers: the first to reach
    a piece that nobody has claimed takes it. Pieces are reached in order by everyone, so the
    claimed pieces are always the first ones: one counter says how far, and a ring (longer
    than the lead) says by whom."""

    RING = 64

    def __init__(self, context: BaseContext) -> None:
        self._lock = context.Lock()
        # [last claimed piece, the piece this process reached, closed], then the owners.
        self._state = context.RawArray("q", 3 + self.RING)
        self._state[0] = self._state[1] = -1

    def claim(self, index: int, claimant: int) -> int:
        """Claim piece `index` for `claimant` (0: this process) unless it is taken; returns
        its owner, or -1 for a helper that is too far ahead and should wait."""
        state = self._state
        with self._lock:
            if state[2]:
                return -2
            if state[0] >= index:
                owner = int(state[3 + index % self.RING])
            elif claimant != 0 and index > state[1] + _LEAD:
                return -1
            else:
                state[0] = index
                state[3 + index % self.RING] = owner = claimant
            if claimant == 0:
                state[1] = index
            return owner

    def close(self) -> None:
        """Helpers claim no more (the pieces have run out, or an error stopped this one)."""
        with self._lock:
            self._state[2] = 1


class _Entry:
    """A piece in flight and, once decoded (here or by a helper), its chunk."""

    __slots__ = ("chunk", "piece")

    def __init__(self, piece: Piece) -> None:
        self.piece = piece
        self.chunk: Chunk | None = None


def _take(entry: _Entry, helpers: list[_Helper], pace: float | None) -> tuple[Piece, Chunk]:
    """The piece and its chunk, waiting for the helper that decodes it up to twice as long as
    this process would take to decode it (at its `pace`, seconds per byte). A helper that is
    later than that has lost its core (a busy machine): this process decodes the piece
    itself, and drops the helper's chunk when it comes."""
    if entry.chunk is None:
        helper = next(h for h in helpers if entry in h.owed)
        helper.collect(wait=None if pace is None else 2 * pace * _size(entry.piece))
    if entry.chunk is None:
        entry.chunk = _decode(entry.piece)
    return entry.piece, entry.chunk


def _size(piece: Piece) -> int:
    """Bytes of text in a piece."""
    if isinstance(piece, Region):
        return piece.end - piece.start
    return len(piece.framed) if isinstance(piece, Cut) else len(piece.text)


class _Helper:
    """A forked process that walks the same file with its own `ChunkReader` (so the same
    pieces in the same order) and decodes the pieces it claims. Only its decoded chunks
    come back: the text never passes between processes (gzip is inflated on both sides,
    which costs the helper less than receiving the text would cost this process), and no
    thread of this process relays anything, so the helper never waits for this process's
    GIL while it decodes."""

    def __init__(self, context: BaseContext, path: Path, claims: _Claims, number: int) -> None:
        self._results, results_out = context.Pipe(duplex=False)
        _widen(results_out)
        self._process = context.Process(  # type: ignore[attr-defined]
            target=_help, args=(path, claims, number, results_out), daemon=True
        )
        self._process.start()
        results_out.close()
        self.owed: deque[_Entry] = deque()
        """Pieces the helper claimed whose chunks have not come back, in order."""
        self.alive = True

    def owe(self, entry: _Entry) -> bool:
        """Wait for the helper's chunk of `entry`; False if the helper is gone."""
        if self.alive:
            self.owed.append(entry)
        return self.alive

    def collect(self, wait: float | None = 0.0) -> None:
        """Take the chunks that came back (waiting up to `wait` seconds for the first; None:
        until it comes)."""
        try:
            while self.owed and self._results.poll(wait):
                identity, chunk = self._results.recv()
                entry = self.owed.popleft()
                if entry.chunk is not None:
                    pass  # decoded here while the helper was late
                elif identity == _identity(entry.piece):
                    entry.chunk = chunk
                else:
                    # Not the piece this process read (the file changed under the two
                    # readers): this process's text is the one decoded.
                    entry.chunk = _decode(entry.piece)
                wait = 0.0
        except (EOFError, OSError):
            # The helper is gone (killed, out of memory): its pieces are decoded here.
            self.alive = False
            while self.owed:
                entry = self.owed.popleft()
                if entry.chunk is None:
                    entry.chunk = _decode(entry.piece)

    def close(self, finished: bool) -> None:
        """Wait for the helper to end; stop it at once when the parse did not finish or
        this process decoded pieces the helper had claimed (it may be waiting to send chunks
        that nobody will take)."""
        if not finished or self.owed:
            self._process.kill()
        self._process.join(timeout=1.0)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._results.close()


def _help(path: Path, claims: _Claims, number: int, results: Connection) -> None:
    """A helper process's work: the pieces of `path` it claims, decoded in order."""
    try:
        for index, piece in enumerate(ChunkReader(path, regions=True).chunks()):
            if isinstance(piece, Remainder):
                return
            while (owner := claims.claim(index, number)) == -1:
                time.sleep(0.0005)  # too far ahead of the other process: let it catch up
            if owner == -2:
                return
            if owner == number:
                results.send((_identity(piece), piece.decode()))
    except (OSError, WallfinderError, KeyboardInterrupt):
        pass  # the other process is gone, or meets the same failure


def _identity(piece: Piece) -> tuple[int, int, bytes]:
    """What tells a piece from another at the same place: its bounds (a region's offsets, a
    cut's length and last bytes)."""
    if isinstance(piece, Region):
        return piece.start, piece.end, b""
    if isinstance(piece, Cut):
        return len(piece.framed), 0, piece.framed[-256:] + piece.separator
    return len(piece.text), -1, b""


PIPE_BYTES = 1 << 20
"""The room asked for in the pipe that brings a helper's chunks back (Linux's default
limit for a pipe; a decoded chunk of a few MB of text takes about half a MB): the helper
writes a chunk in one go and decodes on while this process is busy."""


def _widen(connection: Connection) -> None:
    try:
        import fcntl

        fcntl.fcntl(connection.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    except (ImportError, AttributeError, OSError):  # pragma: no cover - not Linux, or refused
        pass


def process_context() -> BaseContext:
    """How to start worker processes: by fork when this process runs a single thread (workers
    start in milliseconds, with every module already imported), else by spawn: forking a
    process whose other threads hold locks (a progress bar's refresh thread) is unsafe."""
    import multiprocessing

    if sys.platform == "linux" and threading.active_count() == 1:
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


def _decode(piece: Piece) -> Chunk:
    return Chunk() if isinstance(piece, Remainder) else piece.decode()


def _build(
    source: str, events: Events, memory: MemoryEvents, assembler: Assembler, header: Header
) -> Trace:
    if len(events) == 0:
        raise WallfinderError(f"{source}: the trace has no events")
    base = header.baseTimeNanoseconds
    trace = Trace(
        source=source,
        events=events,
        strings=assembler.string_table(),
        ids=list(assembler.ids),
        raw=list(assembler.raw),
        origin_us=assembler.origin_us or 0.0,
        device_properties=[d for d in header.deviceProperties or [] if isinstance(d, dict)],
        distributed=dict(header.distributedInfo or {}),
        base_time_ns=int(base) if isinstance(base, int | float) else None,
        process_labels=assembler.process_labels,
        memory=memory,
        cut_step=header.wallfinder_cut_step,
        dynamo=header.wallfinder_dynamo,
        module_step=header.wallfinder_module_step,
        warnings=[assembler.join_note] if assembler.join_note else [],
    )
    _check_activity(trace)
    _check_time_units(trace)
    return trace


_ACTIVITY = np.array(_TIMED, np.int8)
"""What a profiler records of a job: every kind of event but its own span, instants and
metadata."""


def _check_activity(trace: Trace) -> None:
    """Refuse a trace that recorded nothing of the job: only the profiler's own `Trace` span,
    its instants and metadata (a profiler stopped before any op ran). Analysing it would give
    a verdict about nothing."""
    if len(trace.memory) == 0 and not np.isin(trace.events.kind, _ACTIVITY).any():
        raise WallfinderError(
            f"{trace.source}: the trace recorded no activity (no ops, annotations, runtime "
            "calls, kernels or memory events): was the profiler stopped before the job ran?"
        )


def _check_time_units(trace: Trace) -> None:
    """Refuse a trace whose host and device clocks are in different units.

    The Chrome format's `ts` is in microseconds; a writer that put one side in nanoseconds
    gives device events whose times are ~1000x the host's. Comparing the two ranges catches
    it; analysing it would give a silently wrong answer.
    """
    ev = trace.events
    host = np.isin(ev.kind, np.array([Kind.CPU_OP, Kind.RUNTIME, Kind.ANNOTATION], np.int8))
    device = np.isin(ev.kind, np.array([Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET], np.int8))
    if not host.any() or not device.any():
        return
    h_ts, d_ts = ev.ts[host], ev.ts[device]
    if h_ts.min() <= d_ts.max() and d_ts.min() <= h_ts.max():
        return  # the two clocks overlap: same unit
    origin_ns = trace.origin_us * 1000.0
    h = abs(float(np.median(h_ts)) + origin_ns)
    d = abs(float(np.median(d_ts)) + origin_ns)
    lo, hi = min(h, d), max(h, d)
    if lo > 0 and 300.0 < hi / lo < 3000.0:
        raise WallfinderError(
            f"{trace.source}: host and device timestamps differ by a factor of {hi / lo:.0f} "
            "(mixed time units: one side in ns, the other in µs?)"
        )
