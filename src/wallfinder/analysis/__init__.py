"""Pure analyses from a `Trace` to a `Diagnosis`: no file I/O, no torch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, Literal, Protocol

import msgspec
import numpy as np
import numpy.typing as npt

from wallfinder.analysis.classify import KernelClass, classify_op
from wallfinder.analysis.counters import counter_report, place_counters
from wallfinder.analysis.critpath import (
    StepGraph,
    consistent_rows,
    cpu_graph,
    critical_path,
    parse_what_if,
)
from wallfinder.analysis.dispatch import Dispatch, DispatchSummary, dispatch_sized
from wallfinder.analysis.findings import Facts, find, rank
from wallfinder.analysis.fusion import fusion_candidates
from wallfinder.analysis.gpu import (
    CLASSES,
    IDLE_CAUSES,
    DeviceOps,
    WindowBreakdown,
    breakdown,
    device_ops,
    graph_replayed,
    is_data_loading,
)
from wallfinder.analysis.intervals import Coverage, in_windows
from wallfinder.analysis.marks import trace_marks
from wallfinder.analysis.memory_profile import memory_profile
from wallfinder.analysis.phases import Attribution, attribute, device_work, host_work
from wallfinder.analysis.roofline import (
    COUNTED_BOUND,
    KernelCost,
    Placement,
    cost_device_ops,
    cpu_roofline,
    kernel_costs,
    kernel_roof,
    launching_ops,
    mfu,
    outermost,
    place,
    roofline,
)
from wallfinder.analysis.scope import ModelFlops, Scope
from wallfinder.analysis.spikes import find_spikes
from wallfinder.analysis.steps import (
    ANNOTATION_ITERATIONS,
    NO_LAUNCH,
    OPTIMIZER_ITERATIONS,
    StepSpans,
    cpu_steps,
    dropped_steps,
    gpu_windows,
    warmup_steps,
)
from wallfinder.analysis.thresholds import (
    JobThresholds,
    MemoryThresholds,
    SnapshotThresholds,
    Thresholds,
    TimeThresholds,
)
from wallfinder.analysis.timeline import step_timeline
from wallfinder.analysis.verdict import decide, gpu_note, headline, thin_evidence
from wallfinder.analysis.views import Views
from wallfinder.diagnosis import (
    Breakdown,
    ClassShare,
    CpuActivity,
    CriticalPath,
    Device,
    Diagnosis,
    DroppedStep,
    FusionCandidate,
    KernelRow,
    MemoryProfile,
    Mfu,
    OpRow,
    Roofline,
    Spike,
    StepBreakdown,
    Steps,
    StepTimeline,
    TraceMarks,
    Verdict,
)
from wallfinder.errors import WallfinderError
from wallfinder.hardware import DeviceSpec, cpu_spec
from wallfinder.trace import (
    Events,
    Kind,
    NcuExport,
    Trace,
    release_free_memory,
    thread_codes,
    thread_key,
)

__all__ = [
    "JobThresholds",
    "MemoryThresholds",
    "ModelFlops",
    "SnapshotThresholds",
    "Thresholds",
    "TimeThresholds",
    "diagnose",
    "diagnose_marked",
    "timed_steps",
]

NS = 1e-9
TOP_ROWS = 15
I64 = npt.NDArray[np.int64]
Basis = Literal["gpu", "cpu"]


def diagnose(
    trace: Trace,
    thresholds: Thresholds | None = None,
    *,
    spec: DeviceSpec | None = None,
    model: ModelFlops | None = None,
    what_if: str | None = None,
    counters: NcuExport | None = None,
) -> Diagnosis:
    """Analyse one rank's trace: steps, breakdown, idle causes, kernel classes, roofline and
    MFU against `spec` (None: the device is unknown, and figures that need it are null),
    the critical path and what-if replay (`what_if`: the changes to replay, as
    `--what-if` takes them; None: the default table), verdict. A trace with no device
    kernels is analysed the same way with the CPU as the device. With `counters` (an Nsight
    Compute export of the same program), each kernel they measured is placed by its counted
    bound instead of the estimate, in the verdict and the findings, and the diagnosis's
    `counters` says which estimates they confirmed or refuted."""
    return _diagnosed(
        trace, thresholds, spec=spec, model=model, what_if=what_if, counters=counters
    )[0]


def diagnose_marked(
    trace: Trace,
    thresholds: Thresholds | None = None,
    *,
    spec: DeviceSpec | None = None,
    model: ModelFlops | None = None,
    what_if: str | None = None,
    counters: NcuExport | None = None,
) -> tuple[Diagnosis, TraceMarks]:
    """`diagnose`, and the marks that show its evidence on the trace's timeline."""
    diagnosis, facts = _diagnosed(
        trace, thresholds, spec=spec, model=model, what_if=what_if, counters=counters
    )
    return diagnosis, trace_marks(facts, diagnosis)


def _diagnosed(
    trace: Trace,
    thresholds: Thresholds | None,
    *,
    spec: DeviceSpec | None,
    model: ModelFlops | None,
    what_if: str | None,
    counters: NcuExport | None = None,
) -> tuple[Diagnosis, Facts]:
    changes = parse_what_if(what_if) if what_if is not None else None
    thresholds = thresholds or Thresholds()
    spans = cpu_steps(trace)
    warnings = _step_warnings(trace, spans)
    dev = device_ops(trace, thresholds.time)
    # Each stage's temporaries go back to the C heap, which keeps their pages: they are given
    # back between the stages, or each stage's peak would stack on the last one's (on a large
    # trace, tens of MB; glibc only, a few ms each).
    release_free_memory()
    device: _DeviceModel = _Gpu(trace, dev, spec) if dev is not None else _Cpu(trace, spec)
    start, end = device.windows(spans)
    wb = device.breakdown(start, end)
    release_free_memory()
    durations = (end - start).astype(np.float64) * NS
    dropped = dropped_steps(spans, durations)
    kept = np.ones(durations.size, dtype=bool)
    kept[[i for i, _ in dropped]] = False
    views = Views()
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
    spikes = find_spikes(scope, wb)
    steps = _step_stats(spans.source, spans.labels, durations, kept, dropped, thresholds, spikes)
    bd = _breakdown(scope, wb, device.basis)
    parts = device.parts(scope, bd)
    release_free_memory()
    memory = views.compute("memory", lambda: memory_profile(scope, *parts.capacity))
    release_free_memory()
    estimate = (parts.device.spec_source or "").startswith("estimate")
    typical = decide(
        steps, parts.breakdown, parts.classes, thresholds, parts.roofline, roof_estimate=estimate
    )
    replayed = views.compute(
        "critical path",
        lambda: critical_path(
            scope,
            parts.fusion,
            parts.roofline,
            changes,
            parts.timeline,
            graph=parts.graph,
            cause=typical.cause,
        ),
    )
    path, whatif = replayed if replayed is not None else (None, None)
    release_free_memory()
    facts = Facts(
        scope,
        steps,
        parts.breakdown,
        parts.roofline,
        parts.fusion,
        parts.dispatch,
        memory,
        whatif,
        parts.attribution,
        parts.main_thread,
    )
    diagnosis = _result(
        trace,
        typical,
        parts.device,
        steps,
        parts.breakdown,
        parts.classes,
        thresholds,
        warnings + parts.warnings,
        kernels=parts.kernels,
        more_kernels=parts.more_kernels,
        cpu=parts.cpu,
        roofline=parts.roofline,
        mfu=parts.mfu,
        fusion=parts.fusion,
        timeline=parts.timeline,
        facts=facts,
        memory=memory,
        critical_path=path,
        attribution=parts.attribution,
    )
    if counters is not None:
        joined = (trace, dev, placement) if dev is not None and placement is not None else None
        report = views.compute(
            "counters", lambda: counter_report(counters, thresholds, diagnosis, joined)
        )
        diagnosis = msgspec.structs.replace(
            diagnosis, counters=report, not_computed=dict(views.failed)
        )
    return diagnosis, facts


def _step_warnings(trace: Trace, spans: StepSpans) -> list[str]:
    warnings = list(trace.warnings)
    if trace.cut_step is not None:
        warnings.append(
            f"{trace.cut_step.replace('ProfilerStep#', 'step ')} is not analysed: the program "
            "stopped during it"
        )
    if spans.whole and trace.format == "kineto":  # other readers say how to mark steps
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


@dataclass(frozen=True)
class _Parts:
    """What a device's own analyses give the common pipeline."""

    device: Device
    breakdown: Breakdown
    classes: list[ClassShare]
    roofline: Roofline | None
    mfu: Mfu
    warnings: list[str]
    capacity: tuple[int | None, str | None] = (None, None)
    kernels: list[KernelRow] = field(default_factory=list)
    more_kernels: list[KernelRow] = field(default_factory=list)
    fusion: list[FusionCandidate] = field(default_factory=list)
    timeline: StepTimeline | None = None
    cpu: CpuActivity | None = None
    dispatch: DispatchSummary | None = None
    attribution: Attribution | None = None
    graph: StepGraph | None = None
    """The step's dependency graph when the device model builds its own (the CPU's); None:
    built from the device's ops."""
    main_thread: int | None = None
    """The CPU as the device: the thread (`thread_key`) whose time is the step's."""


class _DeviceModel(Protocol):
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

    def parts(self, scope: Scope, bd: Breakdown) -> _Parts:
        """The device's tables, roofline and MFU over the steady-state steps."""
        ...


class _Gpu:
    basis: Final = "gpu"

    def __init__(self, trace: Trace, dev: DeviceOps, spec: DeviceSpec | None) -> None:
        self.trace, self.dev, self.spec = trace, dev, spec

    def windows(self, spans: StepSpans) -> tuple[I64, I64]:
        return gpu_windows(spans, self.dev.ops, self.dev.launch_ts)

    def breakdown(self, start: I64, end: I64) -> WindowBreakdown:
        return breakdown(self.trace, self.dev, start, end)

    def parts(self, scope: Scope, bd: Breakdown) -> _Parts:
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
        rf = roofline(scope, costed, placed)
        fusion = scope.views.compute("fusion", lambda: fusion_candidates(scope, costed)) or []
        # (Freed pages back between the large analyses, as between the pipeline's stages.)
        release_free_memory()
        timeline = scope.views.compute("timeline", lambda: step_timeline(scope))
        release_free_memory()
        return _Parts(
            device=_device(trace, dev, spec),
            breakdown=bd,
            classes=classes,
            roofline=rf,
            mfu=mfu(scope, costed),
            warnings=warnings,
            capacity=_capacity(trace, dev.device, spec),
            kernels=every_kernel[:TOP_ROWS],
            more_kernels=every_kernel[TOP_ROWS:],
            fusion=fusion,
            timeline=timeline,
            attribution=scope.views.compute(
                "phases", lambda: attribute(scope, device_work(scope, placed))
            ),
        )


def _result(
    trace: Trace,
    typical: Verdict,
    device: Device,
    steps: Steps,
    bd: Breakdown,
    classes: list[ClassShare],
    thresholds: Thresholds,
    warnings: list[str],
    *,
    kernels: list[KernelRow] | None = None,
    more_kernels: list[KernelRow] | None = None,
    cpu: CpuActivity | None = None,
    roofline: Roofline | None = None,
    mfu: Mfu | None = None,
    fusion: list[FusionCandidate] | None = None,
    timeline: StepTimeline | None = None,
    facts: Facts | None = None,
    memory: MemoryProfile | None = None,
    critical_path: CriticalPath | None = None,
    attribution: Attribution | None = None,
) -> Diagnosis:
    """The Diagnosis of a rank from its analyses and `typical`, the wall of its typical
    step (`decide`)."""
    # The rules run once; the headline's wall, where it differs, only re-ranks their findings.
    found = find(facts) if facts is not None else []
    findings = rank(found, typical.wall)
    verdict, findings = headline(typical, steps, findings, bd)
    thin = thin_evidence(
        steps,
        device_known=device.kind == "cpu" or device.matched_spec is not None,
        launches_known=not any(w.startswith("no launch records") for w in warnings),
        roofline=roofline,
        wall=verdict.wall,
        gpu=gpu_note(
            bool(trace.device_properties),
            len(trace.of_kind(Kind.RUNTIME)),
            trace.memory.device_type,
        )
        if device.kind == "cpu"
        else None,
    )
    verdict = msgspec.structs.replace(verdict, thin_evidence=thin)
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
        kernels=kernels or [],
        more_kernels=more_kernels or [],
        classes=classes,
        cpu=cpu,
        roofline=roofline,
        mfu=mfu or Mfu(value=None, basis="not computed"),
        fusion=fusion or [],
        warnings=warnings,
        timeline=timeline,
        memory=memory,
        trace_format=trace.format,
        critical_path=critical_path,
        phases=attribution.phases if attribution else None,
        modules=attribution.modules if attribution else None,
        not_computed=dict(facts.scope.views.failed) if facts is not None else {},
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
    d = np.asarray(durations, dtype=np.float64)
    dropped = warmup_steps(d)
    kept = np.ones(d.size, dtype=bool)
    kept[[i for i, _ in dropped]] = False
    labels = [f"step {i}" for i in range(d.size)]
    return _step_stats(source, labels, d, kept, dropped, thresholds or Thresholds(), [])


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
    classes = [
        ClassShare(
            cls=c.value, time_s=float(class_time[i]) * NS, share=float(class_time[i]) / total
        )
        for i, c in enumerate(CLASSES)
        if class_time[i] > 0
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
        row = kernel_roof(row, kc, costs.get(code), spec)
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


class _Cpu:
    """No device kernels: the CPU is the device, its main thread's time the step's."""

    basis: Final = "cpu"

    def __init__(self, trace: Trace, spec: DeviceSpec | None) -> None:
        # The main thread's rows alone are copied (the host's are most of a trace's rows).
        kinds: tuple[Kind, ...] = (Kind.CPU_OP, Kind.ANNOTATION, Kind.PYTHON)
        pid, tid, name, dur = trace.columns_of_kinds(kinds, "pid", "tid", "name", "dur")
        if pid.size == 0:
            kinds = (Kind.RUNTIME, Kind.OTHER)
            pid, tid, name, dur = trace.columns_of_kinds(kinds, "pid", "tid", "name", "dur")
        if pid.size == 0:
            raise WallfinderError(
                f"{trace.source}: no device kernels and no CPU activity to analyse"
            )
        self.trace = trace
        self.spec = spec if spec is not None and spec.vendor == "cpu" else cpu_spec()
        self.main = main = _main_thread(trace, thread_key(pid, tid), name, dur)
        self.mine = trace.on_thread(kinds, main)
        self.category, self.dispatch = _cpu_categories(trace, self.mine)
        self.beside = _collectives_beside(trace, main)
        self.tiny = self.python = self.waited = np.zeros(0, dtype=np.int64)

    def windows(self, spans: StepSpans) -> tuple[I64, I64]:
        return spans.cpu_start, spans.cpu_end

    def breakdown(self, start: I64, end: I64) -> WindowBreakdown:
        mine, category, beside = self.mine, self.category, self.beside
        cov = [Coverage.of(mine.ts[category <= k], mine.end[category <= k]) for k in range(5)]
        upto = [c.covered(start, end) for c in cov]
        data, comm = upto[0], upto[1] - upto[0]
        ops = upto[2] - upto[1]
        # Dispatch-sized ops are host overhead, as the gaps they leave on a GPU would be.
        self.tiny = upto[3] - upto[2]
        self.python = upto[4] - upto[3]
        # The collectives on the main thread's other threads count where it records nothing
        # of its own (it waits for them there, as far as the trace shows); beside its ops
        # they are hidden, as a GPU's communication beside compute is.
        with_beside = [Coverage.union(cov[k], beside).covered(start, end) for k in (1, 2, 4)]
        waited = self.waited = with_beside[2] - upto[4]
        hidden = ops - (with_beside[1] - with_beside[0])
        untraced = (end - start) - upto[4] - waited
        zeros = np.zeros(start.size, dtype=np.int64)
        causes = {k: np.zeros(start.size) for k in IDLE_CAUSES}
        causes["data_loading"] = data.astype(np.float64)
        causes["host_overhead"] = (self.tiny + self.python).astype(np.float64)
        causes["other"] = untraced.astype(np.float64)
        idle = data + self.tiny + self.python + untraced
        return WindowBreakdown(start, end, ops, comm + waited, zeros, idle, causes, hidden)

    def parts(self, scope: Scope, bd: Breakdown) -> _Parts:
        trace, spec, mine, kept = self.trace, self.spec, self.mine, scope.kept
        total = float((scope.end - scope.start)[kept].sum()) or 1.0
        cpu, classes = _cpu_activity(
            scope,
            mine,
            self.category,
            bd,
            tiny=float(self.tiny[kept].sum()) / total,
            python=float(self.python[kept].sum()) / total,
            waited=float(self.waited[kept].sum()) / total,
        )
        runtime = trace.of_kind(Kind.RUNTIME)
        cpu_ops = mine.take(np.flatnonzero(mine.kind == Kind.CPU_OP))
        roof: Roofline | None = None
        mfu_ = Mfu(value=None, basis="unknown: the accelerator's work is not in the trace")
        if len(runtime):
            names = {trace.strings[c] for c in np.unique(runtime.name)}
            warning = (
                "the trace records accelerator runtime calls but no device kernels "
                f"(e.g. {sorted(names)[0]!r}): showing the CPU-side breakdown"
            )
        else:
            warning = "no device activity in the trace: the CPU is analysed as the device"
            # A pure CPU run: the ops' CPU time is their compute time. With accelerator
            # runtime calls (MTIA, a device whose kernels were not traced) it is only
            # dispatch time.
            roof, mfu_ = cpu_roofline(scope, cpu_ops)
        estimate = "; roofs are a nominal estimate (give --spec FILE for this CPU)"
        device = Device(
            name="CPU",
            kind="cpu",
            matched_spec=spec.name,
            spec_source=spec.source,
            peak_flops=dict(spec.peak_flops),
            mem_bandwidth=spec.mem_bandwidth,
            note="CPU-only trace: CPU-side breakdown" + (estimate if spec.estimate else ""),
        )
        return _Parts(
            device=device,
            breakdown=bd,
            classes=classes,
            roofline=roof,
            mfu=mfu_,
            warnings=[warning],
            cpu=cpu,
            dispatch=self.dispatch.summary(cpu_ops, scope.window_start, scope.window_end),
            attribution=scope.views.compute(
                "phases", lambda: attribute(scope, host_work(scope, cpu_ops))
            ),
            graph=scope.views.compute(
                "critical path",
                lambda: cpu_graph(scope, mine, self.category, self.dispatch, self.beside),
            ),
            main_thread=self.main,
        )


def _main_thread(trace: Trace, keys: I64, names: npt.NDArray[np.int32], dur: I64) -> int:
    """The thread (`thread_key`) of the most step markers among host rows of these threads,
    names and durations; without markers, of the most time."""
    step_rows = np.isin(names, trace.names_matching(lambda s: s.startswith("ProfilerStep#")))
    pool = keys[step_rows] if step_rows.any() else keys
    weights = None if step_rows.any() else dur.astype(np.float64)
    uniq, inverse = np.unique(pool, return_inverse=True)
    return int(uniq[np.argmax(np.bincount(inverse, weights=weights))])


def _collectives_beside(trace: Trace, main: int) -> Coverage:
    """The collectives (ops and ranges the communication patterns name, e.g.
    `gloo:all_reduce`) on the other threads of the main thread's (`thread_key`) process: the
    threads a step's collectives run on (gloo's work threads, the autograd engine's), which
    the main thread waits for before its next step."""
    codes = trace.names_matching(lambda s: classify_op(s) is KernelClass.COMMUNICATION)
    if codes.size == 0:
        return Coverage.of(np.zeros(0, np.int64), np.zeros(0, np.int64))
    rows = trace.named((Kind.CPU_OP, Kind.ANNOTATION), codes)
    pid, _ = thread_codes(main)
    rows = rows.take(np.flatnonzero((rows.pid == pid) & (rows.thread != main)))
    return Coverage.of(rows.ts, rows.end)


def _cpu_categories(trace: Trace, events: Events) -> tuple[npt.NDArray[np.int8], Dispatch]:
    """0 data loading, 1 communication, 2 ops, 3 dispatch-sized ops, 4 Python/annotations,
    9 step markers; and the dispatch-sized trees among the CPU ops (`events`' CPU_OP rows)."""
    table = np.full(len(trace.strings), 4, dtype=np.int8)
    for code in np.unique(events.name).tolist():
        name = trace.strings[code]
        if name.startswith("ProfilerStep#"):
            table[code] = 9
        elif is_data_loading(name):
            table[code] = 0
        elif classify_op(name) is KernelClass.COMMUNICATION:
            table[code] = 1
    cat = table[events.name]
    is_op = np.flatnonzero(events.kind == Kind.CPU_OP)
    dispatch = dispatch_sized(events.take(is_op))
    op_cat = cat[is_op]
    op_cat[op_cat == 4] = np.where(dispatch.sized[op_cat == 4], 3, 2)
    cat[is_op] = op_cat
    return cat, dispatch


def _cpu_activity(
    scope: Scope,
    mine: Events,
    category: npt.NDArray[np.int8],
    bd: Breakdown,
    *,
    tiny: float,
    python: float,
    waited: float,
) -> tuple[CpuActivity, list[ClassShare]]:
    """`tiny` and `python`: the shares of the step in dispatch-sized ops and in Python;
    `waited`: in collectives on other threads, the main thread recording nothing."""
    trace, start, end = scope.trace, scope.window_start, scope.window_end
    ops = mine.take(np.flatnonzero((category >= 1) & (category <= 3)))
    ops = ops.take(np.flatnonzero(outermost(ops) & in_windows(ops.ts, start, end)))
    steps = max(start.size, 1)
    dur = ops.dur.astype(np.float64)
    total = float(dur.sum()) or 1.0
    uniq, inverse = np.unique(ops.name, return_inverse=True)
    time = np.bincount(inverse, weights=dur) if uniq.size else np.zeros(0)
    count = np.bincount(inverse) if uniq.size else np.zeros(0, dtype=np.int64)
    op_cls = [classify_op(trace.strings[int(c)]).value for c in uniq.tolist()]
    by_class: dict[str, float] = {}
    for c, t in zip(op_cls, time.tolist(), strict=True):
        by_class[c] = by_class.get(c, 0.0) + t
    classes = sorted(
        (ClassShare(cls=c, time_s=t * NS, share=t / total) for c, t in by_class.items()),
        key=lambda c: -c.time_s,
    )
    top = [
        OpRow(
            name=trace.strings[int(uniq[i])],
            cls=op_cls[i],
            count=int(count[i]),
            time_s=float(time[i]) * NS,
            share=float(time[i]) / total,
        )
        for i in np.argsort(-time)[:TOP_ROWS].tolist()
    ]
    activity = CpuActivity(
        data_loading=bd.idle_causes["data_loading"],
        ops=bd.compute + bd.comm_exposed - waited + tiny,
        python=python,
        untraced=bd.idle_causes["other"],
        waiting_on_collectives=waited,
        op_time_by_class_s={c: t * NS / steps for c, t in by_class.items()},
        top_ops=top,
    )
    return activity, classes
