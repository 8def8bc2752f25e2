"""The terminal report fits the terminal it is printed in: every real trace's `analyze` at 80,
100 and 200 columns has no line wider than the page, no table cell over two lines, and no
table drawn with a header but no rows; the CLI lays it out at $COLUMNS (issue 30).

Each trace is diagnosed once for the module and rendered at each width."""

from __future__ import annotations

import copy
import io
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
from rich.cells import cell_len
from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table

from realtraces import real_trace, real_trace_params
from wallfinder import Diagnosis, analyze
from wallfinder.api import analyze_counters
from wallfinder.cli import main
from wallfinder.report import render_counters
from wallfinder.report._format import short_kernel
from wallfinder.report._table import FitTable
from wallfinder.report.counters import counter_parts
from wallfinder.report.terminal import ByWidth, render_text, renderables

WIDTHS = (80, 100, 200)
TRACES = [
    *real_trace_params(),
    *real_trace_params("sampled_128rank_job"),
    *real_trace_params("*.sqlite"),
]
_diagnoses: dict[Path, Diagnosis] = {}


def diagnosis(path: Path) -> Diagnosis:
    """Each trace (file, rank folder or Nsight export) is diagnosed once per session."""
    if path not in _diagnoses:
        _diagnoses[path] = analyze(path)
    return _diagnoses[path]


def too_wide(text: str, width: int) -> list[str]:
    return [line for line in text.splitlines() if cell_len(line) > width]


def tables(parts: Iterable[RenderableType], width: int) -> Iterator[Table | FitTable]:
    """The tables among the report's parts, inside groups, panels and width-drawn parts too
    (layout grids, which have no header, are not tables)."""
    for part in parts:
        if isinstance(part, FitTable):
            yield part
        elif isinstance(part, Table):
            if part.show_header:
                yield part
        elif isinstance(part, Group):
            yield from tables(part.renderables, width)
        elif isinstance(part, Panel):
            yield from tables([part.renderable], width)
        elif isinstance(part, ByWidth):
            yield from tables([part.draw(width)], width)


_RULE = re.compile(r"^[\s━╇┿╋─┼┬┴╈╀]+$")


def row_heights(table: Table | FitTable, width: int) -> list[int]:
    """How many lines each row of `table` takes at `width` (what moved under a row counted
    apart: it may take two lines of its own)."""
    if isinstance(table, FitTable):
        blocks = table.row_blocks(width)
        if blocks is None:  # stacked as records: no cells to wrap
            return []
        heights = [sum("┃" in line.plain for line in blocks[0])]
        for block in blocks[1:]:
            cells = sum("│" in line.plain for line in block)
            heights += [cells, len(block) - cells]
        return heights
    # A rich table drawn with a line between rows: the lines between two rules are one row.
    ruled = copy.copy(table)
    ruled.show_lines = True
    buffer = io.StringIO()
    Console(file=buffer, width=width, no_color=True, soft_wrap=False).print(ruled, crop=False)
    lines = buffer.getvalue().splitlines()
    # Uncropped, a table too wide for the page shows it (cropped, it loses its last columns).
    assert too_wide(buffer.getvalue(), width) == [], f"a table wider than {width} columns"
    first = next(i for i, line in enumerate(lines) if "━" in line)
    heights, count = [], 0
    for line in lines[first + 1 :]:
        if _RULE.match(line):
            heights.append(count)
            count = 0
        elif "│" in line:
            count += 1
    return [*heights, count]


def row_count(table: Table | FitTable) -> int:
    return len(table.rows) if isinstance(table, FitTable) else table.row_count


@pytest.mark.parametrize("path", TRACES)
def test_the_terminal_report_fits_80_100_and_200_columns(path: Path | None) -> None:
    assert path is not None
    d = diagnosis(path)
    for width in WIDTHS:
        assert too_wide(render_text(d, width=width), width) == [], width
        for table in tables(renderables(d), width):
            assert row_count(table) > 0, f"an empty table at {width} columns"
            heights = row_heights(table, width)
            assert max(heights, default=0) <= 2, (width, heights)


def test_the_cli_lays_the_report_out_at_columns(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Issue 30: at COLUMNS=80, 142 of 215 lines of this report were wider than the terminal
    # (the report was laid out at 100 whatever the terminal).
    path = real_trace("tracelens/mi300x_resnet_act_checkpoint.json.gz")
    for columns in (80, 132):
        monkeypatch.setenv("COLUMNS", str(columns))
        assert main(["analyze", str(path)]) == 0
        out = capsys.readouterr().out
        assert too_wide(out, columns) == []
        # The report uses the room it is given: the verdict box spans the page.
        assert any(cell_len(line) == columns for line in out.splitlines())


@pytest.mark.parametrize("path", real_trace_params("ncu/*.csv*"))
def test_the_counters_report_fits_80_columns_one_row_per_kernel(path: Path | None) -> None:
    # Issue 30: the table was 136 columns wide, one line per launch (26, near-identical).
    assert path is not None
    report = analyze_counters(path)
    assert too_wide(render_counters(report, "text", width=80), 80) == []
    (table,) = tables(counter_parts(report), 80)
    assert max(row_heights(table, 80)) <= 2
    # Launches of one kernel (as the table names it) are one row, with their count.
    shown = {short_kernel(k.name) for k in report.kernels}
    assert row_count(table) < len(report.kernels) or len(shown) == len(report.kernels)
    assert isinstance(table, FitTable)
    launches = [int(row.cells[1]) for row in table.rows]
    assert sum(launches) == len(report.kernels)
