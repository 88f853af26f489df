"""The figures (specdemo/app/plots.py) show model text as text: plotly reads `<b>`, `<br>`, `<a href>` ... in every
title, tick label, legend entry, hover label and annotation as markup, so a token carrying them must reach the
figure escaped (`&lt;b&gt;`), which plotly draws as the characters `<b>`. Every figure function is fed real events
from a run of the toy pair whose token texts are rewritten to hostile ones; one test draws them in Chromium."""

from __future__ import annotations

import html
import inspect
import os
import shutil
from dataclasses import replace

import pytest

from specdemo import SamplingConfig, SpecConfig, baseline_generate, speculative_generate
from specdemo.app import plots
from specdemo.i18n import tr

EVIL = '<b>bold</b><br><a href="https://example.com/x">link</a>'
RAW = ("<b>", "<br>", "<a ")


def hostile(text: str) -> str:
    return EVIL + text  # the toy words stay distinct, so no two tick labels collide


def hostile_round(rnd):
    drafts = [replace(d, text=hostile(d.text), top=[replace(c, text=hostile(c.text)) for c in d.top])
              for d in rnd.drafts]
    return replace(rnd, drafts=drafts, tokens=[replace(t, text=hostile(t.text)) for t in rnd.tokens],
                   bonus_top=[replace(c, text=hostile(c.text)) for c in rnd.bonus_top])


@pytest.fixture(scope="module")
def runs(toy_pair):
    """A speculative run (with top candidates for the inspector) and a target-only run, every token text hostile."""
    sampling = SamplingConfig(temperature=1.0)
    spec = speculative_generate(toy_pair, "a b c", sampling, SpecConfig(k=3, max_new_tokens=16, seed=3))
    base = baseline_generate(toy_pair, "a b c", sampling, 16, seed=3)
    spec = replace(spec, prompt=hostile(spec.prompt), text=hostile(spec.text),
                   rounds=[hostile_round(r) for r in spec.rounds])
    base = replace(base, prompt=hostile(base.prompt), text=hostile(base.text),
                   steps=[replace(s, token=replace(s.token, text=hostile(s.token.text))) for s in base.steps])
    assert any(d.top for r in spec.rounds for d in r.drafts) and any(r.bonus_top for r in spec.rounds)
    return spec, base


def figures(spec, base) -> dict[str, list]:
    """{figure function: the figures it drew from the hostile events}."""
    inspected = [plots.inspector(r, pos) for r in spec.rounds
                 for pos in range(1, len(r.drafts) + 1 + bool(r.bonus_top))]
    tokens = [hostile(w) for w in "abcd"] + [EVIL]
    race_runs = {hostile("target only"): [(0.1, 1), (0.2, 2)], hostile("fixed = 3"): [(0.05, 2), (0.1, 4)]}
    return {
        "race": [plots.race(spec, base)],
        "strategy_race": [plots.strategy_race(race_runs)],
        "acceptance_per_round": [plots.acceptance_per_round(spec)],
        "round_times": [plots.round_times(spec, base), plots.round_times(spec, None)],
        "accepted_length_histogram": [plots.accepted_length_histogram(spec)],
        "acceptance_by_position": [plots.acceptance_by_position(spec)],
        "speedup_vs_theory": [plots.speedup_vs_theory(spec, base), plots.speedup_vs_theory(spec, None)],
        "inspector": inspected,
        "inspector_empty": [plots.inspector_empty()],
        "k_sweep": [plots.k_sweep([{"k": 1, "speedup": 1.2}, {"k": 2, "speedup": 1.4}], 0.8, 0.1)],
        "distribution": [plots.distribution(tokens, [0.3, 0.3, 0.2, 0.1, 0.1], [0.2] * 5, [0.25] * 4 + [0.0], 100)],
        "present": [plots.present(f, True) for f in inspected[:2]],
    }


def strings(obj) -> list[str]:
    """Every string in a figure's data and layout (plotly's own template left out)."""
    if isinstance(obj, str):
        return [obj]
    if isinstance(obj, dict):
        return [s for k, v in obj.items() if k != "template" for s in strings(v)]
    if isinstance(obj, (list, tuple)):
        return [s for v in obj for s in strings(v)]
    return []


def tick_labels(fig) -> list[str]:
    return [x for t in fig.data if t.type == "bar" for x in (t.x or ()) if isinstance(x, str)]


def test_every_figure_function_is_fed_the_hostile_token(runs):
    made = figures(*runs)
    public = {name for name, f in inspect.getmembers(plots, inspect.isfunction)
              if f.__module__ == plots.__name__ and not name.startswith("_") and f.__annotations__.get("return")
              in ("go.Figure", "Figure")}
    assert public - set(made) == set(), "a figure function is missing from this test"


def test_no_markup_from_a_token_reaches_any_text_field(runs):
    for name, figs in figures(*runs).items():
        for fig in figs:
            d = fig.to_plotly_json()
            for s in strings(d["data"]) + strings(d["layout"]):
                assert not any(raw in s.lower() for raw in RAW), (name, s)
                assert "<" not in s and ">" not in s, (name, s)


def test_token_text_is_escaped_once_so_plotly_shows_it_literally(runs):
    spec, _ = runs
    shown = html.escape(repr(EVIL)[1:-1], quote=False)  # what plotly decodes back to the repr of the token
    assert shown.startswith("&lt;b&gt;bold&lt;/b&gt;&lt;br&gt;&lt;a href=")
    made = figures(*runs)
    annotated = titled = 0
    for fig in made["inspector"]:
        labels = tick_labels(fig)
        assert labels and all(lbl.startswith(shown) for lbl in labels), labels
        for lbl in labels:  # decoding the entities once gives the token's repr back, unchanged
            assert html.unescape(lbl).startswith(repr(EVIL)[1:-1])
        title = fig.layout.title.text
        if "position" in title and "bonus" not in title:
            assert shown in title and "&amp;lt;" not in title, title
            titled += 1
        for a in fig.layout.annotations:  # the "drafted" arrow points at the escaped tick label
            assert a.x in labels
            annotated += 1
    assert titled and annotated
    dist = made["distribution"][0]
    assert list(dist.data[0].x) == [shown + w for w in "abcd"] + [shown]
    names = [t.name for t in made["strategy_race"][0].data]
    assert names == [html.escape(hostile(n), quote=False) for n in ("target only", "fixed = 3")]


CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian chromium is not installed")
def test_chromium_draws_the_token_as_text(runs, tmp_path):
    """plotly.js in Chromium: the token's `<b>`, `<br>` and `<a href>` show as characters in the title, the tick
    labels, the annotation and the legend; no bold, no line break, no link is drawn."""
    from playwright.sync_api import sync_playwright
    from plotly.offline import get_plotlyjs

    made = figures(*runs)
    inspected = next(f for f in made["inspector"] if f.layout.annotations and "bonus" not in f.layout.title.text)
    figs = [inspected, made["distribution"][0], made["strategy_race"][0]]
    divs = "".join(f.to_html(full_html=False, include_plotlyjs=False, div_id=f"fig{i}") for i, f in enumerate(figs))
    page_file = tmp_path / "figures.html"
    page_file.write_text(f"<!doctype html><html><head><meta charset='utf-8'><script>{get_plotlyjs()}</script></head>"
                         f"<body>{divs}</body></html>")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page()
            page.goto(page_file.as_uri())
            page.wait_for_function("document.querySelectorAll('.main-svg').length >= 6")

            def texts(selector: str) -> list[str]:
                return page.eval_on_selector_all(selector, "els => els.map(e => e.textContent)")

            title = texts("#fig0 .gtitle")[0]
            assert EVIL in title, title
            ticks = texts("#fig0 .xtick text") + texts("#fig1 .xtick text")
            assert ticks and all(t.startswith(repr(EVIL)[1:-1]) for t in ticks), ticks
            assert texts("#fig0 .annotation-text")
            assert [t for t in texts("#fig2 .legendtext") if t.startswith(EVIL)] == texts("#fig2 .legendtext")
            assert len(texts("#fig2 .legendtext")) == 2
            # plotly draws <b> as a bold tspan, <br> as a second line, <a href> as an svg link: none of them here
            assert page.locator("svg a").count() == 0
            assert page.locator("tspan[style*='bold']").count() == 0
            assert page.locator("tspan.line").count() == 0
            # the inspector's probability axis names no p above 1
            assert max(float(t) for t in texts("#fig0 .ytick text")) <= 1
            # a race line's hover: the run's name as text, its tokens and its seconds, not a raw (x, y) tuple
            page.evaluate("Plotly.Fx.hover('fig2', [{curveNumber: 1, pointNumber: 2}])")
            page.wait_for_function("document.querySelectorAll('#fig2 .hoverlayer text').length > 0")
            assert texts("#fig2 .hoverlayer text") == [EVIL + "fixed = 3: 4 tokens at 0.10 s"]
        finally:
            browser.close()


# ----------------------------------------------------------------------------------------- the UI review's charts
# Real runs of the embedded Shakespeare pair (its EAGLE head too), sampled, so that drafts fall outside the inspector's
# top lists: the tree's lists are the target's top 8, the chains' the target's and the draft's top 2.


@pytest.fixture(scope="module")
def shakespeare(pair) -> dict:
    def run(strategy: str, temperature: float, top: int, **shape):
        return speculative_generate(pair, "ROMEO:\n", SamplingConfig(temperature), SpecConfig(
            strategy=strategy, k=4, max_new_tokens=32, seed=0, top_candidates=top, **shape))

    out = {"tree": run("tree", 0.8, 8, tree_topk=3, tree_depth=4, tree_budget=10),  # bushy: more nodes than depth
           "fixed": run("fixed", 1.0, 2), "eagle": run("eagle", 1.0, 2)}
    out["target"] = baseline_generate(pair, "ROMEO:\n", SamplingConfig(0.8), 16, seed=0)
    return out


def drafted(trace):
    """(round, drafted position) for every position a round drafted."""
    return [(r, d) for r in trace.rounds for d in r.drafts]


@pytest.mark.parametrize("strategy", ["tree", "fixed", "eagle"])
def test_the_inspector_always_draws_the_drafted_token_with_its_p_and_q_under_the_arrow(shakespeare, strategy):
    """The review's round 3 of a tree: the head drafted '-', to which the target gave p = 8e-14, so '-' was not
    among the target's top tokens and the chart had no bar and no arrow for it. A chain's draft, sampled from q,
    can be missing from both top lists the same way."""
    pairs = drafted(shakespeare[strategy])
    assert any(all(c.token_id != d.token_id for c in d.top) for _, d in pairs)  # the case the review found
    for rnd, d in pairs:
        fig = plots.inspector(rnd, d.position)
        [arrow] = fig.layout.annotations
        assert arrow.text == "drafted"
        i = list(fig.data[0].x).index(arrow.x)
        assert html.unescape(arrow.x).startswith(repr(d.text)[1:-1] or "(empty)")
        assert (fig.data[0].y[i], fig.data[1].y[i]) == (d.p, d.q)  # its p, and its q (a tree's: the head's p)
        assert arrow.y == max(b.y[i] for b in fig.data)  # the arrow points at its bars, the highest of them
        assert fig.data[1].name == ("head p: the head's probability of each child" if rnd.tree else "q draft")


def inspected(trace, lang=None):
    return [(r, pos, plots.inspector(r, pos, lang=lang)) for r in trace.rounds
            for pos in range(1, len(r.drafts) + 1 + bool(r.bonus_top))]


def titles_of(trace, lang):
    return [(r, pos, f.layout.title.text) for r, pos, f in inspected(trace, lang)]


@pytest.mark.parametrize("strategy", ["tree", "fixed", "eagle"])
def test_the_inspectors_probability_axis_never_names_a_p_above_one(shakespeare, strategy):
    """The review saw the axis run to 1.2: it ends a little above the highest bar, with no tick above 1."""
    figs = inspected(shakespeare[strategy])
    assert any(max(max(b.y) for b in f.data) > 0.8 for _, _, f in figs)  # bars near 1, where 1.2 showed
    for _, _, fig in figs:
        bottom, top = fig.layout.yaxis.range
        assert bottom == 0 and fig.layout.yaxis.autorange is False
        assert top >= max(max(b.y) for b in fig.data)
        assert top <= 1 or (fig.layout.yaxis.tickmode == "array" and max(fig.layout.yaxis.tickvals) == 1), top


@pytest.mark.parametrize("lang,depth,position", [("en", "tree depth", "position"), ("zh-CN", "树深", "个位置")])
def test_the_inspector_title_names_a_trees_depth_and_a_chains_position(shakespeare, lang, depth, position):
    """A tree does not use K: its positions are the depths of its path, and the title says so."""
    for strategy in ("tree", "fixed"):
        titles = titles_of(shakespeare[strategy], lang)
        drafted_titles = [t for r, pos, t in titles if pos <= len(r.drafts)]
        assert drafted_titles and all((depth if strategy == "tree" else position) in t for t in drafted_titles)
        assert not any((position if strategy == "tree" else depth) in t for _, _, t in titles)
    past_leaf = [t for r, pos, t in titles_of(shakespeare["tree"], lang) if pos > len(r.drafts) and r.tree]
    assert past_leaf and all(depth.split()[-1] in t for t in past_leaf), past_leaf


@pytest.mark.parametrize("lang", ["en", "zh-CN"])
def test_the_strategy_race_says_how_to_start_it_before_it_runs(lang):
    empty = plots.strategy_race({}, lang)
    [note] = empty.layout.annotations
    assert tr("race.run", lang) in note.text and note.xref == "paper"
    assert not plots.strategy_race({"a": [(0.1, 1)]}, lang).layout.annotations


@pytest.mark.parametrize("lang", ["en", "zh-CN"])
def test_race_lines_hover_with_the_runs_name_its_tokens_and_its_seconds(shakespeare, lang):
    """The review's hover read '(0.5591802, 20)'; the Chromium test above reads the drawn hover."""
    figs = [plots.race(shakespeare["fixed"], shakespeare["target"], lang), plots.strategy_race({"a": [(0.1, 1)]}, lang)]
    lines = [t for f in figs for t in f.data]
    assert len(lines) == 3
    for line in lines:
        assert all(part in line.hovertemplate for part in ("%{fullData.name}", "%{y:d}", "%{x:.2f}"))
        assert line.hoverlabel.namelength == 0  # the name is in the text: no second box repeating it
    assert (tr("chart.race_y", lang) in lines[0].hovertemplate) == (lang == "en")  # "tokens" / "个 token"


def test_acceptance_by_position_draws_only_the_drafted_depths_of_a_tree_with_legible_counts(shakespeare):
    """The review: a tree's chart ran to position 15 (k counts a tree's nodes) with tiny "n=0" labels."""
    tree = shakespeare["tree"]
    deepest = max(len(r.drafts) for r in tree.rounds)
    assert max(r.k for r in tree.rounds) > deepest
    for presenting in (False, True):
        fig = plots.present(plots.acceptance_by_position(tree, "en"), presenting)
        assert list(fig.data[0].x) == list(range(1, deepest + 1))
        counts = [a for a in fig.layout.annotations if a.text.startswith("n=")]
        assert [int(a.text[2:]) for a in counts] == [plots.acceptance(tree.rounds, x)["judged"] for x in fig.data[0].x]
        assert all(int(a.text[2:]) > 0 for a in counts)  # every drafted depth was judged
        tick = fig.layout.xaxis.tickfont.size or fig.layout.font.size
        assert all((a.font.size or fig.layout.font.size) >= tick for a in counts)
        assert fig.layout.xaxis.title.text == "depth in the tree"
    chain = plots.acceptance_by_position(shakespeare["fixed"], "en")
    assert list(chain.data[0].x) == [1, 2, 3, 4] and chain.layout.xaxis.title.text == "draft position"


@pytest.mark.parametrize("lang,words", [("en", "does not apply"), ("zh-CN", "不适用")])
def test_the_theory_chart_of_a_tree_is_a_note_without_a_k_axis(shakespeare, lang, words):
    """The review: an empty plot with a K axis from 0 to 1 for a tree run. With or without the baseline, the tree's
    chart is a note (in the page's language) and draws no axis; a chain's still draws its K axis."""
    tree, base = shakespeare["tree"], shakespeare["target"]
    for fig in (plots.speedup_vs_theory(tree, base, lang=lang), plots.speedup_vs_theory(tree, None, lang=lang)):
        [note] = fig.layout.annotations
        assert words in note.text and not fig.data
        for axis in (fig.layout.xaxis, fig.layout.yaxis):
            assert axis.showticklabels is False and axis.showgrid is False and not axis.title.text
    chain = plots.speedup_vs_theory(shakespeare["fixed"], base, lang=lang)
    assert chain.data and chain.layout.xaxis.showticklabels is not False


@pytest.mark.parametrize("lang", ["en", "zh-CN"])
def test_the_distribution_title_names_the_token_the_text_names(lang):
    """The tab's text says 'token 2 of the reply' where the strategy drafts nothing at first (dist.later); the
    title said 'First token'. It names the same position, and says nothing false where the caller gives none."""
    args = (["a", "b"], [0.5, 0.5], [0.4, 0.6], None, 100, lang)
    for pos in (1, 2, 7):
        title = plots.distribution(*args, position=pos).layout.title.text
        said = tr("dist.later", lang, pos=pos, who="", before="")
        shared = {"en": f"oken {pos} of the reply", "zh-CN": f"回复第 {pos} 个 token"}[lang]
        assert shared in title and shared in said, (title, said)
    unnamed = plots.distribution(*args).layout.title.text
    assert "First token" not in unnamed and "第一个" not in unnamed and "100" in unnamed
