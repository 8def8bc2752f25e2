"""Renderers for `wallfinder history`: a job's recorded runs and their trend, as terminal
text, JSON, Markdown or one self-contained HTML page (the report page's inlined plotly,
script and Content-Security-Policy). Every figure is the Trend's own."""

from __future__ import annotations

from typing import Any

import msgspec
from rich.table import Table
from rich.text import Text

from wallfinder.history import NameCount, RunRecord, Trend
from wallfinder.report import _format as fmt
from wallfinder.report._figures import WALL_COLOR, layout, plot_text
from wallfinder.report.html import render_page
from wallfinder.report.terminal import print_parts
from wallfinder.units import size

__all__ = ["HISTORY_FORMATS", "render_history", "render_names"]

HISTORY_FORMATS = ("text", "json", "md", "html")
COMMIT_CHARS = 8


def render_history(t: Trend, fmt_name: str, *, width: int | None = None) -> str:
    """The trend of a job's runs in format `fmt_name` (one of HISTORY_FORMATS)."""
    if fmt_name == "json":
        return t.to_json() + "\n"
    if fmt_name == "md":
        return _markdown(t)
    if fmt_name == "html":
        return _html(t)
    if fmt_name != "text":
        raise ValueError(f"unknown history format {fmt_name!r}: one of {HISTORY_FORMATS}")
    table = Table(box=None, pad_edge=False, header_style="bold")
    headers, keys = _columns(t)
    for column, right in headers:
        table.add_column(column, justify="right" if right else "left")
    for row in _rows(t):
        table.add_row(*(row[key] for key in keys))
    title = Text(f"wallfinder history: {t.name} ({_runs(len(t.runs))})", style="bold")
    return print_parts([title, table, Text(summary(t))], width=width, color=False)


def render_names(names: list[NameCount], fmt_name: str, *, width: int | None = None) -> str:
    """The recorded job names with their run counts."""
    if fmt_name == "json":
        return msgspec.json.format(msgspec.json.encode(names), indent=2).decode() + "\n"
    if fmt_name not in ("text", "md"):
        raise ValueError(f"the list of names is text, md or json, not {fmt_name!r}")
    if not names:
        return "No runs recorded yet (analyze or run with --record NAME).\n"
    if fmt_name == "md":
        lines = ["| name | runs | last recorded (UTC) |", "|---|--:|---|"]
        lines += [f"| {_md(n.name)} | {n.runs} | {_when(n.last_recorded_at)} |" for n in names]
        return "\n".join(lines) + "\n"
    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("name")
    table.add_column("runs", justify="right")
    table.add_column("last recorded (UTC)")
    for n in names:
        table.add_row(n.name, str(n.runs), _when(n.last_recorded_at))
    return print_parts([table], width=width, color=False)


def summary(t: Trend) -> str:
    """The trend in one line: first → last, best, worst."""
    if len(t.runs) == 1:
        return f"One run: step {fmt.ms(t.first_s)} ms."
    return (
        f"Step {fmt.ms(t.first_s)} → {fmt.ms(t.last_s)} ms ({_signed(t.change)}) over "
        f"{_runs(len(t.runs))}; best {fmt.ms(t.best.step_s)} ms (run {t.best.id}, "
        f"{_when(t.best.recorded_at)}), worst {fmt.ms(t.worst.step_s)} ms (run {t.worst.id}, "
        f"{_when(t.worst.recorded_at)})."
    )


# Rows -------------------------------------------------------------------------------------------

_HEADERS = (
    ("#", True),
    ("recorded (UTC)", False),
    ("commit", False),
    ("step ms", True),
    ("vs prev", True),
    ("MFU", True),
    ("idle", True),
    ("wall · cause", False),
)
_KEYS = ("id", "when", "commit", "step", "change", "mfu", "idle", "wall")
_PEAK = ("peak alloc", True)
"""The peak allocated memory column, shown when a run of the trend profiled memory."""


def _has_memory(t: Trend) -> bool:
    return any(r.run.peak_allocated is not None for r in t.runs)


def _columns(t: Trend) -> tuple[tuple[tuple[str, bool], ...], tuple[str, ...]]:
    """The table's headers and row keys: the peak memory column before the wall's when a run
    has a memory profile."""
    if not _has_memory(t):
        return _HEADERS, _KEYS
    return (*_HEADERS[:-1], _PEAK, _HEADERS[-1]), (*_KEYS[:-1], "peak", _KEYS[-1])


def _rows(t: Trend) -> list[dict[str, Any]]:
    return [
        {
            "id": str(r.run.id),
            "when": _when(r.run.recorded_at),
            "commit": (r.run.commit or "")[:COMMIT_CHARS] or "—",
            "source": r.run.source,
            "step": fmt.ms(r.run.step_s),
            "step_ms": r.run.step_s * 1e3,
            "change": "—" if r.change is None else _signed(r.change),
            "change_v": "" if r.change is None else r.change,
            "mfu": fmt.pct(r.run.mfu),
            "mfu_v": "" if r.run.mfu is None else r.run.mfu,
            "idle": fmt.pct(r.run.idle),
            "idle_v": r.run.idle,
            "peak": "—" if r.run.peak_allocated is None else size(r.run.peak_allocated),
            "peak_v": "" if r.run.peak_allocated is None else r.run.peak_allocated,
            "wall": _wall(r.run),
        }
        for r in t.runs
    ]


def _wall(r: RunRecord) -> str:
    return f"{r.wall}: {fmt.cause_label(r.wall, r.cause)}"


def _when(iso: str) -> str:
    """An ISO time as "YYYY-MM-DD HH:MM" (the stored times are UTC)."""
    return iso[:16].replace("T", " ")


def _signed(change: float) -> str:
    return f"{change * 100:+.1f}%".replace("-", "−")


def _runs(n: int) -> str:
    return f"{n} run" + ("s" if n != 1 else "")


def _md(text: str) -> str:
    """Text for a Markdown table cell: no cell breaks, no markup."""
    out = text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")
    for ch in "`*_[]<>":
        out = out.replace(ch, "\\" + ch)
    return out


def _markdown(t: Trend) -> str:
    headers, keys = _columns(t)
    lines = [
        f"### wallfinder history: {_md(t.name)} ({_runs(len(t.runs))})",
        "",
        "| " + " | ".join(name for name, _ in headers) + " |",
        "|" + "|".join("--:" if right else "---" for _, right in headers) + "|",
    ]
    lines += [
        "| "
        + " | ".join(_md(str(row[key])) if key in ("wall", "commit") else row[key] for key in keys)
        + " |"
        for row in _rows(t)
    ]
    lines += ["", summary(t)]
    return "\n".join(lines) + "\n"


# HTML -------------------------------------------------------------------------------------------


def _html(t: Trend) -> str:
    return render_page(
        "history.html",
        _figures(t),
        t=t,
        rows=_rows(t),
        summary=summary(t),
        memory=_has_memory(t),
    )


def _figures(t: Trend) -> dict[str, Any]:
    runs = [r.run for r in t.runs]
    x = [f"#{r.id}" for r in runs]
    hover = [
        plot_text(f"{_when(r.recorded_at)} · {(r.commit or 'no commit')[:COMMIT_CHARS]}")
        + "<br>"
        + plot_text(_wall(r))
        for r in runs
    ]
    common = {"x": x, "customdata": hover, "type": "scatter", "mode": "lines+markers"}
    step = {
        **common,
        "name": "median step",
        "y": [r.step_s * 1e3 for r in runs],
        "marker": {"color": [WALL_COLOR.get(r.wall, "#24292f") for r in runs], "size": 9},
        "line": {"color": "#24292f"},
        "hovertemplate": "%{x} %{customdata}<br>step %{y:.3f} ms<extra></extra>",
    }
    shares = [
        {
            **common,
            "name": "MFU",
            "y": [None if r.mfu is None else r.mfu * 100 for r in runs],
            "line": {"color": "#1a7f37"},
            "hovertemplate": "%{x} %{customdata}<br>MFU %{y:.1f}%<extra></extra>",
        },
        {
            **common,
            "name": "idle",
            "y": [r.idle * 100 for r in runs],
            "line": {"color": "#6e7781"},
            "hovertemplate": "%{x} %{customdata}<br>idle %{y:.1f}%<extra></extra>",
        },
    ]
    xaxis = {"type": "category", "title": {"text": "run"}}
    figures: dict[str, Any] = {
        "plot-step": _one_line(step, xaxis, "ms"),
        "plot-shares": {
            "data": shares,
            "layout": layout(
                height=300,
                xaxis=xaxis,
                yaxis={"title": {"text": "% of the step / of peak"}, "range": [0, 100]},
            ),
        },
    }
    if _has_memory(t):
        peak = {
            **common,
            "name": "peak allocated",
            "y": [None if r.peak_allocated is None else r.peak_allocated / 2**30 for r in runs],
            "line": {"color": "#8250df"},
            "hovertemplate": "%{x} %{customdata}<br>peak allocated %{y:.2f} GiB<extra></extra>",
        }
        figures["plot-memory"] = _one_line(peak, xaxis, "GiB")
    return figures


def _one_line(line: dict[str, Any], xaxis: dict[str, Any], unit: str) -> dict[str, Any]:
    """A chart of one line over the runs, its y axis in `unit` from zero."""
    return {
        "data": [line],
        "layout": layout(
            height=300,
            showlegend=False,
            xaxis=xaxis,
            yaxis={"title": {"text": unit}, "rangemode": "tozero"},
        ),
    }
