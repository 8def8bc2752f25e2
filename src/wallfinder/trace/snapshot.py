"""Loading PyTorch CUDA allocator snapshots (`torch.cuda.memory._dump_snapshot(path)`).

A snapshot is a pickle, and a pickle can run code when it is loaded. The format is plain
dicts, lists, strings and numbers, so the unpickler here refuses every global a pickle asks
for (`find_class`): a pickle that needs one is not a plain snapshot, and nothing it names is
ever imported or called. Gzip-compressed snapshots are read too. Every key is optional: older
and newer torch versions add and drop fields.
"""

from __future__ import annotations

import io
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from wallfinder.errors import WallfinderError
from wallfinder.trace._reader import gunzipped, read_errors

# (Defined beside the profiler's memory events, whose bytes' sign they are: the analyses replay
# both sources without importing this reader.)
from wallfinder.trace.model import ALLOC, FREE, OOM, OTHER

__all__ = [
    "ALLOC",
    "FREE",
    "MAX_SNAPSHOT_BYTES",
    "OOM",
    "OTHER",
    "History",
    "Snapshot",
    "SnapshotBlock",
    "SnapshotFrame",
    "SnapshotSegment",
    "TraceEntry",
    "history",
    "load_snapshot",
    "parse_snapshot",
]

MAX_SNAPSHOT_BYTES = 4 * 1024**3
"""The most bytes (after decompression) a snapshot may have: a guard against a file that is
not a snapshot at all, or a compressed file that expands without end."""


class SnapshotFrame(msgspec.Struct, frozen=True):
    filename: str = "??"
    line: int = 0
    name: str = "??"


class _HistoryEntry(msgspec.Struct, frozen=True):
    frames: list[SnapshotFrame] = []


class SnapshotBlock(msgspec.Struct, frozen=True):
    """A block of a segment: a live allocation ("active_allocated", or "active_pending_free"
    while its stream uses finish) or free space ("inactive"). `frames[0]` is the innermost."""

    size: int = 0
    requested_size: int | None = None
    address: int | None = None
    state: str = "inactive"
    frames: list[SnapshotFrame] = []
    history: list[_HistoryEntry] = []
    """Older snapshots keep the frames here instead (the last entry is the current one)."""

    @property
    def live(self) -> bool:
        return self.state.startswith("active")

    @property
    def stack(self) -> list[SnapshotFrame]:
        if self.frames or not self.history:
            return self.frames
        return self.history[-1].frames


class SnapshotSegment(msgspec.Struct, frozen=True):
    device: int = 0
    address: int | None = None
    total_size: int | None = None
    allocated_size: int | None = None
    active_size: int | None = None
    requested_size: int | None = None
    stream: int | None = None
    segment_type: str | None = None
    blocks: list[SnapshotBlock] = []

    @property
    def reserved(self) -> int:
        if self.total_size is not None:
            return self.total_size
        return sum(b.size for b in self.blocks)

    @property
    def allocated(self) -> int:
        if self.allocated_size is not None:
            return self.allocated_size
        return sum(b.size for b in self.blocks if b.live)


class TraceEntry(msgspec.Struct, frozen=True):
    """One allocator event of the recorded history. For "oom", torch puts the device's free
    memory in `addr` and the requested bytes in `size`."""

    action: str = ""
    addr: int = 0
    size: int = 0
    stream: int | None = None
    frames: list[SnapshotFrame] = []
    time_us: int | None = None


@dataclass(frozen=True)
class History:
    """One device's trace entries as columns (row `i` is entry `i`)."""

    action: npt.NDArray[np.int64]
    """ALLOC, FREE, OOM or OTHER. The free is the one that returns the block to the
    allocator: "free_completed" where the history records it (a block used on another
    stream is freed when that stream's work ends), else "free_requested"."""
    addr: npt.NDArray[np.int64]
    """The block's address; for OOM, the device's free bytes."""
    size: npt.NDArray[np.int64]
    """The block's bytes; for OOM, the bytes requested."""
    time_us: list[int | None]
    frames: list[list[SnapshotFrame]]


def history(entries: list[TraceEntry]) -> History:
    """The columns of one device's trace entries (`Snapshot.device_traces[i]`)."""
    names = {e.action for e in entries}
    codes = {"alloc": ALLOC, "oom": OOM}
    codes["free_completed" if "free_completed" in names else "free_requested"] = FREE
    n = len(entries)
    return History(
        action=np.fromiter((codes.get(e.action, OTHER) for e in entries), np.int64, n),
        addr=np.fromiter((e.addr for e in entries), np.int64, n),
        size=np.fromiter((e.size for e in entries), np.int64, n),
        time_us=[e.time_us for e in entries],
        frames=[e.frames for e in entries],
    )


class Snapshot(msgspec.Struct, frozen=True):
    segments: list[SnapshotSegment] = []
    device_traces: list[list[TraceEntry]] = []
    allocator_settings: dict[str, Any] | None = None


class _RefusedError(Exception):
    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


class _PlainUnpickler(pickle.Unpickler):
    """Loads plain data only: any global (a class, a function) is refused before import."""

    def find_class(self, module: str, name: str) -> Any:
        # os.system pickles as posix.system (nt.system on Windows): name it as people know it.
        shown = "os" if module in ("posix", "nt") else module
        raise _RefusedError(f"{shown}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise _RefusedError("a persistent object")


def _read(path: Path, max_bytes: int) -> bytes:
    with read_errors(path, "expected an allocator snapshot file"):
        size = path.stat().st_size
        if path.is_dir():
            raise WallfinderError(f"{path}: is a folder, expected an allocator snapshot file")
        if size == 0:
            raise WallfinderError(f"{path}: empty file, expected an allocator snapshot")
        with path.open("rb") as f, gunzipped(f) as g:
            if g is f and size > max_bytes:  # plain: its size says it before reading it
                raise WallfinderError(_too_big(path, max_bytes))
            data = g.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise WallfinderError(_too_big(path, max_bytes))
    if not data:
        raise WallfinderError(f"{path}: empty file, expected an allocator snapshot")
    return data


def _too_big(path: Path, max_bytes: int) -> str:
    return f"{path}: larger than {max_bytes / 1024**3:.1f} GiB, too big for an allocator snapshot"


def load_snapshot(path: str | Path, *, max_bytes: int = MAX_SNAPSHOT_BYTES) -> Snapshot:
    """The allocator snapshot pickled at `path` (plain or gzip), loaded without running any
    code it holds. Raises `WallfinderError` with one line for anything else."""
    path = Path(path)
    return parse_snapshot(_read(path, max_bytes), source=str(path))


def parse_snapshot(data: bytes, *, source: str = "snapshot") -> Snapshot:
    """The snapshot in the pickled bytes `data` (see `load_snapshot`)."""
    if data.lstrip()[:1] in (b"{", b"["):
        raise WallfinderError(
            f"{source}: a JSON file, not an allocator snapshot; for a profiler trace's memory "
            "(recorded with profile_memory=True), run `wallfinder analyze` on it"
        )
    try:
        raw = _PlainUnpickler(io.BytesIO(data)).load()
    except _RefusedError as exc:
        raise WallfinderError(
            f"{source}: not a plain allocator snapshot: the pickle asks for {exc.what} "
            "(refused: a pickle can run code)"
        ) from None
    except EOFError:
        raise WallfinderError(f"{source}: truncated pickle (the file ends early)") from None
    except pickle.UnpicklingError as exc:
        if "truncated" in str(exc):
            raise WallfinderError(f"{source}: truncated pickle (the file ends early)") from None
        raise WallfinderError(f"{source}: not a pickle ({exc})") from None
    except Exception as exc:  # arbitrary bytes fail in many ways inside the unpickler
        raise WallfinderError(f"{source}: not a pickle ({type(exc).__name__})") from None
    if not isinstance(raw, dict) or not ("segments" in raw or "device_traces" in raw):
        what = f"a dict with keys {sorted(map(str, raw))[:5]}" if isinstance(raw, dict) else None
        raise WallfinderError(
            f"{source}: not an allocator snapshot: a pickled {what or type(raw).__name__}, "
            "expected a dict with 'segments' (torch.cuda.memory._dump_snapshot)"
        )
    try:
        return msgspec.convert(raw, Snapshot)
    except msgspec.ValidationError as exc:
        raise WallfinderError(f"{source}: not a plain allocator snapshot: {exc}") from None
