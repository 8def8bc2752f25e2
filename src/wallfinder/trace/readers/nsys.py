"""Nsight Systems captures: a SQLite export (`nsys export --type sqlite`, by its first bytes
whatever its name) or an `.nsys-rep` report (by its name), exported with `nsys` first. Each
process with GPU activity is a rank. The reader itself is `trace._nsys`, imported (with
sqlite3) for such files only."""

from __future__ import annotations

from pathlib import Path

from wallfinder.trace.model import Trace
from wallfinder.trace.readers import Load, Reader, register

SQLITE_MAGIC = b"SQLite format 3\x00"
REPORT_SUFFIXES = (".nsys-rep", ".qdrep")


def _recognises(path: Path, head: bytes) -> bool:
    return path.suffix.lower() in REPORT_SUFFIXES or head.startswith(SQLITE_MAGIC)


def _read(path: Path, load: Load) -> list[Trace]:
    from wallfinder.trace._nsys import load_nsys

    if load.progress is not None:
        load.progress(0, 1)
    traces = load_nsys(path, load.step_range)
    if load.progress is not None:
        load.progress(1, 1)
    return traces


NSYS = register(
    Reader(
        name="nsys",
        title="an Nsight Systems capture",
        recognises=_recognises,
        read=_read,
    )
)
