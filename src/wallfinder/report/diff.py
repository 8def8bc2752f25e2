"""Reports of a `DiagnosisDiff` (`wallfinder diff`): the terminal form and Markdown. Every
figure comes from the diff; this module only formats."""

from __future__ import annotations

from collections.abc import Iterator

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from wallfinder.diagnosis import DiagnosisDiff, PartChange
from wallfinder.report import _format as fmt

__all__ = ["render_diff_markdown", "render_diff_text", "verdict_line"]

_PARTS = {
    "compute": "compute",
    "comm_exposed": "exposed communication",
    "copy_exposed": "exposed copies",
    "idle": "idle",
}
_KIND = {"op": "op", "kernel": "kernel", "cpu_op": "CPU op"}
_STATUS_ORDER = ("resolved", "new", "remaining")


def part_label(part: str) -> str:
    """A breakdown row of the diff in words (`idle:<cause>` rows are idle causes)."""
    if part.startswith("idle:"):
        return "  " + fmt.IDLE_LABEL.get(part[5:], part[5:].replace("_", " "))
    return _PARTS.get(part, part)


def verdict_line(x: DiagnosisDiff) -> str:
    """The verdict change in one sentence."""
    v = x.verdict
    before = f"{v.before_wall} ({_flat(fmt.cause_label(v.before_wall, v.before_cause))})"
    after = f"{v.after_wall} ({_flat(fmt.cause_label(v.after_wall, v.after_cause))})"
    if not v.moved:
        return f"the wall did not move: {before}"
    return f"the wall moved from {before} to {after}"


def _flat(label: str) -> str:
    """A label without its own parentheses, to sit inside ours."""
    return label.replace(" (", ", ").replace(")", "")


def step_line(x: DiagnosisDiff) -> str:
    s = x.steps
    faster = ""
    if s.speedup is not None and s.change_s != 0:
        faster = (
            f", {s.speedup:.2f}x faster" if s.speedup >= 1 else f", {1 / s.speedup:.2f}x slower"
        )
    return (
        f"{fmt.ms(s.before_s)} ms → {fmt.ms(s.after_s)} ms ({s.change * 100:+.1f}%{faster}) — "
        f"{s.note}"
    )


def mfu_line(x: DiagnosisDiff) -> str:
    m = x.mfu
    if m.change is None:
        return (
            f"{fmt.pct(m.before)} → {fmt.pct(m.after)} (not comparable: "
            f"before {m.basis_before}; after {m.basis_after})"
        )
    return f"{fmt.pct(m.before)} → {fmt.pct(m.after)} ({m.change * 100:+.1f} points)"


def match_lines(x: DiagnosisDiff) -> list[str]:
    return [
        f"{_KIND[m.kind]}s: {m.matched} matched by name"
        + (" and shapes" if m.kind == "op" else "")
        + f", {m.before_only} only before, {m.after_only} only after (of each run's listed rows)"
        for m in x.matches
    ]


def _shown_parts(x: DiagnosisDiff) -> list[PartChange]:
    """The breakdown rows, leaving out idle causes that are zero on both sides."""
    return [p for p in x.breakdown if not p.part.startswith("idle:") or p.before or p.after]


# Terminal -----------------------------------------------------------------------------------


def render_diff_text(x: DiagnosisDiff, *, width: int | None = None, color: bool = False) -> str:
    """The diff as the terminal shows it (plain text unless `color`)."""
    from wallfinder.report.terminal import print_parts

    return print_parts(renderables(x), width=width, color=color)


def renderables(x: DiagnosisDiff) -> Iterator[RenderableType]:
    head = Text()
    head.append("wallfinder diff", style="bold")
    head.append(f" · {x.before_source} → {x.after_source}")
    head.append(
        f"\ndevice: {x.before_device or 'unknown'} → {x.after_device or 'unknown'}", style="dim"
    )
    yield head
    body = Text()
    body.append("Step time ", style="bold")
    body.append(step_line(x))
    body.append("\nWall ", style="bold")
    body.append(verdict_line(x))
    yield body
    yield _breakdown_table(x)
    if x.findings:
        yield _findings_table(x)
    if x.moved:
        yield _moved_table(x)
    lines = [*match_lines(x), f"MFU {mfu_line(x)}"]
    yield Text("\n".join(lines))
    if x.notes:
        yield Text("\n".join(f"note: {n}" for n in x.notes), style="dim")


def _breakdown_table(x: DiagnosisDiff) -> Table:
    t = Table(title="Breakdown (share of the step, ms per step)", title_justify="left")
    for col in ("part", "before", "after", "change", "before ms", "after ms"):
        t.add_column(col, justify="left" if col == "part" else "right")
    for p in _shown_parts(x):
        t.add_row(
            part_label(p.part),
            fmt.pct(p.before),
            fmt.pct(p.after),
            f"{(p.after - p.before) * 100:+.1f} pts",
            fmt.ms(p.before_s),
            fmt.ms(p.after_s),
        )
    return t


def _findings_table(x: DiagnosisDiff) -> Table:
    t = Table(title="Findings", title_justify="left")
    for col in ("status", "finding", "share before", "share after"):
        t.add_column(col, justify="right" if col.startswith("share") else "left")
    for f in x.findings:
        t.add_row(
            f.status,
            Text(f"{f.id}: {f.title}"),
            "—" if f.share_before is None else fmt.pct(f.share_before),
            "—" if f.share_after is None else fmt.pct(f.share_after),
        )
    return t


def _moved_table(x: DiagnosisDiff) -> Table:
    t = Table(title="Moved most (ms per step)", title_justify="left")
    for col in ("kind", "name", "before", "after", "change"):
        t.add_column(col, justify="right" if col in ("before", "after", "change") else "left")
    for m in x.moved:
        name = fmt.ellipsize(fmt.short_kernel(m.name) if m.kind == "kernel" else m.name, 40)
        if m.shapes:
            name += " " + fmt.ellipsize(m.shapes, 30)
        t.add_row(
            _KIND[m.kind],
            Text(name),
            fmt.ms(m.before_s),
            fmt.ms(m.after_s),
            f"{m.change_s * 1e3:+.2f}",
        )
    return t


# Markdown -----------------------------------------------------------------------------------


def _md_part(part: str) -> str:
    from wallfinder.report.markdown import text

    return ("↳ " if part.startswith("idle:") else "") + text(part_label(part).strip())


def render_diff_markdown(x: DiagnosisDiff) -> str:
    """The diff as a Markdown summary for a pull-request comment."""
    from wallfinder.report.markdown import code, text

    out = [
        f"### wallfinder diff: {text(verdict_line(x))}",
        "",
        f"{code(x.before_source)} → {code(x.after_source)} · device "
        f"{text(x.before_device or 'unknown')} → {text(x.after_device or 'unknown')}",
        "",
        f"**Step time** {text(step_line(x))}",
        "",
        "| part | before | after | change | before ms | after ms |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    out += [
        f"| {_md_part(p.part)} | {fmt.pct(p.before)} | {fmt.pct(p.after)} | "
        f"{(p.after - p.before) * 100:+.1f} pts | {fmt.ms(p.before_s)} | {fmt.ms(p.after_s)} |"
        for p in _shown_parts(x)
    ]
    if x.findings:
        out += ["", "| status | finding | share before | share after |", "|---|---|---:|---:|"]
        out += [
            f"| {f.status} | {code(f.id, table=True)} {text(f.title)} | "
            f"{'—' if f.share_before is None else fmt.pct(f.share_before)} | "
            f"{'—' if f.share_after is None else fmt.pct(f.share_after)} |"
            for f in x.findings
        ]
    if x.moved:
        out += [
            "",
            "| kind | name | before ms | after ms | change ms |",
            "|---|---|---:|---:|---:|",
        ]
        out += [
            f"| {_KIND[m.kind]} | {code(m.name, table=True)}"
            + (f" {code(m.shapes, table=True)}" if m.shapes else "")
            + f" | {fmt.ms(m.before_s)} | {fmt.ms(m.after_s)} | {m.change_s * 1e3:+.2f} |"
            for m in x.moved
        ]
    out += ["", *(f"- {text(line)}" for line in match_lines(x))]
    out += [f"- **MFU** {text(mfu_line(x))}"]
    if x.notes:
        out += ["", *(f"- _note:_ {text(n)}" for n in x.notes)]
    out += ["", f"<sub>wallfinder · {x.schema}</sub>", ""]
    return "\n".join(out)
