"""Pure analyses from a `Trace` to a `Diagnosis`: no file I/O, no torch."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Final, TypedDict

import msgspec
import numpy as np
import numpy.typing as npt

from wallfinder.analysis.compiled import compiled_code
from wallfinder.analysis.counters import CounterPlacement, counter_report, place_counters
from wallfinder.analysis.cpu import CpuDevice
from wallfinder.analysis.critpath import (
    Change,
    StepGraph,
    WhatIf,
    consistent_rows,
    critical_path,
    parse_what_if,
)
from wallfinder.analysis.critpath.lever import selected
from wallfinder.analysis.device import TOP_ROWS, Basis, DeviceModel, DeviceParts
from wallfinder.analysis.findings import Facts, find, rank
from wallfinder.analysis.fusion import fusion_candidates
from wallfinder.analysis.gpu import (
    CLASSES,
    COMM,
    DeviceOps,
    WindowBreakdown,
    breakdown,
    busy_holders,
    device_ops,
    graph_replayed,
)
from wallfinder.analysis.marks import trace_marks
from wallfinder.analysis.memory_profile import memory_profile
from wallfinder.analysis.parallelism import detect as detect_parallelism
from wallfinder.analysis.phases import Attribution, attribute, device_work
from wallfinder.analysis.pipeline import Stage, Upstream, View, timed
from wallfinder.analysis.pipeline import run as run_stages
from wallfinder.analysis.roofline import (
    COUNTED_BOUND,
    Costed,
    KernelCost,
    Placement,
    cost_device_ops,
    kernel_costs,
    kernel_roof,
    launching_ops,
    mfu,
    place,
    roofline,
)
from wallfinder.analysis.rules import claimed
from wallfinder.analysis.scope import ModelFlops, Scope
from wallfinder.analysis.serving import serving, serving_verdict
from wallfinder.analysis.spikes import find_spikes
from wallfinder.analysis.steps import (
    ANNOTATION_ITERATIONS,
    NO_LAUNCH,
    OPTIMIZER_ITERATIONS,
    StepSpans,
    compiling_steps,
    cpu_steps,
    dropped_steps,
    gpu_windows,
    warmup_steps,
)
from wallfinder.analysis.thresholds import (
    JobThresholds,
    MemoryThresholds,
    SlackThresholds,
    SnapshotThresholds,
    StepThresholds,
    Thresholds,
    TimeThresholds,
)
from wallfinder.analysis.timeline import step_timeline
from wallfinder.analysis.verdict import decide, gpu_note, headline, named, thin_evidence
from wallfinder.analysis.views import Views
from wallfinder.diagnosis import (
    Breakdown,
    ClassShare,
    CompiledCode,
    CriticalPath,
    Device,
    Diagnosis,
    DroppedStep,
    FusionCandidate,
    KernelRow,
    MemoryProfile,
    Parallelism,
    Serving,
    Spike,
    StepBreakdown,
    Steps,
    StepTimeline,
    TraceMarks,
    Verdict,
)
from wallfinder.errors import WallfinderError
from wallfinder.hardware import DeviceSpec
from wallfinder.trace import (
    Kind,
    Trace,
    release_free_memory,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from wallfinder.trace import NcuExport

__all__ = [
    "DiagnoseOptions",
    "JobThresholds",
    "MemoryThresholds",
    "ModelFlops",
    "SlackThresholds",
    "SnapshotThresholds",
    "StepThresholds",
    "Thresholds",
    "TimeThresholds",
    "diagnose",
    "diagnose_marked",
    "timed_steps",
]

NS = 1e-9
I64 = npt.NDArray[np.int64]


class DiagnoseOptions(TypedDict, total=False):
    """The keywords `diagnose` and `diagnose_marked` take (None where not given)."""

    spec: DeviceSpec | None
    model: ModelFlops | None
    what_if: str | None
    counters: NcuExport | None


def diagnose(
    trace: Trace, thresholds: Thresholds | None = None, **options: Unpack[DiagnoseOptions]
) -> Diagnosis:
    """Analyse one rank's trace: steps, breakdown, idle causes, kernel classes, roofline and
    MFU against `spec` (None: the device is unknown, and figures that need it are null),
    the critical path and what-if replay (`what_if`: the changes to replay, as
    `--what-if` takes them; None: the default table), verdict. A trace with no device
    kernels is analysed the same way with the CPU as the device. With `counters` (an Nsight
    Compute export of the same program), each kernel they measured is placed by its counted
    bound instead of the estimate, in the verdict and the findings, and the diagnosis's
    `counters` says which estimates they confirmed or refuted."""
    return _diagnosed(trace, thresholds, **options)[0]


def diagnose_marked(
    trace: Trace, thresholds: Thresholds | None = None, **options: Unpack[DiagnoseOptions]
) -> tuple[Diagnosis, TraceMarks]:
    """`diagnose`, and the marks that show its evidence on the trace's timeline."""
    diagnosis, facts = _diagnosed(trace, thresholds, **options)
    return diagnosis, trace_marks(facts, diagnosis)


def _diagnosed(
    trace: Trace,
    thresholds: Thresholds | None,
    *,
    spec: DeviceSpec | None = None,
    model: ModelFlops | None = None,
    what_if: str | None = None,
    counters: NcuExport | None = None,
) -> tuple[Diagnosis, Facts]:
    changes = parse_what_if(what_if) if what_if is not None else None
    thresholds = thresholds or Thresholds()
    spans = timed("cpu steps", lambda: cpu_steps(trace, thresholds.steps))
    warnings = _step_warnings(trace, spans)
    dev = timed("device ops", lambda: device_ops(trace, thresholds.time))
    # Each stage's temporaries go back to the C heap, which keeps their pages: they are given
    # back between the stages, or each stage's peak would stack on the last one's (on a large
    # trace, tens of MB; glibc only, a few ms each).
    release_free_memory()
    device: DeviceModel = timed(
        "device model",
        lambda: (
            _Gpu(trace, dev, spec, thresholds)
            if dev is not None
            else CpuDevice(trace, spec, thresholds)
        ),
    )
    scope, up, placement = timed(
        "scope", lambda: _scope(trace, spans, dev, device, thresholds, model, counters, changes)
    )
    run_stages(STAGES, scope, up)
    parts = up[PARTS]
    path, whatif = up[CRITICAL_PATH] or (None, None)
    facts = _facts(scope, up, whatif)
    diagnosis = timed(
        "findings",
        lambda: _result(
            facts, parts, up[TYPICAL], warnings + parts.warnings, up[TIMELINE], critical_path=path
        ),
    )
    if up[PARALLELISM] is not None:
        diagnosis = msgspec.structs.replace(diagnosis, parallelism=up[PARALLELISM])
    if up[COMPILED] is not None:
        diagnosis = msgspec.structs.replace(diagnosis, compiled=up[COMPILED])
    found = up[SERVING]
    if found is not None:
        diagnosis = msgspec.structs.replace(
            diagnosis,
            serving=found,
            verdict=serving_verdict(
                diagnosis.verdict, found, diagnosis.device, diagnosis.steps, scope.thresholds
            ),
        )
    if counters is not None:
        joined = (trace, dev, placement) if dev is not None and placement is not None else None
        # (Contained here, not as a stage: it reads the finished diagnosis.)
        report = scope.views.compute(
            "counters", lambda: counter_report(counters, thresholds, diagnosis, joined)
        )
        diagnosis = msgspec.structs.replace(
            diagnosis, counters=report, not_computed=dict(scope.views.failed)
        )
    return diagnosis, facts


def _scope(
    trace: Trace,
    spans: StepSpans,
    dev: DeviceOps | None,
    device: DeviceModel,
    thresholds: Thresholds,
    model: ModelFlops | None,
    counters: NcuExport | None,
    changes: list[Change] | None,
) -> tuple[Scope, _Upstream, CounterPlacement | None]:
    """The rank's scope (its step windows on the device's clock, the steady-state ones), what
    the stages start from, and where the counters placed the device's kernels."""
    start, end = device.windows(spans)
    wb = device.breakdown(start, end)
    release_free_memory()
    durations = (end - start).astype(np.float64) * NS
    dropped = dropped_steps(
        spans, durations, thresholds.steps, compiling_steps(trace, spans, thresholds.steps)
    )
    kept = np.ones(durations.size, dtype=bool)
    kept[[i for i, _ in dropped]] = False
    if not kept.any():
        raise WallfinderError(
            f"{trace.source}: no step lasts any time (zero-length events, or device work "
            "that ends before its step begins)"
        )
    views = Views()
    # (Contained here, not as a stage: the scope is made with what it places.)
    placement = (
        views.compute(
            "counters", lambda: place_counters(trace, dev, counters, thresholds, device.spec)
        )
        if counters is not None and dev is not None
        else None
    )
    scope = Scope(
        trace,
        spans,
        dev,
        start,
        end,
        kept,
        device.spec,
        thresholds,
        model or ModelFlops(),
        # Counters of another program change nothing (`place_counters` says why).
        placement if placement is not None and placement.mismatch is None else None,
        views,
    )
    return scope, _Upstream(device, wb, durations, dropped, changes), placement


@dataclass
class _Upstream(Upstream):
    """What the stages start from besides the scope, and the parts they made."""

    device: DeviceModel
    windows: WindowBreakdown
    """Every step's time on the device, in compute, exposed communication and copies, idle."""
    durations: npt.NDArray[np.float64]
    """Every step's duration (s)."""
    dropped: list[tuple[int, str]]
    """The steps set aside (warm-up, start-up), with why."""
    changes: list[Change] | None
    """The what-if's changes to replay (None: the default table)."""
    facts_memo: dict[Callable[[Facts], object], object] = field(default_factory=dict)
    """What the rank's facts computed once (`Facts.once`): the critical path's levers'
    facts and the findings' share it."""


def _steps(scope: Scope, up: _Upstream) -> Steps:
    spans, thresholds = scope.spans, scope.thresholds
    spikes = up[SPIKES]
    return _step_stats(
        spans.source, spans.labels, up.durations, scope.kept, up.dropped, thresholds, spikes
    )


def _typical(scope: Scope, up: _Upstream) -> Verdict:
    """The wall of the typical step (`decide`)."""
    parts = up[PARTS]
    estimate = (parts.device.spec_source or "").startswith("estimate")
    return decide(
        up[STEPS],
        parts.breakdown,
        parts.classes,
        scope.thresholds,
        parts.roofline,
        roof_estimate=estimate,
    )


def _facts(scope: Scope, up: _Upstream, whatif: WhatIf | None) -> Facts:
    """What the rules look at, from the stages' parts (`whatif`: the graph to replay on)."""
    parts = up[PARTS]
    return Facts(
        scope,
        up[STEPS],
        parts.breakdown,
        parts.roofline,
        up[FUSION] or [],
        parts.dispatch,
        up[MEMORY],
        whatif,
        up[PHASES],
        parts.main_thread,
        up[SERVING],
        up[PARALLELISM],
        up.facts_memo,
    )


def _critical_path(scope: Scope, up: _Upstream) -> tuple[CriticalPath | None, WhatIf | None]:
    fusion = up[FUSION]
    # The strategy levers' work is selected by their rules, from the facts they read (all
    # but the graph, being built here).
    facts = _facts(scope, up, None)
    # (One-off start-up in the graph stays as measured under every fix: `StepGraph.once`.)
    return critical_path(
        scope,
        fusion or [],
        up[PARTS].roofline,
        up.changes,
        up[TIMELINE],
        graph=up[GRAPH],
        cause=up[TYPICAL].cause,
        levers=partial(selected, facts),
    )


SPIKES: Stage[_Upstream, list[Spike]] = Stage(
    "spikes", lambda scope, up: find_spikes(scope, up.windows)
)
STEPS: Stage[_Upstream, Steps] = Stage("steps", _steps)
BREAKDOWN: Stage[_Upstream, Breakdown] = Stage(
    "breakdown", lambda scope, up: _breakdown(scope, up.windows, up.device.basis)
)
PARTS: Stage[_Upstream, DeviceParts] = Stage(
    "device", lambda scope, up: up.device.parts(scope, up[BREAKDOWN]), frees=True
)
FUSION: View[_Upstream, list[FusionCandidate]] = View(
    "fusion", lambda scope, up: up.device.fusion(scope), frees=True
)
TIMELINE: View[_Upstream, StepTimeline | None] = View(
    "timeline", lambda scope, up: up.device.timeline(scope), frees=True
)
# (Freed after: on a 990 MB trace whose parse ran beside helper processes, the memory
# view's peak stacked on the phases' freed pages and took the analysis to 0.61x the file;
# given back, 0.57x.)
PHASES: View[_Upstream, Attribution] = View(
    "phases", lambda scope, up: up.device.phases(scope), frees=True
)
PARALLELISM: View[_Upstream, Parallelism | None] = View(
    "parallelism", lambda scope, up: detect_parallelism(scope, up[PHASES])
)
# (The CPU's own graph: a failure building it costs the critical path, under its name.)
GRAPH: View[_Upstream, StepGraph | None] = View(
    "critical path", lambda scope, up: up.device.graph(scope)
)
MEMORY: View[_Upstream, MemoryProfile | None] = View(
    "memory", lambda scope, up: memory_profile(scope, *up[PARTS].capacity), frees=True
)
COMPILED: View[_Upstream, CompiledCode | None] = View(
    "compiled", lambda scope, up: compiled_code(scope)
)
SERVING: View[_Upstream, Serving | None] = View("serving", lambda scope, up: serving(scope))
TYPICAL: Stage[_Upstream, Verdict] = Stage("verdict", _typical)
CRITICAL_PATH: View[_Upstream, tuple[CriticalPath | None, WhatIf | None]] = View(
    "critical path", _critical_path, frees=True
)

STAGES: tuple[Stage[_Upstream, Any] | View[_Upstream, Any], ...] = (
    SPIKES,
    STEPS,
    BREAKDOWN,
    PARTS,
    FUSION,
    TIMELINE,
    PHASES,
    PARALLELISM,
    GRAPH,
    MEMORY,
    COMPILED,
    SERVING,
    TYPICAL,
    CRITICAL_PATH,
)
"""A rank's analyses after its scope, in the order they run (`pipeline.run`): the device's
own (`DeviceModel`), then the common views and the verdict of the typical step."""


def _step_warnings(trace: Trace, spans: StepSpans) -> list[str]:
    warnings = list(trace.warnings)
    if trace.cut_step is not None:
        warnings.append(
            f"{trace.cut_step.replace('ProfilerStep#', 'step ')} is not analysed: the program "
            "stopped during it"
        )
    if spans.whole and trace.reader.profiler_steps:  # other readers say how to mark steps
        warnings.append(
            "no ProfilerStep markers: the whole trace is analysed as one window "
            "(use torch.profiler's schedule and p.step() to get per-step figures)"
        )
    elif spans.source == OPTIMIZER_ITERATIONS:
        warnings.append(
            "no ProfilerStep markers: the steps are the iterations between optimizer steps "
            "(the first runs from the trace's start, start-up included)"
        )
    elif spans.source == ANNOTATION_ITERATIONS:
        warnings.append(
            "no ProfilerStep markers: the steps are the repetitions of the annotated sequence "
            f"that starts with {spans.labels[0].split('(', 1)[-1].rstrip(')')!r} (the first "
            "runs from the trace's start, start-up included)"
        )
    return warnings


class _Gpu:
    basis: Final = "gpu"
    costed: Costed
    """Each device op's share of its op's cost (set by `parts`, for the views after it)."""
    placed: Placement

    def __init__(
        self, trace: Trace, dev: DeviceOps, spec: DeviceSpec | None, thresholds: Thresholds
    ) -> None:
        self.trace, self.dev, self.spec, self.thresholds = trace, dev, spec, thresholds

    def windows(self, spans: StepSpans) -> tuple[I64, I64]:
        return gpu_windows(spans, self.dev.ops, self.dev.launch_ts)

    def breakdown(self, start: I64, end: I64) -> WindowBreakdown:
        return breakdown(self.trace, self.dev, start, end, self.thresholds.slack)

    def parts(self, scope: Scope, bd: Breakdown) -> DeviceParts:
        trace, dev, spec = self.trace, self.dev, self.spec
        bd = msgspec.structs.replace(bd, graph_replayed=graph_replayed(dev, scope.inside))
        launcher, by_time = launching_ops(trace.of_kind(Kind.CPU_OP), dev)
        costed = cost_device_ops(scope, launcher)
        placed = place(scope, costed)
        every_kernel, classes = _kernel_tables(scope, kernel_costs(scope, costed), placed)
        warnings = []
        if spec is None:
            warnings.append(
                "unknown device: no peaks, so roofline bounds, % of roof and MFU are null "
                "(name it with --device, or give a spec file with --spec)"
            )
        unlaunched = int((dev.launch_ts == NO_LAUNCH).sum())
        if unlaunched and unlaunched == len(dev.ops):
            warnings.append(
                "no launch records (runtime calls) for the device's work: idle time cannot be "
                "split into host waits and launch latency"
            )
        elif unlaunched > 0.05 * len(dev.ops):
            warnings.append(f"{unlaunched} of {len(dev.ops)} device ops have no launch record")
        if by_time > 0.5 * len(dev.ops):
            warnings.append(
                "the kernels' External ids do not name the ops that launched them: each kernel "
                "is joined to the innermost CPU op around its launch call instead"
            )
        self.costed, self.placed = costed, placed
        return DeviceParts(
            device=_device(trace, dev, spec),
            breakdown=bd,
            classes=classes,
            roofline=roofline(scope, costed, placed),
            mfu=mfu(scope, costed),
            warnings=warnings,
            capacity=_capacity(trace, dev.device, spec),
            kernels=every_kernel[:TOP_ROWS],
            more_kernels=every_kernel[TOP_ROWS:],
        )

    def fusion(self, scope: Scope) -> list[FusionCandidate]:
        return fusion_candidates(scope, self.costed)

    def timeline(self, scope: Scope) -> StepTimeline | None:
        return step_timeline(scope)

    def phases(self, scope: Scope) -> Attribution:
        return attribute(scope, device_work(scope, self.placed))

    def graph(self, scope: Scope) -> StepGraph | None:
        return None


def _result(
    facts: Facts,
    parts: DeviceParts,
    typical: Verdict,
    warnings: list[str],
    timeline: StepTimeline | None,
    *,
    critical_path: CriticalPath | None,
) -> Diagnosis:
    """The Diagnosis of a rank from its analyses (`facts`, and the device's own `parts`) and
    `typical`, the wall of its typical step (`decide`)."""
    trace, thresholds, steps, bd = facts.trace, facts.thresholds, facts.steps, facts.breakdown
    device, roofline, attribution = parts.device, parts.roofline, facts.attribution
    # The rules run once; the headline's wall, where it differs, only re-ranks their findings.
    found = find(facts)
    findings = rank(found, typical.wall)
    verdict, findings = headline(typical, steps, findings, bd)
    thin = thin_evidence(
        steps,
        device_known=device.kind == "cpu" or device.matched_spec is not None,
        launches_known=not any(w.startswith("no launch records") for w in warnings),
        roofline=roofline,
        wall=verdict.wall,
        thresholds=thresholds,
        gpu=gpu_note(
            bool(trace.device_properties),
            len(trace.of_kind(Kind.RUNTIME)),
            trace.memory.device_type,
        )
        if device.kind == "cpu"
        else None,
    )
    verdict = msgspec.structs.replace(verdict, thin_evidence=thin)
    # The strategy's own loss named in the verdict when it is most of the exposed
    # communication the verdict names (the wall and the cause keep their values).
    # (Once per facts: the exposed-communication finding asked the same.)
    claims = facts.scope.views.compute("verdict mechanism", partial(facts.once, claimed))
    verdict = named(verdict, claims or [], bd)
    if verdict.wall != typical.wall:
        findings = rank(found, verdict.wall)  # the new wall's findings first
    if critical_path is not None and bd.basis == "gpu":
        # (On the CPU a host cut also divides the Python between ops, which the per-op
        # overhead finding does not claim: not the same fix.)
        rows = consistent_rows(critical_path.what_if, findings)
        critical_path = msgspec.structs.replace(critical_path, what_if=rows)
    return Diagnosis(
        source=trace.source,
        rank=trace.rank,
        world_size=trace.world_size,
        device=device,
        steps=steps,
        breakdown=bd,
        verdict=verdict,
        findings=findings,
        kernels=parts.kernels,
        more_kernels=parts.more_kernels,
        classes=parts.classes,
        cpu=parts.cpu,
        roofline=roofline,
        mfu=parts.mfu,
        fusion=facts.fusion,
        warnings=warnings,
        timeline=timeline,
        memory=facts.memory,
        trace_format=trace.format,
        critical_path=critical_path,
        phases=attribution.phases if attribution else None,
        modules=attribution.modules if attribution else None,
        not_computed=dict(facts.scope.views.failed),
    )


def _device(trace: Trace, dev: DeviceOps, spec: DeviceSpec | None) -> Device:
    name = None
    for props in trace.device_properties:
        if props.get("id") == dev.device and isinstance(props.get("name"), str):
            name = str(props["name"]).strip() or None
            break
    name = name or trace.device_name
    if spec is not None:
        note = f"peaks: {spec.name} ({spec.source.split(':', 1)[0]})"
        if spec.matched:  # a family, a MIG slice or an inferred device: say how it was chosen
            note += f"; {spec.matched}"
    elif name:
        note = f"{name!r} matches no known device: figures that need its peaks are null"
    else:
        note = "the trace has no deviceProperties: device unknown"
    return Device(
        name=name,
        kind="gpu",
        index=dev.device,
        matched_spec=spec.name if spec else None,
        spec_source=spec.source if spec else None,
        peak_flops=dict(spec.peak_flops) if spec else None,
        mem_bandwidth=spec.mem_bandwidth if spec else None,
        note=note,
    )


def _capacity(trace: Trace, device: int, spec: DeviceSpec | None) -> tuple[int | None, str | None]:
    """The device's memory capacity in bytes, and where it comes from."""
    if spec is not None and spec.mem_bytes:
        return int(spec.mem_bytes), f"datasheet: {spec.name}"
    for props in trace.device_properties:
        total = props.get("totalGlobalMem")
        if props.get("id") == device and isinstance(total, int | float) and total > 0:
            return int(total), "trace deviceProperties"
    return None, None


def timed_steps(
    durations: Sequence[float], source: str, thresholds: Thresholds | None = None
) -> Steps:
    """Step-time statistics from measured step durations (seconds, in order), with no trace:
    what `StepTimer` and `wallfinder run --timer-only` report. Leading warm-up steps are
    dropped as for a trace."""
    if not durations:
        raise WallfinderError("no step was timed: nothing marked a step")
    thresholds = thresholds or Thresholds()
    d = np.asarray(durations, dtype=np.float64)
    dropped = warmup_steps(d, thresholds.steps)
    kept = np.ones(d.size, dtype=bool)
    kept[[i for i, _ in dropped]] = False
    labels = [f"step {i}" for i in range(d.size)]
    return _step_stats(source, labels, d, kept, dropped, thresholds, [])


def _step_stats(
    source: str,
    labels: list[str],
    durations: npt.NDArray[np.float64],
    kept: npt.NDArray[np.bool_],
    dropped: list[tuple[int, str]],
    thresholds: Thresholds,
    spikes: list[Spike],
) -> Steps:
    d = durations[kept]
    mean = float(d.mean())
    cv = float(d.std() / mean) if d.size > 1 and mean > 0 else 0.0
    return Steps(
        source=source,
        total=int(durations.size),
        count=int(d.size),
        median_s=float(np.median(d)),
        mean_s=mean,
        min_s=float(d.min()),
        max_s=float(d.max()),
        cv=cv,
        stable=cv <= thresholds.max_cv,
        spikes=spikes,
        dropped=[
            DroppedStep(step=labels[i], duration_s=float(durations[i]), reason=r)
            for i, r in dropped
        ],
    )


def _breakdown(scope: Scope, wb: WindowBreakdown, basis: Basis) -> Breakdown:
    """The breakdown's shares over the steady-state steps, and every step's parts."""
    spans, kept = scope.spans, scope.kept
    length = (wb.end - wb.start).astype(np.float64)
    total = float(length[kept].sum()) or 1.0
    n = max(int(kept.sum()), 1)

    def share(x: npt.NDArray[np.int64] | npt.NDArray[np.float64]) -> float:
        return float(np.asarray(x, dtype=np.float64)[kept].sum()) / total

    per_step = [
        StepBreakdown(
            step=spans.labels[i],
            start_s=float(wb.start[i] - wb.start[0]) * NS,
            duration_s=float(length[i]) * NS,
            compute_s=float(wb.compute[i]) * NS,
            comm_exposed_s=float(wb.comm_exposed[i]) * NS,
            copy_exposed_s=float(wb.copy_exposed[i]) * NS,
            idle_s=float(wb.idle[i]) * NS,
            idle_causes_s={k: float(v[i]) * NS for k, v in wb.idle_causes.items()},
            warmup=not bool(kept[i]),
        )
        for i in range(length.size)
    ]
    ms = 1e-6 / n
    return Breakdown(
        basis=basis,
        compute=share(wb.compute),
        comm_exposed=share(wb.comm_exposed),
        copy_exposed=share(wb.copy_exposed),
        idle=share(wb.idle),
        comm_hidden=share(wb.comm_hidden),
        idle_causes={k: share(v) for k, v in wb.idle_causes.items()},
        per_step_ms={
            "step": float(length[kept].sum()) * ms,
            "compute": float(wb.compute[kept].sum()) * ms,
            "comm_exposed": float(wb.comm_exposed[kept].sum()) * ms,
            "copy_exposed": float(wb.copy_exposed[kept].sum()) * ms,
            "idle": float(wb.idle[kept].sum()) * ms,
        },
        steps=per_step,
    )


def _kernel_tables(
    scope: Scope, costs: dict[int, KernelCost], placed: Placement
) -> tuple[list[KernelRow], list[ClassShare]]:
    """Every kernel by GPU time (the diagnosis keeps the top `TOP_ROWS` as its kernels, the
    rest for the exported table) and time per class, over the steady-state steps; kernels
    whose ops have a cost model get FLOPs, bytes and their place on the roofline."""
    trace, dev, inside, spec = scope.trace, scope.gpu, scope.inside, scope.spec
    ops = dev.ops
    names, cls, dur = ops.name[inside], dev.cls[inside], ops.dur[inside].astype(np.float64)
    total = float(dur.sum()) or 1.0
    class_time = np.bincount(cls, weights=dur, minlength=len(CLASSES))
    # Every class with a kernel in the table has its row, even at 0 s: kernels that short are
    # recorded as 0 µs (a trace of whole microseconds). With no kernel time at all there are
    # no shares to split: no class table.
    class_count = np.bincount(cls, minlength=len(CLASSES))
    timed = bool(dur.sum() > 0)
    # The timeline's weights besides the summed ones: the walls are decided on it.
    holders = busy_holders(
        dev, inside, scope.window_start, scope.window_end, streams=placed.bound == 2
    )
    busy = float(holders.held.sum())
    classes = [
        ClassShare(
            cls=c.value,
            time_s=float(class_time[i]) * NS,
            share=float(class_time[i]) / total,
            busy=float(holders.held[i]) / busy if busy > 0 else None,
            streaming=float(holders.streaming[i]) / busy if busy > 0 else 0.0,
            beside=holders.comm_beside / total if i == COMM else 0.0,
        )
        for i, c in enumerate(CLASSES)
        if timed and class_count[i] > 0
    ]
    classes.sort(key=lambda c: -c.time_s)
    uniq, inverse = np.unique(names, return_inverse=True)
    time = np.bincount(inverse, weights=dur)
    count = np.bincount(inverse)
    first_cls = np.zeros(uniq.size, dtype=np.int8)
    first_cls[inverse] = cls
    rows = []
    # Only the names the counters re-placed need `_counted`'s scan of every op.
    moved = (
        set(np.unique(names[placed.by_counters[inside]]).tolist())
        if scope.counters is not None
        else set()
    )
    for i in np.argsort(-time).tolist():
        code = int(uniq[i])
        kc = CLASSES[int(first_cls[i])]
        row = KernelRow(
            name=trace.strings[code],
            cls=kc.value,
            count=int(count[i]),
            time_s=float(time[i]) * NS,
            share=float(time[i]) / total,
        )
        row = kernel_roof(row, kc, costs.get(code), spec, scope.thresholds.skinny_tile)
        rows.append(_counted(row, code, scope, placed) if code in moved else row)
    return rows, classes


def _counted(row: KernelRow, code: int, scope: Scope, placed: Placement) -> KernelRow:
    """`row` with the counters' bound and % of roof where they re-placed most of its time
    (`roofline.place`), the estimate kept beside them."""
    if scope.counters is None:
        return row
    ops = scope.gpu.ops
    mine = scope.inside & (ops.name == code)
    dur = ops.dur.astype(np.float64)
    moved = mine & placed.by_counters
    if float(dur[moved].sum()) <= 0.5 * float(dur[mine].sum()):
        return row
    counted = np.bincount(scope.counters.bound[moved], minlength=4).argmax()
    pct = placed.pct[moved]
    weights = dur[moved]
    ok = np.isfinite(pct)
    return msgspec.structs.replace(
        row,
        bound=COUNTED_BOUND[int(counted)],
        pct_of_roof=float((pct[ok] * weights[ok]).sum() / weights[ok].sum())
        if weights[ok].sum() > 0
        else None,
        bound_basis="counters",
        estimated_bound=row.bound,
    )
