"""The HTML report's plotly figures, built from the Diagnosis's numbers alone (the page around
them is `html`'s): the steps, phases, modules, timeline, memory and roofline charts, and the
measured points of a counters report; with the colours the page's tables share.

Strings from the trace reach a plot label through `plot_text` (plotly reads a few HTML tags
in labels); the page puts the figures' JSON in an inert script block.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any

from wallfinder.diagnosis import (
    MEMORY_CATEGORIES,
    CounterReport,
    DeviceMemoryProfile,
    Diagnosis,
    OpRoofRow,
    StepTimeline,
    TimelineGap,
)
from wallfinder.report import _format as fmt

GL_POINTS = 1000
"""A roofline with more points than this is drawn with WebGL (scattergl) rather than SVG."""
NAME_CHARS = 90
"""Names are cut to this many characters in tables and plot labels; the full name is in the
table cell's tooltip and in the JSON report."""

CLASS_COLOR = {
    "gemm": "#1f77b4",
    "attention": "#6f42c1",
    "convolution": "#0f8b8d",
    "depthwise_conv": "#7fc4c5",
    "elementwise": "#ff7f0e",
    "reduction": "#c9a227",
    "normalization": "#e377c2",
    "softmax": "#9cae1c",
    "copy": "#17becf",
    "communication": "#9467bd",
    "other": "#8c8c8c",
}
PART_COLOR = {
    "compute": "#2ca02c",
    "comm_exposed": "#9467bd",
    "copy_exposed": "#17becf",
}
PHASE_COLOR = {
    "data_wait": "#d62728",
    "input_copy": "#17becf",
    "forward": "#2ca02c",
    "backward": "#1f77b4",
    "optimizer": "#c9a227",
    "communication": "#9467bd",
    "other": "#b0b4b9",
}
IDLE_COLOR = {
    "data_loading": "#d62728",
    "synchronization": "#ff7f0e",
    "communication_wait": "#e377c2",
    "host_overhead": "#f2b701",
    "launch_latency": "#8c564b",
    "dependency_wait": "#7f7f7f",
    "startup": "#bcbd22",
    "other": "#c7c7c7",
}
IDLE_TOTAL_COLOR = "#6e7781"
PATH_COLOR = {
    "data": IDLE_COLOR["data_loading"],
    "host": IDLE_COLOR["host_overhead"],
    "launch": IDLE_COLOR["launch_latency"],
    "sync": IDLE_COLOR["synchronization"],
    "communication": IDLE_COLOR["communication_wait"],
    "compute": "#2ca02c",
    "bandwidth": "#1f77b4",
    "wait": IDLE_COLOR["dependency_wait"],
}
"""The critical path's categories on the timeline (the idle causes' colours where they
match)."""
MEMORY_COLOR = {
    "parameters": "#bcbd22",
    "before_trace": "#8c959f",
    "activations": "#1f77b4",
    "retained": "#d62728",
    "gradients": "#ff7f0e",
    "optimizer_state": "#9467bd",
    "temporaries": "#17becf",
    "other": "#8c564b",
}
"""One colour per memory category, in the chart and the table beside it."""
STEP_LABELS = 12
"""At most this many step labels on the memory chart (every step still gets its line)."""
WALL_COLOR = {"compute": "#1a7f37", "bandwidth": "#b7791f", "overhead": "#cf222e"}
_FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, Helvetica, Arial, sans-serif"


COUNTER_PLOT = "plot-counter-roofline"
_COUNTER_BOUND_COLOR = {
    "compute": "#2ca02c",
    "memory": "#ff7f0e",
    "latency": "#9467bd",
    "?": "#b0b4b9",
}


def counter_roofline_figure(r: CounterReport) -> dict[str, Any] | None:
    """Log-log: each profiled launch with counted FLOPs and DRAM bytes a point at its achieved
    AI and FLOP/s, sized by its time and coloured by its bound by counters. None when no
    launch has both."""
    points = [k for k in r.kernels if k.ai and k.flops_per_s and k.ai > 0 and k.flops_per_s > 0]
    if not points:
        return None
    longest = max(k.duration_s or 0.0 for k in points) or 1.0
    data = []
    for bound, color in _COUNTER_BOUND_COLOR.items():
        mine = [k for k in points if (k.bound or "?") == bound]
        if not mine:
            continue
        data.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": f"{bound}-bound" if bound != "?" else "bound unknown",
                "x": [k.ai for k in mine],
                "y": [k.flops_per_s for k in mine],
                "marker": {
                    "color": color,
                    "size": [6 + 30 * math.sqrt((k.duration_s or 0.0) / longest) for k in mine],
                    "opacity": 0.75,
                    "line": {"width": 1, "color": "#ffffff"},
                },
                "hovertext": [
                    f"<b>{k.id}: {plot_text(fmt.short_kernel(k.name))}</b><br>"
                    f"AI {k.ai:.3g} FLOP/B · {fmt.si(k.flops_per_s, 'FLOP/s')} · "
                    f"{fmt.duration(k.duration_s)}<br>{plot_text(k.reason)}"
                    for k in mine
                ],
                "hoverinfo": "text",
            }
        )
    return {
        "data": data,
        "layout": layout(
            height=420,
            xaxis={"type": "log", "title": {"text": "achieved arithmetic intensity (FLOP/byte)"}},
            yaxis={"type": "log", "title": {"text": "achieved FLOP/s (counted)"}},
            legend={"orientation": "v", "x": 1.02, "y": 1, "xanchor": "left"},
            margin={"l": 70, "r": 16, "t": 16, "b": 56},
            hovermode="closest",
        ),
    }


def plot_text(text: str) -> str:
    """A string for a plot label: escaped, since plotly reads <b>, <a href>, <br> and the like
    in labels and takes `$...$` for LaTeX. (Quotes stay: with no `<` there is no tag for them
    to end an attribute of, and plotly would show `&quot;` as written.)"""
    return html.escape(text, quote=False).replace("$", "&#36;")


# Figures (plotly specs, built from the Diagnosis's numbers) -------------------------------------


def diagnosis_figures(d: Diagnosis) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    if d.breakdown.steps:
        figures["plot-steps"] = _steps_figure(d)
    if d.phases is not None and d.phases.steps:
        figures["plot-phases"] = _phases_figure(d)
    if d.modules is not None and d.modules.rows:
        figures["plot-modules"] = _modules_figure(d)
    if d.timeline is not None:
        figures["plot-timeline"] = _timeline_figure(d, d.timeline)
    memory = d.main_memory
    if memory is not None and memory.timeline:
        figures["plot-memory"] = _memory_figure(memory)
    if d.roofline is not None:
        roofline = _roofline_figure(d)
        if roofline is not None:
            figures["plot-roofline"] = roofline
    if d.counters is not None:
        points = counter_roofline_figure(d.counters)
        if points is not None:
            figures[COUNTER_PLOT] = points
    return figures


def layout(**extra: Any) -> dict[str, Any]:
    axis = {"gridcolor": "#e6e8eb", "zerolinecolor": "#d0d4d9", "automargin": True}
    layout: dict[str, Any] = {
        "font": {"family": _FONT, "size": 12, "color": "#24292f"},
        "paper_bgcolor": "#ffffff",
        "plot_bgcolor": "#ffffff",
        "margin": {"l": 60, "r": 16, "t": 16, "b": 48},
        "legend": {"orientation": "h", "y": -0.2, "yanchor": "top", "x": 0},
        "hoverlabel": {"align": "left", "font": {"family": _FONT}},
        "xaxis": dict(axis),
        "yaxis": dict(axis),
    }
    for key, value in extra.items():
        if key in ("xaxis", "yaxis"):
            layout[key] = {**layout[key], **value}
        else:
            layout[key] = value
    return layout


def _steps_figure(d: Diagnosis) -> dict[str, Any]:
    """Stacked bars, one per step: compute, exposed communication, exposed copies, and the
    idle time by cause (milliseconds)."""
    steps = d.breakdown.steps
    x = [plot_text(s.step) for s in steps]
    opacity = [0.4 if s.warmup else 1.0 for s in steps]
    hover_step = [
        plot_text(s.step) + (" (warm-up: not in the figures)" if s.warmup else "") for s in steps
    ]
    parts: list[tuple[str, str, list[float]]] = [
        (fmt.part_label(d, "compute"), PART_COLOR["compute"], [s.compute_s for s in steps]),
        (
            fmt.part_label(d, "comm_exposed"),
            PART_COLOR["comm_exposed"],
            [s.comm_exposed_s for s in steps],
        ),
        (
            fmt.part_label(d, "copy_exposed"),
            PART_COLOR["copy_exposed"],
            [s.copy_exposed_s for s in steps],
        ),
    ]
    for cause, color in IDLE_COLOR.items():
        values = [s.idle_causes_s.get(cause, 0.0) for s in steps]
        parts.append((f"idle: {fmt.idle_label(d, cause)}", color, values))
    data: list[dict[str, Any]] = [
        {
            "type": "bar",
            "name": plot_text(label),
            "x": x,
            "y": [v * 1e3 for v in values],
            "customdata": hover_step,
            "marker": {"color": color, "opacity": opacity},
            "hovertemplate": "%{customdata}<br>"
            + plot_text(label)
            + ": %{y:.3f} ms<extra></extra>",
        }
        for label, color, values in parts
        if any(v > 0 for v in values)
    ]
    return _per_step_bars(data, len(steps), height=360)


def _per_step_bars(data: list[dict[str, Any]], steps: int, *, height: int) -> dict[str, Any]:
    """A figure of stacked bars, one per step (milliseconds): the layout the step breakdown and
    the phases share."""
    if steps < 4:
        for trace in data:
            trace["width"] = 0.3  # one wide bar reads as a block, not a step
    return {
        "data": data,
        "layout": layout(
            barmode="stack",
            showlegend=True,
            height=height,
            bargap=0.15,
            xaxis={"type": "category"},
            legend={"orientation": "h", "y": -0.12, "yanchor": "top", "x": 0},
            yaxis={"title": {"text": "ms"}},
        ),
    }


def _phases_figure(d: Diagnosis) -> dict[str, Any]:
    """Stacked bars, one per step: its exposed time by phase (milliseconds)."""
    assert d.phases is not None
    steps = d.phases.steps
    x = [plot_text(s.step) for s in steps]
    opacity = [0.4 if s.warmup else 1.0 for s in steps]
    data: list[dict[str, Any]] = [
        {
            "type": "bar",
            "name": label,
            "x": x,
            "y": [s.exposed_s.get(key, 0.0) * 1e3 for s in steps],
            "marker": {"color": PHASE_COLOR[key], "opacity": opacity},
            "hovertemplate": "%{x}<br>" + label + ": %{y:.3f} ms<extra></extra>",
        }
        for key, label in fmt.PHASE_LABEL.items()
        if any(s.exposed_s.get(key, 0.0) > 0 for s in steps)
    ]
    return _per_step_bars(data, len(steps), height=320)


_BOUND_COLOR = {"compute": "#2ca02c", "bandwidth": "#ff7f0e", "unknown": "#b0b4b9"}


def _main_bound(bound_s: dict[str, float]) -> str:
    """Where most of a module's time sits on the roofline ("unknown" when nothing is known)."""
    return max(bound_s, key=lambda k: bound_s[k]) if bound_s else "unknown"


_ROOT_ID, _NO_MODULE_ID = "\u0000all", "\u0000none"
"""The icicle's own nodes (no module path holds a NUL): all the time, and its part in no
module."""


def _modules_figure(d: Diagnosis) -> dict[str, Any]:
    """The module tree as an icicle (click a module to zoom into it): its root is all the
    step's device (or CPU) time, the time in no module beside the modules, so that each
    module's width is its share; its children's within it; hover for forward, backward,
    share and where the time sits on the roofline."""
    assert d.modules is not None
    rows = d.modules.rows
    where = "device" if d.phases is None or d.phases.basis == "gpu" else "CPU"
    # Each module's own time (beside its listed children's): "remainder" branches add the
    # children's back, so no rounding can make children overflow their parent.
    own = [(r.forward_s + r.backward_s) * 1e3 for r in rows]
    index = {r.path: i for i, r in enumerate(rows)}
    for r in rows:
        if r.parent in index:
            own[index[r.parent]] -= (r.forward_s + r.backward_s) * 1e3
    own = [max(v, 0.0) for v in own]
    hover = []
    for r in rows:
        total = r.forward_s + r.backward_s
        bound = (
            ", ".join(
                f"{fmt.pct(v / total, 0)} {k}-bound"
                if k != "unknown"
                else f"{fmt.pct(v / total, 0)} unknown"
                for k, v in sorted(r.bound_s.items(), key=lambda kv: -kv[1])
            )
            if total > 0
            else ""
        )
        spread = (
            f"<br>{r.spread.count} blocks: {fmt.ms(r.spread.min_s)}/{fmt.ms(r.spread.median_s)}/"
            f"{fmt.ms(r.spread.max_s)} ms, slowest {plot_text(r.spread.outlier)}"
            if r.spread
            else ""
        )
        hover.append(
            f"{plot_text(r.path)}<br>forward {fmt.ms(r.forward_s)} ms, backward "
            f"{fmt.ms(r.backward_s)} ms ({fmt.pct(r.share)} of the device time)"
            + (f"<br>{bound}" if bound else "")
            + spread
        )
    # A lone top module would fill the box whatever its share (an icicle's root is the whole):
    # the root is all the time, and the time in no module is a part of it beside the modules.
    none_ms = d.modules.unattributed_s * 1e3
    all_ms = sum(v for v in own) + none_ms
    return {
        "data": [
            {
                "type": "icicle",
                "ids": [_ROOT_ID, _NO_MODULE_ID, *(plot_text(r.path) for r in rows)],
                "labels": [
                    f"all {where} time per step",
                    "in no module",
                    *(plot_text(r.name) for r in rows),
                ],
                "parents": [
                    "",
                    _ROOT_ID,
                    *(plot_text(r.parent) if r.parent else _ROOT_ID for r in rows),
                ],
                "values": [0.0, none_ms, *own],
                "branchvalues": "remainder",
                "customdata": [
                    f"all {where} time: {fmt.ms(all_ms * 1e-3)} ms per step",
                    f"in no module: {fmt.ms(none_ms * 1e-3)} ms per step "
                    f"({fmt.pct(none_ms / all_ms if all_ms > 0 else 0.0)} of the {where} time)",
                    *hover,
                ],
                "hovertemplate": "%{customdata}<extra></extra>",
                "tiling": {"orientation": "v"},
                "marker": {
                    "colors": [
                        "#f6f8fa",
                        "#eaeef2",
                        *(_BOUND_COLOR[_main_bound(r.bound_s)] for r in rows),
                    ]
                },
            }
        ],
        "layout": layout(height=420, margin={"l": 8, "r": 8, "t": 8, "b": 8}),
    }


_LANES = {"compute": "compute", "communication": "communication", "copy": "copies"}
_IDLE_LANE = "GPU idle"
_HOST_LANE = "host, in the gaps"
_PATH_LANE = "critical path"


def _timeline_figure(d: Diagnosis, t: StepTimeline) -> dict[str, Any]:
    """The representative step: busy spans per lane coloured by kernel class, idle gaps
    coloured by their main cause, and the host event that explains each wait."""
    data: list[dict[str, Any]] = []
    by_class: dict[str, list[Any]] = {}
    for s in t.spans:
        by_class.setdefault(s.cls, []).append(s)
    for cls in CLASS_COLOR:
        spans = by_class.get(cls, [])
        if not spans:
            continue
        data.append(
            _hbar(
                plot_text(cls),
                CLASS_COLOR[cls],
                [_LANES[s.lane] for s in spans],
                [(s.start_s, s.end_s) for s in spans],
                [
                    f"{_LANES[s.lane]} {s.start_s * 1e3:.3f}–{s.end_s * 1e3:.3f} ms<br>"
                    f"busy {fmt.duration(s.busy_s)} of {fmt.duration(s.end_s - s.start_s)} "
                    f"in {s.ops} ops, mostly {plot_text(s.cls)}"
                    for s in spans
                ],
                legendgroup="class",
            )
        )
        # A stretch is paler the less of it is busy (it spans gaps too short to draw).
        data[-1]["marker"]["opacity"] = [
            0.3 + 0.7 * min(1.0, s.busy_s / max(s.end_s - s.start_s, 1e-12)) for s in spans
        ]
    by_cause: dict[str, list[TimelineGap]] = {}
    for g in t.gaps:
        main = max(g.causes_s.items(), key=lambda kv: kv[1])[0] if g.causes_s else "other"
        by_cause.setdefault(main, []).append(g)
    for cause, color in IDLE_COLOR.items():
        gaps = by_cause.get(cause, [])
        if not gaps:
            continue
        data.append(
            _hbar(
                plot_text(f"idle: {fmt.idle_label(d, cause)}"),
                color,
                [_IDLE_LANE] * len(gaps),
                [(g.start_s, g.end_s) for g in gaps],
                [_gap_hover(d, g) for g in gaps],
                legendgroup="idle",
            )
        )
    hosted = [g for g in t.gaps if g.host]
    if hosted:
        data.append(
            _hbar(
                "host activity",
                "#24292f",
                [_HOST_LANE] * len(hosted),
                [(g.start_s, g.end_s) for g in hosted],
                [_gap_hover(d, g) for g in hosted],
                legendgroup="host",
            )
        )
    path = d.critical_path.timeline if d.critical_path is not None else []
    for category, color in PATH_COLOR.items():
        segments = [p for p in path if p.category == category]
        if segments:
            data.append(
                _hbar(
                    f"path: {category}",
                    color,
                    [_PATH_LANE] * len(segments),
                    [(p.start_s, p.end_s) for p in segments],
                    [
                        f"critical path {p.start_s * 1e3:.3f}–{p.end_s * 1e3:.3f} ms: {category}"
                        for p in segments
                    ],
                    legendgroup="path",
                )
            )
    lanes = [_PATH_LANE] * bool(path)
    lanes += [name for key, name in _LANES.items() if any(s.lane == key for s in t.spans)]
    lanes += [_IDLE_LANE] * bool(t.gaps) + [_HOST_LANE] * bool(hosted)
    return {
        "data": data,
        "layout": layout(
            barmode="overlay",
            height=120 + 38 * max(len(lanes), 1),
            xaxis={
                "title": {"text": "ms from the start of the step"},
                "range": [0, t.duration_s * 1e3],
            },
            yaxis={
                "type": "category",
                "categoryorder": "array",
                "categoryarray": lanes,
                "autorange": "reversed",
            },
            legend={"orientation": "h", "y": -0.35, "yanchor": "top", "x": 0},
            margin={"l": 120, "r": 16, "t": 8, "b": 48},
        ),
    }


def _memory_figure(m: DeviceMemoryProfile) -> dict[str, Any]:
    """The device's memory over the trace: allocated bytes stacked by category, the total,
    the allocator's reserved bytes, the peak marked, and where each step starts."""
    points = m.timeline
    x = [p.t_s for p in points]
    data = _memory_lines(m, x)
    top = max([m.peak_allocated, *(max(p.allocated, p.reserved) for p in points)])
    if m.capacity and m.peak_reserved >= m.capacity / 2:
        top = max(top, m.capacity)  # near full: the capacity belongs on the chart
    if m.capacity:
        data.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": f"capacity {fmt.size(m.capacity)}",
                "visible": True if top >= m.capacity else "legendonly",
                "x": [min(x), max(x)],
                "y": [m.capacity, m.capacity],
                "line": {"width": 1.5, "color": "#cf222e", "dash": "dot"},
                "hoverinfo": "name",
            }
        )
    shapes, labels = _step_marks(m)
    start = min([x[0], *(s.start_s for s in m.steps)])
    end = max([x[-1], *(s.end_s for s in m.steps)])
    ticks, texts = _byte_ticks(max(top * 1.15, 8.0))  # headroom for the peak's label
    return {
        "data": data,
        "layout": layout(
            height=400,
            hovermode="x unified",
            shapes=shapes,
            annotations=[
                *labels,
                _peak_label(m, (m.peak_time_s - start) / max(end - start, 1e-12)),
            ],
            xaxis={
                "title": {"text": "time from the start of the trace"},
                "range": [start, end],
                "ticksuffix": " s",
                "hoverformat": ".4f",
            },
            yaxis={"range": [0, ticks[-1]], "tickvals": ticks, "ticktext": texts},
            legend={
                "orientation": "h",
                "y": -0.24,
                "yanchor": "top",
                "x": 0,
                "traceorder": "normal",
            },
            margin={"l": 60, "r": 16, "t": 28, "b": 40},
        ),
    }


def _memory_lines(m: DeviceMemoryProfile, x: list[float]) -> list[dict[str, Any]]:
    """The memory chart's lines at times `x`: allocated bytes stacked by category, their
    total, the allocator's reserved bytes (when recorded) and the peak's marker."""
    points = m.timeline
    data: list[dict[str, Any]] = []
    for cat in MEMORY_CATEGORIES:
        ys = [p.categories.get(cat, 0) for p in points]
        if any(ys):
            color = MEMORY_COLOR.get(cat, "#8c8c8c")
            label = plot_text(fmt.MEMORY_CATEGORY_LABEL.get(cat, cat))
            line = {"width": 0.5, "color": color}
            data.append(_bytes_line(label, x, ys, line, stack="allocated", fill=_rgba(color, 0.6)))
    allocated = [p.allocated for p in points]
    data.append(_bytes_line("allocated", x, allocated, {"width": 1, "color": "#24292f"}))
    if any(p.reserved for p in points):
        line = {"width": 1.5, "color": "#57606a", "dash": "dash"}
        data.append(_bytes_line("reserved", x, [p.reserved for p in points], line))
    data.append(
        {
            "type": "scatter",
            "mode": "markers",
            "name": "peak",
            "showlegend": False,
            "x": [m.peak_time_s],
            "y": [m.peak_allocated],
            "marker": {"color": "#cf222e", "size": 10, "symbol": "diamond"},
            "hovertemplate": plot_text(f"peak allocated: {fmt.size(m.peak_allocated)}")
            + "<br>"
            + plot_text(fmt.memory_when(m))
            + "<extra></extra>",
        }
    )
    return data


def _bytes_line(
    name: str,
    x: list[float],
    ys: list[int],
    line: dict[str, Any],
    *,
    stack: str | None = None,
    fill: str | None = None,
) -> dict[str, Any]:
    """A line of byte counts over time, each point's hover its size (`name`: plot text),
    stacked in the group `stack` and filled with `fill` when given."""
    trace: dict[str, Any] = {"type": "scatter", "mode": "lines"}
    if stack is not None:
        trace["stackgroup"] = stack
    trace |= {"name": name, "x": x, "y": ys, "line": line}
    if fill is not None:
        trace["fillcolor"] = fill
    trace["customdata"] = [fmt.size(v) for v in ys]
    trace["hovertemplate"] = name + ": %{customdata}<extra></extra>"
    return trace


def _peak_label(m: DeviceMemoryProfile, position: float) -> dict[str, Any]:
    """The annotation naming the peak (its size, and its step and phase when known), at
    `position` along the time axis (0: its left edge, 1: its right edge)."""
    where = ", ".join(part for part in (m.peak_step, m.peak_phase) if part)
    text = f"peak {fmt.size(m.peak_allocated)}" + (f" · {where}" if where else "")
    return {
        "x": m.peak_time_s,
        "y": m.peak_allocated,
        "xref": "x",
        "yref": "y",
        "text": plot_text(text),
        "showarrow": True,
        "arrowhead": 0,
        "arrowcolor": "#cf222e",
        "ax": 0,
        "ay": -28,
        # Near an edge the label reads away from it, not over the axis.
        "xanchor": _edge_anchor(position),
        "font": {"color": "#cf222e", "size": 12},
        "bgcolor": "rgba(255,255,255,0.85)",
    }


def _edge_anchor(position: float) -> str:
    """How to anchor a label at `position` (0: the plot's left edge, 1: its right edge)."""
    return "left" if position < 0.15 else "right" if position > 0.85 else "center"


def _step_marks(m: DeviceMemoryProfile) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A light line where each step starts (and the last ends), warm-up steps shaded, and the
    steps' labels above the plot (every k-th when there are many)."""
    shapes: list[dict[str, Any]] = []
    labels: list[dict[str, Any]] = []
    every = max(1, math.ceil(len(m.steps) / STEP_LABELS))
    line = {"color": "#afb8c1", "width": 1, "dash": "dot"}
    for i, s in enumerate(m.steps):
        edge = {"type": "line", "xref": "x", "yref": "paper", "y0": 0, "y1": 1, "layer": "below"}
        shapes.append({**edge, "x0": s.start_s, "x1": s.start_s, "line": line})
        if i == len(m.steps) - 1:
            shapes.append({**edge, "x0": s.end_s, "x1": s.end_s, "line": line})
        if s.warmup:
            shapes.append(
                {
                    "type": "rect",
                    "xref": "x",
                    "yref": "paper",
                    "x0": s.start_s,
                    "x1": s.end_s,
                    "y0": 0,
                    "y1": 1,
                    "fillcolor": "#eff1f3",
                    "line": {"width": 0},
                    "layer": "below",
                }
            )
        if i % every == 0:
            labels.append(
                {
                    "x": s.start_s,
                    "y": 1,
                    "xref": "x",
                    "yref": "paper",
                    "xanchor": "left",
                    "yanchor": "bottom",
                    "showarrow": False,
                    "text": plot_text(s.step + (" (warm-up)" if s.warmup else "")),
                    "font": {"size": 11, "color": "#57606a"},
                    "hovertext": plot_text(
                        f"{s.step}: starts with {fmt.size(s.start_allocated)} allocated, "
                        f"peaks at {fmt.size(s.peak_allocated)}"
                    ),
                }
            )
    return shapes, labels


def _byte_ticks(top: float) -> tuple[list[float], list[str]]:
    """Tick values from 0 to at least `top` bytes, a round number of one binary unit apart,
    and their labels (0, 2 GiB, 4 GiB, ...)."""
    unit, scale = "B", 1
    for name, factor in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if top >= factor:
            unit, scale = name, factor
            break
    span = max(top / scale, 1e-9)
    rough = span / 5
    magnitude = 10 ** math.floor(math.log10(rough))
    step = next(k * magnitude for k in (1, 2, 2.5, 5, 10) if k * magnitude >= rough)
    count = math.ceil(span / step - 1e-9)
    values = [k * step for k in range(count + 1)]
    return [v * scale for v in values], ["0" if v == 0 else f"{v:g} {unit}" for v in values]


def _rgba(color: str, alpha: float) -> str:
    """A #rrggbb colour with transparency."""
    r, g, b = (int(color[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def _hbar(
    name: str,
    color: str,
    lanes: list[str],
    spans: Sequence[tuple[float, float]],
    hover: list[str],
    *,
    legendgroup: str,
) -> dict[str, Any]:
    return {
        "type": "bar",
        "orientation": "h",
        "name": name,
        "legendgroup": legendgroup,
        "y": lanes,
        "base": [a * 1e3 for a, _ in spans],
        "x": [(b - a) * 1e3 for a, b in spans],
        "width": 0.7,
        "marker": {"color": color, "line": {"width": 0}},
        "hovertext": hover,
        "hoverinfo": "text",
    }


def _gap_hover(d: Diagnosis, g: TimelineGap) -> str:
    lines = [f"idle {fmt.duration(g.end_s - g.start_s)} from {g.start_s * 1e3:.3f} ms"]
    lines += [
        f"{plot_text(fmt.idle_label(d, c))}: {fmt.duration(s)}"
        for c, s in sorted(g.causes_s.items(), key=lambda kv: -kv[1])
    ]
    if g.host:
        lines.append("host: " + plot_text(fmt.ellipsize(g.host, NAME_CHARS)))
    return "<br>".join(lines)


def _roofline_figure(d: Diagnosis) -> dict[str, Any] | None:
    """Log-log roofline: the bandwidth slope and a roof per peak (dtypes with the same peak
    share one), the ridges marked, and each costed op a point sized by its time and coloured
    by its class. None when no op can be placed on it."""
    r = d.roofline
    assert r is not None
    ops = [o for o in (*r.ops, *r.more_ops) if o.ai is not None and o.ai > 0 and o.flops > 0]
    if not ops:
        return None
    peaks = d.device.peak_flops or {}
    bandwidth = d.device.mem_bandwidth
    kind = "scattergl" if len(ops) > GL_POINTS else "scatter"
    longest = max(o.time_s for o in ops) or 1.0
    data: list[dict[str, Any]] = []
    for cls, color in CLASS_COLOR.items():
        mine = [o for o in ops if (o.cls or "other") == cls]
        if not mine:
            continue
        data.append(
            {
                "type": kind,
                "mode": "markers",
                "name": plot_text(cls),
                "legendgroup": "ops",
                "x": [o.ai for o in mine],
                "y": [o.achieved_flops for o in mine],
                "marker": {
                    "color": color,
                    "size": [6 + 30 * math.sqrt(o.time_s / longest) for o in mine],
                    "opacity": 0.75,
                    "line": {"width": 1, "color": "#ffffff"},
                },
                "hovertext": [_op_hover(d, o) for o in mine],
                "hoverinfo": "text",
            }
        )
    used = {o.dtype for o in ops} | ({d.mfu.dtype} if d.mfu.dtype else set())
    xs = [o.ai for o in ops if o.ai] + list(r.ridge.values())
    lo, hi = min(xs) / 8, max(xs) * 8
    # One roof per distinct peak (A100: fp32 and fp64 are both 19.5 TFLOP/s).
    roofs: dict[float, list[str]] = {}
    for dtype, peak in sorted(peaks.items(), key=lambda kv: -kv[1]):
        roofs.setdefault(peak, []).append(dtype)
    if bandwidth and roofs:
        top = max(roofs)
        top_ridge = next((r.ridge[dt] for dt in roofs[top] if dt in r.ridge), None)
        if top_ridge is not None:
            # The slope: attainable FLOP/s = AI × bandwidth, up to the highest roof's ridge.
            data.append(
                {
                    "type": "scatter",
                    "mode": "lines",
                    "name": f"memory bandwidth {fmt.si(bandwidth, 'B/s')}",
                    "legendgroup": "roofs",
                    "x": [lo, top_ridge],
                    "y": [lo * bandwidth, top],
                    "line": {"color": "#24292f", "width": 2},
                    "hoverinfo": "name",
                }
            )
    for n, (peak, dtypes) in enumerate(roofs.items()):
        label = ", ".join(dtypes)
        ridge = next((r.ridge[dt] for dt in dtypes if dt in r.ridge), None)
        hover = f"{label}: peak {fmt.si(peak, 'FLOP/s')}"
        if ridge is not None:
            hover += f", ridge at {ridge:.3g} FLOP/B"
        data.append(
            {
                "type": "scatter",
                "mode": "lines" if ridge is None else "lines+markers+text",
                "name": f"{label} peak {fmt.si(peak, 'FLOP/s')}",
                "legendgroup": "roofs",
                "visible": True if used & set(dtypes) or not used & set(peaks) else "legendonly",
                "x": [lo if ridge is None else ridge, hi],
                "y": [peak, peak],
                "line": {"color": "#24292f", "width": 1.5, "dash": "dash"},
                "marker": {"size": [9, 0], "symbol": "diamond", "color": "#24292f"},
                "text": ["" if ridge is None else f"{label} ridge {ridge:.3g}", ""],
                # Labels alternate sides so that the ridges of close roofs do not overlap.
                "textposition": "top left" if n % 2 == 0 else "bottom right",
                "hovertext": [hover, hover],
                "hoverinfo": "text",
            }
        )
    ys = [o.achieved_flops for o in ops]
    drawn = [p for p, dts in roofs.items() if used & set(dts)] or list(roofs)
    y_lo, y_hi = min(ys) / 4, max([*ys, *drawn]) * 4
    decades = range(math.ceil(math.log10(y_lo)), math.floor(math.log10(y_hi)) + 1)
    return {
        "data": data,
        "layout": layout(
            height=480,
            xaxis={
                "type": "log",
                "title": {"text": "arithmetic intensity (FLOP/byte)"},
                "range": [math.log10(lo), math.log10(hi)],
                "dtick": 1,
            },
            yaxis={
                "type": "log",
                "title": {"text": "achieved FLOP/s"},
                "range": [math.log10(y_lo), math.log10(y_hi)],
                "tickvals": [10.0**k for k in decades],
                "ticktext": [
                    fmt.si(10.0**k, "", ".0f").strip() if k >= 0 else f"1e{k}" for k in decades
                ],
            },
            legend={"orientation": "v", "x": 1.02, "y": 1, "xanchor": "left"},
            margin={"l": 70, "r": 16, "t": 16, "b": 56},
            hovermode="closest",
        ),
    }


def _op_hover(d: Diagnosis, o: OpRoofRow) -> str:
    lines = [
        "<b>" + plot_text(fmt.ellipsize(o.name, NAME_CHARS)) + "</b>",
        "shapes " + plot_text(fmt.ellipsize(o.shapes, NAME_CHARS)) + f" · {plot_text(o.dtype)}",
        f"{o.calls} calls, {fmt.duration(o.time_s / fmt.step_count(d))} per step",
        f"AI {o.ai:.3g} FLOP/B" if o.ai is not None else "AI ?",
        f"achieved {fmt.si(o.achieved_flops, 'FLOP/s')}, {fmt.si(o.achieved_bandwidth, 'B/s')}",
        f"{fmt.pct(o.pct_of_roof)} of roof ({o.bound or '?'}-bound)",
    ]
    return "<br>".join(lines)
