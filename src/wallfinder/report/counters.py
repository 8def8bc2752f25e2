"""The counters report (`wallfinder counters`, `analyze --counters`) as text: it renders the
`CounterReport` and computes nothing new (its HTML page is `html.render_counters_html`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from wallfinder.diagnosis import CounterReport
from wallfinder.report._format import short_kernel, si
from wallfinder.report.terminal import print_parts
from wallfinder.units import duration, pct, size

__all__ = ["counter_parts", "render_counters_text", "shell_lines"]


def _ratio(r: float | None) -> str:
    return "?" if r is None else f"{r:.2f}x"


def _kernel_table(r: CounterReport) -> Table:
    table = Table(
        title="per launch, by counters (% of peak; FLOPs and AI measured)",
        title_justify="left",
        box=None,
        pad_edge=False,
    )
    columns: tuple[tuple[str, Literal["left", "right"]], ...] = (
        ("id", "right"),
        ("kernel", "left"),
        ("time", "right"),
        ("SM", "right"),
        ("mem", "right"),
        ("DRAM", "right"),
        ("L2", "right"),
        ("L1", "right"),
        ("DRAM bytes", "right"),
        ("FLOP/s", "right"),
        ("AI", "right"),
        ("occ.", "right"),
        ("bound", "left"),
    )
    for col, just in columns:
        table.add_column(col, justify=just, overflow="fold" if col == "kernel" else "ellipsis")
    for k in r.kernels:
        bound = (k.bound or "?") + (f" ({k.unit})" if k.unit and k.bound != "latency" else "")
        table.add_row(
            str(k.id),
            short_kernel(k.name),
            duration(k.duration_s),
            pct(k.sm_pct, 0),
            pct(k.memory_pct, 0),
            pct(k.dram_pct, 0),
            pct(k.l2_pct, 0),
            pct(k.l1_pct, 0),
            size(k.dram_bytes),
            si(k.flops_per_s, "FLOP/s"),
            "?" if k.ai is None else f"{k.ai:.2f}",
            pct(k.occupancy, 0),
            bound,
        )
    return table


def _check_table(r: CounterReport) -> Table:
    table = Table(
        title="the roofline's estimate beside the counters",
        title_justify="left",
        box=None,
        pad_edge=False,
    )
    for col in (
        "kernel",
        "time",
        "launches",
        "estimate",
        "% of roof",
        "counters",
        "FLOPs est/cnt",
        "bytes est/cnt",
        "status",
    ):
        table.add_column(col, overflow="fold" if col == "kernel" else "ellipsis")
    for c in r.checks:
        table.add_row(
            short_kernel(c.kernel),
            duration(c.time_s),
            f"{c.launches} ({c.matched_by})",
            c.estimated_bound or "?",
            pct(c.pct_of_roof, 0),
            (c.counter_bound or "?")
            + (f" ({c.counter_unit})" if c.counter_unit and c.counter_bound != "latency" else ""),
            _ratio(c.flops_ratio),
            _ratio(c.bytes_ratio),
            c.status,
        )
    return table


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
    if r.checks:
        yield _check_table(r)
        detail = [f"  {short_kernel(c.kernel)}: {c.detail}" for c in r.checks if c.detail]
        if detail:
            yield Text("\n".join(detail))
    if r.unmatched_kernels or r.checks:
        yield Text(
            f"matched {len(r.checks)} of the trace's top kernels; "
            f"{len(r.unmatched_kernels)} unmatched; "
            f"{r.unmatched_launches} profiled launches matched no kernel of the trace"
        )
    yield _kernel_table(r)
    yield Text(
        "\n".join(
            f"  {k.id} {short_kernel(k.name)}: {k.reason}"
            + (f"; {k.unit}" if k.bound == "latency" and k.unit else "")
            for k in r.kernels
        ),
        style="dim",
    )
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


def render_counters_text(r: CounterReport, *, width: int | None = None) -> str:
    """The counters report as plain text."""
    return print_parts(counter_parts(r), width=width or 140, color=False)
