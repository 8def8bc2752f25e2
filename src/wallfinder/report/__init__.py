"""Renderers: each turns a `Diagnosis` into one output format and computes nothing new."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from wallfinder.diagnosis import Diagnosis, Steps

__all__ = ["FORMATS", "render", "render_steps"]

FORMATS = ("text", "json", "md", "html")


def render(diagnosis: Diagnosis, fmt: str, *, width: int | None = None) -> str:
    """The diagnosis in format `fmt`: "text" (the terminal report), "json" (the contract),
    "md" (a Markdown summary for a pull-request comment) or "html" (one self-contained page).
    Each renderer is imported only when its format is asked for."""
    if fmt == "json":
        return diagnosis.to_json() + "\n"
    if fmt == "md":
        from wallfinder.report.markdown import render_markdown

        return render_markdown(diagnosis)
    if fmt == "html":
        from wallfinder.report.html import render_html

        return render_html(diagnosis)
    if fmt != "text":
        raise ValueError(f"unknown report format {fmt!r}: one of {', '.join(FORMATS)}")
    from wallfinder.report.terminal import render_text

    return render_text(diagnosis, width=width)


def render_steps(steps: Steps, fmt: str, *, width: int | None = None) -> str:
    """Step times alone (what the step timer measures) in format `fmt`."""
    if fmt == "json":
        return steps.to_json() + "\n"
    from wallfinder.report.terminal import render_steps as text

    return text(steps, width=width)
