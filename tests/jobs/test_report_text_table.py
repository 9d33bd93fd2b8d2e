"""The terminal tables of `farm report` and `farm compare` (jobs.report.text_table): drawn as rich's Table
draws the same cells, without rich's per-cell layout (issue 46)."""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table
from rich.text import Text

from jobs.report.text_table import TextTable

HEAD = ["backend", "status", "median ms", "verdict"]
ROWS = [
    ["torch_fp32 (base)", "ok", "0.0020", "-"],
    ["torch_bf16", "failed", "12.5000", "slower x1.250 (25.0% change >= 5.0%, p=1e-09 < 0.002)"],
    ["spin ms=3", "ok", "-", "ambiguous"],
]


def _printed(renderable, width: int, color: bool = False) -> list[str]:
    out = io.StringIO()
    console = Console(file=out, width=width, color_system="standard" if color else None, force_terminal=color)
    console.print(renderable)
    return [line.rstrip() for line in out.getvalue().splitlines()]


def _rich(title: str | None, show_lines: bool) -> Table:
    table = Table(title=title, title_justify="left", show_lines=show_lines)
    for h in HEAD:
        table.add_column(h, justify="right" if h == "median ms" else "left")
    for row in ROWS:
        table.add_row(*row)
    return table


def _ours(title: str | None, show_lines: bool) -> TextTable:
    table = TextTable(HEAD, {"median ms"}, title=title, show_lines=show_lines)
    for row in ROWS:
        table.add_row(*row)
    return table


def test_drawn_as_rich_draws_it():
    for title, lines in ((None, False), ("shape m=1 n=256 k=256 (float32)", False), (None, True)):
        assert _printed(_ours(title, lines), 200) == _printed(_rich(title, lines), 200)


def test_a_narrow_console_wraps_the_widest_column_as_rich_does():
    assert _printed(_ours(None, True), 80) == _printed(_rich(None, True), 80)
    narrow = _printed(_ours(None, False), 60)
    assert max(len(line) for line in narrow) <= 60
    assert "p=1e-09" in "".join(narrow)


def test_cells_are_text_not_markup_and_keep_their_styles():
    table = TextTable(["config", "correct"])
    table.add_row("[red]tile[/red]", Text("FAIL", style="red"))
    plain = _printed(table, 80)
    assert any("[red]tile[/red]" in line for line in plain)
    coloured = "\n".join(_printed(table, 80, color=True))
    assert "\x1b[31mFAIL" in coloured and "\x1b[31mtile" not in coloured


def test_a_row_of_the_wrong_length_is_refused():
    table = TextTable(["a", "b"])
    try:
        table.add_row("1")
    except ValueError as err:
        assert "1 cells for 2 columns" in str(err)
    else:
        raise AssertionError("a short row was accepted")


def test_a_cells_width_is_riches():
    """text_table.cell_len (printable ASCII counted by len) gives rich's cell_len for every text: ASCII
    control characters count 0, wide characters 2, combining marks 0."""
    from rich.cells import cell_len as rich_cell_len

    from jobs.report.text_table import cell_len

    texts = ["", "abc", "1.2345", "m=64 n=256 k=256", "a\tb", "x\x1b[0m", "\x00", "日本", "é", "e\u0301",
             "🙂 ok", "~" * 50, "".join(map(chr, range(128)))]  # fmt: skip
    for text in texts:
        assert cell_len(text) == rich_cell_len(text), repr(text)
