"""Renderers: each turns a `Diagnosis` into one output format and computes nothing new."""

from wallfinder.report.terminal import render_text, to_html

__all__ = ["render", "render_text", "to_html"]

FORMATS = ("text", "json")


def render(diagnosis: object, fmt: str, *, width: int | None = None) -> str:
    """The diagnosis in format `fmt` ("text" or "json")."""
    from wallfinder.diagnosis import Diagnosis

    assert isinstance(diagnosis, Diagnosis)
    if fmt == "json":
        return diagnosis.to_json() + "\n"
    return render_text(diagnosis, width=width)
