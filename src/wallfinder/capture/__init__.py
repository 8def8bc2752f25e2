"""Capture: profile a real training loop with torch.profiler and diagnose what it recorded.

The only package that imports torch, and only when a profile starts: importing wallfinder (or
this module) never does.

    with wallfinder.profile(active=5) as p:
        for batch in loader:
            train_step(batch)      # p.step() each iteration, or let optimizer steps mark them
    print(p.diagnosis)
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from wallfinder.api import Options, analyze
from wallfinder.diagnosis import Diagnosis
from wallfinder.errors import WallfinderError

__all__ = ["Profile", "profile"]

F = TypeVar("F", bound=Callable[..., Any])


def _rank() -> int:
    """This process's rank: from torch.distributed when initialised, else the launcher's
    environment (torchrun sets RANK), else 0."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    return int(os.environ.get("RANK", "0"))


class Profile:
    """A torch.profiler session over a training loop: `wait` steps ignored, `warmup` steps
    profiled but discarded (compilation, autotuning, allocator growth), `active` steps kept.

    Steps are marked by `step()`; with `auto_step` (the default), every optimizer step marks
    one too, so an unmodified loop works, unless the loop calls `step()` itself. On exit the
    trace (one per rank, the rank in its name) is written to `trace_dir` and analysed:
    `diagnosis` holds the result and `trace_path` the file.
    """

    def __init__(
        self,
        *,
        wait: int = 1,
        warmup: int = 2,
        active: int = 5,
        trace_dir: str | os.PathLike[str] = "wallfinder-traces",
        memory: bool = False,
        stacks: bool = False,
        auto_step: bool = True,
        options: Options | None = None,
    ) -> None:
        if wait < 0 or warmup < 0 or active < 1:
            raise WallfinderError("profile needs wait ≥ 0, warmup ≥ 0 and active ≥ 1 steps")
        self.wait, self.warmup, self.active = wait, warmup, active
        self.trace_dir = Path(trace_dir)
        self.memory, self.stacks, self.auto_step = memory, stacks, auto_step
        self.options = options
        self.trace_path: Path | None = None
        self.diagnosis: Diagnosis | None = None
        self._profiler: Any = None
        self._hook: Any = None
        self._manual = False

    def __enter__(self) -> Profile:
        import torch
        from torch.profiler import ProfilerActivity, schedule

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():  # ROCm builds report their GPUs through CUDA too
            activities.append(ProfilerActivity.CUDA)
        self.trace_dir.mkdir(parents=True, exist_ok=True)
        self._profiler = torch.profiler.profile(
            activities=activities,
            schedule=schedule(wait=self.wait, warmup=self.warmup, active=self.active, repeat=1),
            on_trace_ready=self._save,
            record_shapes=True,
            profile_memory=self.memory,
            with_stack=self.stacks,
        )
        self._profiler.__enter__()
        if self.auto_step:
            from torch.optim.optimizer import register_optimizer_step_post_hook

            self._hook = register_optimizer_step_post_hook(self._on_optimizer_step)
        return self

    def _on_optimizer_step(self, *_: Any) -> None:
        if not self._manual:
            self._profiler.step()

    def step(self) -> None:
        """Mark the end of a training step (then optimizer steps no longer do)."""
        self._manual = True
        self._profiler.step()

    def _save(self, prof: Any) -> None:
        path = self.trace_dir / f"trace_rank{_rank()}.json"
        prof.export_chrome_trace(str(path))
        self.trace_path = path

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        self._profiler.__exit__(exc_type, exc, tb)
        if exc_type is not None:
            return
        if self.trace_path is None:
            raise WallfinderError(
                f"the loop ended before any profiled step: it needs {self.wait + self.warmup} "
                f"steps before the {self.active} kept ones (mark steps with p.step(), or run "
                "an optimizer step per iteration)"
            )
        self.diagnosis = analyze(self.trace_path, self.options)

    def __call__(self, fn: F) -> F:
        """Use as a decorator: the function runs inside the profile; `diagnosis` after."""

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self:
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]


profile = Profile
"""`wallfinder.profile(...)`: `with wallfinder.profile() as p: ...`, then `p.diagnosis`; or
`@wallfinder.profile()` on the function that runs the loop."""
