"""The memory report (`wallfinder memory`) as text (rich) and Markdown: it renders the
`MemoryReport` and computes nothing new."""

from __future__ import annotations

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from wallfinder.diagnosis import MemoryPeak, MemoryReport, MemorySite
from wallfinder.report._format import memory_saving
from wallfinder.report.terminal import print_parts
from wallfinder.units import duration, size

__all__ = ["render_memory_markdown", "render_memory_text"]


def _categories(cats: dict[str, int]) -> str:
    return ", ".join(f"{name} {size(n)}" for name, n in cats.items() if n) or "none"


def _when(p: MemoryPeak) -> str:
    """When the peak came, from the recorded history's start ("" without time stamps)."""
    return "" if p.time_s is None else f", {duration(p.time_s)} into the recorded history"


def _site_table(title: str, sites: list[MemorySite]) -> Table:
    table = Table(title=title, title_justify="left", box=None, pad_edge=False)
    table.add_column("bytes", justify="right")
    table.add_column("count", justify="right")
    table.add_column("category")
    table.add_column("call site", overflow="fold")
    for s in sites:
        table.add_row(size(s.bytes), str(s.count), s.category, s.site)
    return table


def _parts(r: MemoryReport) -> list[RenderableType]:
    parts: list[RenderableType] = [Text(f"wallfinder memory: {r.source}", style="bold")]
    parts += [
        Text(
            f"device {d.device}: reserved {size(d.reserved)}, allocated {size(d.allocated)}, "
            f"cached free {size(d.free)} in {d.segments} segments (largest free block "
            f"{size(d.largest_free_block)})\n  live by category: {_categories(d.categories)}"
        )
        for d in r.devices
    ]
    for p in r.peaks:
        when = _when(p)
        parts.append(
            Text(
                f"peak on device {p.device}: {size(p.bytes)} at event {p.index} of {p.events}"
                f"{when}\n  history start {size(p.start)}, end {size(p.end)} (growth "
                f"{size(p.growth)})\n  at the peak: {_categories(p.categories)}"
            )
        )
        if p.sites:
            parts.append(_site_table(f"live at the peak (device {p.device})", p.sites))
    if r.sites:
        parts.append(_site_table("live at the snapshot, by call site", r.sites))
    if r.leaks:
        parts.append(
            Text(
                "kept across steps while memory grows (leak suspects):\n"
                + "\n".join(
                    f"  {size(s.bytes)} in {s.count} allocations over {s.steps} steps: {s.site}"
                    for s in r.leaks
                )
            )
        )
    parts += [
        Text(
            f"OOM on device {e.device} at event {e.index}: requested {size(e.requested)}, "
            f"{size(e.device_free)} free on the device",
            style="bold red",
        )
        for e in r.ooms
    ]
    if r.findings:
        lines = [Text("findings", style="bold")]
        lines += [
            Text(f"- {f.title} ({memory_saving(f)})\n  evidence: {f.evidence}\n  fix: {f.fix}")
            for f in r.findings
        ]
        parts.append(Text("\n").join(lines))
    else:
        parts.append(Text("findings: none"))
    if r.notes:
        parts.append(Text("\n".join(f"note: {n}" for n in r.notes), style="dim"))
    return parts


def render_memory_text(r: MemoryReport, *, width: int | None = None) -> str:
    """The memory report as plain text."""
    return print_parts(_parts(r), width=width, color=False)


def render_memory_markdown(r: MemoryReport) -> str:
    """The memory report as Markdown (a pull-request or issue comment)."""
    out = [f"## wallfinder memory: `{r.source}`", ""]
    if r.devices:
        out += ["| device | reserved | allocated | cached free | segments | largest free |"]
        out += ["|---:|---:|---:|---:|---:|---:|"]
        for d in r.devices:
            out.append(
                f"| {d.device} | {size(d.reserved)} | {size(d.allocated)} | {size(d.free)} "
                f"| {d.segments} | {size(d.largest_free_block)} |"
            )
        out.append("")
    for p in r.peaks:
        out.append(
            f"**Peak on device {p.device}:** {size(p.bytes)} at event {p.index} of {p.events}"
            f"{_when(p)} (growth over the history {size(p.growth)}); "
            f"{_categories(p.categories)}"
        )
        out.append("")
    sites = r.peaks[0].sites if r.peaks else r.sites
    if sites:
        out += ["| bytes | count | category | call site |", "|---:|---:|---|---|"]
        out += [f"| {size(s.bytes)} | {s.count} | {s.category} | `{s.site}` |" for s in sites]
        out.append("")
    out.append("### Findings")
    out += [
        f"- **{f.title}** ({memory_saving(f)}) — {f.evidence}. *Fix:* {f.fix}" for f in r.findings
    ] or ["- none"]
    out.append("")
    out += [f"_{n}_" for n in r.notes]
    return "\n".join(out) + "\n"
