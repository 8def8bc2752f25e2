"""Markdown, for a pull-request comment."""

from __future__ import annotations

from wallfinder.report.formats import COUNTERS, DIAGNOSIS, DIFF, MEMORY, Drawn, Format

MD = Format("md", rank=2)
MD.draws(
    {
        DIAGNOSIS: Drawn("markdown", "render_markdown"),
        DIFF: Drawn("diff", "render_diff_markdown"),
        MEMORY: Drawn("memory", "render_memory_markdown"),
        COUNTERS: Drawn("markdown", "render_counters_markdown"),
    }
)
