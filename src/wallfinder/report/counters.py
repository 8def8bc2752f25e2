"""The counters report (`wallfinder counters`, `analyze --counters`) as text: it renders the
`CounterReport` and computes nothing new."""

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

__all__ = ["counter_parts", "render_counters_text"]


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


def counter_parts(r: CounterReport) -> Iterator[RenderableType]:
    """The report's parts, for its own page and for the end of a diagnosis."""
    yield Text(
        f"hardware counters: {r.source} ({r.page} page, {len(r.kernels)} launches)",
        style="bold",
    )
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
            + "\n".join(f"  {c}" for c in r.collect)
        )
    if r.notes:
        yield Text("\n".join(f"note: {n}" for n in r.notes), style="dim")


def render_counters_text(r: CounterReport, *, width: int | None = None) -> str:
    """The counters report as plain text."""
    return print_parts(counter_parts(r), width=width or 140, color=False)
