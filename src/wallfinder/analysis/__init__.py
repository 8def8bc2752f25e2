"""Pure analyses from a `Trace` to a `Diagnosis`: no file I/O, no torch."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import numpy as np
import numpy.typing as npt

from wallfinder.analysis.classify import KernelClass, classify_op
from wallfinder.analysis.dispatch import Dispatch, dispatch_sized
from wallfinder.analysis.findings import Facts, find
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
from wallfinder.analysis.memory_profile import memory_profile
from wallfinder.analysis.roofline import (
    KernelCost,
    ModelFlops,
    cost_device_ops,
    cpu_roofline,
    kernel_costs,
    kernel_roof,
    launching_ops,
    mfu,
    outermost,
    roofline,
)
from wallfinder.analysis.spikes import find_spikes
from wallfinder.analysis.steps import (
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
from wallfinder.analysis.verdict import decide, headline, thin_evidence
from wallfinder.diagnosis import (
    Breakdown,
    ClassShare,
    CpuActivity,
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
)
from wallfinder.errors import WallfinderError
from wallfinder.hardware import DeviceSpec, cpu_spec
from wallfinder.trace import Events, Kind, Trace

__all__ = [
    "JobThresholds",
    "MemoryThresholds",
    "ModelFlops",
    "SnapshotThresholds",
    "Thresholds",
    "TimeThresholds",
    "diagnose",
    "timed_steps",
]

NS = 1e-9
TOP_ROWS = 15


def diagnose(
    trace: Trace,
    thresholds: Thresholds | None = None,
    *,
    spec: DeviceSpec | None = None,
    model: ModelFlops | None = None,
) -> Diagnosis:
    """Analyse one rank's trace: steps, breakdown, idle causes, kernel classes, roofline and
    MFU against `spec` (None: the device is unknown, and figures that need it are null),
    verdict."""
    thresholds = thresholds or Thresholds()
    model = model or ModelFlops()
    spans = cpu_steps(trace)
    dev = device_ops(trace)
    warnings: list[str] = []
    if trace.cut_step is not None:
        warnings.append(
            f"{trace.cut_step.replace('ProfilerStep#', 'step ')} is not analysed: the program "
            "stopped during it"
        )
    if spans.whole:
        warnings.append(
            "no ProfilerStep markers: the whole trace is analysed as one window "
            "(use torch.profiler's schedule and p.step() to get per-step figures)"
        )
    elif spans.source == OPTIMIZER_ITERATIONS:
        warnings.append(
            "no ProfilerStep markers: the steps are the iterations between optimizer steps "
            "(the first runs from the trace's start, start-up included)"
        )
    if dev is None:
        return _diagnose_cpu(trace, spans, thresholds, warnings, spec, model)
    start, end = gpu_windows(spans, dev.ops, dev.launch_ts)
    wb = breakdown(trace, dev, start, end)
    durations = (end - start).astype(np.float64) * NS
    dropped = dropped_steps(spans, durations)
    kept = np.ones(durations.size, dtype=bool)
    kept[[i for i, _ in dropped]] = False
    spikes = find_spikes(trace, dev, spans.labels, wb, kept)
    steps = _step_stats(spans.source, spans.labels, durations, kept, dropped, thresholds, spikes)
    inside = in_windows(dev.ops.ts, start[kept], end[kept])
    bd = msgspec.structs.replace(
        _gpu_breakdown(spans, wb, kept), graph_replayed=graph_replayed(dev, inside)
    )
    launcher = launching_ops(trace.of_kind(Kind.CPU_OP), dev)
    costed = cost_device_ops(trace, dev, launcher, spec)
    roof = roofline(trace, dev, inside, costed, spec, steps.count)
    kernels, classes = _kernel_tables(trace, dev, inside, kernel_costs(dev, costed, inside), spec)
    step_time = float((end - start)[kept].sum()) * NS / max(steps.count, 1)
    mfu_ = mfu(costed, dev, inside, step_time, steps.count, spec, model)
    fusion = fusion_candidates(trace, dev, inside, costed, steps.count, start[kept])
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
    capacity, capacity_source = _capacity(trace, dev.device, spec)
    memory = memory_profile(
        trace,
        spans,
        kept,
        device=dev.device,
        capacity=capacity,
        capacity_source=capacity_source,
        world_size=trace.world_size,
        thresholds=thresholds,
    )
    return _result(
        trace,
        _device(trace, dev, spec),
        steps,
        bd,
        classes,
        thresholds,
        warnings,
        kernels=kernels,
        roofline=roof,
        mfu=mfu_,
        fusion=fusion,
        timeline=step_timeline(trace, dev, start, end, kept, spans.labels),
        facts=Facts(
            trace=trace,
            dev=dev,
            inside=inside,
            steps=steps,
            breakdown=bd,
            roofline=roof,
            fusion=fusion,
            peak_flops=dict(spec.peak_flops) if spec else {},
            window_start=start[kept],
            window_end=end[kept],
            thresholds=thresholds,
            sm_count=spec.sm_count if spec else None,
            memory=memory,
        ),
        memory=memory,
    )


def _result(
    trace: Trace,
    device: Device,
    steps: Steps,
    bd: Breakdown,
    classes: list[ClassShare],
    thresholds: Thresholds,
    warnings: list[str],
    *,
    kernels: list[KernelRow] | None = None,
    cpu: CpuActivity | None = None,
    roofline: Roofline | None = None,
    mfu: Mfu | None = None,
    fusion: list[FusionCandidate] | None = None,
    timeline: StepTimeline | None = None,
    facts: Facts | None = None,
    memory: MemoryProfile | None = None,
) -> Diagnosis:
    estimate = (device.spec_source or "").startswith("estimate")
    typical = decide(steps, bd, classes, thresholds, roofline, roof_estimate=estimate)
    findings = find(facts, typical.wall) if facts is not None else []
    verdict, findings = headline(typical, steps, findings, bd)
    thin = thin_evidence(
        steps,
        device_known=device.kind == "cpu" or device.matched_spec is not None,
        launches_known=not any(w.startswith("no launch records") for w in warnings),
        roofline=roofline,
        wall=verdict.wall,
        gpu_unrecorded=device.kind == "cpu"
        and (bool(trace.device_properties) or len(trace.of_kind(Kind.RUNTIME)) > 0),
    )
    verdict = msgspec.structs.replace(verdict, thin_evidence=thin)
    if verdict.wall != typical.wall and facts is not None:
        findings = find(facts, verdict.wall)  # the new wall's findings first
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
        classes=classes,
        cpu=cpu,
        roofline=roofline,
        mfu=mfu or Mfu(value=None, basis="not computed"),
        fusion=fusion or [],
        warnings=warnings,
        timeline=timeline,
        memory=memory,
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


def _gpu_breakdown(spans: StepSpans, wb: WindowBreakdown, kept: npt.NDArray[np.bool_]) -> Breakdown:
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
        basis="gpu",
        compute=share(wb.compute),
        comm_exposed=share(wb.comm_exposed),
        copy_exposed=share(wb.copy_exposed),
        idle=share(wb.idle),
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
    trace: Trace,
    dev: DeviceOps,
    inside: npt.NDArray[np.bool_],
    costs: dict[int, KernelCost],
    spec: DeviceSpec | None,
) -> tuple[list[KernelRow], list[ClassShare]]:
    """Top kernels by GPU time and time per class, over the steady-state steps; kernels whose
    ops have a cost model get FLOPs, bytes and their place on the roofline."""
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
    for i in np.argsort(-time)[:TOP_ROWS].tolist():
        code = int(uniq[i])
        kc = CLASSES[int(first_cls[i])]
        row = KernelRow(
            name=trace.strings[code],
            cls=kc.value,
            count=int(count[i]),
            time_s=float(time[i]) * NS,
            share=float(time[i]) / total,
        )
        rows.append(kernel_roof(row, kc, costs.get(code), spec))
    return rows, classes


def _diagnose_cpu(
    trace: Trace,
    spans: StepSpans,
    thresholds: Thresholds,
    warnings: list[str],
    spec: DeviceSpec | None = None,
    model: ModelFlops | None = None,
) -> Diagnosis:
    """No device kernels: the CPU is the device. Breakdown of the main thread's time."""
    host = trace.of_kind(Kind.CPU_OP, Kind.ANNOTATION, Kind.PYTHON)
    if len(host) == 0:
        host = trace.of_kind(Kind.RUNTIME, Kind.OTHER)
    if len(host) == 0:
        raise WallfinderError(f"{trace.source}: no device kernels and no CPU activity to analyse")
    thread = _main_thread(trace, host)
    mine = host.take(np.flatnonzero(host.thread == thread))
    category, dispatch = _cpu_categories(trace, mine)
    cov = [Coverage.of(mine.ts[category <= k], mine.end[category <= k]) for k in range(5)]
    start, end = spans.cpu_start, spans.cpu_end
    upto = [c.covered(start, end) for c in cov]
    data, comm = upto[0], upto[1] - upto[0]
    ops = upto[2] - upto[1]
    # Dispatch-sized ops are host overhead, as the gaps they leave on a GPU would be.
    tiny = upto[3] - upto[2]
    python = upto[4] - upto[3]
    length = end - start
    untraced = length - upto[4]
    durations = length.astype(np.float64) * NS
    dropped = dropped_steps(spans, durations)
    kept = np.ones(durations.size, dtype=bool)
    kept[[i for i, _ in dropped]] = False
    zeros = np.zeros(length.size, dtype=np.int64)
    causes = {k: np.zeros(length.size) for k in IDLE_CAUSES}
    causes["data_loading"] = data.astype(np.float64)
    causes["host_overhead"] = (tiny + python).astype(np.float64)
    causes["other"] = untraced.astype(np.float64)
    wb = WindowBreakdown(start, end, ops, comm, zeros, data + tiny + python + untraced, causes)
    spikes = find_spikes(trace, None, spans.labels, wb, kept)
    steps = _step_stats(spans.source, spans.labels, durations, kept, dropped, thresholds, spikes)
    bd = _gpu_breakdown(spans, wb, kept)
    bd = Breakdown(**{**{f: getattr(bd, f) for f in bd.__struct_fields__}, "basis": "cpu"})
    total = float(length[kept].sum()) or 1.0
    cpu, classes = _cpu_activity(
        trace,
        mine,
        category,
        start[kept],
        end[kept],
        bd,
        tiny=float(tiny[kept].sum()) / total,
        python=float(python[kept].sum()) / total,
    )
    if trace.of_kind(Kind.RUNTIME).name.size:
        runtimes = {trace.strings[c] for c in np.unique(trace.of_kind(Kind.RUNTIME).name)}
        warnings.append(
            "the trace records accelerator runtime calls but no device kernels "
            f"(e.g. {sorted(runtimes)[0]!r}): showing the CPU-side breakdown"
        )
    else:
        warnings.append("no device activity in the trace: the CPU is analysed as the device")
    if spec is None or spec.vendor != "cpu":
        spec = cpu_spec()
    roof: Roofline | None = None
    mfu_ = Mfu(value=None, basis="unknown: the accelerator's work is not in the trace")
    if len(trace.of_kind(Kind.RUNTIME)) == 0:
        # A pure CPU run: the ops' CPU time is their compute time. With accelerator runtime
        # calls (MTIA, a device whose kernels were not traced) it is only dispatch time.
        cpu_ops = mine.take(np.flatnonzero(mine.kind == Kind.CPU_OP))
        roof, mfu_ = cpu_roofline(
            trace, cpu_ops, start[kept], end[kept], spec, steps.count, model or ModelFlops()
        )
    device = Device(
        name="CPU",
        kind="cpu",
        matched_spec=spec.name,
        spec_source=spec.source,
        peak_flops=dict(spec.peak_flops),
        mem_bandwidth=spec.mem_bandwidth,
        note="CPU-only trace: CPU-side breakdown"
        + (
            "; roofs are a nominal estimate (give --spec FILE for this CPU)"
            if spec.estimate
            else ""
        ),
    )
    memory = memory_profile(
        trace, spans, kept, device=None, world_size=trace.world_size, thresholds=thresholds
    )
    facts = Facts(
        trace=trace,
        dev=None,
        inside=np.zeros(0, dtype=bool),
        steps=steps,
        breakdown=bd,
        roofline=None,
        fusion=[],
        peak_flops={},
        window_start=start[kept],
        window_end=end[kept],
        thresholds=thresholds,
        cpu_dispatch=dispatch.summary(
            mine.take(np.flatnonzero(mine.kind == Kind.CPU_OP)), start[kept], end[kept]
        ),
        memory=memory,
    )
    return _result(
        trace,
        device,
        steps,
        bd,
        classes,
        thresholds,
        warnings,
        cpu=cpu,
        roofline=roof,
        mfu=mfu_,
        facts=facts,
        memory=memory,
    )


def _main_thread(trace: Trace, host: Events) -> int:
    keys = host.thread
    step_rows = np.isin(host.name, trace.names_matching(lambda s: s.startswith("ProfilerStep#")))
    pool = keys[step_rows] if step_rows.any() else keys
    weights = None if step_rows.any() else host.dur.astype(np.float64)
    uniq, inverse = np.unique(pool, return_inverse=True)
    return int(uniq[np.argmax(np.bincount(inverse, weights=weights))])


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
    trace: Trace,
    mine: Events,
    category: npt.NDArray[np.int8],
    start: npt.NDArray[np.int64],
    end: npt.NDArray[np.int64],
    bd: Breakdown,
    *,
    tiny: float,
    python: float,
) -> tuple[CpuActivity, list[ClassShare]]:
    """`tiny` and `python`: the shares of the step in dispatch-sized ops and in Python."""
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
        ops=bd.compute + bd.comm_exposed + tiny,
        python=python,
        untraced=bd.idle_causes["other"],
        op_time_by_class_s={c: t * NS / steps for c, t in by_class.items()},
        top_ops=top,
    )
    return activity, classes
