"""The HTML report: one self-contained page rendered from the Diagnosis alone.

Everything is inline (plotly.js once, the page's style and script, the figures as JSON): the
page opens from disk, offline, e-mailed or attached to a CI run, and no request leaves it. A
Content-Security-Policy says so to the browser too: no connection of any kind, and no script
but the page's own (allowed by their hashes).

Strings from the trace (kernel and op names, shapes, host events, the file name) reach the page
three ways, each escaped: as page text by the template engine (autoescape); as plot labels by
`plot_text`, since plotly reads a few HTML tags in them; and inside the figures' JSON, where
`_script_json` leaves no `<` that could close the script block.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterable
from functools import cache
from importlib import metadata, resources
from typing import Any

import jinja2
from markupsafe import Markup

from wallfinder.diagnosis import (
    CounterReport,
    Diagnosis,
    JobSummary,
    KernelRow,
    OpRoofRow,
    OpRow,
    StepTimeline,
)
from wallfinder.report import _format as fmt
from wallfinder.report._compiled import compiled_head, compiled_lines
from wallfinder.report._figures import (
    CLASS_COLOR,
    COUNTER_PLOT,
    IDLE_COLOR,
    IDLE_TOTAL_COLOR,
    MEMORY_COLOR,
    PART_COLOR,
    PHASE_COLOR,
    WALL_COLOR,
    counter_roofline_figure,
    diagnosis_figures,
)
from wallfinder.report._parallel import parallelism_head, parallelism_lines
from wallfinder.report._serving import serving_head, serving_lines

__all__ = ["render_html"]

TOP_GAPS = 10
"""Idle gaps of the timeline listed in the table beneath it (the longest)."""


def render_html(d: Diagnosis) -> str:
    """The report as one self-contained HTML page."""
    figures, context = report_context(d)
    return render_page("report.html", figures, webgl=_uses_webgl(figures), **context)


def report_context(d: Diagnosis) -> tuple[dict[str, Any], dict[str, Any]]:
    """The report's figures and what `report.html` shows, formatted from the diagnosis: the
    page above, and `wallfinder serve`'s views of a run, which frame the same template."""
    figures = diagnosis_figures(d)
    return figures, {
        "d": d,
        "v": _view(d, figures),
        "wall_color": WALL_COLOR,
        "cause_label": fmt.cause_label,
        "ranks_memory": fmt.ranks_have_memory(d),
        "counter_plot": COUNTER_PLOT in figures,
    }


def render_counters_html(r: CounterReport) -> str:
    """A counters report (`wallfinder counters`) as one self-contained HTML page: the card a
    diagnosis's page shows, alone, with the measured points on a roofline."""
    figures = {}
    points = counter_roofline_figure(r)
    if points is not None:
        figures[COUNTER_PLOT] = points
    return render_page("counters.html", figures, c=r, counter_plot=points is not None)


def render_page(
    template: str, figures: dict[str, Any], *, webgl: bool = False, **context: Any
) -> str:
    """One self-contained page from `template` (which extends `page.html`): the stylesheet,
    plotly and the page script inlined, `figures` as inert JSON, and the Content-Security-
    Policy that allows exactly those scripts. `context` is what the template shows."""
    plotly_js = _plotly_js()
    page_js = _asset("report.js")
    return (
        _environment()
        .get_template(template)
        .render(
            **context,
            csp=_csp((plotly_js, page_js), webgl=webgl),
            css=Markup(_asset("report.css")),
            plotly_js=Markup(plotly_js),
            page_js=Markup(page_js),
            figures=Markup(_script_json(figures)),
            version=_version(),
        )
    )


# Assets -----------------------------------------------------------------------------------------


def _asset(name: str) -> str:
    return (
        resources.files("wallfinder.report")
        .joinpath("templates")
        .joinpath(name)
        .read_text(encoding="utf-8")
    )


@cache
def _plotly_js() -> str:
    """plotly.js, as the plotly package ships it, made safe to inline in a script block."""
    from plotly.offline import get_plotlyjs

    js: str = get_plotlyjs()
    return _inline_script(js)


def _inline_script(js: str) -> str:
    """`js` with nothing that would end its script block or open an HTML comment in it (it
    has none today; `<\\/` and `<\\!` mean the same in JavaScript strings and regexes)."""
    for seq, safe in (("</script", "<\\/script"), ("</SCRIPT", "<\\/SCRIPT"), ("<!--", "<\\!--")):
        js = js.replace(seq, safe)
    return js


@cache
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(_asset),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        pct=fmt.pct,
        ms=fmt.ms,
        dur=fmt.duration,
        si=fmt.si,
        short=fmt.short_kernel,
        size=fmt.size,
    )
    return env


def _version() -> str:
    try:
        return metadata.version("wallfinder")
    except metadata.PackageNotFoundError:  # run from a source tree that is not installed
        return ""


def _csp(scripts: Iterable[str], *, webgl: bool = False) -> str:
    """The page's Content-Security-Policy: its own scripts (by hash) and inline styles, images
    only from data: and blob: URLs (plotly's PNG export), no connection, frame or form. WebGL
    plots need 'unsafe-eval' (plotly's WebGL layer, regl, compiles its drawing code at run
    time); no data from the trace is ever evaluated."""
    hashes = " ".join(
        "'sha256-" + base64.b64encode(hashlib.sha256(s.encode()).digest()).decode() + "'"
        for s in scripts
    )
    if webgl:
        hashes += " 'unsafe-eval'"
    return (
        f"default-src 'none'; script-src {hashes}; style-src 'unsafe-inline'; "
        "img-src data: blob:; font-src data:; base-uri 'none'; form-action 'none'"
    )


def _uses_webgl(figures: dict[str, Any]) -> bool:
    return any(
        str(trace.get("type", "")).endswith("gl")
        for figure in figures.values()
        for trace in figure["data"]
    )


def _script_json(value: object) -> str:
    """JSON for a `<script type="application/json">` block: no `<`, `>` or `&` that HTML
    could read, no line separators JavaScript could trip on."""
    text = json.dumps(value, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


# The view: what the template shows, formatted --------------------------------------------------


def _view(d: Diagnosis, figures: dict[str, Any]) -> dict[str, Any]:
    return {
        "title": fmt.title_line(d),
        "cause": fmt.verdict_label(d.verdict, d.breakdown.basis),
        "questions": [
            {
                "question": q.question,
                "answer": q.answer,
                "mark": {"yes": "yes", "no": "no", "unknown": "?"}[q.answer],
                "detail": q.detail,
            }
            for q in d.verdict.questions
        ],
        "finding_groups": [
            (label, group)
            for label, group in (
                ("", [f for f in d.findings if f.wall == d.verdict.wall]),
                ("Not your wall now", [f for f in d.findings if f.wall != d.verdict.wall]),
            )
            if group
        ],
        "breakdown": _breakdown_rows(d),
        "graph_line": fmt.graph_line(d),
        "critical_path_line": fmt.critical_path_line(d),
        "what_if": fmt.what_if_cells(d),
        "gaps": _gap_rows(d, d.timeline) if d.timeline else [],
        "roof_ops": [_op_row(d, o) for o in d.roofline.ops] if d.roofline else [],
        "roof_more": len(d.roofline.more_ops) if d.roofline else 0,
        "roof_lines": _roofline_lines(d),
        "roof_plot": "plot-roofline" in figures,
        "tensor_core_fix": fmt.tensor_core_fix(d),
        "classes": [
            {"cls": c.cls, "share": c.share, "ms": c.time_s * 1e3 / fmt.step_count(d)}
            for c in d.classes
        ],
        "names": _name_rows(d),
        "name_kind": "op" if d.cpu is not None else "kernel",
        "class_color": CLASS_COLOR,
        "job": _job_view(d.job) if d.job is not None else None,
        "parallelism_head": parallelism_head(d),
        "parallelism": parallelism_lines(d),
        "compiled_head": compiled_head(d),
        "compiled": compiled_lines(d),
        "serving_head": serving_head(d),
        "serving": serving_lines(d),
        "not_computed": fmt.not_computed_lines(d),
        "memory": _memory_view(d, figures),
        "phases": [
            {
                "label": fmt.PHASE_LABEL[k],
                "share": share,
                "ms": share * d.breakdown.per_step_ms["step"],
                "device_ms": None if busy is None else busy * 1e3,
                "color": PHASE_COLOR[k],
            }
            for k, share, busy in fmt.phase_parts(d)
        ],
        "module_columns": fmt.MODULE_COLUMNS,
        "modules": [
            {"depth": r.depth, "cells": [c.strip() for c in fmt.module_cells(r)]}
            for r in (d.modules.rows if d.modules else [])
        ],
    }


def _breakdown_rows(d: Diagnosis) -> list[dict[str, Any]]:
    b = d.breakdown
    step_ms = b.per_step_ms["step"]
    rows = []
    for part, share in fmt.breakdown_parts(d):
        rows.append(
            {
                "label": fmt.part_label(d, part),
                "share": share,
                "ms": share * step_ms,
                "sub": False,
                "color": PART_COLOR.get(part, IDLE_TOTAL_COLOR),
            }
        )
    for cause, share in fmt.idle_causes(d):
        rows.append(
            {
                "label": fmt.idle_label(d, cause),
                "share": share,
                "ms": share * step_ms,
                "sub": True,
                "color": IDLE_COLOR.get(cause, "#c7c7c7"),
            }
        )
    return rows


def _gap_rows(d: Diagnosis, t: StepTimeline) -> list[dict[str, Any]]:
    longest = sorted(t.gaps, key=lambda g: -(g.end_s - g.start_s))[:TOP_GAPS]
    return [
        {
            "start_ms": g.start_s * 1e3,
            "length": g.end_s - g.start_s,
            "causes": ", ".join(
                f"{fmt.idle_label(d, c)} {fmt.duration(s)}"
                for c, s in sorted(g.causes_s.items(), key=lambda kv: -kv[1])
            ),
            "host": g.host,
        }
        for g in longest
    ]


def _op_row(d: Diagnosis, o: OpRoofRow) -> dict[str, Any]:
    compute = o.bound == "compute" or (o.bound is None and o.flops > 0)
    return {
        "name": o.name,
        "shapes": o.shapes,
        "dtype": o.dtype,
        "cls": o.cls or "",
        "calls": o.calls,
        "ms": o.time_s * 1e3 / fmt.step_count(d),
        "ai": o.ai,
        "achieved": o.achieved_flops if compute else o.achieved_bandwidth,
        "achieved_text": fmt.si(o.achieved_flops, "FLOP/s")
        if compute
        else fmt.si(o.achieved_bandwidth, "B/s"),
        "bound": o.bound or "?",
        "pct": o.pct_of_roof,
        "kernels": [fmt.short_kernel(k) for k in o.kernels],
        "kernel_names": o.kernels,
    }


def _name_row(d: Diagnosis, r: OpRow | KernelRow) -> dict[str, Any]:
    """What an op's row and a kernel's row of the top-names table both show."""
    return {
        "name": r.name,
        "cls": r.cls,
        "count": r.count,
        "share": r.share,
        "ms": r.time_s * 1e3 / fmt.step_count(d),
    }


def _name_rows(d: Diagnosis) -> list[dict[str, Any]]:
    if d.cpu is not None:
        return [_name_row(d, r) for r in d.cpu.top_ops]
    return [
        {**_name_row(d, k), "ai": k.ai, "bound": k.bound, "pct": k.pct_of_roof} for k in d.kernels
    ]


def _job_view(j: JobSummary) -> dict[str, Any]:
    """The cross-rank summary, formatted: every figure is the JobSummary's own."""
    return {
        "cause": fmt.cause_label(j.wall, j.cause),
        "world": f"{j.ranks} of {j.world_size}" if j.world_size else str(j.ranks),
        "skew": None if j.max_clock_skew_s is None else fmt.duration(j.max_clock_skew_s),
        "link": None
        if j.link is None
        else j.link + (f", {fmt.si(j.link_peak, 'B/s')} each way" if j.link_peak else ""),
        "stragglers": [
            {
                "rank": s.rank,
                "late": fmt.pct(s.late_share, 0),
                "wait_ms": fmt.ms(s.wait_caused_s),
                "share": fmt.pct(s.share),
                "doing": s.doing,
            }
            for s in j.stragglers
        ],
        "collectives": [
            {
                "group": c.group,
                "name": c.name,
                "ranks": c.ranks,
                "count": c.count,
                "bytes": c.bytes,
                "size": "?" if c.bytes is None else fmt.si(float(c.bytes), "B"),
                "transfer_s": c.transfer_s,
                "wait_s": c.wait_s,
                "busbw": c.busbw,
                "busbw_text": fmt.si(c.busbw, "B/s"),
                "pct": c.pct_of_link,
            }
            for c in j.collectives
        ],
    }


def _memory_view(d: Diagnosis, figures: dict[str, Any]) -> dict[str, Any] | None:
    """The memory profile, formatted: every figure is the MemoryProfile's own."""
    m = d.main_memory
    if d.memory is None or m is None:
        return None
    return {
        "device": m.device,
        "peak": fmt.memory_peak(m),
        "capacity": fmt.memory_capacity(m),
        "when": fmt.memory_when(m),
        "plot": "plot-memory" in figures,
        "reserved": m.peak_reserved > 0,
        "steps": bool(m.steps),
        "categories": [
            {
                "label": label,
                "size": fmt.size(n),
                "share": share,
                "color": MEMORY_COLOR.get(c, "#8c8c8c"),
            }
            for c, label, n, share in fmt.memory_categories(m)
        ],
        "sites": [
            {
                "site": s.site,
                "category": fmt.MEMORY_CATEGORY_LABEL.get(s.category, s.category),
                "color": MEMORY_COLOR.get(s.category, "#8c8c8c"),
                "bytes": s.bytes,
                "size": fmt.size(s.bytes),
                "count": s.count,
            }
            for s in m.sites[: fmt.MEMORY_TOP_SITES]
        ],
        "growth": fmt.memory_growth_lines(m),
        "leak": fmt.memory_leak_line(m),
        "leak_sites": fmt.memory_leak_sites(m),
        "findings": [
            {"title": f.title, "evidence": f.evidence, "fix": f.fix, "saving": fmt.memory_saving(f)}
            for f in d.memory.findings
        ],
        "others": [fmt.memory_device_line(o) for o in d.memory.devices[1:]],
        "notes": d.memory.notes,
    }


def _roofline_lines(d: Diagnosis) -> list[str]:
    r = d.roofline
    if r is None:
        return []
    lines = [fmt.roofline_summary(r), *fmt.roof_lines(r, matmul=True), *fmt.roofline_notes(r)]
    return [line[0].upper() + line[1:] + "." for line in lines]


# What `wallfinder serve` frames differently (its pages load these scripts from itself) -------


def template_environment() -> jinja2.Environment:
    """The report's template environment (its loader, filters and escaping), for a caller
    that overlays its own templates on the report's (`wallfinder serve`)."""
    return _environment()


def figures_json(figures: dict[str, Any]) -> Markup:
    """`figures` as the inert JSON every wallfinder page reads its plots from."""
    return Markup(_script_json(figures))


def uses_webgl(figures: dict[str, Any]) -> bool:
    """Whether a page of `figures` needs WebGL (and so 'unsafe-eval' in its policy)."""
    return _uses_webgl(figures)
