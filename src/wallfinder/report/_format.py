"""Numbers and labels shared by the HTML and Markdown reports (formatting only: every figure
comes from the Diagnosis)."""

from __future__ import annotations

from wallfinder.analysis.precision import precision_fix
from wallfinder.diagnosis import (
    MEMORY_CATEGORIES,
    DeviceMemoryProfile,
    Diagnosis,
    Finding,
    ModuleRow,
    Roofline,
    Verdict,
)
from wallfinder.units import duration, ms, pct, size
from wallfinder.units import short_kernel as units_short_kernel

__all__ = [
    "CAUSE_LABEL",
    "CPU_IDLE_CAUSE",
    "CPU_IDLE_LABEL",
    "IDLE_LABEL",
    "MEMORY_CATEGORY_LABEL",
    "MEMORY_TOP_SITES",
    "MODULE_COLUMNS",
    "MODULE_TOP",
    "PHASE_LABEL",
    "breakdown_parts",
    "cause_label",
    "device_label",
    "duration",
    "ellipsize",
    "idle_causes",
    "idle_label",
    "memory_capacity",
    "memory_categories",
    "memory_device_line",
    "memory_growth_lines",
    "memory_leak_line",
    "memory_leak_sites",
    "memory_peak",
    "memory_saving",
    "memory_when",
    "module_cells",
    "ms",
    "part_label",
    "pct",
    "phase_parts",
    "short_kernel",
    "si",
    "size",
    "step_count",
    "tensor_core_fix",
    "title_line",
    "unplaced",
]

IDLE_LABEL = {
    "data_loading": "data loading (DataLoader)",
    "synchronization": "synchronisation (host blocked on GPU)",
    "communication_wait": "collective wait on the host",
    "host_overhead": "host overhead (CPU ops, Python)",
    "launch_latency": "launch latency",
    "dependency_wait": "launched work waiting (stream/event/peer, unrecorded work)",
    "startup": "start-up: library, module loading, JIT (one-off)",
    "other": "unexplained",
}
CAUSE_LABEL = {
    **IDLE_LABEL,
    "unstable": "unstable step time (slow steps)",
    "comm_exposed": "exposed communication",
    "copy_exposed": "exposed memory copies",
    "straggler": "a straggler rank (the others wait for it)",
}


def not_computed_lines(d: Diagnosis) -> list[str]:
    """One line per optional view an internal error left out (`modules: not computed
    (internal error: KeyError …; rerun with --debug)`): the rest of the report stands."""
    return [f"{view}: not computed ({why})" for view, why in d.not_computed.items()]


def job_lines(d: Diagnosis) -> list[str]:
    """The cross-rank summary in plain sentences (terminal and Markdown share them)."""
    j = d.job
    if j is None:
        return []
    world = f" of {j.world_size}" if j.world_size else ""
    skew = "?" if j.max_clock_skew_s is None else duration(j.max_clock_skew_s)
    lines = [
        f"Job: {j.ranks}{world} ranks — {j.wall.upper()} wall, {cause_label(j.wall, j.cause)}: "
        f"{j.reason}",
        f"Clock skew (estimated): {skew} at most — {j.clock_basis}",
        f"Collectives matched across ranks: {j.matched}, left out: {j.unmatched}",
    ]
    for s in j.stragglers:
        lines.append(  # noqa: PERF401 (one row per item, built in several lines)
            f"Straggler: rank {s.rank} — last to arrive at {pct(s.late_share, 0)} of collectives, "
            f"the others wait {ms(s.wait_caused_s)} ms/step for it; it was {s.doing}"
        )
    lines += [f"note: {n}" for n in j.notes]
    return lines


def collective_cells(d: Diagnosis) -> list[list[str]]:
    """The job's collectives table: one row of cells per collective kind and size."""
    j = d.job
    if j is None:
        return []
    rows = []
    for c in j.collectives:
        rows.append(  # noqa: PERF401 (one row per item, built in several lines)
            [
                c.group,
                c.name,
                str(c.ranks or "?"),
                str(c.count),
                "?" if c.bytes is None else si(float(c.bytes), "B"),
                ms(c.transfer_s),
                ms(c.wait_s),
                si(c.busbw, "B/s"),
                pct(c.pct_of_link, 0) if c.pct_of_link is not None else "?",
            ]
        )
    return rows


COLLECTIVE_COLUMNS = (
    "group",
    "collective",
    "ranks",
    "count",
    "size",
    "transfer ms",
    "wait ms",
    "bus bw",
    "of link",
)


def cause_label(wall: str, cause: str) -> str:
    """A verdict's cause in words: an idle cause for the overhead wall, a kernel class for
    the bandwidth wall (the two vocabularies share words such as "other")."""
    if wall == "overhead":
        return CAUSE_LABEL.get(cause, cause)
    if wall == "bandwidth":
        return f"{cause} kernels (memory-bound)"
    return cause


def verdict_label(v: Verdict, basis: str = "gpu") -> str:
    """The verdict's headline cause in words: its cause, and the parallel strategy's
    mechanism that explains most of it where the analysis named one. On the CPU (`basis`
    "cpu") "other" holds the thread's waits, not only what the trace leaves unexplained."""
    label = (
        CPU_IDLE_CAUSE
        if basis == "cpu" and v.wall == "overhead" and v.cause == "other"
        else cause_label(v.wall, v.cause)
    )
    return f"{label} — {v.mechanism}" if v.mechanism else label


CPU_IDLE_CAUSE = "waiting or untraced"
"""The CPU's idle cause "other" in a headline: a blocking call, an idle event loop, or time
its thread records nothing in."""


CPU_IDLE_LABEL = {
    "data_loading": "data loading (DataLoader)",
    "host_overhead": "framework overhead (tiny ops, Python)",
    "synchronization": "waiting on the device (synchronising calls)",
    "other": "waiting or untraced (no work recorded)",
}


def si(value: float | None, unit: str, digits: str = ".1f") -> str:
    """`value` with an SI prefix (k, M, G, T, P) on `unit`; "?" when unknown."""
    if value is None:
        return "?"
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:{digits}} {prefix}{unit}"
    return f"{value:{digits}} {unit}"


def step_count(d: Diagnosis) -> int:
    """The steps a per-step figure divides by: the diagnosis's, at least one."""
    return max(d.steps.count, 1)


def short_kernel(kernel: str) -> str:
    """A kernel name for a report's tables: `units.short_kernel` at any width, without the
    `at::native::` every ATen kernel carries (the JSON has the name whole)."""
    return units_short_kernel(kernel, width=None, aten=False)


def tensor_core_fix(d: Diagnosis) -> str:
    """What moves fp32 matmuls onto this device's tensor cores (the dtypes it has peaks for):
    the fp32-matmul finding's advice, in short."""
    return precision_fix(d.device.peak_flops).short


_PART_LABEL = {
    "gpu": {
        "compute": "compute",
        "comm_exposed": "exposed communication",
        "copy_exposed": "exposed copies",
        "idle": "GPU idle",
    },
    "cpu": {
        "compute": "ops doing arithmetic",
        "comm_exposed": "communication",
        "copy_exposed": "exposed copies",
        "idle": "overhead and waiting",
    },
}


def breakdown_parts(d: Diagnosis) -> list[tuple[str, float]]:
    """The breakdown's parts in report order with their shares of the step (a CPU trace has no
    copies row)."""
    b = d.breakdown
    parts = ("compute", "comm_exposed", "copy_exposed", "idle")
    return [(p, getattr(b, p)) for p in parts if not (b.basis == "cpu" and p == "copy_exposed")]


def idle_causes(d: Diagnosis) -> list[tuple[str, float]]:
    """The idle causes that took any time, largest first, with their shares of the step."""
    ranked = sorted(d.breakdown.idle_causes.items(), key=lambda kv: -kv[1])
    return [(cause, share) for cause, share in ranked if share > 0]


def part_label(d: Diagnosis, part: str) -> str:
    """A breakdown part (compute, comm_exposed, copy_exposed, idle) in words."""
    return _PART_LABEL[d.breakdown.basis][part]


def idle_label(d: Diagnosis, cause: str) -> str:
    """An idle cause in words (a CPU trace's "idle" is its time outside ops)."""
    if d.breakdown.basis == "cpu":
        return CPU_IDLE_LABEL.get(cause, cause.replace("_", " "))
    return CAUSE_LABEL.get(cause, cause.replace("_", " "))


def graph_line(d: Diagnosis) -> str:
    """How much of the kernel time was replayed from CUDA/HIP graphs ("" when none)."""
    share = d.breakdown.graph_replayed
    return f"{pct(share)} of kernel time replayed from CUDA/HIP graphs" if share > 0 else ""


def gain(f: Finding, times: str = "x") -> str:
    """What a time finding can gain, in words: its bound and share of the step, or for a
    one-off cost its share of the profiled time."""
    if f.saves == "once":
        return f"a one-off cost: {pct(f.share, 0)} of the profiled time, none per steady step"
    if f.replay_speedup is not None:
        return (
            f"{f.replay_speedup:.2f}{times} by replay; Amdahl's bound {f.max_speedup:.2f}{times} "
            f"({pct(f.share, 0)} of the step)"
            + (f"; then the {f.wall_after} wall" if f.wall_after else "")
        )
    basis = "bound; " if f.gain_basis == "bound" else ""
    return f"up to {f.max_speedup:.2f}{times} faster ({basis}{pct(f.share, 0)} of the step)"


def what_if_cells(d: Diagnosis) -> list[list[str]]:
    """The what-if table's rows: the change, the replayed step, the speed-up and the wall
    after (empty without a critical path)."""
    cp = d.critical_path
    if cp is None:
        return []
    return [
        [
            r.change,
            f"{ms(r.step_s)} ms",
            f"{r.speedup:.2f}x" + (f" (as {r.capped_by})" if r.capped_by else ""),
            r.wall_after,
        ]
        for r in cp.what_if
    ]


def critical_path_line(d: Diagnosis) -> str:
    """The critical path in one line: where its time goes, the replay check, and the rank it
    runs through ("" without one)."""
    cp = d.critical_path
    if cp is None:
        return ""
    parts = ", ".join(
        f"{k} {pct(v, 0)}" for k, v in sorted(cp.shares.items(), key=lambda x: -x[1]) if v >= 0.01
    )
    rank = f" through rank {cp.rank} (the rank the others wait for)" if cp.rank is not None else ""
    capped = sorted({r.capped_by for r in cp.what_if if r.capped_by})
    return (
        f"critical path{rank} (the longest chain of dependent host and device work; its host "
        "time can run while the GPU is busy, so it is not the breakdown's idle time): "
        f"{parts}; the {cp.wall} wall. Replaying the unchanged graph gives "
        f"{ms(cp.replayed_step_s)} ms per step for the measured {ms(cp.measured_step_s)} ms "
        f"({cp.replay_error:+.1%}); the what-ifs are estimates from the replay, never below "
        "the device's busy time under the fix"
        + (
            f"; a row marked 'as {capped[0]}' gains more in the replay than that finding's "
            "bound allows for its cause, and shows the finding's figure"
            if capped
            else ""
        )
        + "".join(f". {n[0].upper()}{n[1:]}" for n in cp.notes)
    )


def ellipsize(text: str, width: int) -> str:
    """`text` cut to `width` characters, an ellipsis marking the cut; newlines as spaces."""
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def device_label(d: Diagnosis) -> str:
    """The device's name as the trace gives it; where it gives none, the spec matched to it,
    marked as inferred (the device note says from what)."""
    if d.device.name:
        return d.device.name
    if d.device.matched_spec:
        return f"{d.device.matched_spec} (inferred)"
    return "unknown device"


def title_line(d: Diagnosis) -> str:
    """Device, rank and steps in one line (the source file is shown apart)."""
    device = device_label(d)
    if d.device.kind == "gpu" and d.device.index is not None:
        device += f" (device {d.device.index})"
    parts = [device]
    if d.rank is not None:
        parts.append(f"rank {d.rank}" + (f" of {d.world_size}" if d.world_size else ""))
    parts.append(f"{d.steps.total} steps ({d.steps.source})")
    return " · ".join(parts)


# Memory (the Diagnosis's MemoryProfile) ---------------------------------------------------------

MEMORY_TOP_SITES = 5
"""Call sites the reports list as live at the memory peak (the JSON has up to ten)."""
MEMORY_CATEGORY_LABEL = {
    "parameters": "parameters",
    "before_trace": "before the trace (parameters, state)",
    "activations": "activations",
    "retained": "kept from earlier steps",
    "gradients": "gradients",
    "optimizer_state": "optimizer state",
    "temporaries": "temporaries",
    "other": "other (allocated between steps)",
}
_PHASE_LABEL = {
    "forward": "forward pass",
    "backward": "backward pass",
    "optimizer": "optimizer step",
}


def ranks_have_memory(d: Diagnosis) -> bool:
    """Whether any rank's trace recorded memory (its peak gets a column in the ranks' table)."""
    return any(r.peak_allocated is not None for r in d.ranks)


def memory_peak(m: DeviceMemoryProfile) -> str:
    """Peak allocated and reserved bytes, with their shares of the capacity when it is known
    (what follows "peak")."""

    def of(n: int, what: str) -> str:
        return f" ({pct(n / m.capacity)}{what})" if m.capacity else ""

    text = f"{size(m.peak_allocated)} allocated{of(m.peak_allocated, ' of capacity')}"
    # The CPU allocator reports no reserved total: 0 means none recorded.
    if m.peak_reserved:
        text += f", {size(m.peak_reserved)} reserved{of(m.peak_reserved, '')}"
    return text


def memory_capacity(m: DeviceMemoryProfile) -> str | None:
    """The device's capacity and where it comes from (None when unknown)."""
    if not m.capacity:
        return None
    source = f" ({m.capacity_source})" if m.capacity_source else ""
    return f"{size(m.capacity)}{source}"


def memory_when(m: DeviceMemoryProfile) -> str:
    """When allocated memory peaks: time into the trace, step, phase and op."""
    parts = [f"{duration(m.peak_time_s)} into the trace"]
    if m.peak_step:
        parts.append(m.peak_step)
    parts.append(_PHASE_LABEL.get(m.peak_phase, m.peak_phase))
    if m.peak_op:
        parts.append(f"in {m.peak_op}")
    return ", ".join(parts)


def memory_categories(m: DeviceMemoryProfile) -> list[tuple[str, str, int, float]]:
    """What is live at the peak by category, largest first, categories with no bytes left out:
    (category, label, bytes, share of the peak's allocated bytes)."""
    peak = max(m.peak_allocated, 1)
    rows = [(c, MEMORY_CATEGORY_LABEL.get(c, c), n, n / peak) for c, n in m.categories.items()]
    order = {c: i for i, c in enumerate(MEMORY_CATEGORIES)}
    rows.sort(key=lambda r: (-r[2], order.get(r[0], len(order))))
    return [r for r in rows if r[2] > 0]


def memory_growth_lines(m: DeviceMemoryProfile) -> list[str]:
    """Growth across steps and how often the allocator reserved and released memory, one
    sentence each (the leak has its own line, with its sites)."""
    lines = []
    g = m.growth_per_step
    if g is not None and not m.leak:
        change = "none" if g == 0 else ("+" if g > 0 else "-") + size(abs(g))
        lines.append(
            f"Growth per step: {change} (the trend of allocated bytes at the steady-state "
            "steps' boundaries)"
        )
    if m.reserved_grows or m.reserved_shrinks:
        line = (
            f"Reserved memory grew {m.reserved_grows} times and shrank {m.reserved_shrinks} "
            "times in the trace (device mallocs and frees)"
        )
        if m.steady_reserved_changes_per_step:
            line += f"; {m.steady_reserved_changes_per_step:.1f} changes per steady-state step"
        lines.append(line)
    elif m.steady_reserved_changes_per_step:
        lines.append(
            f"Reserved memory changed {m.steady_reserved_changes_per_step:.1f} times per "
            "steady-state step"
        )
    return lines


def memory_leak_line(m: DeviceMemoryProfile) -> str | None:
    """The leak in one sentence, to follow a "LEAK" mark (None when there is none); its sites
    are listed apart."""
    if not m.leak:
        return None
    rate = f" by {size(m.growth_per_step)} per step" if m.growth_per_step else ""
    where = " from these call sites:" if m.leak_sites else ""
    return f"allocated memory grows{rate}, in blocks never freed{where}"


def memory_leak_sites(m: DeviceMemoryProfile) -> list[str]:
    """Each leak site in words: where, its op, bytes, blocks and steps."""
    return [
        f"{s.site}"
        + (f" ({s.op})" if s.op and s.op != s.site else "")
        + f": {size(s.bytes)} in {s.count} blocks over {s.steps} steps"
        for s in m.leak_sites
    ]


def memory_saving(f: Finding) -> str:
    """The most a memory finding's fix can free at the peak, in words."""
    return "bound unknown" if f.saving_bytes is None else f"frees at most {size(f.saving_bytes)}"


def memory_device_line(m: DeviceMemoryProfile) -> str:
    """Another device's memory in one line: its peaks."""
    line = f"{m.device}: peak {size(m.peak_allocated)} allocated"
    if m.peak_reserved:
        line += f", {size(m.peak_reserved)} reserved"
    return line


PHASE_LABEL = {
    "data_wait": "data wait",
    "input_copy": "input copy",
    "forward": "forward",
    "backward": "backward",
    "optimizer": "optimizer",
    "communication": "communication",
    "other": "other",
}
"""The phases in report order, in words."""
MODULE_TOP = 15
"""Module rows the terminal and Markdown reports show (the JSON and HTML have them all)."""


def phase_parts(d: Diagnosis) -> list[tuple[str, float, float | None]]:
    """The phases that took any time: (phase, share of the step exposed, device seconds per
    step or None on a CPU trace), in report order."""
    p = d.phases
    if p is None:
        return []
    return [
        (k, p.exposed.get(k, 0.0), p.gpu_s.get(k) if p.gpu_s else None)
        for k in PHASE_LABEL
        if p.exposed.get(k, 0.0) > 0 or p.gpu_s.get(k, 0.0) > 0
    ]


def module_cells(r: ModuleRow) -> list[str]:
    """A module row's cells: name (indented by depth), forward and backward ms/step, share,
    where most of its time sits on the roofline (mem, comp, or ? for unknown), and a
    repeated block's spread (min/median/max ms/step) with its slowest instance."""
    total = r.forward_s + r.backward_s
    bound = "-"
    if total > 0 and r.bound_s:
        key = max(r.bound_s, key=lambda k: r.bound_s[k])
        bound = f"{_BOUND_SHORT[key]} {pct(r.bound_s[key] / total, 0)}"
    spread = slowest = ""
    if r.spread is not None:
        s = r.spread
        spread = f"{ms(s.min_s)}/{ms(s.median_s)}/{ms(s.max_s)}"
        slowest = f"{s.outlier} ({s.count}×)"
    return [
        "  " * r.depth + r.name,
        ms(r.forward_s),
        ms(r.backward_s),
        pct(r.share),
        bound,
        spread,
        slowest,
    ]


_BOUND_SHORT = {"bandwidth": "mem", "compute": "comp", "unknown": "?"}
MODULE_COLUMNS = ("module", "fwd ms", "bwd ms", "share", "bound", "min/med/max ms", "slowest of")
"""The module table's column headings (`module_cells` gives each row's)."""


def roofline_summary(r: Roofline) -> str:
    """The roofline's sentence on busy time, unpunctuated: how much is compute- and
    bandwidth-bound, unplaced, and costed."""
    return (
        f"busy time {pct(r.compute_bound_share)} compute-bound, "
        f"{pct(r.bandwidth_bound_share)} bandwidth-bound, {unplaced(r)}; "
        f"{pct(r.costed_share)} of it has a cost model"
    )


def roof_lines(r: Roofline, *, matmul: bool) -> list[str]:
    """How close to their roof the compute- and bandwidth-bound kernels (and the matmul
    kernels, with `matmul`) run, time-weighted: a line each where known, unpunctuated."""
    roofs = [
        ("compute-bound kernels", r.pct_of_roof_compute),
        ("bandwidth-bound kernels", r.pct_of_roof_bandwidth),
    ]
    if matmul:
        roofs.append(("matmul kernels", r.pct_of_roof_matmul))
    return [
        f"{label} run at {pct(value)} of their roof (time-weighted)"
        for label, value in roofs
        if value is not None
    ]


def roofline_notes(r: Roofline) -> list[str]:
    """What the roofline section says beyond its shares: the kernels hardware counters
    re-placed, the latency-bound share, and the L2 roof."""
    lines = []
    if r.by_counters:
        lines.append("re-placed by hardware counters: " + "; ".join(r.by_counters))
    if r.latency_bound_share > 0:
        lines.append(
            f"{pct(r.latency_bound_share)} of busy time is latency-bound by counters "
            "(neither the SMs nor memory busy)"
        )
    if r.l2_note:
        lines.append(r.l2_note)
    return lines


def unplaced(r: Roofline) -> str:
    """The busy time the roofline places on neither roof, and why, in words: communication and
    kernels without a class's bound, and matmuls whose bound is unknown without shapes."""
    why = "communication, other"
    if r.matmul_unknown_share:
        why += f"; {pct(r.matmul_unknown_share)} of busy time matmuls without shapes"
    return f"{pct(r.unknown_bound_share)} neither ({why})"
