"""Issue 44, items 6 and 12: charts and the draft tree that read on a projector. Each strategy has its own colour and
dash, the same in every chart that draws a run, with 3:1 contrast on the page; the legend never covers the x axis
title (measured in Chromium on the served page at 1280x720, in English and Chinese); an empty chart's axes start at
0; the tree draws whitespace, control and special tokens as chips that name them, and marks a refused child without
a line through its text. Every run here is a real run of the embedded Shakespeare pair."""

from __future__ import annotations

import dataclasses
import itertools
import os
import re
import xml.etree.ElementTree as ET

import pytest
from conftest import CHROMIUM

from specdemo import SamplingConfig, SpecConfig, baseline_generate, speculative_generate
from specdemo.app import plots, style, tree_view, views
from specdemo.config import STRATEGIES
from specdemo.engine.captions import said
from specdemo.engine.events import Round
from specdemo.i18n import tr

SVG = "{http://www.w3.org/2000/svg}"
XHTML = "{http://www.w3.org/1999/xhtml}"
LANGS = ("en", "zh-CN")


def luminance(hex_colour: str) -> float:
    """WCAG 2.1 relative luminance of an sRGB colour."""
    rgb = [int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    lin = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def contrast(a: str, b: str) -> float:
    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def look(trace) -> tuple[str, str]:
    return trace.line.color, trace.line.dash or "solid"


# ------------------------------------------------------------------------------------------------ item 6: the looks


def test_each_strategy_has_a_look_of_its_own_that_reads_on_white():
    looks = plots.STRATEGY_STYLE
    assert set(looks) == {"target", *STRATEGIES}
    colours = [s["color"] for s in looks.values()]
    dashes = [s["dash"] for s in looks.values()]
    assert len(set(colours)) == len(colours) and len(set(dashes)) == len(dashes)  # apart in colour and in grey
    for name, s in looks.items():
        assert contrast(s["color"], "#FFFFFF") >= 3.0, (name, contrast(s["color"], "#FFFFFF"))  # WCAG 1.4.11
    assert (plots.THEORY_STYLE["color"], plots.THEORY_STYLE["dash"]) not in {(c, d) for c, d in zip(colours, dashes)}
    assert contrast(plots.THEORY_STYLE["color"], "#FFFFFF") >= 3.0


def race_entries() -> list[dict]:
    """One entry per strategy, as runs.strategy_race gives them to views.race_label."""
    return [{"strategy": s, "k": 4, "ngram": 3, "tree": (4, 6, 60) if s == "tree" else None} for s in STRATEGIES]


@pytest.mark.parametrize("lang", LANGS)
def test_the_strategy_race_names_k_as_k(lang):
    """The race's EAGLE chain reads "EAGLE head, K = 4", not "EAGLE head = 4"; fixed K reads "fixed K = 4"."""
    names = {e["strategy"]: views.race_label(e, lang) for e in race_entries()}
    assert names["eagle"].endswith(", K = 4") and names["fixed"].endswith(" = 4") and "= 4" not in names["tree"]


@pytest.mark.parametrize("lang", LANGS)
def test_the_strategy_race_draws_each_strategy_in_its_look(lang):
    """The race's lines are named by views.race_label ("EAGLE tree (top-k 4, ...)" starts with "EAGLE", like "EAGLE
    head, K = 4"): each is drawn in its own strategy's look, and no two lines look alike (the chain and the tree were
    one blue)."""
    entries = race_entries()
    lines = {tr("race.target_only", lang): [(0.1, 1)]} | {views.race_label(e, lang): [(0.05, 2)] for e in entries}
    fig = plots.strategy_race(lines, lang)
    assert len(fig.data) == len(STRATEGIES) + 1
    want = ["target"] + [e["strategy"] for e in entries]
    for trace, strategy in zip(fig.data, want, strict=True):
        s = plots.STRATEGY_STYLE[strategy]
        assert look(trace) == (s["color"], s["dash"]), (trace.name, strategy)
    assert len({look(t) for t in fig.data}) == len(fig.data)


@pytest.fixture(scope="module")
def runs(pair) -> dict:
    """A short run of every strategy on one prompt and seed, and target-only decoding."""
    sampling = SamplingConfig(0.0)
    out = {s: speculative_generate(pair, "ROMEO:\n", sampling, SpecConfig(strategy=s, k=3, max_new_tokens=10, seed=0))
           for s in STRATEGIES}
    out["target"] = baseline_generate(pair, "ROMEO:\n", sampling, 10, seed=0)
    return out


@pytest.mark.parametrize("lang", LANGS)
def test_a_strategy_looks_the_same_in_every_chart(runs, lang):
    """The main race chart, the strategy race, the K sweep and the theory chart's measured point give a strategy the
    same colour (and the lines the same dash); target-only decoding too; the closed forms take no strategy's look."""
    base = runs["target"]
    target = plots.STRATEGY_STYLE["target"]
    race_lines = {tr("race.target_only", lang): [(0.1, 1)]}
    race_lines |= {views.race_label(e, lang): [(0.05, 2)] for e in race_entries()}
    in_race = dict(zip(["target", *STRATEGIES], (look(t) for t in plots.strategy_race(race_lines, lang).data),
                       strict=True))
    strategy_looks = {(s["color"], s["dash"]) for s in plots.STRATEGY_STYLE.values()}
    for strategy in STRATEGIES:
        spec = runs[strategy]
        assert spec.settings["strategy"] == strategy
        main = plots.race(spec, base, lang)
        assert [look(t) for t in main.data] == [in_race[strategy], (target["color"], target["dash"])]
        theory = plots.speedup_vs_theory(spec, base, lang=lang)
        measured = [t for t in theory.data if t.mode == "markers"]
        if strategy != "tree":  # a tree has no E/(cK+1): the chart says so in words
            assert [t.marker.color for t in measured] == [in_race[strategy][0]]
            curves = [look(t) for t in theory.data if t.mode == "lines"]
            assert curves and not set(curves) & strategy_looks
    sweep = plots.k_sweep([{"k": 1, "speedup": 1.1}, {"k": 2, "speedup": 1.3}], 0.7, 0.1, lang)
    assert look(sweep.data[0]) == in_race["fixed"]  # runs.k_sweep drafts with fixed K
    assert look(sweep.data[1]) not in strategy_looks


@pytest.mark.parametrize("lang", LANGS)
def test_the_time_chart_splits_each_round_into_its_draft_verify_and_the_rest(runs, lang):
    """Issue 45, item 7: each round is one stacked bar of its draft, its verify and the rest, in ms, which add up to
    the round's time in the film strip; the draft in its strategy's colour, the verify in target-only's, the rest
    in a hatched grey, each at 3:1 on white; the median target-only step is the dashed line beside them; the axis
    names the clock (the host's here; CUDA events in a trace run on a GPU)."""
    base = runs["target"]
    step_ms = sorted(s.step_ms for s in base.steps)[len(base.steps) // 2]
    for strategy in STRATEGIES:
        spec = runs[strategy]
        fig = plots.round_times(spec, base, lang)
        bars = [t for t in fig.data if t.type == "bar"]
        assert [b.name for b in bars] == [tr(key, lang) for key in plots.PHASE_KEY.values()]
        assert fig.layout.barmode == "stack" and fig.layout.title.text == tr("chart.times", lang)
        for bar, field in zip(bars, plots.PHASE_KEY, strict=True):
            assert list(bar.x) == [r.index + 1 for r in spec.rounds]
            assert list(bar.y) == pytest.approx([getattr(r, field) for r in spec.rounds], abs=1e-3)
        totals = [sum(b.y[i] for b in bars) for i in range(len(spec.rounds))]
        assert totals == pytest.approx([r.draft_ms + r.verify_ms + r.overhead_ms for r in spec.rounds], abs=3e-3)
        assert all(v > 0 for v in bars[1].y)  # every round calls the target once
        colours = [b.marker.color for b in bars]
        assert colours == [plots.STRATEGY_STYLE[strategy]["color"], plots.STRATEGY_STYLE["target"]["color"],
                           plots.PHASE_STYLE["overhead_ms"]["color"]]
        assert all(contrast(c, "#FFFFFF") >= 3.0 for c in colours) and bars[2].marker.pattern.shape == "x"
        halo, line = [t for t in fig.data if t.type == "scatter"]  # a white line under the dashes, off the legend
        assert halo.line.color == "#FFFFFF" and halo.showlegend is False and list(halo.y) == list(line.y)
        assert list(line.y) == pytest.approx([step_ms] * 2, abs=1e-3) and line.name == tr("chart.t_step", lang)
        assert fig.layout.yaxis.title.text == tr("chart.times_y_host", lang)
        on_gpu = dataclasses.replace(spec, settings=spec.settings | {"device": "cuda:0"})
        assert plots.round_times(on_gpu, None, lang).layout.yaxis.title.text == tr("chart.times_y_cuda", lang)
    assert not [t for t in plots.round_times(runs["fixed"], None, lang).data if t.type == "scatter"]


EMPTY = {
    "race": lambda lang: plots.race(None, None, lang),
    "round_times": lambda lang: plots.round_times(None, None, lang),
    "strategy_race": lambda lang: plots.strategy_race({}, lang),
    "acceptance_per_round": lambda lang: plots.acceptance_per_round(None, lang),
    "accepted_length_histogram": lambda lang: plots.accepted_length_histogram(None, lang),
    "acceptance_by_position": lambda lang: plots.acceptance_by_position(None, lang),
    "speedup_vs_theory": lambda lang: plots.speedup_vs_theory(None, None, lang=lang),
    "inspector_empty": lambda lang: plots.inspector_empty(lang),
    "k_sweep": lambda lang: plots.k_sweep([], None, None, lang),
}


@pytest.mark.parametrize("name", sorted(EMPTY))
def test_an_empty_chart_starts_its_axes_at_zero(name):
    """plotly's autorange for a chart with no data runs from -1; every chart the page can show empty says 0."""
    for lang, presenting in itertools.product(LANGS, (False, True)):
        fig = plots.present(EMPTY[name](lang), presenting)
        assert not any(len(t.x or ()) for t in fig.data)
        for axis in (fig.layout.xaxis, fig.layout.yaxis):
            assert axis.autorange is False and axis.range[0] >= 0 and axis.range[1] > axis.range[0], (name, axis.range)


def test_a_chart_with_data_keeps_its_own_ranges(runs):
    fig = plots.race(runs["fixed"], runs["target"])
    assert fig.layout.xaxis.range is None and fig.layout.xaxis.autorange is None


# ------------------------------------------------------------------------------------------------ item 12: chips


CHIPS = {  # token text -> the chip's words, in English and in Chinese
    "\n": ("\u21b5 newline", "\u21b5 换行"),
    "\r\n": ("\u21b5 newline", "\u21b5 换行"),
    "\n\n": ("\u21b5 2 newlines", "\u21b5 2 个换行"),
    " ": ("\u2423 space", "\u2423 空格"),
    "    ": ("\u2423 4 spaces", "\u2423 4 个空格"),
    "\u3000": ("\u2423 space", "\u2423 空格"),
    "\t": ("\u21e5 tab", "\u21e5 制表符"),
    " \n  ": ("\u21b5\u2423 blank", "\u21b5\u2423 空白"),
    "\n\t ": ("\u21b5\u21e5\u2423 blank", "\u21b5\u21e5\u2423 空白"),
    "\x07": ("ctrl U+0007", "控制 U+0007"),
    "\u200b": ("ctrl U+200B", "控制 U+200B"),
    "\u2028": ("ctrl U+2028", "控制 U+2028"),  # a line separator, not a space
    "": ("\u00b7 piece", "\u00b7 字符片段"),
    "\ufffd": ("\u00b7 piece", "\u00b7 字符片段"),
    "<|im_end|>": ("im_end", "im_end"),
    "</s>": ("</s>", "</s>"),
    '<|a&"b|>': ('a&"b', 'a&"b'),  # a special-looking token's name is escaped like any text
}
TEXTS = {",": ",", ";": ";", " the": " the", "a\nb": "a\u21b5b", "<b>x</b>": "<b>x</b>"}  # read as they are


@pytest.fixture(scope="module")
def miss_round(pair) -> Round:
    """A real tree round that ended off the tree, so that it has refused children, unused branches and the path."""
    trace = speculative_generate(pair, "ROMEO:\n", SamplingConfig(0.8),
                                 SpecConfig(strategy="tree", max_new_tokens=64, seed=0, tree_topk=3, tree_depth=3,
                                            tree_budget=8))
    rounds = [r for r in trace.rounds if r.tree and any(t.label == "resampled" for t in r.tokens)
              and any(not nd.on_path for nd in r.tree)]
    assert rounds, "the seed should give a round that ended off the tree"
    return max(rounds, key=lambda r: len(r.tree))


def with_texts(rnd: Round, texts: list[str]) -> Round:
    """The round with its nodes' texts (and so the path's, which kept_texts reads from the tokens) replaced."""
    tree = [dataclasses.replace(nd, text=texts[i % len(texts)]) for i, nd in enumerate(rnd.tree)]
    path = [nd for nd in tree if nd.on_path]
    tokens = [dataclasses.replace(t, text=path[i].text) if i < len(path) else t for i, t in enumerate(rnd.tokens)]
    return dataclasses.replace(rnd, tree=tree, tokens=tokens)


def node_shows(g: ET.Element) -> tuple[str, str]:
    """("chip", its words) or ("text", what the text says, newline and tab marks included)."""
    span = g.find(f"{SVG}foreignObject/{XHTML}span")
    if span is not None:
        return "chip", span.text
    return "text", "".join(g.find(f"{SVG}text").itertext())


@pytest.mark.parametrize("lang", LANGS)
def test_the_tree_names_tokens_with_nothing_to_read_in_chips(miss_round, lang):
    texts = list(CHIPS) + list(TEXTS)
    rounds = [with_texts(miss_round, texts[i:] + texts[:i]) for i in range(0, len(texts), max(1, len(miss_round.tree)))]
    seen = set()
    for rnd in rounds:
        drawn = tree_view.tree_html(rnd, lang)
        svg = ET.fromstring(re.search(r"<svg .*</svg>", drawn, re.S).group(0))  # well-formed: everything escaped
        for g in svg.iter(f"{SVG}g"):
            if "sd-tree-node" not in g.get("class", "") or not g.get("data-node").isdigit():
                continue
            nd = rnd.tree[int(g.get("data-node"))]
            shown = node_shows(g)
            if nd.text in CHIPS:
                assert shown == ("chip", CHIPS[nd.text][LANGS.index(lang)]), (nd.text, shown)
            else:
                assert shown == ("text", TEXTS[nd.text]), (nd.text, shown)
            seen.add(nd.text)
            assert said(nd.text, lang) in g.find(f"{SVG}title").text  # the tooltip quotes the token itself
    assert seen == set(texts)
    assert "<script" not in drawn and '"b|' not in drawn


def test_a_refused_child_is_marked_by_its_box_not_a_line_through_its_text(miss_round):
    rnd = with_texts(miss_round, [",", ";", ":", "."])
    drawn = tree_view.tree_html(rnd, "en")
    svg = ET.fromstring(re.search(r"<svg .*</svg>", drawn, re.S).group(0))
    nodes = [g for g in svg.iter(f"{SVG}g") if "sd-tree-node" in g.get("class", "")]
    refused = [g for g in nodes if "sd-tree-refused" in g.get("class")]
    assert refused and all(g.find(f"{SVG}g[@class='sd-tree-mark']") is not None for g in refused)
    assert all(g.find(f"{SVG}g[@class='sd-tree-mark']") is None for g in nodes if g not in refused)
    assert "line-through" not in tree_view.TREE_CSS
    punct = [g.find(f"{SVG}text") for g in nodes if g.get("data-node").isdigit()]
    assert punct and all("sd-tok-punct" in t.get("class") for t in punct)  # lone marks drawn large and bold


# ------------------------------------------------------------------------------------------------ in Chromium

browser_only = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian chromium is not installed")



@browser_only
@pytest.mark.parametrize("locale", ["en-US", "zh-CN"])
def test_chips_fit_their_nodes_in_chromium(browser, miss_round, locale, tmp_path):
    """At 1280x720 every chip's words show whole (nothing cut by its border) inside its node's box, the refused
    children's text has no line through it, and a refused child's cross is drawn in vermillion."""
    lang = "en" if locale == "en-US" else "zh-CN"
    page_file = tmp_path / "tree.html"
    texts = list(CHIPS)
    body = "".join(tree_view.tree_html(with_texts(miss_round, texts[i:] + texts[:i]), lang)
                   for i in range(0, len(texts), len(miss_round.tree)))
    page_file.write_text(f"<!doctype html><meta charset=utf-8><style>{style.CSS + tree_view.TREE_CSS}</style>{body}")
    context = browser.new_context(viewport={"width": 1280, "height": 720}, locale=locale)
    pg = context.new_page()
    pg.goto(page_file.as_uri())
    chips = pg.eval_on_selector_all(".sd-chip", """cs => cs.map(c => {
        const node = c.closest('.sd-tree-node').querySelector('rect').getBoundingClientRect();
        const b = c.getBoundingClientRect();
        return {words: c.textContent, cut: c.scrollWidth > c.clientWidth + 0.5,
                inside: b.left >= node.left && b.right <= node.right && b.top >= node.top && b.bottom <= node.bottom};
    })""")
    assert {c["words"] for c in chips} == {w[LANGS.index(lang)] for w in CHIPS.values()}
    assert all(not c["cut"] and c["inside"] for c in chips), [c for c in chips if c["cut"] or not c["inside"]]
    refused = pg.eval_on_selector_all(".sd-tree-refused", """gs => gs.map(g => {
        const t = g.querySelector('.sd-tok-text, .sd-chip');
        return [getComputedStyle(t).textDecorationLine, getComputedStyle(g.querySelector('.sd-tree-mark text')).fill];
    })""")
    assert refused and all(line == "none" and fill == "rgb(213, 94, 0)" for line, fill in refused), refused
    context.close()


def legend_clear_of_the_axis_title(page, plot: str) -> dict:
    """The legend's and the x axis title's boxes in a drawn chart, and whether they overlap."""
    return page.evaluate("""sel => {
        const root = document.querySelector(sel);
        const box = q => { const e = root.querySelector(q); if (!e) return null;
                           const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
        const legend = box('.legend'), title = box('.g-xtitle');
        const overlap = !!(legend && title && legend[0] < title[2] && title[0] < legend[2]
                           && legend[1] < title[3] && title[1] < legend[3]);
        const traces = (root.querySelector('.js-plotly-plot')._fullData || []).map(t => [t.line.color, t.line.dash]);
        const layout = root.querySelector('.js-plotly-plot')._fullLayout;
        return {legend, title, overlap, traces, x0: layout.xaxis.range[0], y0: layout.yaxis.range[0]};
    }""", plot)


@browser_only
def test_the_legend_never_covers_the_axis_title_on_the_served_page(browser, app_url):
    """At 1280x720: the empty race chart's axes start at 0; a strategy race draws six lines in six looks, and its
    legend, the main race chart's and every other shown chart's stay clear of their x axis titles, in English, in
    Chinese (the same charts redrawn) and in presenter mode."""
    from test_browser import open_page, set_slider

    context, page = open_page(browser, app_url, "en-US", 1280, 720)
    page.get_by_role("tab", name="Strategy race").click()
    page.wait_for_selector("#sd-race-plot .js-plotly-plot")
    empty = legend_clear_of_the_axis_title(page, "#sd-race-plot")
    assert empty["legend"] is None and empty["x0"] >= 0 and empty["y0"] >= 0, empty
    set_slider(page, "sd-max-new", 16)
    page.click("#sd-race-run")
    page.wait_for_function("document.querySelector('#sd-race-table').innerText.includes('EAGLE tree')", timeout=180000)
    page.wait_for_function("document.querySelectorAll('#sd-race-plot .scatterlayer .trace').length == 6")
    checks = []
    for step in ("en", "zh", "presenter"):
        if step == "zh":
            page.get_by_text("简体中文", exact=True).click()
            page.wait_for_function("document.querySelector('#sd-race-plot .g-xtitle')?.textContent.includes('秒')")
        if step == "presenter":
            page.locator("#sd-presenter input").check()
            page.wait_for_function("(document.querySelector('#sd-race-plot .gtitle')?.style.fontSize || '') === '24px'",
                                   timeout=60000)
        for plot in ("#sd-race-plot", "#sd-race"):
            page.locator(plot).scroll_into_view_if_needed()
            got = legend_clear_of_the_axis_title(page, plot)
            checks.append((step, plot, got))
            assert got["legend"] and got["title"] and not got["overlap"], (step, plot, got)
            assert got["legend"][1] >= got["title"][3] - 0.5, (step, plot, got)  # the legend sits below the title
        everywhere = page.eval_on_selector_all(".js-plotly-plot", """ps => ps.filter(p => p.offsetParent).map(p => {
            const l = p.querySelector('.legend'), t = p.querySelector('.g-xtitle');
            if (!l || !t) return null;
            const a = l.getBoundingClientRect(), b = t.getBoundingClientRect();
            return [p.closest('[id]').id, a.top >= b.bottom - 0.5 || a.bottom <= b.top + 0.5
                    || a.left >= b.right || a.right <= b.left]; }).filter(Boolean)""")
        assert len(everywhere) >= 3 and all(clear for _, clear in everywhere), (step, everywhere)  # every chart shown
        race = checks[-2][2]["traces"]
        assert len(race) == 6 and len({tuple(t) for t in race}) == 6, race
        assert sorted((c.upper(), d) for c, d in race) == sorted((s["color"].upper(), s["dash"]) for s in
                                                                 plots.STRATEGY_STYLE.values())
    context.close()


@pytest.mark.parametrize("locale", ["en-US", "zh-CN"])
def test_the_time_chart_draws_every_round_on_the_served_page(browser, app_url, locale, tmp_path):
    """Issue 45, item 7, as a visitor sees it at 1280x720: after a run, the Charts tab opens on the time chart, one
    stacked bar of three phases per round of the film strip, titled and labelled in the page's language, with the
    target-only step's line when the baseline ran (it does by default)."""
    from test_browser import DONE, open_page, set_prompt, set_slider

    lang = "en" if locale == "en-US" else "zh-CN"
    context, page = open_page(browser, app_url, locale, 1280, 720)
    set_slider(page, "sd-max-new", 24)
    set_prompt(page, "ROMEO:\n")
    page.click("#sd-generate")
    page.wait_for_function(DONE, timeout=120000)
    rounds = page.locator("#sd-film .sd-row").count()
    assert rounds > 1
    page.get_by_role("tab", name=tr("tab.charts", lang)).click()
    page.wait_for_function("document.querySelectorAll('#sd-times .barlayer .trace').length == 3")
    chart = page.locator("#sd-times")
    chart.scroll_into_view_if_needed()
    assert chart.locator(".gtitle").text_content() == tr("chart.times", lang)  # SVG text: no inner_text
    assert chart.locator(".g-ytitle").text_content() == tr("chart.times_y_host", lang)
    legend = chart.locator(".legend").text_content()
    for key in (*plots.PHASE_KEY.values(), "chart.t_step"):
        assert tr(key, lang) in legend, (key, legend)
    per_trace = page.eval_on_selector_all("#sd-times .barlayer .trace", "ts => ts.map(t => t.querySelectorAll('.point').length)")
    assert per_trace == [rounds] * 3, (per_trace, rounds)
    box = chart.bounding_box()
    assert box["width"] > 600 and box["height"] >= 280  # the tab's whole width: a round's bars can be told apart
    chart.screenshot(path=str(tmp_path / f"times-{locale}.png"))
    context.close()
