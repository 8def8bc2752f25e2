"""Renderers: each turns a `Diagnosis` into one output format and computes nothing new."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from wallfinder.diagnosis import (
        Calculation,
        CounterReport,
        Diagnosis,
        DiagnosisDiff,
        MemoryReport,
        Steps,
        TraceMarks,
    )
    from wallfinder.report.export import Exported

__all__ = [
    "COUNTER_FORMATS",
    "DIFF_FORMATS",
    "FORMATS",
    "MEMORY_FORMATS",
    "export_tables",
    "render",
    "render_calculation",
    "render_counters",
    "render_diff",
    "render_memory",
    "render_steps",
    "write_marks",
]

FORMATS = ("text", "json", "md", "html")
DIFF_FORMATS = ("text", "json", "md", "html")
MEMORY_FORMATS = ("text", "json", "md")
COUNTER_FORMATS = ("text", "json", "html")


def render(diagnosis: Diagnosis, fmt: str, *, width: int | None = None) -> str:
    """The diagnosis in format `fmt`: "text" (the terminal report), "json" (the contract),
    "md" (a Markdown summary for a pull-request comment) or "html" (one self-contained page).
    Each renderer is imported only when its format is asked for."""
    if fmt == "json":
        return diagnosis.to_json() + "\n"
    if fmt == "md":
        from wallfinder.report.markdown import render_markdown

        return render_markdown(diagnosis)
    if fmt == "html":
        from wallfinder.report.html import render_html

        return render_html(diagnosis)
    if fmt != "text":
        raise ValueError(f"unknown report format {fmt!r}: one of {', '.join(FORMATS)}")
    from wallfinder.report.terminal import render_text

    return render_text(diagnosis, width=width)


def export_tables(diagnosis: Diagnosis, folder: Path) -> Exported:
    """Write the diagnosis's tables (kernels, ops, modules, phases, roofline) into `folder`
    as CSV, and as Parquet when pyarrow is installed (`Exported.note` says when it is not).
    Raises `WallfinderError` when the folder cannot be written."""
    from wallfinder.report.export import export_tables as write

    return write(diagnosis, folder)


def write_marks(marks: TraceMarks, path: Path) -> None:
    """Write the marks of `api.analyze_marked` as a companion trace that Perfetto and
    chrome://tracing open beside the original (gzip when `path` ends in `.gz`). Raises
    `WallfinderError` when it cannot be written."""
    from wallfinder.report.annotated import write_marks as write

    write(marks, path)


def render_steps(steps: Steps, fmt: str, *, width: int | None = None) -> str:
    """Step times alone (what the step timer measures) in format `fmt`."""
    if fmt == "json":
        return steps.to_json() + "\n"
    from wallfinder.report.terminal import render_steps as text

    return text(steps, width=width)


def render_calculation(calculation: Calculation, fmt: str) -> str:
    """The roofline calculator's result (`wallfinder roofline`) in format `fmt`: "json", else
    the terminal text."""
    if fmt == "json":
        return calculation.to_json() + "\n"
    from wallfinder.report.terminal import render_calculation as text

    return text(calculation)


def render_diff(diff: DiagnosisDiff, fmt: str, *, width: int | None = None) -> str:
    """A diff of two diagnoses in format `fmt`: "text", "json", "md" or "html" (one
    self-contained page)."""
    if fmt == "json":
        return diff.to_json() + "\n"
    if fmt == "html":
        from wallfinder.report.diff import render_diff_html

        return render_diff_html(diff)
    if fmt == "md":
        from wallfinder.report.diff import render_diff_markdown

        return render_diff_markdown(diff)
    if fmt != "text":
        raise ValueError(f"unknown diff format {fmt!r}: one of {', '.join(DIFF_FORMATS)}")
    from wallfinder.report.diff import render_diff_text

    return render_diff_text(diff, width=width)


def render_memory(report: MemoryReport, fmt: str, *, width: int | None = None) -> str:
    """A memory report (`wallfinder memory`) in format `fmt`: "text", "json" or "md"."""
    if fmt == "json":
        return report.to_json() + "\n"
    if fmt == "md":
        from wallfinder.report.memory import render_memory_markdown

        return render_memory_markdown(report)
    if fmt != "text":
        raise ValueError(f"unknown memory format {fmt!r}: one of {', '.join(MEMORY_FORMATS)}")
    from wallfinder.report.memory import render_memory_text

    return render_memory_text(report, width=width)


def render_counters(report: CounterReport, fmt: str, *, width: int | None = None) -> str:
    """A counters report (`wallfinder counters`) in format `fmt`: "text", "json" or "html"
    (one self-contained page)."""
    if fmt == "json":
        return report.to_json() + "\n"
    if fmt == "html":
        from wallfinder.report.html import render_counters_html

        return render_counters_html(report)
    if fmt != "text":
        raise ValueError(f"unknown counters format {fmt!r}: one of {', '.join(COUNTER_FORMATS)}")
    from wallfinder.report.counters import render_counters_text

    return render_counters_text(report, width=width)
