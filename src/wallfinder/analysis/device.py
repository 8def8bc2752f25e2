"""The device a rank's steps ran on, as the pipeline sees it: an accelerator (`analysis`'s
`_Gpu`) or, when the trace has no device work, the CPU (`analysis.cpu`). A device model gives
the steps' windows and breakdown, its own tables (`DeviceParts`), and its side of the optional
views; the stages (`analysis.STAGES`) do the rest the same way for both."""

from __future__ import annotations

from typing import Literal, Protocol

import msgspec
import numpy as np
import numpy.typing as npt

from wallfinder.analysis.critpath import StepGraph
from wallfinder.analysis.dispatch import DispatchSummary
from wallfinder.analysis.gpu import WindowBreakdown
from wallfinder.analysis.phases import Attribution
from wallfinder.analysis.scope import Scope
from wallfinder.analysis.steps import StepSpans
from wallfinder.diagnosis import (
    Breakdown,
    ClassShare,
    CpuActivity,
    Device,
    FusionCandidate,
    KernelRow,
    Mfu,
    Roofline,
    StepTimeline,
)
from wallfinder.hardware import DeviceSpec

I64 = npt.NDArray[np.int64]
Basis = Literal["gpu", "cpu"]
TOP_ROWS = 15
"""Rows of the diagnosis's kernel and op tables (the rest go to the exported tables)."""


class DeviceParts(msgspec.Struct, frozen=True):
    """What a device's own analyses give the common pipeline."""

    device: Device
    breakdown: Breakdown
    classes: list[ClassShare]
    roofline: Roofline | None
    mfu: Mfu
    warnings: list[str]
    capacity: tuple[int | None, str | None] = (None, None)
    kernels: list[KernelRow] = msgspec.field(default_factory=list)
    more_kernels: list[KernelRow] = msgspec.field(default_factory=list)
    cpu: CpuActivity | None = None
    dispatch: DispatchSummary | None = None
    main_thread: int | None = None
    """The CPU as the device: the thread (`thread_key`) whose time is the step's."""


class DeviceModel(Protocol):
    """The device the steps ran on: an accelerator (its kernels, copies and launches) or,
    when the trace has none, the CPU (its main thread's ops)."""

    @property
    def spec(self) -> DeviceSpec | None:
        """The device's peaks (None: unknown)."""
        ...

    @property
    def basis(self) -> Basis:
        """What the breakdown's time is: a GPU's or the CPU's main thread's."""
        ...

    def windows(self, spans: StepSpans) -> tuple[I64, I64]:
        """Every step's window on the device's clock."""
        ...

    def breakdown(self, start: I64, end: I64) -> WindowBreakdown:
        """Every step's time in compute, exposed communication and copies, and idle."""
        ...

    def parts(self, scope: Scope, bd: Breakdown) -> DeviceParts:
        """The device's tables, roofline and MFU over the steady-state steps."""
        ...

    # The device's part of the optional views (each a `View` stage, after `parts`):

    def fusion(self, scope: Scope) -> list[FusionCandidate]:
        """The chains of ops that fusing would save time on (none on the CPU)."""
        ...

    def timeline(self, scope: Scope) -> StepTimeline | None:
        """Every step's device activity on one timeline (None on the CPU)."""
        ...

    def phases(self, scope: Scope) -> Attribution:
        """The steps' time by phase and by module."""
        ...

    def graph(self, scope: Scope) -> StepGraph | None:
        """The step's dependency graph when the device model builds its own (the CPU's);
        None: built from the device's ops."""
        ...
