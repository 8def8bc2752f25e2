"""`wallfinder run`: run an unmodified program with the step hook loaded into it, then say what
happened.

The hook (`_hook.py`) reaches the program through a `sitecustomize` module put first on its
`PYTHONPATH`, so it works for `python train.py`, `python -m pkg.train`, `torchrun ...` and
scripts that start Python themselves. The program's own `sitecustomize`, if any, still runs.
Each measured process writes a status file at exit; `run_program` reads them and returns a
`RunOutcome`: the program's exit code, the traces written, the memory snapshots taken when a
process ran out of device memory, and one line per thing the user should know (an exception,
running out of memory, too few steps, no optimizer, a signal).
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wallfinder.capture import TRACE_DIR
from wallfinder.capture._hook import ACTIVE_ENV, CONFIG_ENV, MEMORY_ENTRIES, STATUS_PREFIX
from wallfinder.errors import WallfinderError

__all__ = [
    "ProcessStatus",
    "RunOutcome",
    "RunSettings",
    "prepare_trace_dir",
    "program_command",
    "run_program",
]

_HOOK = Path(__file__).with_name("_hook.py")

_SITECUSTOMIZE = """\
# Written by `wallfinder run`: loads its step hook into this Python, then the sitecustomize
# module this one hides, if there is one.
import importlib.util as _util
import os as _os
import sys as _sys

_here = _os.path.dirname(_os.path.abspath(__file__))
try:
    _spec = _util.spec_from_file_location("_wallfinder_hook", {hook!r})
    _module = _util.module_from_spec(_spec)
    _sys.modules["_wallfinder_hook"] = _module
    _spec.loader.exec_module(_module)
    _module.install()
except Exception as _exc:
    _sys.stderr.write("wallfinder: not measuring this process: %s\\n" % (_exc,))
_sys.path[:] = [p for p in _sys.path if _os.path.abspath(p or ".") != _here]
_me = _sys.modules.pop("sitecustomize")
try:
    import sitecustomize  # noqa: F401
except ImportError:
    _sys.modules["sitecustomize"] = _me  # the import system expects a module under this name
"""

_LAUNCHERS = ("torch.distributed.run", "torch.distributed.launch")


@dataclass(frozen=True)
class RunSettings:
    """What `wallfinder run` measures: `steps` steps after `warmup` warm-up steps (the first
    step is always one), counted by the first optimizer's `step()`.

    `memory` records the profiler's memory events and, on CUDA, the allocator's history (its
    newest `memory_entries` allocations and frees) for a snapshot should the program run out
    of device memory. `stacks` records Python stacks in the profiler; None (the default)
    records them with `memory`, whose call sites are Python functions only with them.
    `modules` (on by default) records one step more, after the timed steps, with a range
    around each `nn.Module` forward: the module view's step, untimed, so the hooks' host time
    is not in what the timed steps measure (the Python tracer of `stacks` records module
    ranges itself)."""

    steps: int = 5
    warmup: int = 3
    memory: bool = False
    stacks: bool | None = None
    modules: bool = True
    stop_after: bool = False
    timer_only: bool = False
    memory_entries: int = MEMORY_ENTRIES

    def __post_init__(self) -> None:
        if self.steps < 1 or self.warmup < 1:
            raise WallfinderError("--steps and --warmup must be at least 1")
        if self.memory_entries < 1:
            raise WallfinderError("the memory history needs at least 1 entry")

    @property
    def python_stacks(self) -> bool:
        """Whether the profiler records Python stacks."""
        return self.memory if self.stacks is None else self.stacks


@dataclass(frozen=True)
class ProcessStatus:
    """What one measured process reported at exit."""

    rank: int
    steps: int
    trace: str | None
    durations: list[float]
    stopped: bool
    error: str | None
    signal: int | None
    trace_error: str | None
    oom: str | None = None
    """The first line of the out-of-memory error that ended the process, or None."""
    snapshot: str | None = None
    """The allocator snapshot taken then, a file name in the trace folder."""
    snapshot_error: str | None = None
    history_error: str | None = None

    @classmethod
    def of(cls, raw: dict[str, Any]) -> ProcessStatus:
        return cls(
            rank=int(raw["rank"]),
            steps=int(raw["steps"]),
            trace=raw.get("trace"),
            durations=[float(x) for x in raw.get("durations", [])],
            stopped=bool(raw.get("stopped")),
            error=raw.get("error"),
            signal=raw.get("signal"),
            trace_error=raw.get("trace_error"),
            oom=(raw.get("oom_message") or "out of memory") if raw.get("oom") else None,
            snapshot=raw.get("snapshot"),
            snapshot_error=raw.get("snapshot_error"),
            history_error=raw.get("history_error"),
        )


@dataclass(frozen=True)
class RunOutcome:
    """The program's exit code (128 + N when a signal N ended it), the traces written, the
    measured processes' statuses (by rank), the lines that say what happened, and the
    allocator snapshots taken when processes ran out of device memory (by rank)."""

    exit_code: int
    trace_dir: Path
    traces: list[Path]
    processes: list[ProcessStatus]
    notes: list[str] = field(default_factory=list)
    snapshots: list[Path] = field(default_factory=list)


def program_command(command: Sequence[str], module: str | None = None) -> list[str]:
    """The command line to run: `-m MODULE ARGS` and `script.py ARGS` run on this Python;
    anything else (`python ...`, `torchrun ...`, a shell script) runs as given."""
    args = list(command)
    if args[:1] == ["--"]:
        args = args[1:]
    if module is not None:
        return [sys.executable, "-m", module, *args]
    if not args:
        raise WallfinderError(
            "give the program to run, e.g. wallfinder run -- python train.py ARGS"
        )
    if args[0].endswith(".py"):
        return [sys.executable, *args]
    return args


def _launcher(command: Sequence[str]) -> bool:
    """torchrun (or `python -m torch.distributed.run`): measure only the workers it starts."""
    if Path(command[0]).name == "torchrun":
        return True
    return any(a == "-m" and b in _LAUNCHERS for a, b in itertools.pairwise(command))


def prepare_trace_dir(trace_dir: Path | None) -> Path:
    """The folder for this run's traces: a new one under `wallfinder-traces/` by default; a
    folder the user names must not hold traces already (they would be analysed with these)."""
    if trace_dir is None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        trace_dir = Path(TRACE_DIR) / f"run-{stamp}"
        n = 1
        while trace_dir.exists():
            n += 1
            trace_dir = Path(TRACE_DIR) / f"run-{stamp}-{n}"
    elif trace_dir.exists():
        if not trace_dir.is_dir():
            raise WallfinderError(f"{trace_dir}: not a folder (--trace-dir)")
        old = sorted(p.name for p in trace_dir.glob("trace_rank*.json"))
        if old:
            raise WallfinderError(
                f"{trace_dir} already holds traces ({old[0]}, ...): they would be analysed "
                "with this run's; give an empty or new --trace-dir"
            )
    try:
        trace_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise WallfinderError(f"{trace_dir}: cannot create ({exc.strerror})") from None
    return trace_dir


def run_program(command: Sequence[str], settings: RunSettings, trace_dir: Path) -> RunOutcome:
    """Run `command` with the step hook, wait for it, and return what happened. Ctrl-C
    reaches the program (it is in the same process group) and SIGTERM is passed on, so the
    program can write the steps it recorded before it ends."""
    command = list(command)
    with tempfile.TemporaryDirectory(prefix="wallfinder-run-") as hook_dir:
        Path(hook_dir, "sitecustomize.py").write_text(_SITECUSTOMIZE.format(hook=str(_HOOK)))
        env = dict(os.environ)
        env.pop(ACTIVE_ENV, None)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (hook_dir, os.environ.get("PYTHONPATH", "")) if p
        )
        env[CONFIG_ENV] = json.dumps(
            {
                "trace_dir": str(trace_dir.resolve()),
                "status_dir": hook_dir,
                "steps": settings.steps,
                "warmup": settings.warmup,
                "memory": settings.memory,
                "memory_entries": settings.memory_entries,
                "stacks": settings.python_stacks,
                "modules": settings.modules,
                "stop_after": settings.stop_after,
                "timer_only": settings.timer_only,
                "ranked": _launcher(command),
            }
        )
        exit_code = _wait(command, env)
        statuses = _statuses(Path(hook_dir))
    traces = sorted(trace_dir.glob("trace_rank*.json"))
    notes = _notes(command, exit_code, statuses, settings, traces)
    snapshots = [trace_dir / s.snapshot for s in statuses if s.snapshot]
    snapshots = [p for p in snapshots if p.is_file()]
    return RunOutcome(exit_code, trace_dir, traces, statuses, notes, snapshots)


def _wait(command: list[str], env: dict[str, str]) -> int:
    try:
        proc = subprocess.Popen(command, env=env)
    except OSError as exc:
        raise WallfinderError(f"cannot run {command[0]}: {exc.strerror or exc}") from None
    previous = signal.signal(signal.SIGTERM, lambda signum, _: proc.send_signal(signum))
    interrupts = 0
    try:
        while True:
            try:
                code = proc.wait()
                break
            except KeyboardInterrupt:
                # The program got the same Ctrl-C; wait for it to write its steps. A second
                # one terminates it, a third kills it.
                interrupts += 1
                if interrupts == 2:
                    proc.terminate()
                elif interrupts > 2:
                    proc.kill()
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 128 - code if code < 0 else code


def _statuses(folder: Path) -> list[ProcessStatus]:
    found = (_status(p) for p in sorted(folder.glob(f"{STATUS_PREFIX}*.json")))
    return sorted((s for s in found if s is not None), key=lambda s: s.rank)


def _status(path: Path) -> ProcessStatus | None:
    try:
        return ProcessStatus.of(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # a process killed while writing it: the exit code says enough


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _notes(
    command: list[str],
    exit_code: int,
    statuses: list[ProcessStatus],
    settings: RunSettings,
    traces: list[Path],
) -> list[str]:
    program = Path(command[0]).name
    notes: list[str] = []
    if any(s.signal for s in statuses):
        pass  # the process's own line says which signal stopped it
    elif exit_code > 128:
        notes.append(f"{program} was killed by {_signal_name(exit_code - 128)}")
    elif exit_code:
        notes.append(f"{program} exited with code {exit_code}")
    if not statuses:
        notes.append(
            "nothing was measured: the program ended before it imported torch, or was killed"
            if exit_code
            else "the program never imported torch: nothing was measured"
        )
        return notes
    wanted = settings.warmup + settings.steps
    by_text: dict[str, list[int]] = {}
    for s in statuses:
        for line in _process_notes(s, settings, wanted):
            by_text.setdefault(line, []).append(s.rank)
    several = len(statuses) > 1
    for line, ranks in by_text.items():
        prefix = f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}: "
        notes.append((prefix if several else "") + line)
    if not traces and not settings.timer_only and any(s.steps > settings.warmup for s in statuses):
        notes.append("no trace was written (see above)")
    return notes


def _process_notes(s: ProcessStatus, settings: RunSettings, wanted: int) -> list[str]:
    lines = []
    if s.oom:
        lines.append(f"the program ran out of memory after {s.steps} steps: {s.oom}")
        if not settings.memory:
            lines.append(
                "run it again with --memory to see what filled memory (on CUDA: the "
                "allocator's state when it ran out, with the call sites)"
            )
    elif s.error:
        lines.append(f"the program raised {s.error} after {s.steps} steps")
    if s.signal:
        lines.append(f"the program was stopped by {_signal_name(s.signal)} after {s.steps} steps")
    if s.steps == 0:
        lines.append(
            "the program never ran an optimizer step: `wallfinder run` counts steps by "
            "optimizer.step() (for a loop without one, use wallfinder.profile and p.step())"
        )
    elif s.steps < wanted:
        measured = max(s.steps - settings.warmup, 0)
        what = "timed" if settings.timer_only else "profiled"
        lines.append(
            f"ran {s.steps} steps, fewer than the {settings.warmup} warm-up + "
            f"{settings.steps} {what} asked: "
            + (
                f"analysing the {measured} {what}"
                if measured
                else f"none was {what} (lower --warmup, or run more steps)"
            )
        )
    if s.stopped:
        lines.append(
            f"stopped the program after the {settings.steps} measured steps (--stop-after)"
        )
    if s.trace_error:
        lines.append(f"could not write the trace: {s.trace_error}")
    if s.history_error:
        lines.append(f"could not record the CUDA memory history: {s.history_error}")
    if s.snapshot_error:
        lines.append(f"could not write the memory snapshot: {s.snapshot_error}")
    return lines
