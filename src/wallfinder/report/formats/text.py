"""The terminal's text (rich), at the console's width or the one given."""

from __future__ import annotations

from wallfinder.report.formats import (
    CALCULATION,
    COUNTERS,
    DIAGNOSIS,
    DIFF,
    MEMORY,
    STEPS,
    Drawn,
    Format,
)

TEXT = Format("text", rank=0)
TEXT.draws(
    {
        DIAGNOSIS: Drawn("terminal", "render_text", width=True),
        DIFF: Drawn("diff", "render_diff_text", width=True),
        MEMORY: Drawn("memory", "render_memory_text", width=True),
        COUNTERS: Drawn("counters", "render_counters_text", width=True),
        STEPS: Drawn("terminal", "render_steps", width=True),
        CALCULATION: Drawn("terminal", "render_calculation"),
    }
)
