"""Two diagnoses compared: `DiagnosisDiff`."""

from __future__ import annotations

from typing import Literal

import msgspec

from wallfinder.diagnosis._base import Wall, _Base

DIFF_SCHEMA = "wallfinder.diff/1"


class StepChange(_Base, frozen=True):
    """The median step before and after, and whether the change stands out of the noise: it
    is `within_noise` when it is no larger than `noise_s`, two standard deviations of the
    steady-state steps of the noisier run (CV x mean step)."""

    before_s: float
    after_s: float
    change_s: float
    change: float
    """`change_s` as a fraction of the step before (negative: faster)."""
    speedup: float | None
    """before / after (null when the step after is zero)."""
    cv_before: float
    cv_after: float
    noise_s: float
    within_noise: bool
    note: str


class PartChange(_Base, frozen=True):
    """One part of the breakdown (or `idle:<cause>`) before and after: its share of the step
    and its time per step (the share times the mean steady-state step)."""

    part: str
    before: float
    after: float
    before_s: float
    after_s: float


class VerdictChange(_Base, frozen=True):
    before_wall: Wall
    before_cause: str
    after_wall: Wall
    after_cause: str
    moved: bool
    """Whether the wall or its cause changed."""


class FindingChange(_Base, frozen=True):
    """A finding by id: `resolved` (before only), `new` (after only) or `remaining` (both)."""

    id: str
    title: str
    status: Literal["resolved", "new", "remaining"]
    share_before: float | None
    share_after: float | None


class NameChange(_Base, frozen=True):
    """An op or kernel found in both runs, with its time per steady-state step."""

    kind: Literal["op", "kernel", "cpu_op"]
    """"op": a costed op signature (matched by name and shapes); "kernel" and "cpu_op": by
    name."""
    name: str
    shapes: str | None
    before_s: float
    after_s: float
    change_s: float


class MatchCount(_Base, frozen=True):
    """How the listed rows of one kind matched across the runs. A Diagnosis lists only its top
    rows, so a name missing from one side may still have run there, below the list."""

    kind: Literal["op", "kernel", "cpu_op"]
    matched: int
    before_only: int
    after_only: int


class MfuChange(_Base, frozen=True):
    before: float | None
    after: float | None
    change: float | None
    """after − before, in fractions of peak (null when either is unknown)."""
    basis_before: str
    basis_after: str


class BytesChange(_Base, frozen=True):
    """A memory figure before and after, in bytes."""

    before: int
    after: int
    change_bytes: int
    """after − before (negative: less memory)."""
    change: float | None
    """`change_bytes` as a fraction of before (null when before is 0)."""


class CategoryChange(_Base, frozen=True):
    """Bytes of one category (`MEMORY_CATEGORIES`) live at the peak, before and after."""

    category: str
    before: int
    after: int
    change_bytes: int


class MemoryChange(_Base, frozen=True):
    """The analysed device's memory before and after, when both runs profiled it (the same
    device label). `categories` (those present on either side) are ordered by how much they
    moved, largest first. `findings` are the memory findings by id; their `share_*` are null
    (a memory finding frees bytes, not step time)."""

    device: str
    peak_allocated: BytesChange
    peak_reserved: BytesChange
    leak_before: bool
    leak_after: bool
    categories: list[CategoryChange] = []
    growth_per_step_before: float | None = None
    growth_per_step_after: float | None = None
    """The median rise of allocated bytes from one steady-state step's start to the next."""
    findings: list[FindingChange] = []


class DiagnosisDiff(_Base, frozen=True, kw_only=True):
    """What moved between two diagnoses of the same job (`wallfinder diff BEFORE AFTER`).
    `notes` says what could not be compared, or only with care (another device, a CPU-only
    run beside a GPU one, another step source, no matched names)."""

    schema: str = DIFF_SCHEMA
    before_source: str
    after_source: str
    before_device: str | None
    after_device: str | None
    basis_before: Literal["gpu", "cpu"]
    basis_after: Literal["gpu", "cpu"]
    steps: StepChange
    breakdown: list[PartChange]
    verdict: VerdictChange
    findings: list[FindingChange] = []
    moved: list[NameChange] = []
    """Matched ops and kernels, by how much their time per step changed (largest first)."""
    matches: list[MatchCount] = []
    mfu: MfuChange
    notes: list[str] = []
    memory: MemoryChange | None = None
    """Memory before and after (null unless both runs profiled memory on the same device)."""

    @classmethod
    def from_json(cls, text: str | bytes) -> DiagnosisDiff:
        return msgspec.json.decode(text, type=cls)
