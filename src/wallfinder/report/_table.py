"""Tables that fit the terminal they are printed in (the terminal report's only table).

rich's own Table fits a narrow console by wrapping cells, a word or a few letters per line (a
rank's cause over 16 lines at 80 columns), or by cutting numbers ("mem 10…"). Here a table is
laid out for the width it gets: figures are never cut; a column marked `spare` moves onto a
line under its row when the columns do not fit ("cause: …"), the most spare first; names are
cut at a separator with an ellipsis, never below their minimum; headings take two lines where
that saves room. Only when even that does not fit are the rows stacked, one record each. No
cell takes more than two lines, and a table without rows is never drawn (`fit_table` says why
in one line, or gives nothing)."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable, Iterator, Sequence
from typing import Literal

import msgspec
from rich.cells import cell_len, set_cell_size
from rich.console import Console, ConsoleOptions, RenderResult
from rich.text import Text

__all__ = ["Col", "FitTable", "Row", "clip", "fit_table", "wrap_lines"]

Justify = Literal["left", "right"]

NAME_MIN = 16
"""The fewest characters a name column is cut to before columns move under their rows."""
UNDER_INDENT = 4
"""Where the line under a row starts: inside the row, so that it reads as part of it."""
_BREAKS = " ,;:([<{/→-_"
"""Where a name may be cut: after one of these (a word, an argument, a namespace), so that
what is left ends at a whole piece."""


class Col(msgspec.Struct, frozen=True):
    """A column: its heading and how it gives way when the table is too wide."""

    heading: str
    justify: Justify = "right"
    name: bool = False
    """A name (kernel, op, module, file, label): cut with an ellipsis to fit, down to
    `min_width`; any other column is shown whole or moved under its row."""
    min_width: int = NAME_MIN
    lines: int = 1
    """Lines a name may take before it is cut (a label reads better on two than cut)."""
    shorten: Callable[[str], str] | None = None
    """A name's shorter form, shown where the whole does not fit (a kernel without its
    template arguments), before it is cut."""
    spare: int = 0
    """0: always a column. Otherwise the column moves under its row ("heading: value", left
    out when empty or "?") when the table does not fit, those with the highest `spare`
    first."""


class Row(msgspec.Struct, frozen=True):
    cells: Sequence[str]
    style: str = ""


class _Layout(msgspec.Struct, frozen=True):
    shown: list[int]  # column indexes drawn as columns
    under: list[int]  # column indexes drawn under their row
    widths: dict[int, int]  # width of each shown column
    two_line_heads: bool


class FitTable(msgspec.Struct):
    """A table that lays itself out for the width it is printed at (a rich renderable)."""

    title: str
    columns: Sequence[Col]
    rows: Sequence[Row]
    caption: str = ""
    title_style: str = ""
    _cache: dict[int, list[list[Text]] | None] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        for row in self.rows:
            if len(row.cells) != len(self.columns):
                raise ValueError(f"{self.title}: a row of {len(row.cells)} cells")

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        if self.title:
            yield Text(self.title, style=self.title_style)
        blocks = self.row_blocks(width)
        if blocks is None:
            yield from self._stacked()
        else:
            for block in blocks:
                yield from block
        if self.caption:
            yield Text(self.caption, style="dim")

    def row_blocks(self, width: int) -> list[list[Text]] | None:
        """The table's lines at `width`: the header (with its rule), then one block of lines
        per row (the row, then what moved under it); None when even the narrowest layout
        does not fit, and the rows are stacked instead."""
        if width not in self._cache:
            layout = self._layout(width)
            self._cache[width] = None if layout is None else self._draw(layout, width)
        return self._cache[width]

    # Layout ---------------------------------------------------------------------------------

    def _natural(self, i: int) -> int:
        return max((cell_len(r.cells[i]) for r in self.rows), default=0)

    def _head_width(self, i: int, two_lines: bool) -> int:
        heading = self.columns[i].heading
        if not two_lines or " " not in heading:
            return cell_len(heading)
        # The narrowest split of the heading into two lines at a space.
        words = heading.split(" ")
        return min(
            max(cell_len(" ".join(words[:k])), cell_len(" ".join(words[k:])))
            for k in range(1, len(words))
        )

    def _layout(self, width: int) -> _Layout | None:
        """Of the layouts that fit (nothing moved under the rows, then the sparest columns,
        then the next; headings on one line, then on two), the one that shows the most of
        the names: a name cut short in a column can read better whole on the line under its
        row. The first such layout wins a tie."""
        cols = self.columns
        order = sorted((c.spare for c in cols if c.spare), reverse=True)
        best: tuple[int, _Layout] | None = None
        for level in [None, *dict.fromkeys(order)]:
            under = [i for i, c in enumerate(cols) if level is not None and c.spare >= level]
            shown = [i for i in range(len(cols)) if i not in under]
            for two_lines in (False, True):
                widths = self._widths(shown, two_lines, width)
                if widths is None:
                    continue
                layout = _Layout(shown, under, widths, two_lines)
                seen = sum(min(widths[i], self._natural(i)) for i in shown if cols[i].name)
                seen += sum(min(self._natural(i), 2 * width) for i in under if cols[i].name)
                if best is None or seen > best[0]:
                    best = (seen, layout)
        return None if best is None else best[1]

    def _widths(self, shown: list[int], two_lines: bool, width: int) -> dict[int, int] | None:
        """Each shown column's width, the names sharing what the figures leave; None when
        the figures and the names at their least do not fit."""
        cols = self.columns
        if not shown:
            return None
        widths = {
            i: max(self._natural(i), self._head_width(i, two_lines))
            for i in shown
            if not cols[i].name
        }
        names = [i for i in shown if cols[i].name]
        head = {i: self._head_width(i, two_lines) for i in names}
        natural = {i: max(self._natural(i), head[i]) for i in names}
        least = {i: min(natural[i], max(cols[i].min_width, head[i])) for i in names}
        room = width - (2 + 3 * (len(shown) - 1)) - sum(widths.values())
        if room < sum(least.values()):
            return None
        widths.update(_share(room, least, natural))
        return widths

    # Drawing --------------------------------------------------------------------------------

    def _draw(self, layout: _Layout, width: int) -> list[list[Text]]:
        cols = self.columns
        shown, widths = layout.shown, layout.widths
        heads: list[list[str]] = []
        for i in shown:
            heading = cols[i].heading
            fits = cell_len(heading) <= widths[i]
            heads.append([heading] if fits else wrap_lines(heading, widths[i], 2))
        height = max(len(h) for h in heads)
        header = []
        for k in range(height):
            cells = []
            for i, h in zip(shown, heads, strict=True):
                # Bottom-aligned: a one-line heading sits beside the second line of another.
                line = h[k - (height - len(h))] if k >= height - len(h) else ""
                cells.append(_pad(line, widths[i], cols[i].justify))
            header.append(Text(_join(cells, "┃"), style="bold"))
        rule = "╇".join("━" * (widths[i] + 2) for i in shown)
        blocks = [[*header, Text(rule)]]
        for row in self.rows:
            cell_lines = [
                self._name_lines(row.cells[i], widths[i], cols[i])
                if cols[i].name
                else [row.cells[i]]
                for i in shown
            ]
            block = []
            for k in range(max(len(c) for c in cell_lines)):
                cells = [
                    _pad(c[k] if k < len(c) else "", widths[i], cols[i].justify)
                    for i, c in zip(shown, cell_lines, strict=True)
                ]
                block.append(Text(_join(cells, "│"), style=row.style))
            # An unknown figure ("?") says nothing on a line of its own: left out there.
            moved = "; ".join(
                f"{cols[i].heading}: {row.cells[i]}"
                for i in layout.under
                if row.cells[i] not in ("", "?")
            )
            if moved:
                indent = " " * UNDER_INDENT
                lines = wrap_lines(moved, width - UNDER_INDENT, 2)
                block += [Text(indent + line, style=row.style or "dim") for line in lines]
            blocks.append(block)
        return blocks

    @staticmethod
    def _name_lines(name: str, width: int, col: Col) -> list[str]:
        if col.shorten is not None and cell_len(name) > width:
            name = col.shorten(name)
        return wrap_lines(name, width, col.lines)

    def _stacked(self) -> Iterator[Text]:
        """Each row as a record: its first cell, then each other as "heading: value" on a
        line of its own (so that no figure is broken over two lines)."""
        for row in self.rows:
            text = Text(row.cells[0], style=row.style or "bold")
            for c, v in zip(self.columns[1:], row.cells[1:], strict=True):
                if v:
                    text.append(f"\n  {c.heading}: {v}", style=row.style)
            yield text


def fit_table(
    title: str,
    columns: Sequence[Col],
    rows: Sequence[Row],
    *,
    caption: str = "",
    empty: str = "",
) -> FitTable | Text | None:
    """A table of `rows`; without rows, the line `empty` says why (or nothing is shown)."""
    if not rows:
        return Text(empty, style="dim") if empty else None
    return FitTable(title, columns, rows, caption=caption)


def _share(room: int, least: dict[int, int], natural: dict[int, int]) -> dict[int, int]:
    """`room` shared among the name columns: each its least, then the rest one character at a
    time to those still short of their natural width (so that two names are cut alike)."""
    widths = dict(least)
    spare = room - sum(least.values())
    while spare > 0:
        short = [i for i in widths if widths[i] < natural[i]]
        if not short:
            break
        for i in short:
            if spare == 0:
                break
            widths[i] += 1
            spare -= 1
    return widths


def _pad(text: str, width: int, justify: Justify) -> str:
    gap = " " * max(width - cell_len(text), 0)
    return gap + text if justify == "right" else text + gap


def _join(cells: list[str], bar: str) -> str:
    return (" " + f" {bar} ".join(cells)).rstrip()


def clip(text: str, width: int) -> str:
    """`text` in at most `width` cells, cut where it must be with an ellipsis: after a word or
    a separator (space, comma, `::`, bracket) when one falls in the last quarter, so that a name
    is never left ending in half a number."""
    text = " ".join(text.split()) if "\n" in text else text
    if cell_len(text) <= width:
        return text
    if width <= 1:
        return "…"[:width]
    head = set_cell_size(text, width - 1)
    cut = max(head.rfind(c) for c in _BREAKS)
    if cut >= (width * 3) // 4:
        head = head[: cut + 1]
    return head.rstrip() + "…"


class _Wrapper(textwrap.TextWrapper):
    # Lines may also break between a list's bracketed items with no space between them (each
    # tensor's shape in [[10,64,56,56],[64]] kept whole), as well as at spaces; never inside
    # a word.
    wordsep_simple_re = re.compile(r"(\s+|(?<=[\])],)(?=\S))")


def wrap_lines(text: str, width: int, lines: int) -> list[str]:
    """`text` in at most `lines` lines of `width` cells, broken between words; what does not
    fit ends with an ellipsis after the last whole word (or is clipped, for one long name)."""
    if lines <= 1 or cell_len(text) <= width:
        return [clip(text, width)]
    indent = text[: len(text) - len(text.lstrip(" "))]
    wrapped = _Wrapper(
        width,
        max_lines=lines,
        placeholder=" …",
        subsequent_indent=indent,
        break_long_words=False,
        break_on_hyphens=False,
    ).wrap(text)
    # textwrap measures characters: a line of wide characters (or one unbreakable word longer
    # than the width) is clipped to the cells it has.
    return [clip(line, width) for line in wrapped] or [clip(text, width)]
