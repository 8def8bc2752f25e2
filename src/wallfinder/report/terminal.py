"""The terminal report: the verdict first, then the numbers that decided it."""

from __future__ import annotations

import io
import re
from collections.abc import Callable, Iterable, Iterator, Sequence

import msgspec
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.panel import Panel
from rich.text import Text

from wallfinder.diagnosis import Calculation, Diagnosis, KernelRow, OpRow, Steps
from wallfinder.report._compiled import compiled_head, compiled_lines
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
    roof_lines,
    roofline_notes,
    roofline_summary,
    short_kernel,
    si,
    size,
    tensor_core_fix,
    verdict_label,
    what_if_cells,
)
from wallfinder.report._parallel import parallelism_head, parallelism_lines
from wallfinder.report._serving import serving_head, serving_lines
from wallfinder.report._table import Col, Row, fit_table

DEFAULT_WIDTH = 100
"""The columns a text report is laid out at when no width is given (the CLI gives $COLUMNS, or
the terminal's)."""

_WALL_STYLE = {"compute": "bold green", "bandwidth": "bold yellow", "overhead": "bold red"}


def renderables(d: Diagnosis) -> Iterator[RenderableType]:
    """The report's parts in order; a part with nothing to show is left out (a table without
    rows is never drawn)."""
    return (part for part in _parts(d) if part is not None)


def _parts(d: Diagnosis) -> Iterator[RenderableType | None]:
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
        yield from _cpu_ops(d)
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
    if d.parallelism is not None:
        yield _parallelism(d)
    if d.compiled is not None:
        yield _compiled(d)
    if d.serving is not None:
        yield _serving(d)
    if d.counters is not None:
        from wallfinder.report.counters import counter_parts

        yield from counter_parts(d.counters)
    if d.not_computed:
        yield Text("\n".join(not_computed_lines(d)), style="yellow")
    if d.warnings:
        yield Text("\n".join(f"note: {w}" for w in d.warnings), style="dim")


def _header(d: Diagnosis) -> ByWidth:
    return ByWidth(lambda width: _header_text(d, width))


def _header_text(d: Diagnosis, width: int) -> Text:
    """What was analysed, in pieces joined by " · ": a piece that does not fit on the line
    starts the next one (a line break inside "(device 2)" would read as two facts)."""
    device = device_label(d)
    if d.device.kind == "gpu" and d.device.index is not None:
        device += f" (device {d.device.index})"
    pieces = [d.source, device]
    if d.rank is not None:
        pieces.append(f"rank {d.rank}" + (f" of {d.world_size}" if d.world_size else ""))
    pieces.append(f"{d.steps.total} steps ({d.steps.source})")
    text = Text()
    text.append("wallfinder", style="bold")
    line = len("wallfinder")
    for piece in pieces:
        if line + 3 + cell_len(piece) <= width:
            text.append(f" · {piece}")
            line += 3 + cell_len(piece)
        else:
            text.append(f"\n  {piece}")
            line = 2 + cell_len(piece)
    if d.device.note:
        text.append(f"\n{d.device.note}", style="dim")
    return text


def _verdict(d: Diagnosis) -> Panel:
    v = d.verdict
    body = Text()
    body.append(f"{v.wall.upper()} wall", style=_WALL_STYLE[v.wall])
    body.append(f" — {verdict_label(v, d.breakdown.basis)}\n", style="bold")
    body.append(v.reason + "\n")
    if v.thin_evidence:
        body.append("confidence: low — " + "; ".join(v.thin_evidence) + "\n", style="yellow")
    for i, q in enumerate(v.questions, 1):
        mark = {"yes": "yes", "no": "NO", "unknown": "?"}[q.answer]
        body.append(f"\n{i}. {q.question} ")
        body.append(mark, style="bold" if q.answer == "no" else "")
        body.append(f" — {q.detail}", style="dim")
    return Panel(Hanging(body), title="verdict", title_align="left")


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


def _steps(d: Diagnosis) -> Group:
    return Group(step_text(d.steps), ByWidth(lambda width: _bar(d, width)))


class ByWidth(msgspec.Struct, frozen=True):
    """A part drawn for the width it is printed at (a bar as long as the line allows)."""

    draw: Callable[[int], RenderableType]

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield hung(self.draw(options.max_width))


_HANG = re.compile(r" *(?:[•-] |\d+\. |note: )?")
"""What a wrapped line hangs under: its indent, and a bullet, number or "note:" after it."""


class Hanging(msgspec.Struct, frozen=True):
    """Text whose lines, where they wrap, go on under their first line's indent and bullet
    ("  evidence: ..." continues two columns in), not at the margin where they would read as
    a new item."""

    text: Text

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        for line in self.text.split("\n", allow_blank=True):
            indent = _HANG.match(line.plain)
            n = indent.end() if indent else 0
            if n == 0 or n > width // 3 or cell_len(line.plain) <= width:
                yield line
                continue
            for k, piece in enumerate(line[n:].wrap(console, width - n)):
                piece.rstrip()
                out = line[:n] if k == 0 else Text(" " * n)
                out.append_text(piece)
                yield out


def hung(part: RenderableType) -> RenderableType:
    """`part` with its text hanging under its indents (inside groups and panels too)."""
    if isinstance(part, Text):
        return Hanging(part)
    if isinstance(part, Group):
        return Group(*(hung(p) for p in part.renderables))
    return part


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


def _bar_width(width: int) -> int:
    """The bar's length on a line of `width`: BAR_WIDTH, less on a narrow terminal."""
    return max(min(BAR_WIDTH, width - 4), 10)


def _bar(d: Diagnosis, width: int) -> Text:
    """The step as one bar: compute, exposed communication, exposed copies, idle; its legend
    beside it, or under it where the line is too short for both."""
    b = d.breakdown
    shares = {
        "compute": b.compute,
        "comm_exposed": b.comm_exposed,
        "copy_exposed": b.copy_exposed,
        "idle": b.idle,
    }
    bar = _bar_width(width)
    cells = {k: round(v * bar) for k, v in shares.items()}
    text = Text("  ")
    for key, char, style in _BAR_PARTS:
        text.append(char * cells[key], style=style)
    legend = "  ".join(
        f"{char} {key.replace('_exposed', '').replace('_', ' ')} {pct(shares[key])}"
        for key, char, _ in _BAR_PARTS
        if shares[key] > 0
    )
    beside = len(text) + 2 + len(legend) <= width
    text.append("  " if beside else "\n  ")
    text.append(legend, style="dim")
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


def _phases(d: Diagnosis) -> ByWidth:
    return ByWidth(lambda width: _phase_text(d, width))


def _phase_text(d: Diagnosis, width: int) -> Text:
    """The step by phase as one bar (exposed time), with each phase's device time."""
    assert d.phases is not None
    p = d.phases
    step_ms = d.breakdown.per_step_ms["step"]
    text = Text("Step by phase (steady state, exposed time; the bar is the step)\n  ")
    for key, share, _ in phase_parts(d):
        char, style = _PHASE_STYLE[key]
        text.append(char * round(share * _bar_width(width)), style=style)
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


def _modules(d: Diagnosis) -> RenderableType | None:
    assert d.modules is not None
    m = d.modules
    # A repeated block's spread and slowest instance go under its row when the columns do not
    # fit (most rows have none).
    name, *figures, spread, slowest = MODULE_COLUMNS
    columns = [
        Col(name, justify="left", name=True, min_width=12),
        *(Col(h) for h in figures),
        Col(spread, spare=1),
        Col(slowest, justify="left", spare=1),
    ]
    caption = ""
    if len(m.rows) > MODULE_TOP or m.unattributed_s > 0:
        caption = (
            f"{len(m.rows) - MODULE_TOP} more rows in the JSON and HTML reports; "
            if len(m.rows) > MODULE_TOP
            else ""
        ) + f"{ms(m.unattributed_s)} ms/step of {_busy_word(d)} time is in no module"
    return fit_table(
        f"Time per module ({_busy_word(d)} time per step; {m.note})",
        columns,
        [Row(module_cells(r)) for r in m.rows[:MODULE_TOP]],
        caption=caption,
    )


def _breakdown(d: Diagnosis) -> RenderableType | None:
    b = d.breakdown
    step_ms = b.per_step_ms["step"]
    cpu = b.basis == "cpu"
    rows = [
        Row([part_label(d, part), pct(share), f"{share * step_ms:.2f}"])
        for part, share in breakdown_parts(d)
    ]
    rows += [
        Row([f"  └ {idle_label(d, cause)}", pct(share), f"{share * step_ms:.2f}"], style="dim")
        for cause, share in idle_causes(d)
        if cause in CPU_IDLE_LABEL or not cpu
    ]
    rows.append(Row(["step (mean)", "100.0%", f"{step_ms:.2f}"], style="bold"))
    return fit_table(
        ("CPU" if cpu else "GPU") + " time per step (steady state)",
        [
            Col("part", justify="left", name=True, min_width=24, lines=2),
            Col("share"),
            Col("ms/step"),
        ],
        rows,
        caption=graph_line(d),
    )


def _memory(d: Diagnosis) -> Iterator[RenderableType | None]:
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
    table = fit_table(
        "Live at the peak by category",
        [
            Col("category", justify="left", name=True, min_width=20, lines=2),
            Col("bytes"),
            Col("share"),
        ],
        [
            Row([label, size(nbytes), pct(share)])
            for _, label, nbytes, share in memory_categories(m)
        ],
    )
    yield text if table is None else Group(text, table)
    yield fit_table(
        "Live at the peak by call site",
        [
            Col("call site", justify="left", name=True, min_width=24),
            Col("category", justify="left", spare=1),
            Col("bytes"),
            Col("blocks"),
        ],
        [
            Row(
                [
                    s.site,
                    MEMORY_CATEGORY_LABEL.get(s.category, s.category),
                    size(s.bytes),
                    str(s.count),
                ]
            )
            for s in m.sites[:MEMORY_TOP_SITES]
        ],
    )
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


def _classes(d: Diagnosis) -> RenderableType | None:
    return _class_table("GPU time by kernel class", "share of GPU time", d)


def _kernels(d: Diagnosis) -> RenderableType | None:
    return _name_table("Top kernels by GPU time", "kernel", d.kernels, d, short_kernel)


def _cpu_ops(d: Diagnosis) -> Iterator[RenderableType | None]:
    assert d.cpu is not None
    yield _class_table("CPU op time by class", "share of op time", d)
    yield _name_table("Top CPU ops (top-level)", "op", d.cpu.top_ops, d)


def _class_table(title: str, share_label: str, d: Diagnosis) -> RenderableType | None:
    steps = max(d.steps.count, 1)
    return fit_table(
        title,
        [Col("class", justify="left"), Col(share_label), Col("ms/step")],
        [Row([c.cls, pct(c.share), f"{c.time_s * 1e3 / steps:.2f}"]) for c in d.classes],
    )


def _name_table(
    title: str,
    what: str,
    rows: Sequence[KernelRow | OpRow],
    d: Diagnosis,
    shorten: Callable[[str], str] | None = None,
) -> RenderableType | None:
    steps = max(d.steps.count, 1)
    return fit_table(
        title,
        [
            Col(what, justify="left", name=True, min_width=24, shorten=shorten),
            Col("class", justify="left"),
            Col("calls"),
            Col("share"),
            Col("ms/step"),
        ],
        [
            Row([r.name, r.cls, str(r.count), pct(r.share), f"{r.time_s * 1e3 / steps:.2f}"])
            for r in rows
        ],
    )


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


def _roofline(d: Diagnosis) -> RenderableType:
    r = d.roofline
    assert r is not None
    text = Text()
    text.append("Roofline ", style="bold")
    text.append(f"({r.device or 'unknown device: no roofs'}) ")
    text.append(roofline_summary(r))
    for line in roof_lines(r, matmul=False):
        text.append(f"\n  {line}")
    if r.fp32_matmul_without_tensor_cores_share > 0:
        text.append(
            f"\n  {pct(r.fp32_matmul_without_tensor_cores_share)} of busy time "
            f"({r.fp32_matmul_without_tensor_cores_s * 1e3:.2f} ms/step) is fp32 matmul on "
            f"kernels without tensor cores: {tensor_core_fix(d)}",
            style="bold",
        )
    for line in roofline_notes(r):
        text.append(f"\n  {line}")
    steps = max(d.steps.count, 1)
    rows = []
    for o in r.ops:
        # The rate of the roof the op is under: FLOP/s when compute-bound, bytes/s otherwise.
        compute = o.bound == "compute" or (o.bound is None and o.flops > 0)
        rows.append(
            Row(
                [
                    o.name,
                    # Some traces record shapes pretty-printed, over many lines.
                    "".join(o.shapes.split()),
                    o.dtype,
                    f"{o.time_s * 1e3 / steps:.2f}",
                    "?" if o.ai is None else f"{o.ai:.3g}",
                    si(o.achieved_flops, "FLOP/s") if compute else si(o.achieved_bandwidth, "B/s"),
                    o.bound or "?",
                    "?" if o.pct_of_roof is None else pct(o.pct_of_roof),
                ]
            )
        )
    table = fit_table(
        "Top ops on the roofline",
        [
            Col("op", justify="left", name=True, min_width=20),
            # Shapes, then the dtype and bound, go under their op's row on a narrow terminal.
            Col("input shapes", justify="left", name=True, min_width=20, spare=2),
            Col("dtype", justify="left", spare=1),
            Col("ms/step"),
            Col("AI"),
            Col("achieved"),
            Col("bound", justify="left", spare=1),
            Col("of roof"),
        ],
        rows,
    )
    return text if table is None else Group(text, table)


def _fusion(d: Diagnosis) -> RenderableType | None:
    return fit_table(
        "Fusion candidates (repeated runs of memory-bound kernels; saving is an upper bound)",
        [
            Col("kernels", justify="left", name=True, min_width=24),
            Col("ops", justify="left", name=True, min_width=18, spare=1),
            Col("runs/step"),
            Col("ms/step"),
            Col("saves ≤ ms"),
        ],
        [
            Row(
                [
                    " → ".join(short_kernel(k) for k in c.kernels),
                    ", ".join(c.ops) or "?",
                    f"{c.occurrences_per_step:.0f}",
                    f"{c.time_s * 1e3:.2f}",
                    f"{c.max_saving_s * 1e3:.2f}",
                ]
            )
            for c in d.fusion
        ],
    )


def _what_if(d: Diagnosis) -> Group:
    """The what-if table, then the critical path in a paragraph of the page's width."""
    parts: list[RenderableType] = []
    table = fit_table(
        "What if (the step's dependency graph replayed with each fix; estimates)",
        [
            Col("fix", justify="left"),
            Col("step"),
            Col("speed-up"),
            Col("wall after", justify="left"),
        ],
        [Row(row) for row in what_if_cells(d)],
    )
    if table is not None:
        parts.append(table)
    parts.append(Text(critical_path_line(d)))
    return Group(*parts)


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


def _ranks(d: Diagnosis) -> RenderableType | None:
    job = d.job is not None
    columns = [
        Col("rank", justify="left"),
        Col("file", justify="left", name=True, min_width=12),
        Col("steps"),
        Col("median ms"),
        Col("compute"),
    ]
    if job:
        columns += [Col("comm exp."), Col("wait ms"), Col("last"), Col("clock ms", spare=1)]
    else:
        columns += [Col("idle"), Col("wall", justify="left")]
    memory = ranks_have_memory(d)
    if memory:
        columns.append(Col("peak mem"))
    # The cause is a phrase: under each rank's row unless the page has room for it.
    columns.append(Col("cause", justify="left", spare=2))
    rows = []
    for r in d.ranks:
        cells = [
            "?" if r.rank is None else str(r.rank),
            r.source,
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
        rows.append(Row(cells))
    return fit_table("Ranks", columns, rows)


_COLLECTIVE_COLUMN = {
    "group": Col("group", justify="left", name=True, min_width=10, spare=2),
    "collective": Col("collective", justify="left", name=True, min_width=12),
    "bus bw": Col("bus bw", spare=1),
    "of link": Col("of link", spare=1),
}
"""How the collectives' columns give way on a narrow terminal (the rest are figures)."""


def _job(d: Diagnosis) -> Iterator[RenderableType | None]:
    yield Text("\n".join(job_lines(d)))
    j = d.job
    link = (
        ""
        if j is None or j.link is None
        else f" (link: {j.link}, {si(j.link_peak, 'B/s')} each way)"
    )
    yield fit_table(
        f"Collectives (per kind and size, whole trace){link}",
        [_COLLECTIVE_COLUMN.get(c, Col(c)) for c in COLLECTIVE_COLUMNS],
        [Row(row) for row in collective_cells(d)],
    )


def _parallelism(d: Diagnosis) -> Hanging:
    """The strategies and their evidence, each item's wrapped lines under its indent."""
    text = Text(parallelism_head(d), style="bold")
    for line in parallelism_lines(d):
        text.append(f"\n  {line}", style="")
    return Hanging(text)


def _compiled(d: Diagnosis) -> Hanging:
    """torch.compile's regions, kernels and counts, each item's wrapped lines indented."""
    text = Text(compiled_head(d), style="bold")
    for line in compiled_lines(d):
        text.append(f"\n  {line}", style="")
    return Hanging(text)


def _serving(d: Diagnosis) -> Hanging:
    """The serving iterations, decode's MBU and the host's time, each item indented."""
    text = Text(serving_head(d), style="bold")
    for line in serving_lines(d):
        text.append(f"\n  {line}", style="")
    return Hanging(text)


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
        width=width or DEFAULT_WIDTH,
        force_terminal=color,
        no_color=not color,
        highlight=False,
        soft_wrap=False,
    )
    for part in parts:
        # Never cropped: a part too wide for the page shows as too wide (and fails the tests)
        # instead of losing its last columns without a word.
        console.print(hung(part), crop=False)
        console.print()
    # rich pads wrapped text and tables with spaces to the width: none is kept at line ends.
    return "\n".join(line.rstrip() for line in buffer.getvalue().split("\n"))


def to_html(d: Diagnosis) -> str:
    """The terminal report as an HTML fragment (for notebooks)."""
    console = Console(record=True, file=io.StringIO(), width=110, highlight=False)
    for part in renderables(d):
        console.print(part)
    return console.export_html(inline_styles=True, code_format="<pre>{code}</pre>")
