"""A terminal table drawn as rich's `Table` draws one (its heavy-headed box, bold header, italic title, one
space of padding, the widest columns wrapped when the table is wider than the console), for tables of
hundreds of rows: rich lays out every cell as a renderable of its own (measured, wrapped, padded, cropped:
about half a millisecond a cell), so a job's report of 500 trials took 4 s to print and `farm compare` of
250 shapes 5 s. Here each cell's text is measured once and the lines are joined as segments.

A cell is a str (printed as it is: no markup) or a rich `Text` (its styles kept).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from rich import box
from rich.cells import cell_len as rich_cell_len
from rich.console import Console, ConsoleOptions
from rich.segment import Segment
from rich.style import Style
from rich.text import Text

Cell = str | Text


@dataclass
class TextTable:
    """Columns (header, right-aligned or not), rows of cells, an optional title; `show_lines` draws a line
    between rows (as rich's `show_lines`)."""

    headers: list[str]
    right: set[str] = field(default_factory=set)  # the headers of the right-aligned columns
    title: str | None = None
    show_lines: bool = False
    rows: list[list[Cell]] = field(default_factory=list)

    def add_row(self, *cells: Cell) -> None:
        if len(cells) != len(self.headers):
            raise ValueError(f"{len(cells)} cells for {len(self.headers)} columns")
        self.rows.append(list(cells))

    def widths(self, max_width: int) -> list[int]:
        """Each column's width: its widest cell, the widest columns narrowed (not below their longest
        word) while the table is wider than `max_width`."""
        natural = [cell_len(h) for h in self.headers]
        least = [max((cell_len(w) for w in h.split()), default=1) for h in self.headers]
        for row in self.rows:
            for i, cell in enumerate(row):
                plain = _plain(cell)
                natural[i] = max(natural[i], cell_len(plain))
                if " " in plain:
                    least[i] = max(least[i], max((cell_len(w) for w in plain.split()), default=1))
                else:
                    least[i] = max(least[i], cell_len(plain))
        return _narrowed(natural, least, max_width - 3 * len(natural) - 1)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[Segment]:
        widths = self.widths(options.max_width)
        frame = box.HEAVY_HEAD.substitute(options, safe=True)
        padded = [w + 2 for w in widths]  # the rules span the padding
        new_line = Segment.line()
        if self.title:
            yield Segment(self.title, console.get_style("table.title"))
            yield new_line
        yield Segment(frame.get_top(padded))
        yield new_line
        header = console.get_style("table.header")
        yield from self._row(console, [Text(h, style=header) for h in self.headers], widths, frame, True)
        yield Segment(frame.get_row(padded, "head"))
        yield new_line
        for i, row in enumerate(self.rows):
            if i and self.show_lines:
                yield Segment(frame.get_row(padded, "row"))
                yield new_line
            yield from self._row(console, row, widths, frame, False)
        yield Segment(frame.get_bottom(padded))
        yield new_line

    def _row(
        self, console: Console, row: list[Cell], widths: list[int], frame: box.Box, head: bool
    ) -> Iterable[Segment]:
        left, mid, right = (
            (frame.head_left, frame.head_vertical, frame.head_right)
            if head
            else (frame.mid_left, frame.mid_vertical, frame.mid_right)
        )
        cells = [_lines(console, cell, w) for cell, w in zip(row, widths, strict=True)]
        right_aligned = [h in self.right for h in self.headers]
        for n in range(max(len(c) for c in cells)):
            # the line's unstyled text gathered into one segment: a segment per cell and pad cost as much
            # as the table's layout
            text = [left]
            for i, (lines, w) in enumerate(zip(cells, widths, strict=True)):
                text.append(" " if not i else f" {mid} ")
                segments, used = lines[n] if n < len(lines) else ([], 0)
                pad = " " * (w - used)
                if right_aligned[i]:
                    text.append(pad)
                for seg in segments:
                    if seg.style is None:
                        text.append(seg.text)
                    else:
                        yield Segment("".join(text))
                        yield seg
                        text = []
                if not right_aligned[i]:
                    text.append(pad)
            text.append(" " + right)
            yield Segment("".join(text))
            yield Segment.line()


def cell_len(text: str) -> int:
    """The text's width in terminal cells, as rich's cell_len counts it: a character each for printable
    ASCII (most cells: numbers, names), without looking each character up."""
    return len(text) if text.isascii() and text.isprintable() else rich_cell_len(text)


def _plain(cell: Cell) -> str:
    return cell.plain if isinstance(cell, Text) else cell


def _narrowed(natural: list[int], least: list[int], room: int) -> list[int]:
    """The widths, the widest narrowed first (to the next widest, or by what is left to take) until they
    fit `room` or none can be narrowed further."""
    widths = list(natural)
    while sum(widths) > room:
        free = [i for i, w in enumerate(widths) if w > least[i]]
        if not free:
            break
        widest = max(widths[i] for i in free)
        first = [i for i in free if widths[i] == widest]
        others = [widths[i] for i in free if widths[i] < widest]
        excess = sum(widths) - room
        for i in first:
            target = max(least[i], max(others, default=0), widest - -(-excess // len(first)))
            widths[i] = target
    return widths


def _lines(console: Console, cell: Cell, width: int) -> list[tuple[list[Segment], int]]:
    """The cell's lines at `width`, each as its segments and its width in cells."""
    if isinstance(cell, str):
        used = cell_len(cell)
        if "\n" not in cell and used <= width:
            return [([Segment(cell)], used)]
        cell = Text(cell)
    used = cell_len(cell.plain)
    if "\n" not in cell.plain and used <= width:
        return [(_segments(console, cell), used)]
    out = []
    for line in cell.wrap(console, width, overflow="fold"):
        line.rstrip()
        out.append((_segments(console, line), line.cell_len))
    return out or [([], 0)]


def _segments(console: Console, text: Text) -> list[Segment]:
    """The text's segments in its styles (Text.render leaves a text of one style, no spans, plain)."""
    if text.spans:
        return list(text.render(console))
    return [Segment(text.plain, console.get_style(text.style) if text.style else None)]


def styled(text: str, style: str | Style | None) -> Cell:
    """A cell in a style (none: the plain text)."""
    return Text(text, style=style) if style else text
