"""The terminal report: the verdict first, then the numbers that decided it."""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator, Sequence

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from wallfinder.diagnosis import Calculation, Diagnosis, KernelRow, OpRow, Steps
from wallfinder.report._format import (
    COLLECTIVE_COLUMNS,
    CPU_IDLE_LABEL,
    MEMORY_CATEGORY_LABEL,
    MEMORY_TOP_SITES,
    MODULE_COLUMNS,
    MODULE_TOP,
    PHASE_LABEL,
    breakdown_parts,
    cause_label,
    collective_cells,
    critical_path_line,
    device_label,
    duration,
    gain,
    graph_line,
    idle_causes,
    idle_label,
    job_lines,
    memory_capacity,
    memory_categories,
    memory_device_line,
    memory_growth_lines,
    memory_leak_line,
    memory_leak_sites,
    memory_peak,
    memory_saving,
    memory_when,
    module_cells,
    ms,
    not_computed_lines,
    part_label,
    pct,
    phase_parts,
    ranks_have_memory,
    roofline_notes,
    short_kernel,
    si,
    size,
    tensor_core_fix,
    unplaced,
    what_if_cells,
)

NAME_WIDTH = 52
"""Kernel and op names are cut to this many characters so the figures beside them fit in 100
columns; the JSON output has them whole."""

_WALL_STYLE = {"compute": "bold green", "bandwidth": "bold yellow", "overhead": "bold red"}


def renderables(d: Diagnosis) -> Iterator[RenderableType]:
    yield _header(d)
    yield _verdict(d)
    if d.findings:
        yield _findings(d)
    yield _steps(d)
    yield _breakdown(d)
    if d.phases is not None:
        yield _phases(d)
    if d.modules is not None and d.modules.rows:
        yield _modules(d)
    yield from _memory(d)
    if d.cpu is not None:
        yield _cpu_ops(d)
    elif d.kernels:
        yield _classes(d)
        yield _kernels(d)
    if d.roofline is not None:
        yield _roofline(d)
    if d.fusion:
        yield _fusion(d)
    yield _mfu(d)
    if d.critical_path is not None:
        yield _what_if(d)
    if d.ranks:
        yield _ranks(d)
    if d.job is not None:
        yield from _job(d)
    if d.counters is not None:
        from wallfinder.report.counters import counter_parts

        yield from counter_parts(d.counters)
    if d.not_computed:
        yield Text("\n".join(not_computed_lines(d)), style="yellow")
    if d.warnings:
        yield Text("\n".join(f"note: {w}" for w in d.warnings), style="dim")


def _header(d: Diagnosis) -> Text:
    device = device_label(d)
    if d.device.kind == "gpu" and d.device.index is not None:
        device += f" (device {d.device.index})"
    rank = ""
    if d.rank is not None:
        rank = f" · rank {d.rank}" + (f" of {d.world_size}" if d.world_size else "")
    text = Text()
    text.append("wallfinder", style="bold")
    text.append(f" · {d.source} · {device}{rank} · {d.steps.total} steps ({d.steps.source})")
    if d.device.note:
        text.append(f"\n{d.device.note}", style="dim")
    return text


def _verdict(d: Diagnosis) -> Panel:
    v = d.verdict
    body = Text()
    body.append(f"{v.wall.upper()} wall", style=_WALL_STYLE[v.wall])
    body.append(f" — {cause_label(v.wall, v.cause)}\n", style="bold")
    body.append(v.reason + "\n")
    if v.thin_evidence:
        body.append("confidence: low — " + "; ".join(v.thin_evidence) + "\n", style="yellow")
    for i, q in enumerate(v.questions, 1):
        mark = {"yes": "yes", "no": "NO", "unknown": "?"}[q.answer]
        body.append(f"\n{i}. {q.question} ")
        body.append(mark, style="bold" if q.answer == "no" else "")
        body.append(f" — {q.detail}", style="dim")
    return Panel(body, title="verdict", title_align="left")


def _findings(d: Diagnosis) -> Text:
    """Ranked fixes: those that move the verdict's wall, then the rest."""
    text = Text()
    text.append("What to fix", style="bold")
    text.append(" (ranked by the most each can gain)", style="dim")
    mine = [f for f in d.findings if f.wall == d.verdict.wall]
    rest = [f for f in d.findings if f.wall != d.verdict.wall]
    for label, group in (("", mine), ("not your wall now", rest)):
        if not group:
            continue
        if label:
            text.append(f"\n{label}:", style="dim")
        for f in group:
            _append_finding(text, f.title, gain(f), f.evidence, f.fix)
    return text


def _append_finding(text: Text, title: str, bound: str, evidence: str, fix: str) -> None:
    """A finding as the terminal lists it: title, its bound, evidence and fix."""
    text.append(f"\n• {title}", style="bold")
    text.append(f" — {bound}")
    text.append("\n  evidence: ", style="dim")
    text.append(evidence)
    text.append("\n  fix: ", style="dim")
    text.append(fix)


def _steps(d: Diagnosis) -> Text:
    text = step_text(d.steps)
    text.append("\n")
    text.append_text(_bar(d))
    return text


def step_text(s: Steps) -> Text:
    """Step time, its spread, and the steps dropped or slow."""
    text = Text()
    text.append("Step time ", style="bold")
    text.append(
        f"median {ms(s.median_s)} ms, range {ms(s.min_s)}–{ms(s.max_s)} ms, "
        f"CV {pct(s.cv)} over {s.count} steps" + ("" if s.stable else " (unstable)")
    )
    for drop in s.dropped:
        text.append(f"\n  dropped {drop.step} ({ms(drop.duration_s)} ms): {drop.reason}", "dim")
    for spike in s.spikes:
        text.append(
            f"\n  slow {spike.step}: {ms(spike.duration_s)} ms, +{ms(spike.excess_s)} ms over "
            f"the median, mostly {spike.part}"
        )
        if spike.kernels:
            text.append(" (" + ", ".join(short_kernel(k) for k in spike.kernels) + ")", style="dim")
    return text


BAR_WIDTH = 60
_BAR_PARTS = (
    ("compute", "█", "green"),
    ("comm_exposed", "▓", "magenta"),
    ("copy_exposed", "▒", "cyan"),
    ("idle", "░", "red"),
)


def _bar(d: Diagnosis) -> Text:
    """The step as one bar: compute, exposed communication, exposed copies, idle."""
    b = d.breakdown
    shares = {
        "compute": b.compute,
        "comm_exposed": b.comm_exposed,
        "copy_exposed": b.copy_exposed,
        "idle": b.idle,
    }
    cells = {k: round(v * BAR_WIDTH) for k, v in shares.items()}
    text = Text("  ")
    for key, char, style in _BAR_PARTS:
        text.append(char * cells[key], style=style)
    text.append("  ")
    text.append(
        "  ".join(
            f"{char} {key.replace('_exposed', '').replace('_', ' ')} {pct(shares[key])}"
            for key, char, _ in _BAR_PARTS
            if shares[key] > 0
        ),
        style="dim",
    )
    return text


_PHASE_STYLE = {
    "data_wait": ("░", "red"),
    "input_copy": ("▒", "cyan"),
    "forward": ("█", "green"),
    "backward": ("█", "blue"),
    "optimizer": ("█", "yellow"),
    "communication": ("▓", "magenta"),
    "other": ("▒", "white"),
}


def _phases(d: Diagnosis) -> Text:
    """The step by phase as one bar (exposed time), with each phase's device time."""
    assert d.phases is not None
    p = d.phases
    step_ms = d.breakdown.per_step_ms["step"]
    text = Text("Step by phase (steady state, exposed time; the bar is the step)\n  ")
    for key, share, _ in phase_parts(d):
        char, style = _PHASE_STYLE[key]
        text.append(char * round(share * BAR_WIDTH), style=style)
    for key, share, busy in phase_parts(d):
        char, style = _PHASE_STYLE[key]
        text.append(f"\n  {char} ", style=style)
        text.append(f"{PHASE_LABEL[key]:<14}{pct(share):>7}  {share * step_ms:8.2f} ms")
        if busy is not None:
            text.append(f"   device time {busy * 1e3:.2f} ms", style="dim")
    if p.evidence:
        text.append("\n  from: " + "; ".join(p.evidence), style="dim")
    for line in p.unsplit:
        text.append(f"\n  not split: {line}", style="dim")
    return text


def _busy_word(d: Diagnosis) -> str:
    """What a module's time is: its device ops', or on a CPU trace its main-thread ops'."""
    return "device" if d.phases is None or d.phases.basis == "gpu" else "CPU (main thread's ops)"


def _modules(d: Diagnosis) -> Table:
    assert d.modules is not None
    m = d.modules
    table = Table(
        title=f"Time per module ({_busy_word(d)} time per step; {m.note})",
        title_justify="left",
        show_edge=False,
    )
    # The spread and the slowest block share a column (two lines) to fit 100 columns.
    headings = [*MODULE_COLUMNS[:-2], "blocks: min/med/max ms, slowest"]
    for i, heading in enumerate(headings):
        last = i == len(headings) - 1
        table.add_column(
            heading,
            justify="left" if i == 0 or last else "right",
            overflow="ellipsis",
            no_wrap=True,
            max_width=24 if i == 0 else None,
            min_width=None if i == 0 or last else max(len(heading), 7),
        )
    for r in m.rows[:MODULE_TOP]:
        *cells, spread, slowest = module_cells(r)
        table.add_row(*[Text(c) for c in cells], Text(f"{spread}\n{slowest}" if spread else ""))
    if len(m.rows) > MODULE_TOP or m.unattributed_s > 0:
        table.caption = (
            f"{len(m.rows) - MODULE_TOP} more rows in the JSON and HTML reports; "
            if len(m.rows) > MODULE_TOP
            else ""
        ) + f"{ms(m.unattributed_s)} ms/step of {_busy_word(d)} time is in no module"
        table.caption_justify = "left"
    return table


def _breakdown(d: Diagnosis) -> Table:
    b = d.breakdown
    step_ms = b.per_step_ms["step"]
    cpu = b.basis == "cpu"
    table = Table(
        title=("CPU" if cpu else "GPU") + " time per step (steady state)",
        title_justify="left",
        show_edge=False,
    )
    table.add_column("part")
    table.add_column("share", justify="right")
    table.add_column("ms/step", justify="right")
    for part, share in breakdown_parts(d):
        table.add_row(part_label(d, part), pct(share), f"{share * step_ms:.2f}")
    for cause, share in idle_causes(d):
        if cause in CPU_IDLE_LABEL or not cpu:
            table.add_row(
                f"  └ {idle_label(d, cause)}", pct(share), f"{share * step_ms:.2f}", style="dim"
            )
    table.add_row("step (mean)", "100.0%", f"{step_ms:.2f}", style="bold")
    if graph_line(d):
        table.caption = graph_line(d)
        table.caption_justify = "left"
    return table


def _memory(d: Diagnosis) -> Iterator[RenderableType]:
    """The analysed device's memory peak, what is live then (by category and call site),
    growth and leaks, the allocator's reserving, the memory findings; other devices in a line."""
    m = d.main_memory
    if d.memory is None or m is None:
        return
    text = Text()
    text.append("Memory ", style="bold")
    text.append(f"{m.device} — peak {memory_peak(m)}")
    capacity = memory_capacity(m)
    if capacity:
        text.append(f"\n  capacity {capacity}")
    text.append(f"\n  at the peak: {memory_when(m)}")
    cats = memory_categories(m)
    if not cats:
        yield text
    else:
        table = Table(title="Live at the peak by category", title_justify="left", show_edge=False)
        table.add_column("category")
        table.add_column("bytes", justify="right", no_wrap=True)
        table.add_column("share", justify="right", no_wrap=True)
        for _, label, nbytes, share in cats:
            table.add_row(label, size(nbytes), pct(share))
        yield Group(text, table)
    if m.sites:
        sites = Table(title="Live at the peak by call site", title_justify="left", show_edge=False)
        sites.add_column("call site", overflow="fold", max_width=NAME_WIDTH)
        sites.add_column("category", no_wrap=True)
        sites.add_column("bytes", justify="right", no_wrap=True)
        sites.add_column("blocks", justify="right", no_wrap=True)
        for s in m.sites[:MEMORY_TOP_SITES]:
            sites.add_row(
                Text(s.site),
                MEMORY_CATEGORY_LABEL.get(s.category, s.category),
                size(s.bytes),
                str(s.count),
            )
        yield sites
    growth = Text("\n".join(memory_growth_lines(m)))
    leak = memory_leak_line(m)
    if leak:
        if growth:
            growth.append("\n")
        growth.append("LEAK", style="bold red")
        growth.append(f": {leak}", style="bold")
        for line in memory_leak_sites(m):
            growth.append(f"\n  • {line}")
    if growth:
        yield growth
    if d.memory.findings:
        found = Text()
        found.append("Memory findings", style="bold")
        found.append(" (what each fix frees at the peak, at most)", style="dim")
        for f in d.memory.findings:
            _append_finding(found, f.title, memory_saving(f), f.evidence, f.fix)
        yield found
    rest = [f"other device {memory_device_line(o)}" for o in d.memory.devices[1:]]
    rest += [f"note: {n}" for n in d.memory.notes]
    if rest:
        yield Text("\n".join(rest), style="dim")


def _classes(d: Diagnosis) -> Table:
    return _class_table("GPU time by kernel class", "share of GPU time", d)


def _kernels(d: Diagnosis) -> Table:
    return _name_table("Top kernels by GPU time", "kernel", d.kernels, d)


def _cpu_ops(d: Diagnosis) -> Group:
    assert d.cpu is not None
    return Group(
        _class_table("CPU op time by class", "share of op time", d),
        _name_table("Top CPU ops (top-level)", "op", d.cpu.top_ops, d),
    )


def _class_table(title: str, share_label: str, d: Diagnosis) -> Table:
    table = Table(title=title, title_justify="left", show_edge=False)
    table.add_column("class")
    table.add_column(share_label, justify="right")
    table.add_column("ms/step", justify="right")
    steps = max(d.steps.count, 1)
    for c in d.classes:
        table.add_row(c.cls, pct(c.share), f"{c.time_s * 1e3 / steps:.2f}")
    return table


def _name_table(title: str, what: str, rows: Sequence[KernelRow | OpRow], d: Diagnosis) -> Table:
    table = Table(title=title, title_justify="left", show_edge=False)
    table.add_column(what, overflow="ellipsis", no_wrap=True, max_width=NAME_WIDTH)
    table.add_column("class", no_wrap=True, min_width=13)
    table.add_column("calls", justify="right", no_wrap=True, min_width=6)
    table.add_column("share", justify="right", no_wrap=True, min_width=6)
    table.add_column("ms/step", justify="right", no_wrap=True, min_width=8)
    steps = max(d.steps.count, 1)
    for r in rows:
        # Names come from the trace: Text() keeps rich from reading them as markup.
        table.add_row(
            Text(r.name), r.cls, str(r.count), pct(r.share), f"{r.time_s * 1e3 / steps:.2f}"
        )
    return table


def render_calculation(c: Calculation) -> str:
    """A `wallfinder roofline` calculation as text."""

    def g(value: float, unit: str) -> str:
        return si(value, unit, ".3g")

    def ai(value: float | None) -> str:
        # Three significant figures, never an exponent: 1990, not 1.99e+03.
        return "∞" if value is None else f"{value:.0f}" if value >= 1000 else f"{value:.3g}"

    lines = [
        f"{c.what} · {c.dtype} on {c.device} ({c.source})",
        f"  FLOPs {g(c.flops, 'FLOP')}, bytes {g(c.bytes, 'B')} ({size(c.bytes)})"
        + (" unfused" if c.ops else "")
        + f", arithmetic intensity {ai(c.ai)} FLOP/B",
        f"  ridge {ai(c.ridge)} FLOP/B ({g(c.peak_flops, 'FLOP/s')} / "
        f"{g(c.mem_bandwidth, 'B/s')}): {c.bound}-bound",
        f"  attainable {g(c.attainable_flops, 'FLOP/s')} "
        f"({c.utilisation_of_peak:.1%} of peak); time floor {duration(c.time_floor_s)}"
        + (" (the ops' floors added: each op its own kernel)" if c.ops else ""),
    ]
    if c.ops:
        lines.append("  unfused, op by op:")
        width = max(len(o.op) for o in c.ops)
        lines += [
            f"    {o.op:<{width}}  {o.what}: {g(o.flops, 'FLOP')}, {size(o.bytes)}, "
            f"AI {ai(o.ai)}, {o.bound}-bound, {duration(o.time_floor_s)}"
            for o in c.ops
        ]
    if c.fused_bytes is not None and c.extra_bytes is not None:
        lines.append(
            f"  fused: {size(c.fused_bytes)} instead of {size(c.bytes)}; unfused moves "
            f"{size(c.extra_bytes)} more ({g(c.extra_bytes, 'B')}), "
            f"{duration(c.extra_bytes_time_s)} at {g(c.mem_bandwidth, 'B/s')}"
        )
    if c.fused_time_floor_s is not None and c.time_saved_s is not None:
        lines.append(
            f"  time floor fused {duration(c.fused_time_floor_s)} instead of "
            f"{duration(c.time_floor_s)}: saves {duration(c.time_saved_s)} per call"
        )
    lines += [f"  note: {note}" for note in c.notes]
    return "\n".join(lines) + "\n"


def _roofline(d: Diagnosis) -> Group:
    r = d.roofline
    assert r is not None
    text = Text()
    text.append("Roofline ", style="bold")
    text.append(f"({r.device or 'unknown device: no roofs'}) ")
    text.append(
        f"busy time {pct(r.compute_bound_share)} compute-bound, "
        f"{pct(r.bandwidth_bound_share)} bandwidth-bound, {unplaced(r)}; "
        f"{pct(r.costed_share)} of it has a cost model"
    )
    for label, value in (
        ("compute-bound kernels", r.pct_of_roof_compute),
        ("bandwidth-bound kernels", r.pct_of_roof_bandwidth),
    ):
        if value is not None:
            text.append(f"\n  {label} run at {pct(value)} of their roof (time-weighted)")
    if r.fp32_matmul_without_tensor_cores_share > 0:
        text.append(
            f"\n  {pct(r.fp32_matmul_without_tensor_cores_share)} of busy time "
            f"({r.fp32_matmul_without_tensor_cores_s * 1e3:.2f} ms/step) is fp32 matmul on "
            f"kernels without tensor cores: {tensor_core_fix(d)}",
            style="bold",
        )
    for line in roofline_notes(r):
        text.append(f"\n  {line}")
    table = Table(title="Top ops on the roofline", title_justify="left", show_edge=False)
    table.add_column("op and input shapes", overflow="ellipsis", no_wrap=True, max_width=34)
    table.add_column("dtype", no_wrap=True, min_width=5)
    table.add_column("ms/step", justify="right", no_wrap=True, min_width=7)
    table.add_column("AI", justify="right", no_wrap=True, min_width=6)
    table.add_column("achieved", justify="right", no_wrap=True, min_width=12)
    table.add_column("bound", no_wrap=True, min_width=9)
    table.add_column("of roof", justify="right", no_wrap=True, min_width=7)
    steps = max(d.steps.count, 1)
    for o in r.ops:
        # The rate of the roof the op is under: FLOP/s when compute-bound, bytes/s otherwise.
        compute = o.bound == "compute" or (o.bound is None and o.flops > 0)
        table.add_row(
            Text(f"{o.name} {o.shapes.replace(' ', '')}"),
            o.dtype,
            f"{o.time_s * 1e3 / steps:.2f}",
            "?" if o.ai is None else f"{o.ai:.3g}",
            si(o.achieved_flops, "FLOP/s") if compute else si(o.achieved_bandwidth, "B/s"),
            o.bound or "?",
            "?" if o.pct_of_roof is None else pct(o.pct_of_roof),
        )
    return Group(text, table)


def _fusion(d: Diagnosis) -> Table:
    table = Table(
        title="Fusion candidates (repeated runs of memory-bound kernels; saving is an upper bound)",
        title_justify="left",
        show_edge=False,
    )
    table.add_column("kernels", overflow="ellipsis", no_wrap=True, max_width=34)
    table.add_column("ops", overflow="ellipsis", no_wrap=True, max_width=18)
    table.add_column("runs/step", justify="right", no_wrap=True, min_width=9)
    table.add_column("ms/step", justify="right", no_wrap=True, min_width=7)
    table.add_column("saves ≤ ms", justify="right", no_wrap=True, min_width=10)
    for c in d.fusion:
        table.add_row(
            Text(" → ".join(short_kernel(k) for k in c.kernels)),
            Text(", ".join(c.ops) or "?"),
            f"{c.occurrences_per_step:.0f}",
            f"{c.time_s * 1e3:.2f}",
            f"{c.max_saving_s * 1e3:.2f}",
        )
    return table


def _what_if(d: Diagnosis) -> Group:
    """The what-if table, then the critical path in a paragraph of the page's width (a table
    caption would wrap at the narrow table's)."""
    title = Text("What if (the step's dependency graph replayed with each fix; estimates)")
    table = Table(show_edge=False)
    table.add_column("fix", no_wrap=True)
    table.add_column("step", justify="right", no_wrap=True)
    table.add_column("speed-up", justify="right", no_wrap=True)
    table.add_column("wall after", no_wrap=True)
    for row in what_if_cells(d):
        table.add_row(*row)
    return Group(title, table, Text(critical_path_line(d)))


def _mfu(d: Diagnosis) -> Text:
    m = d.mfu
    text = Text()
    text.append("MFU ", style="bold")
    if m.value is None:
        text.append(f"unknown — {m.basis}")
    else:
        text.append(
            f"{pct(m.value)} ({si(m.achieved_flops, 'FLOP/s')} of "
            f"{si(m.peak_flops, 'FLOP/s')} {m.dtype} peak) — {m.basis}"
        )
    return text


def _ranks(d: Diagnosis) -> Table:
    table = Table(title="Ranks", title_justify="left", show_edge=False)
    job = d.job is not None
    columns = ["rank", "file", "steps", "median ms", "compute"]
    columns += ["comm exp.", "wait ms", "last", "clock ms"] if job else ["idle", "wall"]
    memory = ranks_have_memory(d)
    if memory:
        columns.append("peak mem")
    longest = max((len(r.source) for r in d.ranks), default=4)
    for col in [*columns, "cause"]:
        if col == "file":
            table.add_column(col, no_wrap=True, min_width=min(longest, 40))
        elif col == "peak mem":
            table.add_column(col, no_wrap=True, justify="right")
        else:
            table.add_column(col, overflow="fold")
    for r in d.ranks:
        cells: list[str | Text] = [
            "?" if r.rank is None else str(r.rank),
            Text(r.source),
            str(r.steps),
            ms(r.median_step_s),
            pct(r.compute),
        ]
        if job:
            cells += [
                pct(r.comm_exposed),
                "?" if r.wait_s is None else ms(r.wait_s),
                "?" if r.late_share is None else f"{r.late_share:.0%}",
                "?" if r.clock_offset_s is None else f"{r.clock_offset_s * 1e3:+.3f}",
            ]
        else:
            cells += [pct(r.idle), r.wall]
        if memory:
            cells.append(size(r.peak_allocated))
        cells.append(cause_label(r.wall, r.cause))
        table.add_row(*cells)
    return table


def _job(d: Diagnosis) -> Iterator[RenderableType]:
    yield Text("\n".join(job_lines(d)))
    rows = collective_cells(d)
    if rows:
        j = d.job
        link = (
            ""
            if j is None or j.link is None
            else f" (link: {j.link}, {si(j.link_peak, 'B/s')} each way)"
        )
        table = Table(
            title=f"Collectives (per kind and size, whole trace){link}",
            title_justify="left",
            show_edge=False,
        )
        for col in COLLECTIVE_COLUMNS:
            table.add_column(col)
        for row in rows:
            table.add_row(*row)
        yield table


def render_text(d: Diagnosis, *, width: int | None = None, color: bool = False) -> str:
    """The terminal report as plain text (or with ANSI colour)."""
    return print_parts(renderables(d), width=width, color=color)


def render_steps(s: Steps, *, width: int | None = None) -> str:
    """Step times alone (the step timer's result) as plain text."""
    title = Text(f"wallfinder: step times ({s.source})", style="bold")
    return print_parts([title, step_text(s)], width=width, color=False)


def print_parts(parts: Iterable[RenderableType], *, width: int | None, color: bool) -> str:
    """`parts` printed one after another, a blank line between them, as text."""
    buffer = io.StringIO()
    console = Console(
        file=buffer,
        width=width or 100,
        force_terminal=color,
        no_color=not color,
        highlight=False,
        soft_wrap=False,
    )
    for part in parts:
        console.print(part)
        console.print()
    return buffer.getvalue()


def to_html(d: Diagnosis) -> str:
    """The terminal report as an HTML fragment (for notebooks)."""
    console = Console(record=True, file=io.StringIO(), width=110, highlight=False)
    for part in renderables(d):
        console.print(part)
    return console.export_html(inline_styles=True, code_format="<pre>{code}</pre>")
