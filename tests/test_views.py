"""The experiment tables (specdemo/views.py) as a Markdown renderer reads them: every row keeps its columns whatever
text a token carries."""

from __future__ import annotations

import html

import pytest
from markdown_it import MarkdownIt

from specdemo.app import views
from specdemo.engine.ties import Divergence


def table_cells(markdown: str) -> list[list[str]]:
    """The text of every cell of the first table, row by row, as a GFM renderer splits them."""
    tokens = MarkdownIt("commonmark").enable("table").parse(markdown)
    rows, row, inside = [], None, False
    for tok in tokens:
        if tok.type == "tr_open":
            row = []
        elif tok.type == "tr_close":
            rows.append(row)
        elif tok.type in ("th_open", "td_open"):
            inside = True
        elif tok.type in ("th_close", "td_close"):
            inside = False
        elif tok.type == "inline" and inside:
            row.append(tok.content)
    return rows


HOSTILE = [("a|b", " |"), ("||", "x\\|y"), ("\n|\n", "|\r\n"), ("*a*", "`_[b](c)_`~~")]


@pytest.mark.parametrize("spec_text,base_text", HOSTILE)
@pytest.mark.parametrize("lang", ["en", "zh-CN"])
def test_a_pipe_in_a_token_keeps_the_race_table_whole(spec_text, base_text, lang):
    """A T = 0 divergence names the two tokens in the race table; a `|` (or a line break) in either must not split
    the cell: every row has the header's columns, and the verdict cell shows both tokens as they are (their repr),
    neither formatted by Markdown nor missing a backslash."""
    parted = Divergence(position=3, spec_token=7, base_token=9, spec_text=spec_text, base_text=base_text,
                        gap_verify=0.01, gap_step=-0.01, logit=12.0)
    race = {"base_tps": 100.0, "base_n": 8, "base_points": [(0.01, 1), (0.08, 8)],
            "entries": [{"strategy": "fixed", "k": 3, "tokens_per_s": 150.0, "rounds": 4, "accepted": 0.6,
                         "per_call": 2.0, "points": [(0.05, 8)], "same": parted}]}
    rows = table_cells(views.race_view(race, lang)["race_md"])
    assert len(rows) == 3 and {len(r) for r in rows} == {len(rows[0])} == {7}, rows
    shown = html.unescape(MarkdownIt("commonmark").renderInline(rows[2][-1]))
    assert repr(spec_text) in shown and repr(base_text) in shown, shown
