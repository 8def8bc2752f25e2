"""The terminal's tables (report/_table.py) laid out for the width they get: figures whole,
spare columns under their rows, names cut at a separator, no cell over two lines, no empty
table; and the width the CLI lays text out at (issue 30)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console, RenderableType
from rich.text import Text

from wallfinder.cli.commands.analyze import report_width
from wallfinder.report._table import Col, FitTable, Row, clip, fit_table, wrap_lines

CAUSE = "launched work waiting (stream/event/peer, unrecorded work)"


def printed(part: RenderableType, width: int) -> list[str]:
    buffer = io.StringIO()
    Console(file=buffer, width=width, no_color=True, soft_wrap=False).print(part, crop=False)
    return buffer.getvalue().splitlines()


def ranks(n: int = 2) -> FitTable:
    columns = [
        Col("rank", justify="left"),
        Col("file", justify="left", name=True, min_width=12),
        Col("median ms"),
        Col("compute"),
        Col("clock ms", spare=1),
        Col("cause", justify="left", spare=2),
    ]
    rows = [
        Row([str(i), f"trace_rank{i}.json.gz", "612.89", "17.2%", "+0.170", CAUSE])
        for i in range(n)
    ]
    table = fit_table("Ranks", columns, rows)
    assert isinstance(table, FitTable)
    return table


def test_a_phrase_is_a_column_where_it_fits_and_a_line_under_its_row_where_not() -> None:
    wide = printed(ranks(), 200)
    assert wide[1].split("┃")[-1].strip() == "cause"
    assert wide[3].endswith(CAUSE)
    narrow = printed(ranks(), 60)
    assert all(len(line) <= 60 for line in narrow)
    # Headings on two lines leave the file name whole; the cause goes under each row,
    # indented inside it, over two lines broken between words.
    assert narrow[1:5] == [
        "      ┃                     ┃ median ┃         ┃  clock",
        " rank ┃ file                ┃     ms ┃ compute ┃     ms",
        "━━━━━━╇━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━╇━━━━━━━━━╇━━━━━━━━",
        " 0    │ trace_rank0.json.gz │ 612.89 │   17.2% │ +0.170",
    ]
    assert narrow[5:7] == [
        "    cause: launched work waiting (stream/event/peer,",
        "    unrecorded work)",
    ]


@pytest.mark.parametrize("width", [40, 50, 60, 80, 100, 200])
def test_figures_are_never_cut_and_no_cell_takes_more_than_two_lines(width: int) -> None:
    table = ranks(3)
    lines = printed(table, width)
    assert all(len(line) <= width for line in lines)
    text = "\n".join(lines)
    for figure in ("612.89", "17.2%", "+0.170"):
        assert text.count(figure) == 3
    blocks = table.row_blocks(width)
    if blocks is not None:
        assert sum("┃" in line.plain for line in blocks[0]) <= 2
        for block in blocks[1:]:
            assert sum("│" in line.plain for line in block) <= 2
            assert sum("│" not in line.plain for line in block) <= 2


def test_too_many_figures_for_the_page_stack_as_records() -> None:
    columns = [Col("kernel", justify="left", name=True), *(Col(f"metric {i}") for i in range(8))]
    table = FitTable("t", columns, [Row(["gemm", *(f"{i}.25 TB/s" for i in range(8))])])
    assert table.row_blocks(60) is None
    lines = printed(table, 60)
    assert lines == ["t", "gemm", *(f"  metric {i}: {i}.25 TB/s" for i in range(8))]


def test_a_table_without_rows_is_not_drawn_or_is_one_line_saying_why() -> None:
    assert fit_table("Top ops on the roofline", [Col("op")], []) is None
    why = fit_table("Top ops", [Col("op")], [], empty="no op has shapes")
    assert isinstance(why, Text)
    assert why.plain == "no op has shapes"


def test_names_are_cut_at_a_separator_with_an_ellipsis() -> None:
    name = "void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>>"
    assert clip(name, 40) == "void at::native::vectorized_elementwise…"
    assert clip("aten::native_batch_norm [[10,64,56,56],[64]]", 36) == (
        "aten::native_batch_norm [[10,64,56,…"
    )
    assert clip("short", 40) == "short"
    # A name column shows the shorter form first, if there is one.
    col = Col("kernel", justify="left", name=True, shorten=lambda n: n.split("<")[0])
    table = FitTable("t", [col, Col("ms")], [Row([name, "1.00"])])
    assert printed(table, 40)[3] == " void at::native::vectorized_…   │ 1.00"
    assert printed(table, 60)[3].startswith(" void at::native::vectorized_elementwise_kernel  ")


def test_a_phrase_wraps_between_words_over_two_lines_at_most() -> None:
    assert wrap_lines(CAUSE, 30, 2) == ["launched work waiting", "(stream/event/peer, …"]
    shapes = "input shapes: [[10,64,112,112],[10,64,112,112],[64],[64]]; dtype: bf16"
    assert wrap_lines(shapes, 40, 2) == [
        "input shapes: [[10,64,112,112],",
        "[10,64,112,112],[64],[64]]; dtype: bf16",
    ]
    assert wrap_lines(shapes, 30, 2) == ["input shapes:", "[[10,64,112,112], …"]


def test_the_cli_lays_text_out_at_columns_else_the_default(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("COLUMNS", "132")
    assert report_width(None) == 132
    assert report_width(tmp_path / "report.txt") == 132
    # Not a terminal (pytest captures standard output) and no $COLUMNS: the report's default.
    monkeypatch.delenv("COLUMNS")
    assert report_width(None) is None
    monkeypatch.setenv("COLUMNS", "wide")
    assert report_width(None) is None
