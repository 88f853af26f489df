"""The page's styling as a projector shows it (style.py, tree_view.TREE_CSS), measured in headless Chromium: gradio's
toast titles in the page's language, the recorded run's note whole under the stats, a presenter's tree reachable in
its box with a scrollbar that shows, the tree's end tokens in the reply's colours for their kinds, and the step keys'
hint readable."""

from __future__ import annotations

import os
import re
import types

import pytest
from conftest import CHROMIUM, CHROMIUM_ARGS
from test_browser import open_page, open_settings, set_slider, wait_caption
from test_tree_ui import SHAPE, ending, tree_rounds

from specdemo import SamplingConfig, SpecConfig, speculative_generate
from specdemo.app import recorded, render, style, tree_view
from specdemo.config import SHIPPED_DEFAULT

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian chromium is not installed")
LANG = {"en-US": "en", "zh-CN": "zh-CN"}
ROUND = {"en-US": "Round {n} of", "zh-CN": "第 {n} 轮"}

# WCAG 2.1's relative luminance of a computed colour ("rgb(r, g, b)" or "rgba(...)"), as a page script
LUM_JS = """const lum = (c) => { const [r, g, b] = c.match(/[\\d.]+/g).slice(0, 3).map(v => +v / 255)
    .map(v => v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4); return 0.2126 * r + 0.7152 * g + 0.0722 * b; };
  const back = (e) => { for (; e; e = e.parentElement) { const c = getComputedStyle(e).backgroundColor;
    if (!/rgba\\(.*, 0\\)$|transparent/.test(c)) return c; } return 'rgb(255, 255, 255)'; };"""


def contrast(a: float, b: float) -> float:
    """WCAG 2.1's contrast ratio of two relative luminances."""
    return (max(a, b) + 0.05) / (min(a, b) + 0.05)


def presenter(page, on: bool) -> None:
    box = page.locator("#sd-presenter input")
    box.check() if on else box.uncheck()
    page.wait_for_function(f"{'' if on else '!'}document.querySelector('#sd-app').classList.contains('sd-present')")
    page.wait_for_timeout(300)


# ------------------------------------------------------------------------------------ toast titles (item 1)
TOAST_JS = """() => { const t = document.querySelector('.toast-title.error'), b = getComputedStyle(t, '::before');
  return {own: getComputedStyle(t).fontSize, before: b.content, size: parseFloat(b.fontSize),
          width: t.getBoundingClientRect().width}; }"""


@pytest.mark.parametrize("locale,title", [("zh-CN", '"出错了"'), ("en-US", "none")])
def test_a_refusals_toast_is_titled_in_the_pages_language(browser, app_url, locale, title):
    """An empty prompt's refusal: on the Chinese page the title gradio draws as "Error" reads 出错了 (the
    catalogue's toast.error), the English word at size 0; the English page keeps gradio's own title."""
    from specdemo.i18n import tr

    context, page = open_page(browser, app_url, locale, 1280, 720)
    page.locator("#sd-prompt textarea").fill("")
    page.click("#sd-generate")
    page.wait_for_selector(".toast-title.error", timeout=15000)
    seen = page.evaluate(TOAST_JS)
    assert seen["before"] == title, seen
    if locale == "zh-CN":
        assert title == f'"{tr("toast.error", "zh-CN")}"'
        assert seen["own"] == "0px" and seen["size"] >= 16 and seen["width"] > 20, seen  # drawn, and only it
    else:
        assert seen["own"] != "0px" and page.inner_text(".toast-title.error").strip() == "Error", seen
    context.close()


# ------------------------------------------------------------------------------------ the recorded note (item 2)
# the note in the stats' line: the height its text needs, the line's own, and the lowest drawn line of its text
NOTE_JS = """() => { const line = document.querySelector('#sd-stats .sd-line');
  const note = line.querySelector('.sd-recorded');
  const range = document.createRange(); range.selectNodeContents(note);
  const bottom = Math.max(...[...range.getClientRects()].map(r => r.bottom));
  return {need: note.scrollHeight, line: line.clientHeight, text: bottom,
          box: line.getBoundingClientRect().bottom}; }"""


@pytest.mark.parametrize("locale", ["zh-CN", "en-US"])
def test_the_recorded_runs_note_is_whole_in_both_languages_and_in_presenter_mode(browser, app_url, locale):
    """Each shipped recording's note (the page opens on one; the other's is drawn into the same line) wraps whole
    inside the stats' line, at 1280 and 1024 wide, in normal and presenter mode: in Chinese at 1280 the tree run's note
    had lost its last words ("运行。") under the line's 36 px."""
    context, page = open_page(browser, app_url, locale, 1280, 720)
    page.wait_for_selector("#sd-stats .sd-recorded")
    notes = {name: render.recorded_note(recorded.load(name)[0], LANG[locale]) for name in
             ("shakespeare", SHIPPED_DEFAULT)}
    for width in (1280, 1024):
        page.set_viewport_size({"width": width, "height": 720})
        for on in (False, True):
            presenter(page, on)
            for name, note in notes.items():
                page.eval_on_selector("#sd-stats .sd-line", "(e, html) => { e.innerHTML = html; }", note)
                seen = page.evaluate(NOTE_JS)
                assert seen["need"] <= seen["line"] and seen["text"] <= seen["box"] + 0.5, (width, on, name, seen)
    context.close()


# ------------------------------------------------------------------------------------ the step keys' hint (item 5)
SUBDUED_JS = "(sel) => { " + LUM_JS + """ const e = document.querySelector(sel);
  return [lum(getComputedStyle(e).color), lum(back(e)), parseFloat(getComputedStyle(e).fontSize)]; }"""


@pytest.mark.parametrize("selector", ["#sd-keys .sd-keys", "#sd-token-view .sd-tokens .sd-prompt"])
def test_the_step_keys_hint_and_the_prompt_read_at_4_5_to_1(browser, app_url, selector):
    """The text the page sets apart in grey, read from the back of a room: the step keys' hint (2.4:1 before) and
    the prompt in the full story (gradio's subdued grey, 2.5:1 before)."""
    context, page = open_page(browser, app_url, "zh-CN", 1280, 720)
    page.evaluate("document.body.classList.add('sd-story')")  # the full story, where the prompt is drawn
    for on in (False, True):
        presenter(page, on)
        text, back, size = page.evaluate(SUBDUED_JS, selector)
        assert contrast(text, back) >= 4.5, (on, contrast(text, back))
        assert size >= (16 if on else 13)
    context.close()


# ------------------------------------------------------------------------------------ the tree's end tokens (item 4)
# for each way a round ends: the tree node's fill, its opacity and its text's colour, the reply's token of that kind
# (its fill and text) and the tree legend's swatch
KIND_JS = "() => { " + LUM_JS + """ const out = {};
  for (const [i, kind] of [[3, 'resampled'], [4, 'bonus']]) {
    const g = document.querySelector('.sd-tree-' + kind), rect = getComputedStyle(g.querySelector('rect'));
    const tok = getComputedStyle(document.querySelector('.sd-tokens .sd-tok.sd-' + kind));
    const sw = getComputedStyle(document.querySelectorAll('.sd-tree-legend .sd-tree-sw')[i]);
    out[kind] = {fill: rect.fill, opacity: +rect.fillOpacity * +getComputedStyle(g).opacity,
                 text: getComputedStyle(g.querySelector('.sd-tok-text')).fill, tok: tok.backgroundColor,
                 tok_text: tok.color, swatch: sw.backgroundColor,
                 contrast: [lum(rect.fill), lum(getComputedStyle(g.querySelector('.sd-tok-text')).fill)]};
  }
  return out; }"""


@pytest.fixture(scope="module")
def ends(pair) -> dict:
    """A tree round ended by the target's correction and one ended by a bonus at a leaf, each token drawn as text
    (not a chip), from sampled tree runs (seeds in turn until both have come): {"miss" or "leaf": the drawing},
    and "tokens": those runs' tokens as the reply draws them."""
    found, tokens = {}, ""
    for seed in range(8):
        trace = speculative_generate(pair, "ROMEO:\n", SamplingConfig(0.8),
                                     SpecConfig(strategy="tree", max_new_tokens=32, seed=seed, **SHAPE))
        tokens += render.tokens_html(trace.prompt, trace.rounds)
        for rnd in tree_rounds(trace):
            end = next((t for t in rnd.tokens if t.label in ("resampled", "bonus")), None)
            if end is not None and tree_view.chip_words(end.text) is None:
                found.setdefault(ending(rnd), tree_view.tree_html(rnd, "en"))
        if {"miss", "leaf"} <= set(found):
            return found | {"tokens": tokens}
    pytest.fail(f"no plain correction and bonus in 8 seeds: {sorted(found)}")


def test_the_trees_end_tokens_wear_the_replys_colours_for_their_kinds(ends, browser, tmp_path):
    """One meaning per colour: the tree's correction and its free extra token are filled as the reply's tokens of
    those kinds (white on navy, black on amber), opaque, their text 4.5:1 or more on the fill; the tree's legend
    swatches match. They had been light blue and pale yellow."""
    page_file = tmp_path / "ends.html"
    page_file.write_text(f"<!doctype html><meta charset=utf-8><style>{style.CSS + tree_view.TREE_CSS}</style>"
                         f"{ends['miss']}{ends['leaf']}{ends['tokens']}")
    page = browser.new_page()
    page.goto(page_file.as_uri())
    seen = page.evaluate(KIND_JS)
    page.close()
    for kind in ("resampled", "bonus"):
        s = seen[kind]
        assert s["fill"] == s["tok"] == s["swatch"] and s["text"] == s["tok_text"], (kind, s)
        assert s["opacity"] == 1, (kind, s)
        assert contrast(*s["contrast"]) >= 4.5 and contrast(s["contrast"][0], 1.0) >= 3, (kind, s)
    assert seen["resampled"]["fill"] != seen["bonus"]["fill"]


# ------------------------------------------------------------------------------------ a tall tree (item 3)
@pytest.fixture(scope="module")
def desktop_chromium(browser):
    """Chromium with its scrollbars drawn, from the same Playwright as `browser`: Playwright's headless launch hides
    every scrollbar (--hide-scrollbars), which is how the review saw none at all."""
    b = browser.browser_type.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
                                    ignore_default_args=["--hide-scrollbars"])
    yield b
    b.close()


# the step view's tree box: its height and its content's, the room its scrollbar takes, the drawing's scale and,
# scrolled to its end, the lowest node's bottom against the box's
TREE_BOX_JS = """() => { const box = document.querySelector('#sd-step-tokens .sd-tree-scroll');
  if (!box) return null;
  const svg = box.querySelector('svg');
  box.scrollTop = box.scrollHeight;
  const r = box.getBoundingClientRect();
  const lowest = Math.max(...[...box.querySelectorAll('.sd-tree-node rect')]
    .map(e => e.getBoundingClientRect().bottom));
  const out = {client: box.clientHeight, content: box.scrollHeight, bar: box.offsetWidth - box.clientWidth,
               scale: svg.getBoundingClientRect().width / svg.viewBox.baseVal.width, lowest,
               inner: r.top + box.clientTop + box.clientHeight, bottom: r.bottom};
  box.scrollTop = 0;
  return out; }"""


def test_a_tall_tree_in_presenter_mode_scrolls_with_a_scrollbar_that_shows(desktop_chromium, app_url):
    """In Chinese at 1280x720, where scrollbars are overlays that show only while scrolling (macOS, phones: Chromium's
    mobile emulation): a run of wide EAGLE trees, stepped through in presenter mode to a round whose tree is taller
    than its box. The box draws its scrollbar (it takes room), the drawing stays at 4/3 of its size or more (its
    text 18.7 px) and, scrolled to its end, its lowest node is whole inside the box, on the screen."""
    locale = "zh-CN"
    overlay = types.SimpleNamespace(new_context=lambda **kw: desktop_chromium.new_context(is_mobile=True, **kw))
    context, page = open_page(overlay, app_url, locale, 1280, 720)
    open_settings(page)
    page.locator("#sd-strategy").get_by_text("EAGLE 草稿树", exact=True).click()
    page.wait_for_selector("#sd-tree-sizes", state="visible")
    for elem_id, value in (("sd-tree-topk", 4), ("sd-tree-depth", 3), ("sd-tree-budget", 24), ("sd-max-new", 16)):
        set_slider(page, elem_id, value)
    page.locator("#sd-prompt textarea").fill("ROMEO:\n")
    page.click("#sd-generate")
    page.wait_for_function("document.querySelector('#sd-stats').innerText.includes('完成')"
                           " && !document.querySelector('#sd-stats .sd-recorded')", timeout=300000)
    presenter(page, True)
    page.wait_for_function("(document.querySelector('#sd-race .gtitle')?.style.fontSize || '') === '24px'",
                           timeout=60000)  # the switch's redraw is on the page before the keys move the cursor
    page.locator("#sd-stats").click()
    rounds = page.locator("#sd-film .sd-row").count()
    seen = None
    for n in range(1, rounds + 1):
        page.keyboard.press("ArrowRight")
        wait_caption(page, ROUND[locale].format(n=n))
        page.wait_for_timeout(200)
        seen = page.evaluate(TREE_BOX_JS)
        if seen and seen["content"] > seen["client"] + 20:
            break
    else:
        pytest.fail(f"no tree taller than its box in {rounds} rounds: {seen}")
    assert seen["bar"] >= 8, f"the scrollbar is drawn and takes room: {seen}"
    assert 4 / 3 - 0.01 <= seen["scale"] <= 1.61, seen
    assert seen["lowest"] <= seen["inner"] + 0.5 and seen["bottom"] <= 720, seen
    assert re.search(r"草稿头起草了一棵含 \d+ 个 token 的树", page.inner_text("#sd-step-caption"))
    context.close()


# ------------------------------------------------------------------------------------ no timer over the stats
OWN_VIEWS = ("#sd-stats", "#sd-token-view", "#sd-film", "#sd-step-tokens", "#sd-step-caption")
WATCH_TIMER_JS = """(views) => { window.sdTimers = []; new MutationObserver(() => {
  for (const e of document.querySelectorAll(views.map((v) => v + ' .progress-text, ' + v + ' .eta-bar').join(', ')))
    if (e.offsetParent !== null && e.textContent.trim()) window.sdTimers.push(e.textContent.trim()); })
  .observe(document.body, {subtree: true, childList: true, characterData: true, attributes: true}); }"""


def test_no_timer_is_drawn_over_the_stats_while_a_run_streams(browser, app_url):
    """The stats, text, film strip and step-through say what a run is doing; gradio's own "processing | 0.1s" over
    them flickered at a run's start and end (seen in a review's screenshot, and over the text once run_over drew it
    after Stop)."""
    context, page = open_page(browser, app_url, "en-US", 1280, 720)
    page.evaluate(WATCH_TIMER_JS, list(OWN_VIEWS))
    for prompt in ("ROMEO:\n", "JULIET:\n"):  # the second run has an ETA to show, from the first
        page.locator("#sd-prompt textarea").fill(prompt)
        page.click("#sd-generate")
        page.wait_for_function("document.querySelector('#sd-stats').innerText.match(/done/)"
                               f" && document.querySelector('#sd-token-view').innerText.startsWith({prompt[:5]!r})",
                               timeout=120000)
    assert page.evaluate("window.sdTimers") == []
    context.close()
