"""Markdown, for a pull-request comment."""

from __future__ import annotations

from wallfinder.report.formats import COUNTERS, DIAGNOSIS, DIFF, MEMORY, Format, drawn_by

MD = Format("md", rank=2)
MD.draws(
    {
        DIAGNOSIS: drawn_by("markdown", "render_markdown"),
        DIFF: drawn_by("diff", "render_diff_markdown"),
        MEMORY: drawn_by("memory", "render_memory_markdown"),
        COUNTERS: drawn_by("markdown", "render_counters_markdown"),
    }
)
