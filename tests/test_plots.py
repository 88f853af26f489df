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
        finally:
            browser.close()
