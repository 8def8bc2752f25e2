"""Markdown, for a pull-request comment."""

from __future__ import annotations

from typing import TYPE_CHECKING

from wallfinder.report.formats import COUNTERS, DIAGNOSIS, DIFF, MEMORY, Format, RenderOptions

if TYPE_CHECKING:
    from wallfinder.diagnosis import CounterReport, Diagnosis, DiagnosisDiff, MemoryReport

MD = Format("md", rank=2)


@MD.renders(DIAGNOSIS)
def _diagnosis(d: Diagnosis, options: RenderOptions) -> str:
    from wallfinder.report.markdown import render_markdown

    return render_markdown(d)


@MD.renders(DIFF)
def _diff(x: DiagnosisDiff, options: RenderOptions) -> str:
    from wallfinder.report.diff import render_diff_markdown

    return render_diff_markdown(x)


@MD.renders(MEMORY)
def _memory(r: MemoryReport, options: RenderOptions) -> str:
    from wallfinder.report.memory import render_memory_markdown

    return render_memory_markdown(r)


@MD.renders(COUNTERS)
def _counters(r: CounterReport, options: RenderOptions) -> str:
    from wallfinder.report.markdown import render_counters_markdown

    return render_counters_markdown(r)
