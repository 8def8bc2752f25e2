"""The result type: one typed, versioned `Diagnosis` that every renderer reads.

The JSON form is the contract of DESIGN.md §5: times in seconds, rates per second, shares and
`pct_of_roof` as fractions in [0, 1]. A field this version cannot compute is null, never
invented. Old files keep loading: fields are only ever added, with defaults.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

SCHEMA = "wallfinder.diagnosis/1"

Wall = Literal["compute", "bandwidth", "overhead"]
Answer = Literal["yes", "no", "unknown"]


class _Base(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=False):
    pass


class Device(_Base, frozen=True):
    """The device the breakdown is about. `kind` is "gpu" (any accelerator with kernels in
    the trace) or "cpu" (no device kernels: the CPU is the device)."""

    name: str | None
    kind: Literal["gpu", "cpu"]
    index: int | None = None
    matched_spec: str | None = None
    peak_flops: dict[str, float] | None = None
    mem_bandwidth: float | None = None
    note: str | None = None


class DroppedStep(_Base, frozen=True):
    step: str
    duration_s: float
    reason: str


class Steps(_Base, frozen=True):
    """Step-time statistics over the steady-state steps (warm-up steps dropped)."""

    source: str
    total: int
    count: int
    median_s: float
    mean_s: float
    min_s: float
    max_s: float
    cv: float
    stable: bool
    dropped: list[DroppedStep] = []


class StepBreakdown(_Base, frozen=True):
    """One step's window and where its time went (seconds; the parts sum to `duration_s`)."""

    step: str
    start_s: float
    duration_s: float
    compute_s: float
    comm_exposed_s: float
    copy_exposed_s: float
    idle_s: float
    idle_causes_s: dict[str, float]
    warmup: bool = False


class Breakdown(_Base, frozen=True):
    """Fractions of step time over the steady-state steps; they sum to 1. `idle_causes`
    split `idle` (fractions of step time, summing to `idle`)."""

    basis: Literal["gpu", "cpu"]
    compute: float
    comm_exposed: float
    copy_exposed: float
    idle: float
    idle_causes: dict[str, float]
    per_step_ms: dict[str, float]
    steps: list[StepBreakdown] = []


class CpuActivity(_Base, frozen=True):
    """CPU-side view for traces with no device kernels: fractions of step time on the main
    thread, and op time by class (seconds per step)."""

    data_loading: float
    ops: float
    python: float
    untraced: float
    op_time_by_class_s: dict[str, float]
    top_ops: list[OpRow] = []


class OpRow(_Base, frozen=True):
    name: str
    cls: str = msgspec.field(name="class")
    count: int
    time_s: float
    share: float


class KernelRow(_Base, frozen=True):
    """A kernel name's total over the steady-state steps (per step: `time_s` / step count).
    Cost-model fields (flops, bytes, ai, bound, pct_of_roof) are null until shapes are costed."""

    name: str
    cls: str = msgspec.field(name="class")
    count: int
    time_s: float
    share: float
    flops: float | None = None
    bytes: float | None = None
    ai: float | None = None
    bound: str | None = None
    pct_of_roof: float | None = None


class ClassShare(_Base, frozen=True):
    cls: str = msgspec.field(name="class")
    time_s: float
    share: float


class Question(_Base, frozen=True):
    question: str
    answer: Answer
    value: float | None
    detail: str


class Verdict(_Base, frozen=True):
    wall: Wall
    cause: str
    reason: str
    questions: list[Question]


class Finding(_Base, frozen=True):
    id: str
    wall: Wall
    title: str
    share: float
    max_speedup: float
    evidence: str
    fix: str


class Mfu(_Base, frozen=True):
    value: float | None
    basis: str


class RankSummary(_Base, frozen=True):
    source: str
    rank: int | None
    steps: int
    median_step_s: float
    compute: float
    idle: float
    wall: Wall
    cause: str


class Diagnosis(_Base, frozen=True, kw_only=True):
    """Where a job's step time goes and which wall it hits. Renders itself in a terminal
    (rich) and in a notebook; `to_json()` gives the contract form."""

    schema: str = SCHEMA
    source: str
    rank: int | None
    world_size: int | None
    device: Device
    steps: Steps
    breakdown: Breakdown
    verdict: Verdict
    findings: list[Finding] = []
    kernels: list[KernelRow] = []
    classes: list[ClassShare] = []
    cpu: CpuActivity | None = None
    mfu: Mfu = Mfu(value=None, basis="not computed yet: needs FLOP counts and device peaks")
    ranks: list[RankSummary] = []
    warnings: list[str] = []

    def to_json(self, *, indent: int = 2) -> str:
        return msgspec.json.format(msgspec.json.encode(self), indent=indent).decode()

    def to_dict(self) -> dict[str, Any]:
        result: dict[str, Any] = msgspec.to_builtins(self)
        return result

    @classmethod
    def from_json(cls, text: str | bytes) -> Diagnosis:
        return msgspec.json.decode(text, type=cls)

    def __rich_console__(self, console: Any, options: Any) -> Any:
        from wallfinder.report.terminal import renderables

        yield from renderables(self)

    def _repr_html_(self) -> str:
        from wallfinder.report.terminal import to_html

        return to_html(self)
