"""The renderer registry: a format is one module of `report.formats` whose renderers are
registered by subject; `wallfinder.report`'s functions dispatch through it, with the same
lists of formats and the same refusals as before."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tracegen import training_trace
from wallfinder import Diagnosis, analyze
from wallfinder.report import (
    COUNTER_FORMATS,
    DIFF_FORMATS,
    FORMATS,
    MEMORY_FORMATS,
    formats,
    render,
    render_memory,
    render_steps,
)
from wallfinder.report.formats import DIAGNOSIS, Format, RenderOptions, formats_of


@pytest.fixture
def diagnosis(tmp_path: Path) -> Diagnosis:
    return analyze(training_trace(4).write(tmp_path / "t.json"))


@pytest.fixture
def one_line() -> Iterator[Format]:
    """A format of the test's own: the verdict on one line, at the width it is given."""
    fmt = Format("one-line", rank=9)

    @fmt.renders(DIAGNOSIS)
    def _one_line(d: Diagnosis, options: RenderOptions) -> str:
        return f"{d.verdict.wall}: {d.verdict.cause}"[: options.width] + "\n"

    try:
        yield fmt
    finally:
        del formats._FORMATS[fmt.name]
        formats._formats.cache_clear()


def test_each_result_lists_the_formats_that_render_it_in_rank_order() -> None:
    assert FORMATS == ("text", "json", "md", "html")
    assert DIFF_FORMATS == ("text", "json", "md", "html")
    assert MEMORY_FORMATS == ("text", "json", "md")
    assert COUNTER_FORMATS == ("text", "json", "md", "html")


def test_a_new_format_is_one_registered_renderer(diagnosis: Diagnosis, one_line: Format) -> None:
    assert formats_of(DIAGNOSIS)[-1] == "one-line"
    assert render(diagnosis, "one-line", width=8) == f"{diagnosis.verdict.wall}: "[:8] + "\n"
    assert render(diagnosis, "json") == diagnosis.to_json() + "\n"


def test_a_format_that_does_not_render_a_result_is_refused_or_falls_back(
    diagnosis: Diagnosis,
) -> None:
    with pytest.raises(ValueError, match=r"unknown report format 'pdf': one of text, json, md"):
        render(diagnosis, "pdf")
    with pytest.raises(ValueError, match="unknown memory format 'html'"):
        render_memory(None, "html")  # type: ignore[arg-type]  # refused before it is read
    # Step times and the calculator have JSON and text: any other format is their text.
    assert render_steps(diagnosis.steps, "md") == render_steps(diagnosis.steps, "text")
    assert render_steps(diagnosis.steps, "json") == diagnosis.steps.to_json() + "\n"


def test_every_renderer_named_by_module_and_function_resolves() -> None:
    # A format module names what draws it as strings (imported on first use): a wrong name
    # would otherwise surface only when that format is asked for.
    drawn = [
        (f.name, r)
        for f in formats._formats()
        for r in f.renderers.values()
        if isinstance(r, formats.Drawn)
    ]
    assert len(drawn) == 13
    for name, r in drawn:
        assert callable(r.draw()), (name, r)
