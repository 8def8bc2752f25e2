"""`Diagnosis` itself, with its what-ifs and critical path, and the marks it puts on a trace."""

from __future__ import annotations

from typing import Any

import msgspec

from wallfinder.diagnosis._base import (
    _DIAGNOSIS_V1,
    SCHEMA,
    Wall,
    _Base,
    _Schema,
    _upgrade_memory_findings,
)
from wallfinder.diagnosis._checks import _violations
from wallfinder.diagnosis._compiled import CompiledCode
from wallfinder.diagnosis._counters import CounterReport
from wallfinder.diagnosis._memory import DeviceMemoryProfile, MemoryProfile
from wallfinder.diagnosis._parallel import Parallelism
from wallfinder.diagnosis._serving import Serving
from wallfinder.diagnosis._step import (
    Breakdown,
    ClassShare,
    CpuActivity,
    Device,
    Finding,
    FusionCandidate,
    JobSummary,
    KernelRow,
    Mfu,
    Modules,
    Phases,
    RankSummary,
    Roofline,
    Steps,
    StepTimeline,
    Verdict,
)


class WhatIfRow(_Base, frozen=True):
    """One what-if: the steady step replayed on its dependency graph with `change` applied
    (an estimate: the graph's edges are read from the trace's timing)."""

    change: str
    step_s: float
    speedup: float
    """Replayed unchanged step / replayed step with the change."""
    wall_after: Wall
    capped_by: str | None = None
    """The finding whose gain for the same fix (or a larger one of the same kind) capped this
    row: the replay gained more than that finding says the fix can (None: the replay as is).
    So one fix has one figure everywhere."""


class PathSegment(_Base, frozen=True):
    """A stretch of the critical path in the timeline's step: seconds from its start, and
    what the path spends it in (one of `CriticalPath.shares`' categories)."""

    start_s: float
    end_s: float
    category: str


class CriticalPath(_Base, frozen=True):
    """The steady steps' dependency graph, replayed: its critical path's time by category
    (`shares` of the replayed step, summing to 1: data, host, launch, sync, communication,
    compute (matmul-class kernels), bandwidth (other kernels), wait (device waits no edge
    explains)), the replay's error against the measured step, and the what-if table."""

    steps: int
    measured_step_s: float
    replayed_step_s: float
    replay_error: float
    """(replayed − measured) / measured, for the unchanged graph."""
    shares: dict[str, float]
    wall: Wall
    host_calls: int
    device_ops: int
    event_waits: int
    sync_edges: int
    what_if: list[WhatIfRow] = []
    notes: list[str] = []
    rank: int | None = None
    """For a job: the rank whose path sets the job's step (the one the others wait for)."""
    rank_shares: dict[str, float] = {}
    """For a job replayed across ranks: per rank, the share of the job's critical path in its
    work between the collectives every rank joins (it arrived last: the others waited); the
    rest is in the collectives' transfers. Empty when not replayed across ranks."""
    timeline: list[PathSegment] = []
    """The path through the step `Diagnosis.timeline` draws (replayed times, which the
    unchanged replay keeps within `replay_error` of the measured ones), bounded in number."""


class Diagnosis(_Base, frozen=True, kw_only=True):
    """Where a job's step time goes and which wall it hits. Renders itself in a terminal
    (rich) and in a notebook; `to_json()` gives the contract form.

    Findings are of one type, `Finding`, in two places by what they save: `findings` holds
    those that cost step time (`saves` "time": the rank's and, for a job, the job's),
    ranked, those that move the verdict's wall first, each group by its bound; the memory
    findings (`saves` "memory": bytes freed at the peak, no step time) stay with the memory
    profile they are about, in `memory.findings`, in the order of their rules. So every
    entry of the ranked list has a speed-up to rank by, and `findings[0]` stays the first fix
    for the wall."""

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
    more_kernels: list[KernelRow] = []
    """Every kernel after the top `kernels`, by time: with them, the whole table (what
    `--export` writes); empty in diagnoses saved before it was kept."""
    classes: list[ClassShare] = []
    cpu: CpuActivity | None = None
    mfu: Mfu = Mfu(value=None, basis="not computed")
    roofline: Roofline | None = None
    fusion: list[FusionCandidate] = []
    ranks: list[RankSummary] = []
    warnings: list[str] = []
    timeline: StepTimeline | None = None
    job: JobSummary | None = None
    """The cross-rank view, for a folder of a job's rank traces."""
    memory: MemoryProfile | None = None
    """Memory from the trace's `[memory]` events (null when it has none)."""
    trace_format: str = "kineto"
    """What recorded the trace: "kineto" (torch.profiler) or "nsys" (Nsight Systems)."""
    counters: CounterReport | None = None
    """Hardware counters (an Nsight Compute export, `--counters`) beside the roofline's
    estimate: each matched kernel's bound confirmed or refuted (null without an export)."""
    critical_path: CriticalPath | None = None
    """The steady steps' critical path and what-if replay (null: no device graph)."""
    phases: Phases | None = None
    """The step by phase (null when not computed)."""
    modules: Modules | None = None
    """Time per module (null when the trace has no module or record_function ranges)."""
    parallelism: Parallelism | None = None
    """The parallelism strategies the trace shows, with their evidence (null: not computed,
    or a diagnosis saved before it was kept)."""
    compiled: CompiledCode | None = None
    """torch.compile in the trace: compiled and eager regions, fused kernels, the compile
    (one-off), Dynamo's own counts (null: no compiled code, or saved before it was kept)."""
    serving: Serving | None = None
    """An LLM serving trace's engine iterations, prefill/decode, decode's MBU and the host
    time between iterations (null: not a serving trace, or saved before it was kept)."""
    not_computed: dict[str, str] = {}
    """The optional views an internal error left out (a bug in wallfinder, never in the
    input), each with why: {"modules": "internal error: KeyError 'x'; rerun with --debug"}.
    The verdict never depends on them; a view missing for want of data is null, not here."""

    @property
    def main_memory(self) -> DeviceMemoryProfile | None:
        """The analysed device's memory profile (None: the trace has no memory events)."""
        return self.memory.main if self.memory is not None else None

    def to_dict(self) -> dict[str, Any]:
        result: dict[str, Any] = msgspec.to_builtins(self)
        return result

    @classmethod
    def from_json(cls, text: str | bytes) -> Diagnosis:
        """A diagnosis from its JSON form, of this schema or an older one (upgraded)."""
        if msgspec.json.decode(text, type=_Schema).schema != _DIAGNOSIS_V1:
            return msgspec.json.decode(text, type=cls)
        data = msgspec.json.decode(text)
        if isinstance(data.get("memory"), dict):
            _upgrade_memory_findings(data["memory"])
        return msgspec.convert({**data, "schema": SCHEMA}, cls)

    def violations(self) -> list[str]:
        """Each invariant this diagnosis breaks, in words (empty when it keeps them all):
        the breakdown's parts and idle causes sum to the step, every share is a fraction,
        every kernel's class is one of the classes, every finding's bound is at least 1x and
        within Amdahl's for its share, and memory categories sum to the peak."""
        return _violations(self)

    def self_check(self) -> None:
        """Raise AssertionError listing every broken invariant (see `violations`); tests call
        it on every fixture and every real trace."""
        problems = self.violations()
        if problems:
            raise AssertionError("diagnosis breaks its invariants: " + "; ".join(problems))

    def __rich_console__(self, console: Any, options: Any) -> Any:
        from wallfinder.report.terminal import renderables

        yield from renderables(self)

    def _repr_html_(self) -> str:
        from wallfinder.report.terminal import to_html

        return to_html(self)


MARKS_SCHEMA = "wallfinder.marks/1"


class TraceMark(_Base, frozen=True):
    """One mark on the timeline of the trace it was made from, in that trace's own clock
    (microseconds, as the Chrome trace-event format keeps them), on one of wallfinder's
    tracks: "steps", "idle gaps", "critical path" or "finding: <id>". `name` is a step label,
    a cause, a category or the name of a kernel or op of the trace; `detail` is wallfinder's
    own words. Nothing else of the trace (no event arguments) is carried."""

    track: str
    name: str
    ts_us: float
    dur_us: float
    """0: an instant."""
    detail: str = ""


class TraceMarks(_Base, frozen=True, kw_only=True):
    """What `wallfinder analyze --annotate` writes beside a trace: the marks, and the process
    id they go on (one the trace does not use, so the two files load side by side or merged)."""

    schema: str = MARKS_SCHEMA
    pid: int
    marks: list[TraceMark] = []
