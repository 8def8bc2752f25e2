"""The runs in a log folder, as `tensorboard_trace_handler` and `wallfinder run` lay them out,
and their diagnoses, made in the background and kept while the files stay the same.

A run is a folder directly under LOGDIR holding trace files (one per rank or worker: one job),
Nsight Systems exports, or a saved diagnosis (`diagnosis.json`, which wins: it is what the run
said about itself); a trace file directly in LOGDIR is a run of its own. Nothing outside
LOGDIR is ever listed: an entry whose real path leaves it (a symlink out) is skipped.
`poll()` looks at the folder again (new runs, changed files); `work()` diagnoses what is
waiting. The server calls both from one background thread; tests call them directly.
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

import msgspec

from wallfinder.api import Diagnosis, Options, analyze, load_diagnosis, saved_schema
from wallfinder.errors import WallfinderError, describe

State = Literal["queued", "analysing", "ready", "error"]

SAVED = "diagnosis.json"
"""The name `wallfinder demo` (and a user's `analyze --format json -o`) saves a diagnosis as."""
TRACE_SUFFIXES = (".json", ".json.gz")
NSYS_SUFFIXES = (".sqlite", ".nsys-rep")


@dataclass
class Run:
    """One run of LOGDIR: its files (relative to LOGDIR), and what is known of it."""

    name: str
    files: list[str]
    signature: tuple[tuple[str, int, int], ...]
    saved: str | None = None
    """The saved diagnosis's file, when the run has one."""
    state: State = "queued"
    diagnosis: Diagnosis | None = None
    error: str | None = None
    modified: float = 0.0

    @property
    def date(self) -> str:
        """When its newest file was written (UTC, to the minute)."""
        when = datetime.fromtimestamp(self.modified, timezone.utc)
        return when.strftime("%Y-%m-%d %H:%M")

    @property
    def traces(self) -> list[str]:
        """Its trace files (not the saved diagnosis)."""
        return [f for f in self.files if f != self.saved]


@dataclass
class Runs:
    """The runs of `root`, by name."""

    root: Path
    options: Options = field(default_factory=lambda: Options(cache=True))
    _runs: dict[str, Run] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def of(cls, logdir: str | Path) -> Runs:
        """The runs of `logdir`; WallfinderError when it is missing or not a folder."""
        path = Path(logdir)
        if not path.exists():
            raise WallfinderError(f"{logdir}: no such folder")
        if not path.is_dir():
            raise WallfinderError(f"{logdir}: not a folder (give the folder your runs are in)")
        return cls(path.resolve())

    def all(self) -> list[Run]:
        """Every run, newest first."""
        with self._lock:
            return sorted(self._runs.values(), key=lambda r: (-r.modified, r.name))

    def get(self, name: str) -> Run | None:
        with self._lock:
            return self._runs.get(name)

    def waiting(self) -> int:
        """How many runs are queued or being analysed."""
        with self._lock:
            return sum(r.state in ("queued", "analysing") for r in self._runs.values())

    def poll(self) -> None:
        """Look at the folder again: new runs are queued, changed ones queued again, and runs
        whose files are gone are dropped."""
        found = {run.name: run for run in self._scan()}
        with self._lock:
            for name in list(self._runs):
                if name not in found:
                    del self._runs[name]
            for name, run in found.items():
                known = self._runs.get(name)
                if known is None or known.signature != run.signature:
                    self._runs[name] = run

    def work(self) -> None:
        """Diagnose every queued run, one at a time."""
        while (run := self._next()) is not None:
            self._diagnose(run)

    def _next(self) -> Run | None:
        with self._lock:
            queued = [r for r in self._runs.values() if r.state == "queued"]
            if not queued:
                return None
            run = max(queued, key=lambda r: r.modified)  # the newest first: what one looks at
            run.state = "analysing"
            return run

    def _diagnose(self, run: Run) -> None:
        try:
            diagnosis: Diagnosis | None = self._analysed(run)
            error = None
        except WallfinderError as exc:
            diagnosis, error = None, self._private(str(exc))
        except Exception as exc:  # a bug: shown as this run's error, the server goes on
            diagnosis = None
            error = (
                f"internal error in wallfinder ({self._private(describe(exc))}): please report it"
            )
        with self._lock:
            if self._runs.get(run.name) is not run:
                return  # its files changed meanwhile: the new entry is queued
            run.diagnosis, run.error = diagnosis, error
            run.state = "ready" if diagnosis is not None else "error"

    def _analysed(self, run: Run) -> Diagnosis:
        if run.saved is not None:
            d = load_diagnosis(self.root / run.saved, self.options)
        else:
            traces = run.traces
            json_traces = [f for f in traces if f.endswith(TRACE_SUFFIXES)]
            if len(json_traces) > 1:
                # One job: every rank file of the folder (the API's folder analysis).
                d = analyze((self.root / json_traces[0]).parent, self.options)
            else:
                d = analyze(self.root / (json_traces or traces)[0], self.options)
        # The page names the run as LOGDIR does, never by the machine's absolute paths.
        return msgspec.structs.replace(d, source=run.name)

    def _private(self, message: str) -> str:
        """`message` with LOGDIR's absolute path cut to nothing (paths relative to it)."""
        return message.replace(f"{self.root}{os.sep}", "").replace(str(self.root), ".")

    # The folder -----------------------------------------------------------------------------

    def _scan(self) -> list[Run]:
        runs = []
        try:
            entries = sorted(self.root.iterdir())
        except OSError:
            return []  # gone or unreadable for now: the next poll looks again
        for entry in entries:
            if entry.name.startswith(".") or not self._inside(entry):
                continue
            if entry.is_dir():
                run = self._folder_run(entry)
            elif _is_trace(entry.name):
                run = self._run(entry.name, [entry], saved=None)
            else:
                run = None
            if run is not None:
                runs.append(run)
        return runs

    def _folder_run(self, folder: Path) -> Run | None:
        try:
            children = sorted(p for p in folder.iterdir() if p.is_file() and self._inside(p))
        except OSError:
            return None
        saved = next((p for p in children if p.name == SAVED and saved_schema(p) is not None), None)
        traces = _latest_cycles([p for p in children if p != saved and _is_trace(p.name)])
        if saved is None and not traces:
            return None
        return self._run(folder.name, ([saved] if saved else []) + traces, saved=saved)

    def _run(self, name: str, files: list[Path], saved: Path | None) -> Run | None:
        try:
            stats = [f.stat() for f in files]
        except OSError:
            return None  # being written or removed: seen at the next poll
        relative = [f.relative_to(self.root).as_posix() for f in files]
        signature = tuple(
            (r, s.st_size, s.st_mtime_ns) for r, s in zip(relative, stats, strict=True)
        )
        return Run(
            name=name,
            files=relative,
            signature=signature,
            saved=saved.relative_to(self.root).as_posix() if saved else None,
            modified=max(s.st_mtime for s in stats),
        )

    def _inside(self, path: Path) -> bool:
        """Whether `path`'s real location is inside LOGDIR (a symlink out is not)."""
        try:
            return path.resolve().is_relative_to(self.root)
        except OSError:
            return False


def _is_trace(name: str) -> bool:
    return name.endswith(TRACE_SUFFIXES + NSYS_SUFFIXES) and name != SAVED


_CYCLE = re.compile(r"^(?P<worker>.+)\.(?P<stamp>\d+)\.pt\.trace\.json(\.gz)?$")
"""`tensorboard_trace_handler`'s file name: `{worker}.{time in ms}.pt.trace.json[.gz]`, one
file per worker and profiling cycle."""


def _latest_cycles(traces: list[Path]) -> list[Path]:
    """Of the files `tensorboard_trace_handler` wrote for one worker in several profiling
    cycles, the newest (the run's latest cycle, as the profiler plugin opened by default):
    the others are the same worker at other steps, not other ranks of a job."""
    newest: dict[str, tuple[int, Path]] = {}
    kept: list[Path] = []
    for path in traces:
        cycle = _CYCLE.match(path.name)
        if cycle is None:
            kept.append(path)
            continue
        stamp = int(cycle["stamp"])
        seen = newest.get(cycle["worker"])
        if seen is None or stamp > seen[0]:
            newest[cycle["worker"]] = (stamp, path)
    return sorted(kept + [p for _, p in newest.values()])
