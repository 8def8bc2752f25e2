"""The counters report (`wallfinder counters`, `analyze --counters`) as text: it renders the
`CounterReport` and computes nothing new (its HTML page is `html.render_counters_html`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from rich.console import RenderableType
from rich.text import Text

from wallfinder.diagnosis import CounterKernel, CounterReport
from wallfinder.report._format import short_kernel, si
from wallfinder.report._table import Col, Row, fit_table
from wallfinder.report.terminal import print_parts
from wallfinder.units import duration, pct, size

__all__ = ["counter_parts", "render_counters_text", "shell_lines"]


def _ratio(r: float | None) -> str:
    return "?" if r is None else f"{r:.2f}x"


def _span(values: list[float | None], show: Callable[[float | None], str]) -> str:
    """Launches' figures in one cell: the figure when they agree (as shown), else the least
    and the most of them, "0–2%"; "?" when none was measured."""
    known = sorted(v for v in values if v is not None)
    if not known:
        return "?"
    low, high = show(known[0]), show(known[-1])
    if low == high:
        return low + ("" if len(known) == len(values) else " (some ?)")
    # One unit for both ends: "3.07–4.10 µs", not "3.07 µs–4.10 µs".
    unit = "%" if low.endswith("%") else f" {low.rsplit(' ', 1)[1]}" if " " in low else ""
    if unit and high.endswith(unit):
        low = low.removesuffix(unit)
    return f"{low}–{high}"


def _groups(r: CounterReport) -> list[list[CounterKernel]]:
    """The profiled launches by kernel name as the table shows it (template arguments, which
    it cannot show, would split rows that read the same) and by bound (with its unit: dram,
    tensor; a latency bound's reasons vary by launch), in the order each was first seen."""
    groups: dict[tuple[str, str | None, str | None], list[CounterKernel]] = {}
    for k in r.kernels:
        unit = None if k.bound == "latency" else k.unit
        groups.setdefault((short_kernel(k.name), k.bound, unit), []).append(k)
    return list(groups.values())


def _bound(k: CounterKernel) -> str:
    return (k.bound or "?") + (f" ({k.unit})" if k.unit and k.bound != "latency" else "")


_KERNEL_COLUMNS = (
    Col("kernel", justify="left", name=True, min_width=20),
    Col("launches"),
    Col("time"),
    Col("SM"),
    Col("mem"),
    Col("DRAM", spare=1),
    Col("L2", spare=1),
    Col("L1", spare=1),
    Col("DRAM bytes", spare=2),
    Col("FLOP/s", spare=2),
    Col("AI", spare=2),
    Col("occ.", spare=1),
    Col("bound", justify="left"),
)
"""The per-kernel table's columns; on a narrow terminal the memory levels, rates and
occupancy go under each kernel's row."""


def _kernel_table(r: CounterReport) -> RenderableType | None:
    rows = []
    for g in _groups(r):
        k = g[0]

        def span(value: Callable[[CounterKernel], float | None], show: Callable[..., str]) -> str:
            return _span([value(x) for x in g], show)  # noqa: B023 (used at once, in the loop)

        rows.append(
            [
                short_kernel(k.name),
                str(sum(x.invocations for x in g)),
                span(lambda x: x.duration_s, duration),
                span(lambda x: x.sm_pct, lambda v: pct(v, 0)),
                span(lambda x: x.memory_pct, lambda v: pct(v, 0)),
                span(lambda x: x.dram_pct, lambda v: pct(v, 0)),
                span(lambda x: x.l2_pct, lambda v: pct(v, 0)),
                span(lambda x: x.l1_pct, lambda v: pct(v, 0)),
                span(lambda x: x.dram_bytes, size),
                span(lambda x: x.flops_per_s, lambda v: si(v, "FLOP/s")),
                span(lambda x: x.ai, lambda v: f"{v:.2f}"),
                span(lambda x: x.occupancy, lambda v: pct(v, 0)),
                _bound(k),
            ]
        )
    # A metric the export did not carry is no column (the note under the table names it).
    keep = [i for i, c in enumerate(_KERNEL_COLUMNS) if any(row[i] != "?" for row in rows)]
    missing = [c.heading for i, c in enumerate(_KERNEL_COLUMNS) if i not in keep]
    return fit_table(
        "per kernel, by counters (% of peak; FLOPs and AI measured; a range over its launches)",
        [_KERNEL_COLUMNS[i] for i in keep],
        [Row([row[i] for i in keep]) for row in rows],
        caption=f"not in the export: {', '.join(missing)}" if missing else "",
    )


def _check_table(r: CounterReport) -> RenderableType | None:
    return fit_table(
        "the roofline's estimate beside the counters",
        [
            Col("kernel", justify="left", name=True, min_width=20),
            Col("time", spare=1),
            Col("launches", spare=2),
            Col("estimate", justify="left"),
            Col("% of roof", spare=1),
            Col("counters", justify="left"),
            Col("FLOPs est/cnt", spare=3),
            Col("bytes est/cnt", spare=3),
            Col("status", justify="left"),
        ],
        [
            Row(
                [
                    short_kernel(c.kernel),
                    duration(c.time_s),
                    f"{c.launches} ({c.matched_by})",
                    c.estimated_bound or "?",
                    pct(c.pct_of_roof, 0),
                    (c.counter_bound or "?")
                    + (
                        f" ({c.counter_unit})"
                        if c.counter_unit and c.counter_bound != "latency"
                        else ""
                    ),
                    _ratio(c.flops_ratio),
                    _ratio(c.bytes_ratio),
                    c.status,
                ]
            )
            for c in r.checks
        ],
    )


def shell_lines(command: str, width: int = 88) -> str:
    """A command line broken into lines of at most `width` with backslash-newlines, so that
    it pastes into a shell as it is (the report's wrapping would break it): between words,
    and inside the `--metrics` list after a comma (that line's continuation starts at column
    0, since the shell joins the pieces into one word)."""
    pieces: list[str] = []  # each ends with the separator that follows it
    for word in command.split(" "):
        parts = word.split(",")
        pieces += [f"{p}," for p in parts[:-1]] + [f"{parts[-1]} "]
    lines: list[str] = []
    line = "  "
    for piece in pieces:
        if len(line) + len(piece) > width and line.strip():
            lines.append(line + "\\")
            line = "  " if line.endswith(" ") else ""
        line += piece
    lines.append(line.rstrip())
    return "\n".join(lines)


def counter_parts(r: CounterReport) -> Iterator[RenderableType]:
    """The report's parts, for its own page and for the end of a diagnosis."""
    yield Text(
        f"hardware counters: {r.source} ({r.page} page, {len(r.kernels)} launches)",
        style="bold",
    )
    if r.mismatch is not None:
        yield Text(r.mismatch, style="bold")
    checks = _check_table(r)
    if checks is not None:
        yield checks
        detail = [f"  {short_kernel(c.kernel)}: {c.detail}" for c in r.checks if c.detail]
        if detail:
            yield Text("\n".join(detail))
    if r.unmatched_kernels or r.checks:
        yield Text(
            f"matched {len(r.checks)} of the trace's top kernels; "
            f"{len(r.unmatched_kernels)} unmatched; "
            f"{r.unmatched_launches} profiled launches matched no kernel of the trace"
        )
    kernels = _kernel_table(r)
    if kernels is not None:
        yield kernels
    yield Text("\n".join(_reasons(r)), style="dim")
    if r.findings:
        lines = [Text("counter findings", style="bold")]
        lines += [
            Text(f"- {f.title}\n  evidence: {f.evidence}\n  fix: {f.fix}") for f in r.findings
        ]
        yield Text("\n").join(lines)
    if r.collect:
        yield Text(
            "collect the counters with (PROGRAM is your command):\n"
            + "\n".join(shell_lines(c) for c in r.collect)
        )
    if r.notes:
        yield Text("\n".join(f"note: {n}" for n in r.notes), style="dim")


def _reasons(r: CounterReport) -> list[str]:
    """Why each kernel is bound as it is: for a kernel launched several times, the reason of
    its longest launch (the one that costs the most), with the launches' ids."""
    lines = []
    for g in _groups(r):
        k = max(g, key=lambda x: x.duration_s or 0.0)
        ids = ", ".join(str(x.id) for x in g)
        which = f" (of {len(g)} launches, the longest: {k.id})" if len(g) > 1 else ""
        lines.append(
            f"  {ids} {short_kernel(k.name)}{which}: {k.reason}"
            + (f"; {k.unit}" if k.bound == "latency" and k.unit else "")
        )
    return lines


def render_counters_text(r: CounterReport, *, width: int | None = None) -> str:
    """The counters report as plain text."""
    return print_parts(counter_parts(r), width=width, color=False)
