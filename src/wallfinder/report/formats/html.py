"""One self-contained HTML page (jinja2 and plotly, imported when a page is drawn)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from wallfinder.report.formats import COUNTERS, DIAGNOSIS, DIFF, Format, RenderOptions

if TYPE_CHECKING:
    from wallfinder.diagnosis import CounterReport, Diagnosis, DiagnosisDiff

HTML = Format("html", rank=3)


@HTML.renders(DIAGNOSIS)
def _diagnosis(d: Diagnosis, options: RenderOptions) -> str:
    from wallfinder.report.html import render_html

    return render_html(d)


@HTML.renders(DIFF)
def _diff(x: DiagnosisDiff, options: RenderOptions) -> str:
    from wallfinder.report.diff import render_diff_html

    return render_diff_html(x)


@HTML.renders(COUNTERS)
def _counters(r: CounterReport, options: RenderOptions) -> str:
    from wallfinder.report.html import render_counters_html

    return render_counters_html(r)
