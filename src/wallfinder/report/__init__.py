"""Renderers: each turns a `Diagnosis` (or another result) into one output format and
computes nothing new. The formats are a registry (`report.formats`, one module per format);
these functions are the public way in, one per kind of result."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from wallfinder.report.formats import (
    CALCULATION,
    COUNTERS,
    DIAGNOSIS,
    DIFF,
    MEMORY,
    STEPS,
    RenderOptions,
    formats_of,
    rendered,
)

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

FORMATS = formats_of(DIAGNOSIS)
DIFF_FORMATS = formats_of(DIFF)
MEMORY_FORMATS = formats_of(MEMORY)
COUNTER_FORMATS = formats_of(COUNTERS)


def render(diagnosis: Diagnosis, fmt: str, *, width: int | None = None) -> str:
    """The diagnosis in format `fmt`: "text" (the terminal report), "json" (the contract),
    "md" (a Markdown summary for a pull-request comment) or "html" (one self-contained page).
    Each renderer is imported only when its format is asked for (`report.formats`)."""
    return rendered(DIAGNOSIS, diagnosis, fmt, RenderOptions(width))


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
    """Step times alone (what the step timer measures) in format `fmt`: "json", else the
    terminal text."""
    return rendered(STEPS, steps, fmt, RenderOptions(width))


def render_calculation(calculation: Calculation, fmt: str) -> str:
    """The roofline calculator's result (`wallfinder roofline`) in format `fmt`: "json", else
    the terminal text."""
    return rendered(CALCULATION, calculation, fmt, RenderOptions())


def render_diff(diff: DiagnosisDiff, fmt: str, *, width: int | None = None) -> str:
    """A diff of two diagnoses in format `fmt`: "text", "json", "md" or "html" (one
    self-contained page)."""
    return rendered(DIFF, diff, fmt, RenderOptions(width))


def render_memory(report: MemoryReport, fmt: str, *, width: int | None = None) -> str:
    """A memory report (`wallfinder memory`) in format `fmt`: "text", "json" or "md"."""
    return rendered(MEMORY, report, fmt, RenderOptions(width))


def render_counters(report: CounterReport, fmt: str, *, width: int | None = None) -> str:
    """A counters report (`wallfinder counters`) in format `fmt`: "text", "json", "md" or
    "html" (one self-contained page, the measured points on a roofline)."""
    return rendered(COUNTERS, report, fmt, RenderOptions(width))
