"""Renderers: each turns a `Diagnosis` into one output format and computes nothing new."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from wallfinder.diagnosis import Diagnosis

__all__ = ["FORMATS", "render"]

FORMATS = ("text", "json")


def render(diagnosis: Diagnosis, fmt: str, *, width: int | None = None) -> str:
    """The diagnosis in format `fmt` ("text" or "json"). The terminal renderer (rich) is
    imported only when text is asked for."""
    if fmt == "json":
        return diagnosis.to_json() + "\n"
    from wallfinder.report.terminal import render_text

    return render_text(diagnosis, width=width)
