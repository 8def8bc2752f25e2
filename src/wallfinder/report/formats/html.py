"""One self-contained HTML page (jinja2 and plotly, imported when a page is drawn)."""

from __future__ import annotations

from wallfinder.report.formats import COUNTERS, DIAGNOSIS, DIFF, Format, drawn_by

HTML = Format("html", rank=3)
HTML.draws(
    {
        DIAGNOSIS: drawn_by("html", "render_html"),
        DIFF: drawn_by("diff", "render_diff_html"),
        COUNTERS: drawn_by("html", "render_counters_html"),
    }
)
