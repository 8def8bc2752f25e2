"""What runs inside the measured program: the profiler session, the step clock, and the hook
`wallfinder run` loads into a program it did not write.

This module imports nothing but the standard library and torch, and torch only when it is
used: `wallfinder run` loads it by file path (from a `sitecustomize` it puts first on the
program's `PYTHONPATH`), into whatever Python the program runs on, which may not have
wallfinder's own dependencies. `wallfinder.profile` and `wallfinder.StepTimer` use the same
classes in-process.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.abc
import importlib.machinery
import json
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any

CONFIG_ENV = "WALLFINDER_RUN"
"""The JSON settings `wallfinder run` passes to the program (see `RunSettings` in `run.py`)."""

ACTIVE_ENV = "WALLFINDER_RUN_ACTIVE"
"""Set in the process being measured, so that the processes it starts (DataLoader workers,
compile workers, subprocesses) are not measured as well."""

STATUS_PREFIX = "status_"
"""Each measured process writes `status_rank{R}_{pid}.json` into the status folder at exit."""

MEMORY_ENTRIES = 100_000
"""Allocations and frees the CUDA memory history keeps (the newest; several KB each)."""

_OOM_WORDS = ("out of memory", "cublas_status_alloc_failed")
_HOST_OOM_WORDS = ("not enough memory", "can't allocate memory")
"""How torch's CPU allocator says it ran out (DefaultCPUAllocator)."""


def rank() -> int:
    """This process's rank: torch.distributed's when initialised, else the launcher's
    environment (torchrun sets RANK), else 0."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def trace_name(rank_: int) -> str:
    return f"trace_rank{rank_}.json"


def snapshot_name(rank_: int) -> str:
    return f"memory_snapshot_rank{rank_}.pickle"


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message ("" when it has none), at most 500 characters."""
    text = str(exc).strip()
    return text.splitlines()[0][:500] if text else ""


def out_of_memory(exc: BaseException) -> BaseException | None:
    """The out-of-memory error `exc` is, or was raised from (`raise ... from`, as torch.compile
    does), else None: torch's `OutOfMemoryError` (`torch.cuda.OutOfMemoryError`), Python's
    `MemoryError`, or a RuntimeError whose message says an allocator ran out ("CUDA error: out
    of memory", "DefaultCPUAllocator: not enough memory", "can't allocate memory")."""
    torch = sys.modules.get("torch")
    kinds: list[type] = [MemoryError]
    for owner in (torch, getattr(torch, "cuda", None)) if torch is not None else ():
        kind = getattr(owner, "OutOfMemoryError", None)
        if isinstance(kind, type):
            kinds.append(kind)
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, tuple(kinds)):
            return current
        if isinstance(current, RuntimeError):
            message = str(current).lower()
            if any(w in message for w in (*_OOM_WORDS, *_HOST_OOM_WORDS)):
                return current
        current = current.__cause__
    return None


def host_out_of_memory(exc: BaseException) -> bool:
    """The host ran out, not a device: a CUDA snapshot would not explain it."""
    return isinstance(exc, MemoryError) or any(w in str(exc).lower() for w in _HOST_OOM_WORDS)


DYNAMO_KEY = "wallfinder_dynamo"
"""The trace's top-level key for what Dynamo counted (`trace.dynamo.DYNAMO_KEY` reads it)."""

MODULE_STEP_KEY = "wallfinder_module_step"
"""The trace's metadata naming the module step (`Recorder`): the `ProfilerStep#N` recorded
with module ranges, not timed."""

_REASON_CHARS = 300


_PATH = re.compile(r"(?:[\w.~-]*/)+([\w-][\w.-]*\.\w+)")
"""A file path in a reason (a guard's source comment names the user's file in full)."""


def _first(text: object) -> str:
    """The first line of a reason Dynamo wrote, bounded, without the source comment a guard
    carries, and with any path cut to its file's base name."""
    if text is None:
        return ""
    lines = str(text).strip().splitlines()
    line = lines[0].split("  #", 1)[0].rstrip() if lines else ""
    return _PATH.sub(r"\1", line)[:_REASON_CHARS]


def _dynamo_compiled() -> bool:
    """Dynamo has compiled a frame in this process."""
    if "torch._dynamo" not in sys.modules:
        return False
    try:
        from torch._dynamo import utils

        return bool(utils.counters["frames"].get("total", 0))
    except Exception:
        return False


def dynamo_report() -> dict[str, Any] | None:
    """What Dynamo counted in this process, when it compiled anything (None otherwise, or
    when this torch keeps its records elsewhere): frames, unique graphs, graph breaks by
    reason and the user's line, each frame compile with the guard failure that caused a
    recompile, and the compile seconds. File names are base names: the trace is shared,
    this machine's paths are not."""
    if "torch._dynamo" not in sys.modules:
        return None
    try:
        from torch._dynamo import utils

        counters = utils.counters
        frames = int(counters["frames"].get("total", 0))
        if not frames:
            return None
        breaks: dict[tuple[str, str, int], int] = {}
        for r in list(getattr(utils, "graph_break_reasons", [])):
            stack = list(getattr(r, "user_stack", None) or [])
            where = stack[-1] if stack else None
            key = (
                _first(r.reason),
                os.path.basename(where.filename) if where is not None else "",
                int(where.lineno or 0) if where is not None else 0,
            )
            breaks[key] = breaks.get(key, 0) + 1
        if not breaks:  # an older torch: the reasons alone, from the counters
            for reason, n in counters["graph_break"].items():
                breaks[(_first(reason), "", 0)] = int(n)
        compiles = [
            {
                "compile_id": str(m.compile_id),
                "function": str(m.co_name),
                "file": os.path.basename(str(m.co_filename or "")),
                "line": int(m.co_firstlineno or 0),
                "seconds": float(m.entire_frame_compile_time_s or 0.0),
                "recompile_reason": _first(m.recompile_reason) or None,
            }
            for m in utils.get_compilation_metrics()
            if getattr(m, "co_name", None) is not None
        ]
        times = utils.compilation_time_metrics
        seconds = sum(
            sum(v) for k, v in times.items() if k == "_compile.compile_inner" or "bw_compiler" in k
        )
        return {
            "frames": frames,
            "graphs": int(counters["stats"].get("unique_graphs", 0)),
            "graph_breaks": [
                {"reason": reason, "file": file, "line": line, "count": n}
                for (reason, file, line), n in breaks.items()
            ],
            "compiles": compiles,
            "compile_s": float(seconds),
        }
    except Exception:  # a torch whose records moved: the trace is still written without them
        return None


MODULE_PREFIX = "nn.Module: "
"""The name the profiler's Python tracer gives a module's forward (`nn.Module: Linear_0`);
`ModuleRanges` names its ranges the same way, so the analysis reads both alike."""


class ModuleRanges:
    """A `record_function` range around every `nn.Module` forward, from global forward
    hooks, named as the Python tracer names ranges (`nn.Module: NAME`): a model's root by
    its class and instance number (`nn.Module: Net_0`), the modules under it by their
    qualified names (`nn.Module: blocks.0.attn`, as `named_modules()` gives them). This is
    the module tree the phase and module analysis needs, at the cost of one range per module
    call, without recording stacks (whose Python tracer costs far more host time). Inside
    torch.compile'd code no range is opened (the compiled graph has no modules)."""

    def __init__(self) -> None:
        self._names: dict[int, str] = {}
        self._counts: dict[str, int] = {}
        self._open = threading.local()
        self._handles: list[Any] = []

    def install(self) -> None:
        import torch

        module = torch.nn.modules.module
        self._record = torch.autograd.profiler.record_function
        compiler = getattr(torch, "compiler", None)
        self._compiling = getattr(compiler, "is_compiling", lambda: False)
        self._handles = [
            module.register_module_forward_pre_hook(self._enter),
            module.register_module_forward_hook(self._exit, always_call=True),
        ]

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _enter(self, mod: object, _args: object) -> None:
        if self._compiling():
            return
        name = self._names.get(id(mod))
        stack = self._stack()
        if name is None:
            kind = type(mod).__name__
            number = self._counts.get(kind, 0)
            self._counts[kind] = number + 1
            name = self._names[id(mod)] = f"{MODULE_PREFIX}{kind}_{number}"
            if not stack:
                self._name_children(mod)

        scope: Any = self._record(name)
        scope.__enter__()
        stack.append((id(mod), scope))

    def _name_children(self, root: object) -> None:
        """Name the modules under a root by their qualified names, as `named_modules()`
        gives them (`blocks.0.attn`): the names the user's code holds."""
        named = getattr(root, "named_modules", None)
        if named is None:
            return
        for qualified, child in named():
            if qualified and id(child) not in self._names:
                self._names[id(child)] = f"{MODULE_PREFIX}{qualified}"

    def _exit(self, mod: object, _args: object, _out: object) -> None:
        stack = self._stack()
        if not any(key == id(mod) for key, _ in stack):
            return  # opened none (compiled code)
        # Close this module's range, and any an exception left open inside it.
        while stack:
            key, scope = stack.pop()
            scope.__exit__(None, None, None)
            if key == id(mod):
                break

    def _stack(self) -> list[tuple[int, Any]]:
        stack: list[tuple[int, Any]] | None = getattr(self._open, "stack", None)
        if stack is None:
            stack = self._open.stack = []
        return stack


class Recorder:
    """torch.profiler over steps: `wait` steps not recorded, `warmup` steps recorded and
    discarded, `active` steps kept. `step()` ends a step; the trace is written to `trace_dir`
    when the active steps are done, or by `stop()` with the steps recorded so far.

    Shapes are always recorded (the cost model needs them). `modules` records one step more
    than `active`, the module step, with a range around each module's forward
    (`ModuleRanges`), and names it in the trace (`wallfinder_module_step`): the timed steps
    run without the hooks, whose host time would add to what they measure, and the module
    view reads the module step. (The Python tracer of `stacks` records module ranges itself,
    in every step: no module step is added then.)"""

    def __init__(
        self,
        trace_dir: Path,
        *,
        wait: int,
        warmup: int,
        active: int,
        memory: bool = False,
        stacks: bool = False,
        modules: bool = False,
    ) -> None:
        self.trace_dir = trace_dir
        self.wait, self.warmup, self.active = wait, warmup, active
        self.memory, self.stacks = memory, stacks
        self.trace_path: Path | None = None
        self.stepped = 0
        self._profiler: Any = None
        self._modules = ModuleRanges() if modules and not stacks else None
        self.recorded = active + (1 if self._modules is not None else 0)
        """Steps recorded after the warm-up: the active ones, and the module step."""

    def start(self) -> None:
        import torch
        from torch.profiler import ProfilerActivity, schedule

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():  # ROCm builds report their GPUs through CUDA too
            activities.append(ProfilerActivity.CUDA)
        self.trace_dir.mkdir(parents=True, exist_ok=True)
        self._profiler = torch.profiler.profile(
            activities=activities,
            schedule=schedule(wait=self.wait, warmup=self.warmup, active=self.recorded, repeat=1),
            on_trace_ready=self._save,
            record_shapes=True,
            profile_memory=self.memory,
            with_stack=self.stacks,
        )
        self._profiler.start()

    def step(self) -> None:
        if self._profiler is not None:
            self.stepped += 1
            if self.stepped == self.wait + self.warmup + self.active and self._no_module_step():
                return
            if self.done:  # this step writes the trace: Dynamo's counts go in it first
                self._add_dynamo(self._profiler)
            self._profiler.step()
            if self._modules is not None and self.stepped == self.wait + self.warmup + self.active:
                # The timed steps are recorded: the next, the last, is the module step.
                step = f"ProfilerStep#{self._profiler.step_num}"
                self._profiler.add_metadata(MODULE_STEP_KEY, step)
                self._modules.install()

    @property
    def done(self) -> bool:
        """The active steps (and the module step) are recorded and written."""
        return self.stepped >= self.wait + self.warmup + self.recorded

    def stop(self) -> None:
        """Stop profiling; steps recorded so far are written (idempotent). Stopped inside
        the active steps, the trace names the step cut short, which the analysis leaves out."""
        profiler, self._profiler = self._profiler, None
        self._remove_module_ranges()
        if profiler is None:
            return
        if self.wait + self.warmup <= self.stepped < self.wait + self.warmup + self.recorded:
            profiler.add_metadata("wallfinder_cut_step", f"ProfilerStep#{profiler.step_num}")
            self._add_dynamo(profiler)
        profiler.stop()

    def _no_module_step(self) -> bool:
        """At the end of the timed steps of a program torch.compile compiled: no module step
        (compiled code opens no module range, and installing the hooks makes Dynamo
        recompile), so the trace is written now. False when a module step follows."""
        if self._modules is None or not _dynamo_compiled():
            return False
        self._modules, self.recorded = None, self.active
        profiler, self._profiler = self._profiler, None
        self._add_dynamo(profiler)
        profiler.stop()  # the timed steps are complete: this writes them (`_save`)
        return True

    @staticmethod
    def _add_dynamo(profiler: Any) -> None:
        report = dynamo_report()
        if report is not None:
            profiler.add_metadata_json(DYNAMO_KEY, json.dumps(report))

    def _save(self, prof: Any) -> None:
        self._remove_module_ranges()  # the recorded steps are done
        path = self.trace_dir / trace_name(rank())
        prof.export_chrome_trace(str(path))
        self.trace_path = path

    def _remove_module_ranges(self) -> None:
        if self._modules is not None:
            self._modules.remove()


class StepClock:
    """Step boundaries at almost no cost: a CUDA event recorded on the current stream at each
    mark when a GPU is in use (read once, at the end: no synchronisation in the loop), else
    the host clock, which is the device's clock on the CPU, where ops run synchronously.
    `clock` is the host clock read at each mark (seconds; `time.perf_counter` by default): a
    test gives readings it controls."""

    def __init__(
        self, use_cuda: bool | None = None, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        if use_cuda is None:
            torch = sys.modules.get("torch")
            use_cuda = bool(torch is not None and torch.cuda.is_available())
        self.use_cuda = use_cuda
        self._clock = clock
        self._marks: list[Any] = []

    @property
    def marks(self) -> int:
        return len(self._marks)

    def mark(self) -> None:
        if self.use_cuda:
            import torch

            event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            event.record()
            self._marks.append(event)
        else:
            self._marks.append(self._clock())

    def durations(self) -> list[float]:
        """Seconds between consecutive marks (synchronises the device once)."""
        if len(self._marks) < 2:
            return []
        if self.use_cuda:
            self._marks[-1].synchronize()
            return [
                float(a.elapsed_time(b)) / 1e3
                for a, b in zip(self._marks, self._marks[1:], strict=False)
            ]
        return [float(b - a) for a, b in zip(self._marks, self._marks[1:], strict=False)]


class FirstOptimizer:
    """Which optimizer steps mark training steps: the first optimizer's only, so that a loop
    with two optimizers (a GAN) does not mark two steps per iteration."""

    def __init__(self) -> None:
        self._id: int | None = None

    def __call__(self, optimizer: object) -> bool:
        if self._id is None:
            self._id = id(optimizer)
        return id(optimizer) == self._id


def schedule_after_first_step(warmup: int) -> tuple[int, int]:
    """(wait, warmup) for a profiler started at the end of the program's first step, so that
    its first `warmup` steps are not kept: the first is over already, the profiler waits
    through the rest but the last, and records that one as the profiler's own warm-up."""
    remaining = max(warmup - 1, 0)
    own = 1 if remaining >= 1 else 0
    return remaining - own, own


class Session:
    """One measured process under `wallfinder run`: steps are the first optimizer's steps;
    the profiler (or the step clock) starts at the end of the first step; at exit a status
    file says what happened, for `wallfinder run` to report.

    With `memory`, the CUDA allocator also records its history from the moment CUDA starts
    (warm-up included, the newest `memory_entries` events), and when the program dies of an
    out-of-memory error on the device, the allocator's snapshot at that moment is written to
    `memory_snapshot_rank{R}.pickle` in the trace folder."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.trace_dir = Path(settings["trace_dir"])
        self.status_dir = Path(settings.get("status_dir") or settings["trace_dir"])
        self.warmup = max(int(settings["warmup"]), 1)
        self.active = int(settings["steps"])
        self.stop_after = bool(settings.get("stop_after", False))
        self.timer_only = bool(settings.get("timer_only", False))
        self.memory = bool(settings.get("memory", False))
        self.stacks = bool(settings.get("stacks", False))
        self.modules = bool(settings.get("modules", True))
        self.memory_entries = int(settings.get("memory_entries") or MEMORY_ENTRIES)
        self.steps = 0
        self.error: str | None = None
        self.oom: str | None = None
        """The first line of the out-of-memory error that ended the program (its kind when
        the message is empty), or None."""
        self.history = False
        self.history_error: str | None = None
        self.snapshot: str | None = None
        self.snapshot_error: str | None = None
        self.stopped = False
        self.signal: int | None = None
        self._first = FirstOptimizer()
        self._recorder: Recorder | None = None
        self._clock: StepClock | None = None
        self._finished = False

    def on_optimizer_step(self, optimizer: object, *_: object) -> None:
        if not self._first(optimizer):
            return
        self.steps += 1
        if self.timer_only:
            self._time_step()
        else:
            self._profile_step()
        extra = self._recorder.recorded - self.active if self._recorder is not None else 0
        if self.stop_after and self.steps >= self.warmup + self.active + extra:
            self.stopped = True
            self.finish()
            raise SystemExit(0)

    def _time_step(self) -> None:
        if self._clock is None:
            self._clock = StepClock()
        if self._clock.marks <= self.active and self.steps >= self.warmup:
            self._clock.mark()

    def _profile_step(self) -> None:
        if self._recorder is None:
            wait, warmup = schedule_after_first_step(self.warmup)
            self._recorder = Recorder(
                self.trace_dir,
                wait=wait,
                warmup=warmup,
                active=self.active,
                memory=self.memory,
                stacks=self.stacks,
                modules=self.modules,
            )
            self._recorder.start()
        else:
            self._recorder.step()
            if self._recorder.done:
                self._recorder.stop()

    def record_memory_history(self) -> None:
        """Start the CUDA allocator's history (with Python stacks) when CUDA starts: queued on
        torch's own lazy initialisation, so that a program that never uses CUDA is not made
        to, nor is a program whose forked children do."""
        torch = sys.modules.get("torch")
        if torch is None:
            return

        def start() -> None:
            # Runs inside torch's CUDA initialisation: an exception would fail the program's
            # first CUDA call.
            try:
                torch.cuda.memory._record_memory_history(
                    enabled="all",
                    context="all",
                    stacks="python",
                    max_entries=self.memory_entries,
                )
                self.history = True
            except Exception as exc:
                self.history_error = f"{type(exc).__name__}: {exc}"[:500]

        try:
            later = getattr(torch.cuda, "_lazy_call", None)
            if later is None:
                if torch.cuda.is_initialized():
                    start()
            else:
                later(start)
        except Exception as exc:
            self.history_error = f"{type(exc).__name__}: {exc}"[:500]

    def on_exception(
        self, kind: type[BaseException], value: BaseException, tb: TracebackType | None
    ) -> None:
        first = first_line(value)
        self.error = f"{kind.__name__}: {first}"[:500] if first else kind.__name__
        oom = out_of_memory(value)
        if oom is None:
            return
        self.oom = first_line(oom) or type(oom).__name__
        if self.memory and not host_out_of_memory(oom):
            self._dump_snapshot()

    def _dump_snapshot(self) -> None:
        """The CUDA allocator's state and history now, while the frames of the error still
        hold their tensors. A dump that fails is recorded, never raised: the program's own
        error is what the user must see."""
        torch = sys.modules.get("torch")
        path = self.trace_dir / snapshot_name(rank())
        try:
            if torch is None or not torch.cuda.is_initialized():
                return  # the program never used CUDA: nothing to snapshot
            self.trace_dir.mkdir(parents=True, exist_ok=True)
            torch.cuda.memory._dump_snapshot(str(path))
            self.snapshot = path.name
        except Exception as exc:
            self.snapshot_error = f"{type(exc).__name__}: {exc}"[:500]
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)  # half a pickle helps no one

    def _stop_memory_history(self) -> None:
        if not self.history:
            return
        self.history = False
        try:
            torch = sys.modules["torch"]
            torch.cuda.memory._record_memory_history(enabled=None)
        except Exception:  # the process is ending; its history has served
            pass

    def on_signal(self, signum: int) -> None:
        self.signal = signum

    def finish(self) -> None:
        """Write what was recorded and the status file (once)."""
        if self._finished:
            return
        self._finished = True
        if self.error is None:
            self._exception_left_unseen()
        recorded_history = self.history
        self._stop_memory_history()
        trace: str | None = None
        failure: str | None = None
        try:
            if self._recorder is not None:
                self._recorder.stop()
                trace = self._recorder.trace_path.name if self._recorder.trace_path else None
        except Exception as exc:  # a profiler that cannot write must not hide the status
            failure = f"{type(exc).__name__}: {exc}"[:500]
        durations = self._clock.durations() if self._clock is not None else []
        status = {
            "rank": rank(),
            "pid": os.getpid(),
            "steps": self.steps,
            "warmup": self.warmup,
            "active": self.active,
            "mode": "timer" if self.timer_only else "profile",
            "trace": trace,
            "durations": durations,
            "stopped": self.stopped,
            "error": self.error,
            "signal": self.signal,
            "trace_error": failure,
            "oom": self.oom is not None,
            "oom_message": self.oom,
            "memory_history": recorded_history,
            "history_error": self.history_error,
            "snapshot": self.snapshot,
            "snapshot_error": self.snapshot_error,
        }
        path = self.status_dir / f"{STATUS_PREFIX}rank{status['rank']}_{os.getpid()}.json"
        path.write_text(json.dumps(status))

    def _exception_left_unseen(self) -> None:
        """The exception that ended the program when our excepthook was not called (the
        program set its own, e.g. rich's tracebacks): Python keeps it in `sys.last_exc` (3.12)
        or `sys.last_value` until the exit handlers have run."""
        value = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
        if isinstance(value, BaseException):
            self.on_exception(type(value), value, value.__traceback__)


def _settings() -> dict[str, Any] | None:
    """The settings for this process, or None when it is not to be measured."""
    raw = os.environ.get(CONFIG_ENV)
    if not raw or os.environ.get(ACTIVE_ENV):
        return None
    settings: dict[str, Any] = json.loads(raw)
    # Under torchrun, the launcher is a Python process too: only the workers it starts (which
    # have LOCAL_RANK) are measured.
    if settings.get("ranked") and "LOCAL_RANK" not in os.environ:
        return None
    return settings


def install() -> None:
    """Called at interpreter start in the program `wallfinder run` runs: measure this process
    once it imports torch (a process that never does is left alone)."""
    settings = _settings()
    if settings is None:
        return
    if "torch" in sys.modules:
        _attach(settings)
    else:
        sys.meta_path.insert(0, _AfterImport("torch", lambda: _attach(settings)))


def _attach(settings: dict[str, Any]) -> None:
    from torch.optim.optimizer import register_optimizer_step_post_hook

    os.environ[ACTIVE_ENV] = str(os.getpid())
    session = Session(settings)
    if session.memory:
        session.record_memory_history()
    register_optimizer_step_post_hook(session.on_optimizer_step)
    atexit.register(session.finish)
    previous_hook = sys.excepthook

    def excepthook(
        kind: type[BaseException], value: BaseException, tb: TracebackType | None
    ) -> None:
        # The program's traceback first: an out-of-memory snapshot can take seconds to write.
        try:
            previous_hook(kind, value, tb)
        finally:
            session.on_exception(kind, value, tb)

    sys.excepthook = excepthook
    _on_termination(session)


def _on_termination(session: Session) -> None:
    """SIGTERM (what torchrun, schedulers and `kill` send) ends the program through the normal
    exit path, so that the steps recorded so far are written; a handler the program set itself
    is left in place."""
    try:
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return

        def terminate(signum: int, _frame: object) -> None:
            session.on_signal(signum)
            raise SystemExit(128 + signum)

        signal.signal(signal.SIGTERM, terminate)
    except ValueError:  # torch imported outside the main thread: signals cannot be set there
        pass


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `then` once the top-level module `name` has finished importing."""

    def __init__(self, name: str, then: Callable[[], None]) -> None:
        self.name, self.then = name, then

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec: importlib.machinery.ModuleSpec | None = None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader: Any = spec.loader
        execute = loader.exec_module
        then = self.then

        def exec_module(module: ModuleType) -> None:
            execute(module)
            try:
                then()
            except Exception as exc:  # never break the program's own import of torch
                sys.stderr.write(f"wallfinder: not measuring this process: {exc}\n")

        loader.exec_module = exec_module
        return spec
