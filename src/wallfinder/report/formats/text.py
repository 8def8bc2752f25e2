"""The terminal's text (rich), at the console's width or the one given."""

from __future__ import annotations

from wallfinder.report.formats import (
    CALCULATION,
    COUNTERS,
    DIAGNOSIS,
    DIFF,
    MEMORY,
    STEPS,
    Format,
    drawn_by,
)

TEXT = Format("text", rank=0)
TEXT.draws(
    {
        DIAGNOSIS: drawn_by("terminal", "render_text", width=True),
        DIFF: drawn_by("diff", "render_diff_text", width=True),
        MEMORY: drawn_by("memory", "render_memory_text", width=True),
        COUNTERS: drawn_by("counters", "render_counters_text", width=True),
        STEPS: drawn_by("terminal", "render_steps", width=True),
        CALCULATION: drawn_by("terminal", "render_calculation"),
    }
)
