"""One rank's analysis context, built once and handed to every analysis.

A `Scope` holds what the analyses start from: the trace, the device's ops (None when the CPU
is the device), every step's window on the device's clock, which of them are steady state,
the device's peaks, what the user said about the model, and the thresholds. The rules' `Facts`
is a scope plus the analyses already made.
"""

from __future__ import annotations

from functools import cached_property

import msgspec
import numpy as np
import numpy.typing as npt

from wallfinder.analysis.counters import CounterPlacement
from wallfinder.analysis.gpu import DeviceOps
from wallfinder.analysis.intervals import in_windows
from wallfinder.analysis.steps import StepSpans
from wallfinder.analysis.thresholds import Thresholds
from wallfinder.analysis.views import Views
from wallfinder.errors import WallfinderError
from wallfinder.hardware import DeviceSpec
from wallfinder.trace import Trace

I64 = npt.NDArray[np.int64]


class ModelFlops(msgspec.Struct, frozen=True):
    """What the user says about the model, for true MFU (all optional)."""

    flops_per_step: float | None = None
    params: float | None = None
    tokens_per_step: float | None = None
    seq_len: float | None = None
    layers: float | None = None
    hidden: float | None = None

    def per_step(self) -> tuple[float, str] | None:
        """Model FLOPs per step and how they were obtained, or None."""
        if self.flops_per_step is not None:
            return self.flops_per_step, "model FLOPs per step given by the user"
        if self.params is not None and self.tokens_per_step is not None:
            flops = 6.0 * self.params * self.tokens_per_step
            basis = "6·N·T (parameters × tokens per step, forward + backward)"
            if self.seq_len and self.layers and self.hidden:
                flops += 12.0 * self.layers * self.hidden * self.seq_len * self.tokens_per_step
                basis += " + 12·L·H·S·T attention"
            return flops, basis
        return None


class Scope(msgspec.Struct, frozen=True, dict=True):  # dict: the cached properties
    """One rank's trace, its device and its step windows: what every analysis takes."""

    trace: Trace
    spans: StepSpans
    dev: DeviceOps | None
    """The accelerator's ops; None when the trace has none and the CPU is the device."""
    start: I64
    """Every step's window, [start, end) in trace ns, on the device's clock."""
    end: I64
    kept: npt.NDArray[np.bool_]
    """Per step: steady state (not warm-up or start-up)."""
    spec: DeviceSpec | None
    thresholds: Thresholds
    model: ModelFlops
    counters: CounterPlacement | None = None
    """Hardware counters joined to the device's kernels (`--counters`): where they decide a
    kernel's bound, it replaces the roofline's estimate (`roofline.place`)."""
    views: Views = msgspec.field(default_factory=Views)
    """The optional views an internal error left out (`analysis.views`)."""

    @property
    def gpu(self) -> DeviceOps:
        """The accelerator's ops, for the analyses that only an accelerator has."""
        if self.dev is None:
            raise WallfinderError(f"{self.trace.source}: no device ops to analyse")
        return self.dev

    @property
    def labels(self) -> list[str]:
        return self.spans.labels

    @cached_property
    def count(self) -> int:
        """Steady-state steps."""
        return int(self.kept.sum())

    @cached_property
    def window_start(self) -> I64:
        """The steady-state steps' windows."""
        return self.start[self.kept]

    @cached_property
    def window_end(self) -> I64:
        return self.end[self.kept]

    @cached_property
    def inside(self) -> npt.NDArray[np.bool_]:
        """Per device op: starts inside a steady-state step (none when the CPU is the
        device)."""
        if self.dev is None:
            return np.zeros(0, dtype=bool)
        return in_windows(self.dev.ops.ts, self.window_start, self.window_end)

    @cached_property
    def step_time_s(self) -> float:
        """The mean steady-state step, in seconds."""
        return float((self.window_end - self.window_start).sum()) * 1e-9 / max(self.count, 1)

    @property
    def peak_flops(self) -> dict[str, float]:
        return dict(self.spec.peak_flops) if self.spec else {}

    @property
    def sm_count(self) -> int | None:
        return self.spec.sm_count if self.spec else None
