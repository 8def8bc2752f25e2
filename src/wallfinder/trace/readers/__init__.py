"""The trace readers, one module per format: each declares a `Reader` (what it recognises
from a file's name and first bytes, how it reads the file into `Trace`s, and the facts of its
format that the analyses and reports ask about) and registers it with `register`.

Adding a format is one module in this package: it is found by its place here, imported on
the first question about a file (a module that would import something heavy, such as
sqlite3, imports it inside its `read`), and asked about every file before the fallback
reader, the one that says why a file is not a trace.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from wallfinder.trace._reader import Progress

if TYPE_CHECKING:
    from wallfinder.trace.model import Trace

__all__ = ["HEAD_BYTES", "Load", "Reader", "reader_for", "reader_named", "register"]

HEAD_BYTES = 64
"""How much of a file a reader sees to recognise it."""


class Load(msgspec.Struct, frozen=True):
    """What a load asks of a reader."""

    progress: Progress | None = None
    workers: int | None = None
    """Processes to decode a large file in (None: the reader's choice)."""
    step_range: str | None = None
    """The range that marks the steps (`Trace.use_step_range`), in place of the reader's."""
    cache: bool = False
    """Keep a large file's parse in wallfinder's cache folder, where the reader can."""


class Reader(msgspec.Struct, frozen=True):
    """One trace format: how its files are recognised and read, and what its traces are."""

    name: str
    """The format's name: `Trace.format`, and the diagnosis's `trace_format`."""
    title: str
    """What a trace of this format is, in words ("an Nsight Systems capture")."""
    recognises: Callable[[Path, bytes], bool]
    """Whether a file is of this format, from its path and its first `HEAD_BYTES` bytes."""
    read: Callable[[Path, Load], list[Trace]]
    """The traces in a file: one per rank it holds (a WallfinderError when it cannot)."""
    profiler_steps: bool = False
    """Its writer marks each step with `ProfilerStep#N` when the program asks it to, so a
    trace without them is told how to get them (other readers say how they chose steps)."""
    trace_events: bool = False
    """Its file is a trace-event timeline that Perfetto opens: marks can be shown beside it."""
    cached: bool = False
    """A large file's parse, and answers about it, are kept in the cache (`trace._cache`)."""
    fallback: bool = False
    """Asked last, about any file no other reader recognises, to say why it is not a
    trace."""


_READERS: dict[str, Reader] = {}


def register(reader: Reader) -> Reader:
    """Add `reader` to the registry (a module of this package does, on import)."""
    if reader.name in _READERS:
        raise ValueError(f"two readers are named {reader.name!r}")
    _READERS[reader.name] = reader
    _readers.cache_clear()
    return reader


@cache
def _readers() -> tuple[Reader, ...]:
    """Every reader, the fallback last; the package's modules imported on first use."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
    return tuple(sorted(_READERS.values(), key=lambda r: (r.fallback, r.name)))


def reader_for(path: Path) -> Reader:
    """The reader of the file at `path`: the first that recognises it, else the fallback."""
    try:
        with path.open("rb") as f:
            head = f.read(HEAD_BYTES)
    except OSError:
        head = b""  # the reader says what is wrong with it
    readers = _readers()
    for reader in readers:
        if reader.recognises(path, head):
            return reader
    return readers[-1]


def reader_named(name: str) -> Reader | None:
    """The reader of the format `name` (a trace's `format`), or None for one this
    wallfinder does not read (a saved diagnosis from another version)."""
    return next((r for r in _readers() if r.name == name), None)
