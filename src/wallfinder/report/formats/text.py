"""The terminal's text (rich), at the console's width or the one given."""

from __future__ import annotations

from typing import TYPE_CHECKING

from wallfinder.report.formats import (
    CALCULATION,
    COUNTERS,
    DIAGNOSIS,
    DIFF,
    MEMORY,
    STEPS,
    Format,
    RenderOptions,
)

if TYPE_CHECKING:
    from wallfinder.diagnosis import (
        Calculation,
        CounterReport,
        Diagnosis,
        DiagnosisDiff,
        MemoryReport,
        Steps,
    )

TEXT = Format("text", rank=0)


@TEXT.renders(DIAGNOSIS)
def _diagnosis(d: Diagnosis, options: RenderOptions) -> str:
    from wallfinder.report.terminal import render_text

    return render_text(d, width=options.width)


@TEXT.renders(DIFF)
def _diff(x: DiagnosisDiff, options: RenderOptions) -> str:
    from wallfinder.report.diff import render_diff_text

    return render_diff_text(x, width=options.width)


@TEXT.renders(MEMORY)
def _memory(r: MemoryReport, options: RenderOptions) -> str:
    from wallfinder.report.memory import render_memory_text

    return render_memory_text(r, width=options.width)


@TEXT.renders(COUNTERS)
def _counters(r: CounterReport, options: RenderOptions) -> str:
    from wallfinder.report.counters import render_counters_text

    return render_counters_text(r, width=options.width)


@TEXT.renders(STEPS)
def _steps(s: Steps, options: RenderOptions) -> str:
    from wallfinder.report.terminal import render_steps

    return render_steps(s, width=options.width)


@TEXT.renders(CALCULATION)
def _calculation(c: Calculation, options: RenderOptions) -> str:
    from wallfinder.report.terminal import render_calculation

    return render_calculation(c)
