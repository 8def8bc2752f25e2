"""Capture: record a training loop with torch.profiler (`Recording`), or time its steps with no
profiler (`Timing`); `run` runs an unmodified program with a step hook, `workloads` the demo
jobs, `calibrate` measures the device. Diagnosing what was captured is not done here:
`wallfinder.measure` builds `wallfinder.profile` and `wallfinder.StepTimer` on these.

The only package that imports torch, and only when a capture starts: importing wallfinder (or
this module) never does.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, TypedDict, TypeVar

from wallfinder.capture._hook import FirstOptimizer, Recorder, StepClock
from wallfinder.errors import WallfinderError

__all__ = ["Recording", "RecordingOptions", "Timing", "require_torch"]

INSTALL_TORCH = "pip install 'wallfinder[torch]'"


def require_torch(what: str) -> None:
    """Raise the one-line error that says how to install torch, when it is not installed."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise WallfinderError(
            f"{what} needs PyTorch, which is not installed here: {INSTALL_TORCH} (or "
            "install the torch build for your accelerator); analysing saved traces needs none"
        )


class _StepMarks:
    """Steps marked by `step()` or, with `auto_step`, by the first optimizer's steps until the
    loop calls `step()` itself. Subclasses say what a mark does."""

    def __init__(self, auto_step: bool) -> None:
        self.auto_step = auto_step
        self._hook: Any = None
        self._manual = False
        self._first = FirstOptimizer()
        self._marks_with: Callable[[], None] | None = None

    def _mark(self) -> None:
        if self._marks_with is not None:
            self._marks_with()

    def _watch_optimizers(self, mark: Callable[[], None]) -> None:
        """Mark steps with `mark` from now on: on `step()` and, with `auto_step`, on the
        first optimizer's steps."""
        self._marks_with = mark
        if self.auto_step:
            from torch.optim.optimizer import register_optimizer_step_post_hook

            self._hook = register_optimizer_step_post_hook(self._on_optimizer_step)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        self._ended(completed=exc_type is None)

    def _ended(self, completed: bool) -> None:
        """The loop ended (`completed`: without an exception); optimizer steps no longer
        mark."""
        raise NotImplementedError

    def _on_optimizer_step(self, optimizer: object, *_: Any) -> None:
        if not self._manual and self._first(optimizer):
            self._mark()

    def step(self) -> None:
        """Mark the end of a training step (then optimizer steps no longer do)."""
        self._manual = True
        self._mark()


DEFAULT_WAIT, DEFAULT_WARMUP, DEFAULT_ACTIVE = 1, 2, 5
"""The profile schedule's defaults: steps ignored, profiled but discarded, kept."""
TRACE_DIR = "wallfinder-traces"
"""Where traces are written by default."""


class RecordingOptions(TypedDict, total=False):
    """The keywords `Recording` takes, for a subclass that passes them on (their defaults and
    meaning are `Recording`'s)."""

    wait: int
    warmup: int
    active: int
    trace_dir: str | os.PathLike[str]
    memory: bool
    stacks: bool | None
    modules: bool
    auto_step: bool


R = TypeVar("R", bound="Recording")
T = TypeVar("T", bound="Timing")


class Recording(_StepMarks):
    """A torch.profiler session over a training loop: `wait` steps ignored, `warmup` steps
    profiled but discarded (compilation, autotuning, allocator growth), `active` steps kept.

    Steps are marked by `step()`; with `auto_step` (the default), every step of the first
    optimizer marks one too, so an unmodified loop works, unless the loop calls `step()`
    itself. On exit the trace (one per rank, the rank in its name) is written to `trace_dir`
    and `trace_path` names it; a loop that stops inside the active steps keeps the steps it
    completed. Shapes are always recorded; `modules` puts a range around each `nn.Module`
    forward, for the module view (tens of µs per module call: off by default, as it would add
    to the host overhead the verdict measures);
    `stacks` records Python stacks, for call sites (the profiler's Python tracer: often tens
    of percent of host time; by default only with `memory`, whose call sites need them).
    `memory` records memory events. A subclass acts on the trace in `recorded`
    (`wallfinder.profile` diagnoses it).
    """

    def __init__(
        self,
        *,
        wait: int = DEFAULT_WAIT,
        warmup: int = DEFAULT_WARMUP,
        active: int = DEFAULT_ACTIVE,
        trace_dir: str | os.PathLike[str] = TRACE_DIR,
        memory: bool = False,
        stacks: bool | None = None,
        modules: bool = False,
        auto_step: bool = True,
    ) -> None:
        if wait < 0 or warmup < 0 or active < 1:
            raise WallfinderError("profile needs wait ≥ 0, warmup ≥ 0 and active ≥ 1 steps")
        super().__init__(auto_step)
        self.wait, self.warmup, self.active = wait, warmup, active
        self.trace_dir = Path(trace_dir)
        # Memory call sites are Python functions only with Python stacks: on with memory unless
        # asked otherwise, as in `wallfinder run --memory`.
        self.memory, self.stacks = memory, memory if stacks is None else stacks
        self.modules = modules
        self.trace_path: Path | None = None
        self._recorder: Recorder | None = None

    def __enter__(self: R) -> R:
        # This class is what `wallfinder.profile` runs: the error names that.
        require_torch("wallfinder.profile")
        self._recorder = Recorder(
            self.trace_dir,
            wait=self.wait,
            warmup=self.warmup,
            active=self.active,
            memory=self.memory,
            stacks=self.stacks,
            modules=self.modules,
        )
        self._recorder.start()
        self._watch_optimizers(self._recorder.step)
        return self

    def _ended(self, completed: bool) -> None:
        self._marks_with = None  # a stopped recorder takes no more steps
        recorder, self._recorder = self._recorder, None
        if recorder is None:
            return
        recorder.stop()
        self.trace_path = recorder.trace_path
        if not completed:
            return
        if self.trace_path is None:
            raise WallfinderError(
                f"the loop ended before any profiled step: it needs {self.wait + self.warmup} "
                f"steps before the {self.active} kept ones (mark steps with p.step(), or run "
                "an optimizer step per iteration)"
            )
        self.recorded(self.trace_path)

    def recorded(self, trace_path: Path) -> None:
        """Called when the loop ended without an exception and `trace_path` was written;
        nothing more is done here."""


class Timing(_StepMarks):
    """Step times with no profiler, at almost no cost: CUDA events when a GPU is in use (read
    once, at the end), the host clock on the CPU. The time from entering to the first mark is
    the first step. `clock`, when given, is read at each mark instead (seconds, on any
    device): another clock, or readings a test controls. A subclass acts on the steps in
    `timed` (`wallfinder.StepTimer` turns them into statistics).
    """

    def __init__(self, *, auto_step: bool = True, clock: Callable[[], float] | None = None) -> None:
        super().__init__(auto_step)
        self._given_clock = clock
        self._clock: StepClock | None = None

    def __enter__(self: T) -> T:
        # This class is what `wallfinder.StepTimer` runs: the error names that.
        require_torch("wallfinder.StepTimer")
        import torch

        if self._given_clock is not None:
            self._clock = StepClock(use_cuda=False, clock=self._given_clock)
        else:
            self._clock = StepClock(use_cuda=torch.cuda.is_available())
        self._clock.mark()
        self._watch_optimizers(self._clock.mark)
        return self

    def durations(self) -> list[float]:
        """The steps timed so far, in seconds (synchronises the device)."""
        return self._clock.durations() if self._clock is not None else []

    def _ended(self, completed: bool) -> None:
        durations = self.durations()
        if completed:
            self.timed(durations)

    def timed(self, durations: list[float]) -> None:
        """Called when the loop ended without an exception, with the step times (seconds, in
        order; empty when nothing marked a step); nothing more is done here."""
