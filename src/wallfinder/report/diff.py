"""Reports of a `DiagnosisDiff` (`wallfinder diff`): the terminal form, Markdown and one
self-contained HTML page (the report page's inlined plotly, script and Content-Security-Policy).
Every figure comes from the diff; this module only formats."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from wallfinder.diagnosis import BytesChange, DiagnosisDiff, MemoryChange, PartChange, StepChange
from wallfinder.report import _format as fmt
from wallfinder.units import kernel_labels, size

__all__ = [
    "memory_lines",
    "render_diff_html",
    "render_diff_markdown",
    "render_diff_text",
    "speed_text",
    "verdict_line",
]

_PARTS = {
    "compute": "compute",
    "comm_exposed": "exposed communication",
    "copy_exposed": "exposed copies",
    "idle": "idle",
}
_KIND = {"op": "op", "kernel": "kernel", "cpu_op": "CPU op"}
_STATUS_ORDER = ("resolved", "new", "remaining")
NAME_CHARS = 90
"""The longest name the HTML page shows in a cell (the whole name is its tooltip)."""
NAME_COLUMN = 71
"""The terminal's "moved most" name cell: an op's name (40) and shapes (30), or a kernel's."""
TOP_CATEGORIES = 3
"""Memory categories named in the text and Markdown forms (those that moved most)."""


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


def speed_text(s: StepChange) -> str:
    """The change of step time as a speed: "2.50x faster", "1.20x slower", "unchanged", or
    "—" when the step after took no time."""
    if s.speedup is None:
        return "—"
    if s.change_s == 0:
        return "unchanged"
    return f"{s.speedup:.2f}x faster" if s.speedup >= 1 else f"{1 / s.speedup:.2f}x slower"


def step_line(x: DiagnosisDiff) -> str:
    s = x.steps
    faster = ""
    if s.speedup is not None and s.change_s != 0:
        faster = ", " + speed_text(s)
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


def memory_lines(m: MemoryChange) -> list[str]:
    """The memory change in a few sentences: the peaks, the categories that moved most at the
    peak, the leak, and the memory findings by status."""
    moved = [c for c in m.categories if c.change_bytes][:TOP_CATEGORIES]
    categories = (
        "moved most at the peak: "
        + ", ".join(
            f"{c.category.replace('_', ' ')} {_signed_size(c.change_bytes)} "
            f"({size(c.before)} → {size(c.after)})"
            for c in moved
        )
        if moved
        else "no category moved at the peak"
    )
    by_status = {
        status: ", ".join(f.id for f in m.findings if f.status == status)
        for status in _STATUS_ORDER
    }
    findings = "; ".join(f"{status}: {ids}" for status, ids in by_status.items() if ids)
    reserved = [f"peak reserved {_bytes_line(m.peak_reserved)}"] if _has_reserved(m) else []
    return [
        f"peak allocated {_bytes_line(m.peak_allocated)}",
        *reserved,
        categories,
        leak_line(m),
        f"memory findings {findings}" if findings else "no memory findings before or after",
    ]


def _has_reserved(m: MemoryChange) -> bool:
    """Whether a reserved total was recorded (the CPU allocator reports none: 0 on both
    sides)."""
    return bool(m.peak_reserved.before or m.peak_reserved.after)


def leak_line(m: MemoryChange) -> str:
    """Whether allocated memory leaked (grew step over step) before and after."""
    before, after = _growth(m.growth_per_step_before), _growth(m.growth_per_step_after)
    if m.leak_before and not m.leak_after:
        return f"leak fixed: allocated memory grew {before} per step before, {after} after"
    if m.leak_before:
        return f"still leaking: allocated memory grows {before} per step before, {after} after"
    if m.leak_after:
        return f"new leak: allocated memory grows {after} per step after ({before} before)"
    return "no leak before or after"


def _growth(bytes_per_step: float | None) -> str:
    return "?" if bytes_per_step is None else size(bytes_per_step)


def _signed_size(n: int) -> str:
    return ("+" if n > 0 else "-" if n < 0 else "±") + size(abs(n))


def _bytes_line(b: BytesChange) -> str:
    """A change in bytes, e.g. "12.00 GiB → 8.00 GiB (-4.00 GiB, -33.3%)"."""
    if b.change_bytes == 0:
        return f"{size(b.before)} → {size(b.after)} (unchanged)"
    share = "" if b.change is None else f", {b.change * 100:+.1f}%"
    return f"{size(b.before)} → {size(b.after)} ({_signed_size(b.change_bytes)}{share})"


def moved_names(x: DiagnosisDiff) -> list[str]:
    """The name each row of `moved` shows: an op's whole; a kernel's short name, with the
    words that tell it from another kernel listed under the same short name (template
    instances, `elementwise_kernel<CUDAFunctor_add, float>`)."""
    kernels = iter(kernel_labels([m.name for m in x.moved if m.kind == "kernel"]))
    return [
        (next(kernels).removeprefix("at::native::") if m.kind == "kernel" else "") or m.name
        for m in x.moved
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
    if x.memory is not None:
        memory = Text()
        memory.append("Memory", style="bold")
        memory.append(f" {x.memory.device}\n" + "\n".join(memory_lines(x.memory)))
        yield memory
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
    for m, label in zip(x.moved, moved_names(x), strict=True):
        # A kernel has no shapes: its label takes their room too, so that the words telling
        # template instances apart stay in view.
        name = fmt.ellipsize(label, 40 if m.kind != "kernel" else NAME_COLUMN)
        if m.shapes:
            name += " " + fmt.ellipsize(m.shapes, NAME_COLUMN - 41)
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
    if x.memory is not None:
        out += ["", f"**Memory** {code(x.memory.device)}", ""]
        out += [f"- {text(line)}" for line in memory_lines(x.memory)]
    if x.notes:
        out += ["", *(f"- _note:_ {text(n)}" for n in x.notes)]
    out += ["", f"<sub>wallfinder · {x.schema}</sub>", ""]
    return "\n".join(out)


# HTML ---------------------------------------------------------------------------------------


def render_diff_html(x: DiagnosisDiff) -> str:
    """The diff as one self-contained HTML page."""
    from wallfinder.report._figures import WALL_COLOR
    from wallfinder.report.html import render_page

    return render_page(
        "diff.html",
        _figures(x),
        x=x,
        step=_step_view(x),
        verdict=_verdict_view(x),
        breakdown=_breakdown_rows(x),
        findings=_finding_rows(x),
        moved=_moved_rows(x),
        matches=match_lines(x),
        mfu=mfu_line(x),
        memory=_memory_view(x.memory),
        wall_color=WALL_COLOR,
    )


def _step_view(x: DiagnosisDiff) -> dict[str, Any]:
    s = x.steps
    speed = speed_text(s)
    judgement = "faster" if s.change_s < 0 else "slower"
    if s.within_noise:
        judgement = "within the noise"
    return {
        "before": fmt.ms(s.before_s),
        "after": fmt.ms(s.after_s),
        "change": f"{s.change_s * 1e3:+.2f} ms ({s.change * 100:+.1f}%)".replace("-", "−"),
        "speed": speed,
        "judgement": judgement,
        "noise": f"±{fmt.ms(s.noise_s)} ms",
        "cv": f"{fmt.pct(s.cv_before)} → {fmt.pct(s.cv_after)}",
        "note": s.note,
    }


def _verdict_view(x: DiagnosisDiff) -> dict[str, Any]:
    v = x.verdict
    return {
        "line": verdict_line(x),
        "before_cause": fmt.cause_label(v.before_wall, v.before_cause),
        "after_cause": fmt.cause_label(v.after_wall, v.after_cause),
    }


def _share(share: float | None) -> str:
    return "—" if share is None else fmt.pct(share)


def _breakdown_rows(x: DiagnosisDiff) -> list[dict[str, Any]]:
    return [
        {
            "label": part_label(p.part).strip(),
            "sub": p.part.startswith("idle:"),
            "before": fmt.pct(p.before),
            "after": fmt.pct(p.after),
            "change": f"{(p.after - p.before) * 100:+.1f} pts".replace("-", "−"),
            "before_ms": fmt.ms(p.before_s),
            "after_ms": fmt.ms(p.after_s),
        }
        for p in _shown_parts(x)
    ]


def _finding_rows(x: DiagnosisDiff) -> list[dict[str, Any]]:
    order = {status: i for i, status in enumerate(_STATUS_ORDER)}
    return [
        {
            "status": f.status,
            "status_v": order[f.status],
            "id": f.id,
            "title": f.title,
            "before": _share(f.share_before),
            "before_v": "" if f.share_before is None else f.share_before,
            "after": _share(f.share_after),
            "after_v": "" if f.share_after is None else f.share_after,
        }
        for f in x.findings
    ]


def _moved_rows(x: DiagnosisDiff) -> list[dict[str, Any]]:
    rows = []
    for m, name in zip(x.moved, moved_names(x), strict=True):
        rows.append(
            {
                "kind": _KIND[m.kind],
                "name": fmt.ellipsize(name, NAME_CHARS),
                "full": m.name,
                "shapes": "" if m.shapes is None else fmt.ellipsize(m.shapes, NAME_CHARS),
                "shapes_full": m.shapes or "",
                "before": fmt.ms(m.before_s),
                "before_v": m.before_s * 1e3,
                "after": fmt.ms(m.after_s),
                "after_v": m.after_s * 1e3,
                "change": f"{m.change_s * 1e3:+.2f}".replace("-", "−"),
                "change_v": m.change_s * 1e3,
            }
        )
    return rows


def _memory_view(m: MemoryChange | None) -> dict[str, Any] | None:
    if m is None:
        return None
    order = {status: i for i, status in enumerate(_STATUS_ORDER)}
    return {
        "device": m.device,
        "allocated": _bytes_line(m.peak_allocated).replace("-", "−"),
        "reserved": _bytes_line(m.peak_reserved).replace("-", "−") if _has_reserved(m) else None,
        "leak": leak_line(m),
        "categories": [
            {
                "label": c.category.replace("_", " "),
                "before": size(c.before),
                "before_v": c.before,
                "after": size(c.after),
                "after_v": c.after,
                "change": _signed_size(c.change_bytes).replace("-", "−"),
                "change_v": c.change_bytes,
            }
            for c in m.categories
        ],
        "findings": [
            {"status": f.status, "status_v": order[f.status], "id": f.id, "title": f.title}
            for f in m.findings
        ],
    }


def _figures(x: DiagnosisDiff) -> dict[str, Any]:
    """Grouped bars: each breakdown part and idle cause in ms per step, before and after
    (horizontal, so that the parts' names read whole)."""
    from wallfinder.report._figures import layout, plot_text

    parts = _shown_parts(x)
    labels = [
        plot_text(("↳ " if p.part.startswith("idle:") else "") + part_label(p.part).strip())
        for p in parts
    ]
    bars = [
        {
            "type": "bar",
            "orientation": "h",
            "name": name,
            "y": labels,
            "x": [getattr(p, name + "_s") * 1e3 for p in parts],
            "customdata": [fmt.pct(getattr(p, name)) for p in parts],
            "marker": {"color": color},
            "hovertemplate": f"{name}: %{{x:.2f}} ms per step (%{{customdata}} of the step)"
            "<extra></extra>",
        }
        for name, color in (("before", "#8c959f"), ("after", "#0969da"))
    ]
    return {
        "plot-breakdown": {
            "data": bars,
            "layout": layout(
                height=120 + 44 * len(parts),
                barmode="group",
                legend={"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 0},
                margin={"l": 60, "r": 16, "t": 32, "b": 48},
                xaxis={"title": {"text": "ms per step"}, "rangemode": "tozero"},
                yaxis={"type": "category", "autorange": "reversed"},
            ),
        }
    }
