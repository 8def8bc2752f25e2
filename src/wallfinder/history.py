"""Run history: each recorded run's key figures and Diagnosis in a local SQLite database, and
the trend of a job's step time, MFU, idle share, peak memory and wall over its runs.

The database is one file (`default_db_path()`, `WALLFINDER_DB`, or a path given) in WAL mode,
so that two jobs recording at once neither block readers nor corrupt it: every write is one
`BEGIN IMMEDIATE` transaction and a writer waits (`BUSY_TIMEOUT_S`) for the other. The schema
version is SQLite's `user_version`; `MIGRATIONS` brings an older file up to date in one
transaction, and a file newer than this code is refused rather than misread.

What a run stores about where it came from: the trace's file name (never its folder), the git
commit of the current directory when it is a repository, and the host name
(`socket.gethostname()`). The Diagnosis is stored with its paths cut to file names.
"""

from __future__ import annotations

import os
import re
import socket
import sqlite3
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path, PurePath, PureWindowsPath

import msgspec

from wallfinder.diagnosis import Diagnosis
from wallfinder.errors import WallfinderError

__all__ = [
    "HISTORY_SCHEMA",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "History",
    "NameCount",
    "RunRecord",
    "Trend",
    "TrendRun",
    "default_db_path",
    "git_commit",
    "resolve_db_path",
]

HISTORY_SCHEMA = "wallfinder.history/1"
"""The `schema` key of `wallfinder history --format json`."""
BUSY_TIMEOUT_S = 30.0
"""How long a writer waits for another one before giving up."""
GIT_TIMEOUT_S = 2.0
DB_ENV = "WALLFINDER_DB"


# Where the database lives -----------------------------------------------------------------------


def default_db_path() -> Path:
    """The per-user database: `$XDG_DATA_HOME/wallfinder/history.sqlite3` (else
    ~/.local/share/...), ~/Library/Application Support/wallfinder/... on macOS,
    %LOCALAPPDATA%\\wallfinder\\... on Windows."""
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or str(Path.home() / "AppData" / "Local")
    elif sys.platform == "darwin":
        base = str(Path.home() / "Library" / "Application Support")
    else:
        base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "wallfinder" / "history.sqlite3"


def resolve_db_path(path: Path | None = None) -> Path:
    """The database to use: `path` (`--db`), else `$WALLFINDER_DB`, else the default."""
    if path is not None:
        return path
    env = os.environ.get(DB_ENV)
    return Path(env) if env else default_db_path()


def git_commit(cwd: Path | None = None) -> str | None:
    """The commit checked out in `cwd` (the current directory), or None when it is not a git
    repository, git is missing or slow."""
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = done.stdout.strip()
    return commit if done.returncode == 0 and re.fullmatch(r"[0-9a-f]{40,64}", commit) else None


# The records ------------------------------------------------------------------------------------


class _Base(msgspec.Struct, frozen=True, kw_only=True):
    pass


class RunRecord(_Base, frozen=True):
    """One recorded run: where and when it ran, and its key figures (the Diagnosis's own)."""

    id: int
    name: str
    recorded_at: str
    """UTC, ISO 8601."""
    source: str
    """The trace's file name (or folder name), never its full path."""
    commit: str | None
    host: str | None
    device: str | None
    step_s: float
    cv: float
    mfu: float | None
    idle: float
    comm_exposed: float | None
    wall: str
    cause: str
    peak_allocated: int | None = None
    """Peak allocated bytes on the analysed device (null: no memory profile)."""


class TrendRun(_Base, frozen=True):
    run: RunRecord
    change: float | None
    """The median step's change over the previous run's, as a fraction (negative: faster)."""


class Trend(_Base, frozen=True, kw_only=True):
    """A job's runs, oldest first, and how its step time moved over them."""

    schema: str = HISTORY_SCHEMA
    name: str
    runs: list[TrendRun]
    first_s: float
    last_s: float
    change: float
    """last / first − 1 (negative: faster)."""
    best: RunRecord
    """The run with the shortest median step."""
    worst: RunRecord
    """The run with the longest median step."""

    def to_json(self) -> str:
        return msgspec.json.format(msgspec.json.encode(self), indent=2).decode()


class NameCount(_Base, frozen=True):
    name: str
    runs: int
    last_recorded_at: str


# Schema migrations ------------------------------------------------------------------------------


def _v1(db: sqlite3.Connection) -> None:
    db.execute(
        """CREATE TABLE runs (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            name TEXT NOT NULL,
            recorded_at TEXT NOT NULL,
            source TEXT NOT NULL,
            git_commit TEXT,
            step_s REAL NOT NULL,
            cv REAL NOT NULL,
            mfu REAL,
            idle REAL NOT NULL,
            wall TEXT NOT NULL,
            cause TEXT NOT NULL,
            diagnosis BLOB NOT NULL
        )"""
    )


def _v2(db: sqlite3.Connection) -> None:
    """Host, device and exposed communication; an index for one job's runs in order."""
    db.execute("ALTER TABLE runs ADD COLUMN host TEXT")
    db.execute("ALTER TABLE runs ADD COLUMN device TEXT")
    db.execute("ALTER TABLE runs ADD COLUMN comm_exposed REAL")
    db.execute("CREATE INDEX runs_by_name ON runs (name, id)")


class _PeakDevice(msgspec.Struct):
    peak_allocated: int


class _PeakMemory(msgspec.Struct):
    devices: list[_PeakDevice] = []


class _PeakOnly(msgspec.Struct):
    """The one figure `_v3` reads from a stored Diagnosis (the rest is skipped unparsed)."""

    memory: _PeakMemory | None = None


def _v3(db: sqlite3.Connection) -> None:
    """Peak allocated bytes, filled in from the stored Diagnosis of runs recorded with a
    memory profile (a blob that does not read back leaves it null, as for any other run)."""
    db.execute("ALTER TABLE runs ADD COLUMN peak_allocated INTEGER")
    rows = db.execute("SELECT id, diagnosis FROM runs").fetchall()
    for run_id, blob in rows:
        try:
            memory = msgspec.json.decode(zlib.decompress(blob), type=_PeakOnly).memory
        except (zlib.error, msgspec.DecodeError, TypeError):
            continue
        if memory is not None and memory.devices:
            peak = memory.devices[0].peak_allocated
            db.execute("UPDATE runs SET peak_allocated = ? WHERE id = ?", (peak, run_id))


MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [_v1, _v2, _v3]
"""Migration k (from 1) brings a database from version k − 1 to version k. Append only."""
SCHEMA_VERSION = len(MIGRATIONS)


def _migrate(db: sqlite3.Connection, where: Path, target: int = SCHEMA_VERSION) -> None:
    with _write(db):
        # Read inside the write lock: two processes opening a new file migrate it once.
        version = int(db.execute("PRAGMA user_version").fetchone()[0])
        if version > target:
            raise WallfinderError(
                f"{where}: history database version {version} is newer than this wallfinder "
                f"understands ({target}); upgrade wallfinder"
            )
        for migration in MIGRATIONS[version:target]:
            migration(db)
        if version != target:
            db.execute(f"PRAGMA user_version = {int(target)}")


def _wal(db: sqlite3.Connection) -> str:
    """Switch to WAL mode and return the mode now in force. Turning a new file to WAL while
    other processes open it can fail with "database is locked" at once, without waiting for
    the busy timeout: retried until that timeout."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            return str(db.execute("PRAGMA journal_mode = WAL").fetchone()[0])
        except sqlite3.OperationalError as exc:  # noqa: PERF203 (a retry loop)
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@contextmanager
def _write(db: sqlite3.Connection) -> Iterator[None]:
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


# The database -----------------------------------------------------------------------------------

_COLUMNS = (
    "id, name, recorded_at, source, git_commit, host, device, step_s, cv, mfu, idle, "
    "comm_exposed, wall, cause, peak_allocated"
)


class History:
    """An open history database. Use as a context manager, or call `close()`."""

    def __init__(self, path: Path | None = None, *, _version: int = SCHEMA_VERSION) -> None:
        self.path = resolve_db_path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(
                self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=True
            )
        except (OSError, sqlite3.Error) as exc:
            raise WallfinderError(
                f"{self.path}: cannot open the history database ({exc})"
            ) from None
        try:
            self._db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            mode = _wal(self._db)
            if str(mode).lower() != "wal":
                raise WallfinderError(f"{self.path}: cannot use WAL mode here (got {mode})")
            self._db.execute("PRAGMA synchronous = NORMAL")
            _migrate(self._db, self.path, _version)
        except sqlite3.DatabaseError as exc:
            self._db.close()
            raise WallfinderError(f"{self.path}: not a usable history database ({exc})") from None
        except BaseException:
            self._db.close()
            raise

    def __enter__(self) -> History:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._db.close()

    def record(
        self,
        name: str,
        diagnosis: Diagnosis,
        *,
        commit: str | None = None,
        host: str | None = None,
        recorded_at: datetime | None = None,
    ) -> RunRecord:
        """Store one run of job `name` and return it as recorded."""
        if not name.strip():
            raise WallfinderError("a run needs a name to be recorded under")
        stored = _without_paths(diagnosis)
        when = (recorded_at or datetime.now(timezone.utc)).astimezone(timezone.utc)
        row = (
            name,
            when.isoformat(timespec="seconds"),
            stored.source,
            commit,
            host,
            stored.device.name,
            stored.steps.median_s,
            stored.steps.cv,
            stored.mfu.value,
            stored.breakdown.idle,
            stored.breakdown.comm_exposed,
            stored.verdict.wall,
            stored.verdict.cause,
            _peak_allocated(stored),
            zlib.compress(msgspec.json.encode(stored), 6),
        )
        try:
            with _write(self._db):
                cursor = self._db.execute(
                    "INSERT INTO runs (name, recorded_at, source, git_commit, host, device, "
                    "step_s, cv, mfu, idle, comm_exposed, wall, cause, peak_allocated, "
                    "diagnosis) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    row,
                )
                run_id = cursor.lastrowid
        except sqlite3.Error as exc:
            raise WallfinderError(f"{self.path}: cannot record the run ({exc})") from None
        assert run_id is not None
        return _record((run_id, *row[:-1]))

    def names(self) -> list[NameCount]:
        """Every job name with its number of runs, by name."""
        rows = self._db.execute(
            "SELECT name, COUNT(*), MAX(recorded_at) FROM runs GROUP BY name ORDER BY name"
        ).fetchall()
        return [NameCount(name=n, runs=c, last_recorded_at=t) for n, c, t in rows]

    def runs(self, name: str, *, last: int | None = None) -> list[RunRecord]:
        """The runs of job `name`, oldest first (only the `last` ones when given)."""
        rows = self._db.execute(
            f"SELECT {_COLUMNS} FROM runs WHERE name = ? ORDER BY id DESC LIMIT ?",
            (name, -1 if last is None else last),
        ).fetchall()
        return [_record(r) for r in reversed(rows)]

    def diagnosis(self, run_id: int) -> Diagnosis:
        """The Diagnosis stored with run `run_id`."""
        row = self._db.execute("SELECT diagnosis FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            raise WallfinderError(f"{self.path}: no run {run_id}")
        return Diagnosis.from_json(zlib.decompress(row[0]))

    def trend(self, name: str, *, last: int | None = None) -> Trend:
        """How job `name`'s runs moved; WallfinderError when it has none."""
        runs = self.runs(name, last=last)
        if not runs:
            known = ", ".join(n.name for n in self.names()[:10]) or "none yet"
            raise WallfinderError(f"no runs recorded as {name!r} in {self.path} (names: {known})")
        return trend(name, runs)


def trend(name: str, runs: list[RunRecord]) -> Trend:
    """The trend of `runs` (oldest first, at least one)."""
    rows = [
        TrendRun(
            run=r,
            change=(r.step_s / prev.step_s - 1) if prev is not None and prev.step_s > 0 else None,
        )
        for prev, r in zip([None, *runs[:-1]], runs, strict=True)
    ]
    first, last = runs[0].step_s, runs[-1].step_s
    return Trend(
        name=name,
        runs=rows,
        first_s=first,
        last_s=last,
        change=last / first - 1 if first > 0 else 0.0,
        best=min(runs, key=lambda r: r.step_s),
        worst=max(runs, key=lambda r: r.step_s),
    )


def _peak_allocated(d: Diagnosis) -> int | None:
    """The peak allocated bytes of `d`'s analysed device (None: no memory profile)."""
    m = d.main_memory
    return m.peak_allocated if m is not None else None


def this_host() -> str | None:
    """This machine's host name (stored with each run), or None."""
    try:
        return socket.gethostname() or None
    except OSError:
        return None


def _record(row: tuple[object, ...]) -> RunRecord:
    """A row of `_COLUMNS` as a RunRecord (checked: the database is a file anyone can edit)."""
    names = [c.strip() for c in _COLUMNS.split(",")]
    fields = dict(zip(names, row, strict=True))
    fields["commit"] = fields.pop("git_commit")
    try:
        return msgspec.convert(fields, RunRecord)
    except msgspec.ValidationError as exc:
        raise WallfinderError(f"a recorded run does not read back: {exc}") from None


def _file_name(source: str) -> str:
    """A source path cut to its last part (either separator: the trace may come from Windows)."""
    return PureWindowsPath(source).name or PurePath(source).name or source


def _without_paths(d: Diagnosis) -> Diagnosis:
    """`d` with each source path (its own, its ranks') cut to the file name, wherever the
    path appears in it (warnings quote it too)."""
    paths = {d.source, *(r.source for r in d.ranks)}
    text = msgspec.json.encode(d).decode()
    # Longest first, so that a folder's path does not cut its files' paths short.
    for path in sorted(paths, key=len, reverse=True):
        name = _file_name(path)
        if path == name:
            continue
        for form in {path, str(Path(path).absolute())}:
            encoded = msgspec.json.encode(form).decode()[1:-1]
            text = text.replace(encoded, msgspec.json.encode(name).decode()[1:-1])
    return Diagnosis.from_json(text)
