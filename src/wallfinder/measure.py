"""Measure, then diagnose: the conveniences that capture a training loop or a program and hand
what was captured to `wallfinder.api`.

    with wallfinder.profile(active=5) as p:
        for batch in loader:
            train_step(batch)      # p.step() each iteration, or let optimizer steps mark them
    print(p.diagnosis)

`wallfinder.capture` captures (the torch.profiler session, the step clock, `wallfinder run`'s
hook) and runs the demo workloads, and analyses nothing; this module sits above both it and
the API. Importing it never imports torch.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from wallfinder.analysis import Thresholds, timed_steps
from wallfinder.analysis.critpath import parse_what_if
from wallfinder.api import Options, analyze, diff, run_names
from wallfinder.capture import Recording, RecordingOptions, Timing
from wallfinder.capture.run import RunOutcome
from wallfinder.capture.workloads import (
    WAIT,
    WARMUP,
    Device,
    Expectation,
    Workload,
    prepare_demo,
)
from wallfinder.diagnosis import Diagnosis, DiagnosisDiff, Steps

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = [
    "DemoPair",
    "DemoResult",
    "Prediction",
    "Profile",
    "StepTimer",
    "diagnose_run",
    "predict",
    "profile",
    "run_demo",
    "run_demo_pair",
    "run_steps",
]

F = TypeVar("F", bound=Callable[..., Any])


class Profile(Recording):
    """A torch.profiler session over a training loop: `wait` steps ignored, `warmup` steps
    profiled but discarded (compilation, autotuning, allocator growth), `active` steps kept.

    Steps are marked by `step()`; with `auto_step` (the default), every step of the first
    optimizer marks one too, so an unmodified loop works, unless the loop calls `step()`
    itself. On exit the trace (one per rank, the rank in its name) is written to `trace_dir`
    and analysed: `diagnosis` holds the result and `trace_path` the file. A loop that stops
    inside the active steps is analysed over the steps it completed. What is recorded and
    what it costs (`modules`, `stacks`, `memory`) is as for `capture.Recording`.
    """

    def __init__(
        self, *, options: Options | None = None, **recording: Unpack[RecordingOptions]
    ) -> None:
        super().__init__(**recording)
        self.options = options
        self.diagnosis: Diagnosis | None = None

    def recorded(self, trace_path: Path) -> None:
        """Analyse the trace just written: `diagnosis` holds the result."""
        self.diagnosis = analyze(trace_path, self.options)

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


class StepTimer(Timing):
    """Step times with no profiler, at almost no cost: CUDA events when a GPU is in use (read
    once, at the end), the host clock on the CPU. Use it to see step time and its spread
    before (and after) profiling.

        with wallfinder.StepTimer() as t:
            for batch in loader:
                train_step(batch)     # t.step() each iteration, or let optimizer steps mark
        print(t.steps.median_s, t.steps.cv)

    The time from entering to the first mark is the first step; leading warm-up steps are
    dropped as in a trace's analysis. `steps` is set on exit. `clock`, when given, is read at
    each mark instead (seconds, on any device): another clock, or readings a test controls.
    """

    def __init__(
        self,
        *,
        auto_step: bool = True,
        thresholds: Thresholds | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        super().__init__(auto_step=auto_step, clock=clock)
        self.thresholds = thresholds
        self.steps: Steps | None = None

    def timed(self, durations: list[float]) -> None:
        """The step statistics of the timed steps: `steps`. No step timed is an error."""
        self.steps = timed_steps(durations, "step timer", self.thresholds)


@dataclass(frozen=True)
class DemoResult:
    """A profiled run of a workload: its diagnosis, the trace, and what was expected."""

    workload: Workload
    fixed: bool
    device: Device
    diagnosis: Diagnosis
    trace_path: Path
    expected: Expectation

    @property
    def differences(self) -> list[str]:
        """How the diagnosis differs from what was expected (empty when it matches)."""
        return self.expected.differences(self.diagnosis)


def run_demo(
    name: str,
    *,
    fixed: bool = False,
    device: str | None = None,
    steps: int = 5,
    trace_dir: str | os.PathLike[str] = "wallfinder-demo",
) -> DemoResult:
    """Profile `steps` steps of a workload (after the ignored and warm-up steps) on `device`
    (default: the GPU when there is one) and diagnose them. On the CPU under glibc this fixes
    the process's malloc mmap threshold (see `wallfinder.capture.workloads.prepare_demo`)."""
    workload, dev = prepare_demo(name, device=device, steps=steps)
    # As written, the what-if table replays the workload's fix: the prediction a pair shows.
    what_if = None if fixed else workload.what_if_for(dev)
    options = Options(what_if=what_if) if what_if else None
    with Profile(wait=WAIT, warmup=WARMUP, active=steps, trace_dir=trace_dir, options=options) as p:
        workload.run(WAIT + WARMUP + steps, fixed, dev)
    # Both are set when the block ends without an exception.
    assert p.diagnosis is not None
    assert p.trace_path is not None
    return DemoResult(
        workload=workload,
        fixed=fixed,
        device=dev,
        diagnosis=p.diagnosis,
        trace_path=p.trace_path,
        expected=workload.expected(dev, fixed),
    )


@dataclass(frozen=True)
class Prediction:
    """The as-written run's what-if for the workload's fix, replayed on its dependency graph,
    beside the fixed run's measured step: mean steady steps, in seconds (estimates: the
    replay is of the graph the trace shows, the measurement of one run)."""

    what_if: str
    """The change replayed (`wallfinder analyze --what-if` form)."""
    replayed_s: float
    """The as-written run's step, replayed unchanged."""
    predicted_s: float
    """The as-written run's step, replayed with the change."""
    measured_s: float
    """The fixed run's measured step."""

    @property
    def error(self) -> float:
        """(predicted − measured) / measured."""
        return (self.predicted_s - self.measured_s) / self.measured_s if self.measured_s else 0.0


def predict(before: DemoResult, after: DemoResult) -> Prediction | None:
    """The prediction of the fixed step from the as-written run's replay: the row of its
    what-if table for the change that stands for the workload's fix; None when the workload
    has none on this device or the as-written run has no such row (no graph)."""
    text = before.workload.what_if_for(before.device)
    path = before.diagnosis.critical_path
    if text is None or path is None:
        return None
    label = parse_what_if(text)[-1].label
    row = next((r for r in path.what_if if r.change == label), None)
    if row is None:
        return None
    return Prediction(
        what_if=label,
        replayed_s=path.replayed_step_s,
        predicted_s=row.step_s,
        measured_s=after.diagnosis.steps.mean_s,
    )


@dataclass(frozen=True)
class DemoPair:
    """A workload run as written (`before`) and with its fix (`after`), and what moved between
    them: `diff`, as `wallfinder diff` of the two runs computes it; `prediction`, what the
    as-written run's replay predicted for the fix (None: no what-if stands for it)."""

    before: DemoResult
    after: DemoResult
    diff: DiagnosisDiff
    prediction: Prediction | None = None

    @classmethod
    def of(cls, before: DemoResult, after: DemoResult) -> DemoPair:
        """The pair of two runs of one workload, with their diff and the prediction."""
        names = run_names(str(before.trace_path), str(after.trace_path))
        moved = diff(before.diagnosis, after.diagnosis, names=names)
        return cls(before, after, moved, predict(before, after))

    @property
    def faster(self) -> bool:
        """Whether the fixed step is faster by more than the runs' own spread."""
        steps = self.diff.steps
        return steps.change_s < 0 and not steps.within_noise

    @property
    def cannot_show(self) -> str:
        """Why this device cannot show the workload's wall ("" when it can)."""
        return self.before.workload.cannot_show(self.before.device)

    @property
    def differences(self) -> list[str]:
        """How the pair differs from what the workload expects on this device: each run's
        diagnosis against its expectation, and a fix expected to make the step faster that did
        not (beyond the noise). Empty when the pair shows what it was made to show."""
        out = [f"as written: {d}" for d in self.before.differences]
        out += [f"fixed: {d}" for d in self.after.differences]
        if self.after.expected.faster and not self.faster:
            out.append(f"the fixed step is not faster beyond the noise ({self.diff.steps.note})")
        return out


def run_demo_pair(
    name: str,
    *,
    device: str | None = None,
    steps: int = 5,
    trace_dir: str | os.PathLike[str] = "wallfinder-demo",
) -> DemoPair:
    """Run a workload as written, then with its fix (each as `run_demo`, into `trace_dir`'s
    subfolders NAME and NAME-fixed), and diff the two diagnoses."""
    root = Path(trace_dir)
    before = run_demo(name, device=device, steps=steps, trace_dir=root / name)
    after = run_demo(name, fixed=True, device=device, steps=steps, trace_dir=root / f"{name}-fixed")
    return DemoPair.of(before, after)


def run_steps(outcome: RunOutcome) -> Steps | None:
    """The step statistics of a `wallfinder run --timer-only` run: the lowest rank's timed
    steps (every rank runs the same steps in data-parallel jobs); None when no step was
    timed."""
    timed = [s for s in outcome.processes if len(s.durations) > 0]
    if not timed:
        return None
    return timed_steps(timed[0].durations, "step timer", None)


def diagnose_run(outcome: RunOutcome, options: Options | None = None) -> Diagnosis | None:
    """The diagnosis of what a `wallfinder run` run profiled: its one trace, or the folder of
    its ranks' traces as one job; None when no trace was written."""
    if not outcome.traces:
        return None
    target = outcome.traces[0] if len(outcome.traces) == 1 else outcome.trace_dir
    return analyze(target, options)
