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
    from concurrent.futures import Future
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


PARALLEL_FROM_BYTES = 64 << 20
"""Traces with more JSON text than this are decoded by worker processes, chunk by chunk
(measured on 2 cores: two workers gain nothing on 35-54 MB traces, 8% on an 87 MB one,
and their forked pages double the process tree's memory)."""


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
    if workers is None:
        workers = _available_cores() if size > PARALLEL_FROM_BYTES else 1
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
    with _decoder(workers) as decode_all:
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
def _decoder(workers: int) -> Iterator[Callable[[Iterator[Piece]], Decoded]]:
    """A function from pieces of the event array to (piece, decoded chunk) pairs in input
    order, decoding in a process pool with a bounded number of pieces in flight (so memory
    stays flat). A `Remainder` passes through undecoded: it needs the pieces before it."""
    if workers <= 1:
        yield lambda pieces: ((p, _decode(p)) for p in pieces)
        return
    # Imported here: most traces are decoded in this process, and startup counts.
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=workers, mp_context=process_context()) as pool:

        def run(pieces: Iterator[Piece]) -> Decoded:
            window: deque[tuple[Piece, Future[Chunk] | None]] = deque()
            for piece in pieces:
                future = None if isinstance(piece, Remainder) else pool.submit(piece.decode)
                window.append((piece, future))
                while len(window) > 2 * workers:
                    yield _resolved(window.popleft())
            while window:
                yield _resolved(window.popleft())

        yield run


def process_context() -> BaseContext:
    """How to start worker processes: by fork when this process runs a single thread (workers
    start in milliseconds, with every module already imported), else by spawn: forking a
    process whose other threads hold locks (a progress bar's refresh thread) is unsafe."""
    import multiprocessing

    if sys.platform == "linux" and threading.active_count() == 1:
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


def _resolved(item: tuple[Piece, Future[Chunk] | None]) -> tuple[Piece, Chunk]:
    piece, future = item
    return piece, (future.result() if future is not None else Chunk())


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
