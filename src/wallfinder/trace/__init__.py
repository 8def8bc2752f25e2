"""Loading profiler traces into the columnar trace model.

Every trace-format quirk lives in this package, in the reader of its format
(`trace.readers`: one module per format, each recognising its files by their first bytes):
the Kineto JSON's (gzip or plain text, the object or bare-array form, B/E pairs, int or
string pids, `bytes`/`Bytes`, capitalised categories, HIP and MTIA runtime names, missing
`deviceProperties`), an Nsight Systems export's; and the text of event arguments (shapes,
dtypes, scalar inputs, grids, collective arguments), decoded here into types (`trace.args`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from wallfinder._lazy import lazy_attributes
from wallfinder.errors import WallfinderError
from wallfinder.trace import _cache
from wallfinder.trace._cache import ResultCache
from wallfinder.trace._heap import release_free_memory
from wallfinder.trace._reader import (
    UNREADABLE,
    Progress,
    gunzipped,
    iter_trace_files,
    text_size,
)
from wallfinder.trace.args import CollectiveArgs, OpArgs, Tensor
from wallfinder.trace.model import (
    NONE,
    Events,
    Kind,
    MemoryEvents,
    Trace,
    step_key,
    thread_codes,
    thread_key,
    thread_mask,
)
from wallfinder.trace.readers import Load, Reader, reader_for, reader_named
from wallfinder.trace.readers.kineto import process_context

if TYPE_CHECKING:
    from wallfinder.trace._ncu import (
        NcuExport,
        NcuLaunch,
        base_name,
        load_ncu,
        ncu_command,
        normalised_name,
    )

# The Nsight Compute reader (and the csv module under it) is imported on first use: only
# `--counters` and `wallfinder counters` read an export (5 ms of every `analyze`'s start).
__getattr__ = lazy_attributes(
    __name__,
    dict.fromkeys(
        ("NcuExport", "NcuLaunch", "base_name", "load_ncu", "ncu_command", "normalised_name"),
        "wallfinder.trace._ncu",
    ),
)

__all__ = [
    "NONE",
    "UNREADABLE",
    "CollectiveArgs",
    "Events",
    "Kind",
    "MemoryEvents",
    "NcuExport",
    "NcuLaunch",
    "OpArgs",
    "Progress",
    "Reader",
    "ResultCache",
    "Tensor",
    "Trace",
    "base_name",
    "check_workers",
    "find_trace_files",
    "gunzipped",
    "load_ncu",
    "load_trace",
    "load_traces",
    "ncu_command",
    "normalised_name",
    "process_context",
    "reader_named",
    "release_free_memory",
    "result_cache",
    "step_key",
    "thread_codes",
    "thread_key",
    "thread_mask",
]


def load_traces(
    path: str | Path,
    progress: Progress | None = None,
    *,
    workers: int | None = None,
    step_range: str | None = None,
    cache: bool = False,
) -> list[Trace]:
    """The traces in one file, read by the reader that recognises it (`trace.readers`): a
    Kineto trace is one; an Nsight Systems capture (a SQLite export, or an `.nsys-rep` report
    when `nsys` is on PATH) is one per process with GPU activity, each a rank. `step_range`
    names the range (NVTX, `record_function`) that marks the steps, in place of
    `ProfilerStep#N` or the reader's choice. `workers` and `cache`: as for `load_trace`.
    Raises `WallfinderError` with a one-line reason for anything that is not a readable
    trace."""
    check_workers(workers)
    p = Path(path)
    if p.is_dir():
        raise WallfinderError(f"{p}: is a folder, expected one trace file")
    if not p.exists():
        raise WallfinderError(f"{p}: no such file")
    load = Load(progress, workers=workers, step_range=step_range, cache=cache)
    return reader_for(p).read(p, load)


def find_trace_files(path: str | Path) -> list[Path]:
    """The trace files at `path`: the file itself, or the traces in a folder (one per rank)."""
    p = Path(path)
    if p.is_dir():
        files = list(iter_trace_files(p))
        if not files:
            raise WallfinderError(f"{p}: no trace files (*.json, *.json.gz) in this folder")
        return files
    if not p.exists():
        raise WallfinderError(f"{p}: no such file or folder")
    return [p]


def check_workers(workers: int | None) -> None:
    """Refuse a number of worker processes below one (None: the default), in one line."""
    if workers is not None and (isinstance(workers, bool) or workers < 1):
        raise WallfinderError(f"workers must be a number of processes ≥ 1, not {workers}")


def load_trace(
    path: str | Path,
    progress: Progress | None = None,
    *,
    workers: int | None = None,
    cache: bool = False,
) -> Trace:
    """Parse one Kineto/PyTorch profiler trace file (`.json` or `.json.gz`) into a `Trace`
    (an Nsight Systems capture of one GPU process too; `load_traces` reads every process of
    one).

    Large files are decoded in `workers` processes (default: one per available core). With
    `cache`, a large file's parse is kept in wallfinder's cache folder and read from there
    while the file is unchanged (`trace._cache`).
    Raises `WallfinderError` with a one-line reason for anything that is not a readable trace.
    """
    traces = load_traces(path, progress, workers=workers, cache=cache)
    if len(traces) > 1:
        raise WallfinderError(f"{Path(path).name}: holds {len(traces)} GPU processes (ranks)")
    return traces[0]


def result_cache(path: Path, question: bytes, files: list[Path]) -> ResultCache | None:
    """Where an answer about the trace file `path` (as `_cache.result_cache`) is kept, when
    its parse would be (a file whose reader caches it, of over FROM_BYTES of text); else
    None."""
    if not path.is_file() or not reader_for(path).cached or not _cache.keeps(text_size(path)):
        return None
    return _cache.result_cache(path, question, files)
