"""The page a speaker can trust on stage (issue 44), in headless Chromium at 1280x720, in both languages: a refused
input leaves the buttons as they were, every number means one thing, the four kinds of token read apart on a
projector, nothing above the reply moves while a run streams, and presenter mode keeps every text a viewer reads
at 16 px or more."""

from __future__ import annotations

import logging
import os

import pytest
from conftest import CHROMIUM
from test_browser import browser, open_page  # noqa: F401  (browser: a fixture)

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian chromium is not installed")
LOCALES = ("en-US", "zh-CN")
TABS = {"en-US": {"race": "Strategy race", "sweep": "K sweep", "dist": "Distribution"},
        "zh-CN": {"race": "策略赛跑", "sweep": "K 值扫描", "dist": "分布检验"}}


@pytest.fixture(params=LOCALES)
def stage(request, browser, app_url):  # noqa: F811
    """The page at 1280x720, a projector's size, in each language."""
    context, pg = open_page(browser, app_url, request.param, width=1280, height=720)
    pg.locale = request.param
    yield pg
    context.close()


def idle_within(page, ms: int = 1000) -> None:
    """Generate live and Stop off within `ms` (the buttons as they were before the click)."""
    page.wait_for_function("!document.querySelector('#sd-generate').disabled"
                           " && document.querySelector('#sd-stop').disabled", timeout=ms)


# each refusal the page can give from a button that starts a model run: (the button, its tab, the prompt)
REFUSALS = [("#sd-generate", None, ""), ("#sd-generate", None, "ROMEO " * 3400), ("#sd-race-run", "race", " "),
            ("#sd-sweep-run", "sweep", ""), ("#sd-dist-run", "dist", "\n")]


@pytest.mark.parametrize("button,tab,prompt", REFUSALS, ids=["empty", "too-long", "race", "sweep", "distribution"])
def test_a_refused_run_leaves_the_buttons_as_they_were(stage, button, tab, prompt, caplog, capfd):
    caplog.set_level(logging.INFO, logger="specdemo")
    stage.locator("#sd-prompt textarea").fill(prompt)
    if tab:
        stage.get_by_role("tab", name=TABS[stage.locale][tab]).click()
    for attempt in range(2):  # a second refusal behaves as the first
        stage.click(button)
        stage.wait_for_selector(".toast-body", timeout=15000)
        idle_within(stage, 5000 if attempt == 0 else 1000)  # the first, counted from the click, includes the server
        toasts = stage.locator(".toast-body")
        assert toasts.count() == 1, "the refusal is said once"
        stage.locator(".toast-close").first.click()
        stage.wait_for_selector(".toast-body", state="detached")
        # no red "Error" pill over the stats: the stats show what they showed
        assert stage.locator("#sd-stats .error").count() == 0
        assert "Error" not in stage.inner_text("#sd-stats")
    stage.wait_for_timeout(300)
    assert buttons_idle(stage)
    refusals = [r.getMessage() for r in caplog.records if r.getMessage().startswith("refused")]
    assert len(refusals) == 2 and all("\n" not in m for m in refusals), refusals
    assert "Traceback" not in capfd.readouterr().err, "an expected refusal prints no traceback"


def buttons_idle(page) -> bool:
    return page.is_enabled("#sd-generate") and not page.is_enabled("#sd-stop")
