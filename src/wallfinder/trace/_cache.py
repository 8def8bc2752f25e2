"""wallfinder's cache folder, and parsed traces kept in it so that a second look at the same
trace (another `--device`, `diff`, `check`, the HTML after the terminal) skips the parse; and
analysis results kept beside them, so that the same question asked again (the HTML after the
terminal, `check` or `diff` of the same trace and options) skips the analysis too.

An entry is one file: a msgpack header (what the trace's header said, its string tables, and
where each column lies) followed by the columns' bytes, which are mapped into memory, not read.
It is keyed by the trace file's size, mtime and a hash of its first and last MiB, and by the
parser that wrote it (a hash of this package's source): an edited trace, a trace rewritten in
place, or a newer wallfinder never reads an old entry. The key is checked again against the
entry's own header, and an entry that does not decode or whose columns do not fit is removed
and rebuilt, never used. An entry holds nothing the trace did not (not its path).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from dataclasses import fields
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np

from wallfinder.errors import WallfinderError
from wallfinder.trace.model import MEMORY_COLUMNS, Events, MemoryEvents, Trace

if TYPE_CHECKING:
    from hashlib import _Hash

FROM_BYTES = 32 << 20
"""Traces with more JSON text than this are cached (smaller ones parse in well under a
second); `load_trace(..., cache=True)` with a smaller file does not write."""


def keeps(size: int) -> bool:
    """Whether the parse of a trace of `size` bytes of text is kept in the cache."""
    return size > FROM_BYTES


LIMIT_BYTES = 4 << 30
"""The parsed traces kept at most: past this, the entries used longest ago are removed."""

RESULTS_LIMIT_BYTES = 256 << 20
"""The analysis results kept at most (a result is a few hundred KB)."""

_HASHED = 1 << 20
"""Bytes of a file hashed at each end for its cache key (with its size and mtime)."""

_ALIGN = 64


def cache_dir(kind: str) -> Path:
    """Where wallfinder keeps `kind` ("nsys" exports, "parsed" traces): $WALLFINDER_CACHE,
    else the user's cache folder. Deleting the folder clears the cache."""
    base = os.environ.get("WALLFINDER_CACHE")
    if base:
        return Path(base) / kind
    xdg = os.environ.get("XDG_CACHE_HOME")
    root = Path(xdg) if xdg else Path.home() / ".cache"
    return root / "wallfinder" / kind


def _sha256(data: bytes) -> _Hash:
    """A sha256 hash object of `data`. (hashlib is imported here, when a cache is used: it
    loads the OpenSSL library, 4 MB of a small trace's analysis that never hashes.)"""
    import hashlib

    return hashlib.sha256(data)


def file_key(path: Path) -> str:
    """A key for the content of `path`: its size, mtime and the hash of its first and last
    MiB (hashing a whole 1 GB file would cost a third of parsing it). Read once per state of
    the file in a process (a diagnosis's key and its parse's key both name the trace)."""
    st = path.stat()
    state = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    known = _file_keys.get(state)
    if known is not None:
        return known
    digest = _sha256(f"{st.st_size}:{st.st_mtime_ns}".encode())
    with path.open("rb") as f:
        digest.update(f.read(_HASHED))
        if st.st_size > 2 * _HASHED:
            f.seek(-_HASHED, os.SEEK_END)
            digest.update(f.read(_HASHED))
    key = _file_keys[state] = digest.hexdigest()[:32]
    return key


_file_keys: dict[tuple[int, int, int, int], str] = {}
"""`file_key` by (device, inode, size, mtime): a file rewritten in place changes its size or
mtime, so its key is read again."""


def exported_report(
    report: Path,
    *,
    tool: str,
    product: str,
    suffix: str,
    args: Callable[[str, Path], list[str]],
    step: str,
    hint: str,
    instead: str,
    from_stdout: bool = False,
) -> Path:
    """A profiler report exported by its `tool` once, into the cache (never beside the
    report), and reused while the report is unchanged: `args(tool's path, partial file)` is
    the command, which writes the partial file (or, `from_stdout`, prints what goes in it).
    Without `tool` on PATH, or when it fails, one line says how to export by hand (`hint`)."""
    if not report.is_file():
        raise WallfinderError(f"{report}: no such file")
    # (Imported here: shutil imports bz2 and lzma, 5 ms of every analyze that exports nothing.)
    import shutil

    exe = shutil.which(tool)
    if exe is None:
        raise WallfinderError(
            f"{report.name}: reading an {product} report needs the {tool} command on PATH; "
            f"or export it yourself ({hint}) and {instead}"
        )
    folder = cache_dir(tool)
    target = folder / f"{file_key(report)}{suffix}"
    if target.is_file():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / f"{target.stem}.{os.getpid()}.partial{suffix}"
    # (Imported here: exporting a report is rare, and subprocess costs an analyze 10 ms.)
    import subprocess

    try:
        done = subprocess.run(args(exe, partial), capture_output=True, check=False)
    except OSError as exc:
        raise WallfinderError(f"{report.name}: {tool} could not be run ({exc.strerror})") from None
    if from_stdout and done.returncode == 0 and done.stdout:
        partial.write_bytes(done.stdout)
    if done.returncode != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        raise WallfinderError(
            f"{report.name}: {step} failed (exit code {done.returncode}); try it by hand: {hint}"
        )
    os.replace(partial, target)
    return target


@cache
def parser_id() -> str:
    """A hash of the trace package's source: entries written by another parser are stale."""
    here = Path(__file__).parent
    return _hash_of(here, here.glob("*.py"))


@cache
def analysis_id() -> str:
    """A hash of the whole package's source and data (device specs): results written by
    another wallfinder, or against other specs, are stale."""
    root = Path(__file__).parent.parent
    sources = root.rglob("*")
    return _hash_of(
        root, (p for p in sources if p.suffix in (".py", ".toml") and "__pycache__" not in p.parts)
    )


def _hash_of(root: Path, sources: Iterable[Path]) -> str:
    """A hash of files: their paths under `root` and their bytes."""
    digest = _sha256(b"")
    for source in sorted(sources):
        digest.update(source.relative_to(root).as_posix().encode() + b"\0")
        digest.update(source.read_bytes())
    return digest.hexdigest()[:16]


class ResultCache:
    """Where the result of one question about one trace file is kept: `read`, `write` (best
    effort, as `write`), `drop` (a kept result that did not decode)."""

    def __init__(self, entry: Path) -> None:
        self.entry = entry

    def read(self) -> bytes | None:
        try:
            data = self.entry.read_bytes()
        except OSError:
            return None
        with contextlib.suppress(OSError):
            os.utime(self.entry)  # used now: the last to be evicted
        return data

    def drop(self) -> None:
        with contextlib.suppress(OSError):
            self.entry.unlink()

    def write(self, data: bytes) -> None:
        with contextlib.suppress(OSError):
            _keep(self.entry, lambda p: p.write_bytes(data), "*.result", RESULTS_LIMIT_BYTES)


def result_cache(path: Path, question: bytes, files: list[Path]) -> ResultCache | None:
    """The cache of the answer to `question` (the options that decide it, encoded) about the
    trace `path`, whose answer also depends on the content of `files` (a spec, a profile, a
    counters export): keyed by all their contents and this wallfinder (`analysis_id`). None
    when one of `files` is not a file (a folder is not keyed) or cannot be read."""
    try:
        digest = _sha256(f"{file_key(path)}-{analysis_id()}\0".encode() + question)
        for f in files:
            if not f.is_file():
                return None
            digest.update(f"\0{file_key(f)}".encode())
    except OSError:
        return None
    return ResultCache(cache_dir("results") / f"{digest.hexdigest()[:32]}.result")


class _Column(msgspec.Struct, array_like=True):
    name: str
    dtype: str
    offset: int
    count: int


class _Header(msgspec.Struct):
    key: str
    parser: str
    origin_us: float
    strings: list[str]
    ids: list[int | float | str | None]
    raw: list[bytes]
    device_properties: list[dict[str, Any]]
    distributed: dict[str, Any]
    base_time_ns: int | None
    process_labels: dict[int, str]
    warnings: list[str]
    cut_step: str | None
    events: list[_Column]
    memory: list[_Column]
    dynamo: dict[str, Any] | None = None
    module_step: str | None = None


_decode_header = msgspec.msgpack.Decoder(_Header).decode
_PREFIX = 16  # b"wallfinder-cache" then the header's length (8 bytes, little-endian)
_MAGIC = b"wallfinder-cache"


def _entry(path: Path) -> tuple[Path, str]:
    key = f"{file_key(path)}-{parser_id()}"
    return cache_dir("parsed") / f"{key}.columns", key


def read(path: Path, source: str) -> Trace | None:
    """The cached parse of `path`, or None (nothing cached, or an entry that is stale or
    damaged: removed)."""
    try:
        entry, key = _entry(path)
    except OSError:
        return None
    try:
        f = entry.open("rb")
    except OSError:
        return None
    with f:
        try:
            trace = _load(f.fileno(), key, source)
        except (OSError, ValueError, TypeError, msgspec.DecodeError):
            pass
        else:
            with contextlib.suppress(OSError):
                os.utime(entry)  # used now: the last to be evicted
            return trace
    with contextlib.suppress(OSError):
        entry.unlink()
    return None


def _load(fd: int, key: str, source: str) -> Trace:
    import mmap  # (here: only a second look reads an entry; the first need not import it)

    data = mmap.mmap(fd, 0, access=mmap.ACCESS_COPY)  # copy on write: columns are writable
    if data[:_PREFIX] != _MAGIC:
        raise ValueError("not a cache entry")
    size = int.from_bytes(data[_PREFIX : _PREFIX + 8], "little")
    header = _decode_header(data[_PREFIX + 8 : _PREFIX + 8 + size])
    if header.key != key or header.parser != parser_id():
        raise ValueError("stale entry")

    def columns(specs: list[_Column], names: tuple[str, ...]) -> dict[str, Any]:
        out = {}
        for c in specs:
            dtype = np.dtype(c.dtype)
            if c.offset + c.count * dtype.itemsize > len(data):
                raise ValueError("truncated entry")
            out[c.name] = np.frombuffer(data, dtype, c.count, c.offset)
        if tuple(out) != names or len({a.shape for a in out.values()}) > 1:
            raise ValueError("columns do not match")
        return out

    events = columns(header.events, tuple(f.name for f in fields(Events)))
    memory = columns(header.memory, MEMORY_COLUMNS)
    return Trace(
        source=source,
        events=Events(**events),
        strings=header.strings,
        ids=header.ids,
        raw=header.raw,
        origin_us=header.origin_us,
        device_properties=header.device_properties,
        distributed=header.distributed,
        base_time_ns=header.base_time_ns,
        process_labels=header.process_labels,
        memory=MemoryEvents(**memory),
        warnings=header.warnings,
        cut_step=header.cut_step,
        dynamo=header.dynamo,
        module_step=header.module_step,
    )


def write(path: Path, trace: Trace) -> None:
    """Keep `trace`, the parse of `path`, in the cache. Best effort: a cache that cannot be
    written (a read-only or full disk) leaves the analysis as it was."""
    with contextlib.suppress(OSError, ValueError, TypeError, OverflowError, msgspec.MsgspecError):
        entry, key = _entry(path)
        _keep(entry, lambda partial: _save(partial, key, trace), "*.columns", LIMIT_BYTES)


def _keep(entry: Path, fill: Callable[[Path], object], pattern: str, limit: int) -> None:
    """Write `entry` whole or not at all (`fill` writes a partial file, renamed into place),
    then evict the folder's `pattern` entries used longest ago past `limit` bytes."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    partial = entry.with_name(f"{entry.name}.{os.getpid()}.partial")
    try:
        fill(partial)
        os.replace(partial, entry)
    finally:
        partial.unlink(missing_ok=True)
    _evict(entry.parent, entry, pattern, limit)


def _evict(folder: Path, keep: Path, pattern: str, limit: int) -> None:
    """Remove the entries (`pattern`) used longest ago while the folder holds over `limit`
    bytes of them (never `keep`, the one just written)."""
    entries = []
    for child in folder.glob(pattern):
        with contextlib.suppress(OSError):
            st = child.stat()
            entries.append((st.st_mtime_ns, st.st_size, child))
    total = sum(size for _, size, _ in entries)
    for _, size, child in sorted(entries, key=lambda e: e[0]):
        if total <= limit:
            break
        if child != keep:
            with contextlib.suppress(OSError):
                child.unlink()
                total -= size


def _save(target: Path, key: str, trace: Trace) -> None:
    arrays: list[tuple[str, np.ndarray[Any, Any]]] = []
    specs: dict[str, list[_Column]] = {"events": [], "memory": []}
    for group, table, names in (
        ("events", trace.events, [f.name for f in fields(Events)]),
        ("memory", trace.memory, list(MEMORY_COLUMNS)),
    ):
        for name in names:
            column = np.ascontiguousarray(getattr(table, name))
            specs[group].append(_Column(name, column.dtype.str, 0, int(column.size)))
            arrays.append((group, column))
    header = _Header(
        key=key,
        parser=parser_id(),
        origin_us=trace.origin_us,
        strings=trace.strings,
        ids=trace.ids,
        raw=trace.raw,
        device_properties=trace.device_properties,
        distributed=trace.distributed,
        base_time_ns=trace.base_time_ns,
        process_labels=trace.process_labels,
        warnings=trace.warnings,
        cut_step=trace.cut_step,
        events=specs["events"],
        memory=specs["memory"],
        dynamo=trace.dynamo,
        module_step=trace.module_step,
    )
    # Offsets depend on the header's length, which depends on the offsets' digits: place the
    # columns after room for the header with offsets of the widest encoding.
    room = len(msgspec.msgpack.encode(header)) + 9 * len(arrays) + _ALIGN
    offset = -(-(_PREFIX + 8 + room) // _ALIGN) * _ALIGN
    for spec, (_, column) in zip([*specs["events"], *specs["memory"]], arrays, strict=True):
        spec.offset = offset
        offset += -(-column.nbytes // _ALIGN) * _ALIGN
    encoded = msgspec.msgpack.encode(header)
    with target.open("wb") as f:
        f.write(_MAGIC + len(encoded).to_bytes(8, "little") + encoded)
        for spec, (_, column) in zip([*specs["events"], *specs["memory"]], arrays, strict=True):
            f.seek(spec.offset)
            f.write(column.data)
        f.truncate(offset)
