"""The page as a person sees it, in headless Chromium (Debian's chromium driven by Playwright): type, generate,
watch coloured tokens, charts and the film strip appear, inspect a round, and make sure hostile text stays text."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian chromium is not installed")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--disable-quic", "--no-first-run"]
SCREENSHOT = Path(__file__).resolve().parent.parent / "assets" / "screenshot.png"


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser, app_url):
    context = browser.new_context(viewport={"width": 1500, "height": 1500})
    pg = context.new_page()
    pg.dialogs = []
    pg.on("dialog", lambda d: (pg.dialogs.append(d.message), d.dismiss()))
    pg.goto(app_url, wait_until="load")
    pg.wait_for_selector("#sd-generate")
    pg.wait_for_selector("#sd-race .js-plotly-plot")  # the page has drawn its (empty) charts: a person sees it ready
    pg.wait_for_function("document.querySelector('#sd-pair-status').innerText.includes('Loaded')")
    yield pg
    context.close()


def set_prompt(page, text: str) -> None:
    box = page.locator("#sd-prompt textarea")
    box.fill(text)


def test_generate_shows_tokens_charts_and_film_strip(page, tmp_path):
    set_prompt(page, "ROMEO:\n")
    t0 = time.perf_counter()
    page.click("#sd-generate")
    page.wait_for_selector("#sd-token-view .sd-tok.sd-accepted, #sd-token-view .sd-tok.sd-bonus", timeout=30000)
    first_round_s = time.perf_counter() - t0
    print(f"\ntime from pressing Generate to the first streamed round: {first_round_s:.3f} s")
    # the run ends when the baseline's stats card is there
    page.wait_for_function("document.querySelector('#sd-stats').innerText.includes('done')", timeout=120000)
    spans = page.locator("#sd-token-view .sd-tok")
    assert spans.count() > 10
    labels = set(page.eval_on_selector_all("#sd-token-view .sd-tok", "els => els.map(e => e.className)"))
    assert any("sd-accepted" in c for c in labels)
    title = spans.first.get_attribute("title")
    assert "p(x) target" in title and "q(x) draft" in title and "min(1, p/q)" in title
    assert "speedup" in page.inner_text("#sd-stats")
    assert page.locator("#sd-race .js-plotly-plot").count() == 1
    assert page.locator("#sd-acc-round .js-plotly-plot").count() == 1
    assert page.locator("#sd-race .js-plotly-plot .scatterlayer .trace").count() == 2  # both runs drawn
    rows = page.locator("#sd-film .sd-row")
    assert rows.count() >= 3
    # open the third round in the inspector by clicking its film-strip row
    rows.nth(2).click()
    page.wait_for_function("document.querySelector('#sd-reason').innerText.length > 10", timeout=20000)
    reason = page.inner_text("#sd-reason")
    assert any(w in reason for w in ("Accepted", "Rejected", "bonus", "never checked"))
    assert page.locator("#sd-inspector .js-plotly-plot").count() == 1
    page.locator("#sd-film").scroll_into_view_if_needed()
    page.evaluate("window.scrollTo(0, 0)")
    out = SCREENSHOT if os.environ.get("SPECDEMO_SAVE_SCREENSHOT") else tmp_path / "screenshot.png"
    page.screenshot(path=str(out), full_page=True)
    assert out.stat().st_size > 20000
    (Path(os.environ.get("SPECDEMO_REPORT_DIR", tmp_path)) / "first_round_s.txt").write_text(f"{first_round_s:.3f}\n")


def test_hostile_prompt_renders_as_inert_text(page):
    payload = "<script>alert('xss1')</script><img src=x onerror=\"alert('xss2')\"><b onmouseover=alert(3)>\"'&\x07"
    set_prompt(page, payload)
    page.click("#sd-generate")
    page.wait_for_function("document.querySelector('#sd-stats').innerText.includes('done')", timeout=120000)
    view = page.locator("#sd-token-view")
    view.hover()
    page.locator("#sd-token-view .sd-prompt").hover()
    assert page.dialogs == []
    assert page.locator("#sd-token-view img, #sd-token-view script, #sd-token-view b").count() == 0
    text = view.inner_text()
    assert "<script>alert('xss1')</script>" in text and "onerror" in text
    assert "\\x07" in text  # a control character is shown, not swallowed
    assert page.locator("img[src='x']").count() == 0


def test_step_through_advances_one_round_at_a_time(page):
    set_prompt(page, "JULIET:\n")
    page.click("#sd-generate")
    page.wait_for_function("document.querySelector('#sd-stats').innerText.includes('done')", timeout=120000)
    page.get_by_role("tab", name="Step through").click()
    page.click("#sd-next-round")
    page.wait_for_function("document.querySelector('#sd-step-caption').innerText.includes('Round 1 of')")
    page.click("#sd-next-round")
    page.wait_for_function("document.querySelector('#sd-step-caption').innerText.includes('Round 2 of')")
    assert "draft proposed" in page.inner_text("#sd-step-caption")
