"""Take the README's screenshots: start the app, open it in headless Chromium (as it opens, then Generate), save.

  assets/screenshot-first-screen.png  English, 1280x720, as the page opens: no click, its recorded run
  assets/screenshot.png               English, 1500 px wide, the whole page after Generate (a live run), the full
                                      story on (rejected drafts struck through), a round open in the inspector
  assets/screenshot-presenter-zh.png  简体中文 in presenter mode, 1280x720 (a projector), stepped to round 3 from the
                                      keyboard: the round's sentence, its tree and the text so far on one screen
  assets/screenshot-tree.png          English, 1280x800, the EAGLE tree: stepped to a round whose path left the tree

Run: .venv/bin/python scripts/screenshot.py [--out-dir assets]. Needs Debian's chromium and a CJK font
(`scripts/setup.sh --dev` installs both; without the font the Chinese renders as boxes).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from measure_app import ARGS, CHROMIUM, free_port  # noqa: E402  (beside this script)

DONE = "document.querySelector('#sd-stats').innerText.match(/done|完成/)"


def ready(page, loaded: str, legend: str) -> None:
    page.wait_for_selector("#sd-generate")
    page.wait_for_selector("#sd-race .js-plotly-plot")
    page.wait_for_function(f"document.querySelector('#sd-pair-status').innerText.includes('{loaded}')")
    # the server's redraw in the browser's language is a separate event from the pair's status
    page.wait_for_function(f"document.querySelector('#sd-legend').innerText.includes({legend!r})")


def generate(page, prompt: str) -> None:
    page.locator("#sd-prompt textarea").fill(prompt)
    page.click("#sd-generate")
    page.wait_for_function(DONE, timeout=180000)
    page.wait_for_timeout(800)  # the last chart redraw


def first_screen(browser, url: str, out: Path) -> None:
    context = browser.new_context(viewport={"width": 1280, "height": 720}, locale="en-US")
    page = context.new_page()
    page.goto(url)
    ready(page, "Loaded", "the draft's guess that the target kept")
    page.wait_for_selector("#sd-token-view .sd-tok")
    page.wait_for_timeout(800)
    page.screenshot(path=str(out))
    context.close()


def english(browser, url: str, out: Path, prompt: str) -> None:
    context = browser.new_context(viewport={"width": 1500, "height": 1500}, locale="en-US")
    page = context.new_page()
    page.goto(url)
    ready(page, "Loaded", "the draft's guess that the target kept")
    generate(page, prompt)
    page.locator("#sd-view").get_by_text("the full story", exact=True).click()  # the rejected drafts too
    page.locator("#sd-film .sd-row").nth(2).click()
    page.wait_for_function("document.querySelector('#sd-reason').innerText.length > 10")
    page.wait_for_timeout(500)
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(out), full_page=True)
    context.close()


def presenter_zh(browser, url: str, out: Path, prompt: str) -> None:
    context = browser.new_context(viewport={"width": 1280, "height": 720}, locale="zh-CN")
    page = context.new_page()
    page.goto(url)
    ready(page, "已加载", "目标模型保留的草稿猜测")
    generate(page, prompt)
    page.locator("#sd-presenter input").check()
    page.wait_for_function("document.querySelector('#sd-app').classList.contains('sd-present')")
    page.wait_for_function("parseFloat(getComputedStyle(document.querySelector('#sd-race .gtitle')).fontSize) > 20")
    page.locator("#sd-stats").click()
    for _ in range(3):  # step to round 3 from the keyboard, as a presenter would
        page.keyboard.press("ArrowRight")
    page.wait_for_function("(document.querySelector('#sd-step-caption')?.innerText || '').includes('第 3 轮')")
    page.wait_for_timeout(500)
    # the keys scrolled the tabs to the top: the projector shows what a speaker steps through, as it is
    page.screenshot(path=str(out))
    context.close()


def tree_round(browser, url: str, out: Path, prompt: str) -> None:
    """The draft tree of a round, as the step-through shows it: the caption, the drawing and the text so far. The
    round is the first whose path went at least two nodes deep and then left the tree (the target's correction)."""
    context = browser.new_context(viewport={"width": 1280, "height": 800}, locale="en-US")
    page = context.new_page()
    page.goto(url)
    ready(page, "Loaded", "the draft's guess that the target kept")
    folded = page.locator("#sd-settings .label-wrap")
    if folded.count() and not page.locator("#sd-settings .label-wrap.open").count():
        folded.click()
    page.locator("#sd-strategy").get_by_text("EAGLE tree", exact=True).click()
    generate(page, prompt)
    rows = page.locator("#sd-film .sd-row")
    pick = next((i for i in range(rows.count()) if rows.nth(i).locator(".sd-resampled").count()
                 and re.search(r"kept ([2-9]|1\d)", rows.nth(i).inner_text())), 1)
    page.locator("#sd-stats").click()
    page.keyboard.press("Home")
    for _ in range(pick + 1):
        page.keyboard.press("ArrowRight")
    page.wait_for_function(f"(document.querySelector('#sd-step-caption')?.innerText || '')"
                           f".includes('Round {pick + 1} of')")
    page.wait_for_selector("#sd-step-tokens .sd-tree svg")
    page.wait_for_timeout(500)
    page.evaluate("window.scrollTo(0, window.scrollY + document.querySelector('#sd-tabs')"
                  ".getBoundingClientRect().top - 4)")
    page.screenshot(path=str(out))
    context.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out-dir", type=Path, default=ROOT / "assets")
    parser.add_argument("--only", choices=("first-screen", "english", "presenter-zh", "tree"), action="append",
                        help="retake only these (repeatable; default: all four)")
    args = parser.parse_args()
    take = set(args.only or ("first-screen", "english", "presenter-zh", "tree"))
    from playwright.sync_api import sync_playwright

    import app
    from specdemo.app.ui import launch
    from specdemo.config import DEFAULT_PRESET, PRESETS

    examples = PRESETS[DEFAULT_PRESET].examples  # the default pair's own prompts, as a visitor would try them

    _, url, _ = launch(app.demo, prevent_thread_lock=True, server_name="127.0.0.1", server_port=free_port(),
                       quiet=True)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
            if "first-screen" in take:
                first_screen(browser, url, args.out_dir / "screenshot-first-screen.png")
            if "english" in take:
                english(browser, url, args.out_dir / "screenshot.png", examples[min(1, len(examples) - 1)])
            if "presenter-zh" in take:
                presenter_zh(browser, url, args.out_dir / "screenshot-presenter-zh.png", examples[-1])
            if "tree" in take and PRESETS[DEFAULT_PRESET].eagle_head:  # a pair without a head has no tree
                tree_round(browser, url, args.out_dir / "screenshot-tree.png", examples[0])
            browser.close()
    finally:
        app.demo.close()
    for name in take:
        print(args.out_dir / f"screenshot-{name}.png".replace("screenshot-english", "screenshot"))


if __name__ == "__main__":
    main()
