"""One self-contained HTML page (jinja2 and plotly, imported when a page is drawn)."""

from __future__ import annotations

from wallfinder.report.formats import COUNTERS, DIAGNOSIS, DIFF, Drawn, Format

HTML = Format("html", rank=3)
HTML.draws(
    {
        DIAGNOSIS: Drawn("html", "render_html"),
        DIFF: Drawn("diff", "render_diff_html"),
        COUNTERS: Drawn("html", "render_counters_html"),
    }
)
