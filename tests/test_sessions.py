"""Sessions of the real app (app.py's demo on localhost) side by side, through gradio_client: what one session does
never waits for another's, and nothing on one session's page outlives the run or the experiment it came from."""

from __future__ import annotations

import json
import os
import threading

import gradio as gr
import pytest
from conftest import CHROMIUM, CHROMIUM_ARGS
from gradio_client import Client
from test_browser import set_slider

from specdemo.app import views
from specdemo.app.handlers import RUN_OUTPUTS
from specdemo.config import PRESETS

RUN = ("shakespeare", "", "", "JULIET:\n", 4, 0.8, 0, 1.0, 40, 1, False, 1.0, None, "fixed")  # /generate_stream


def run_in(client: Client, lang: str = "en") -> None:
    """A finished run in this client's session (the step-through reads it from the session's state)."""
    client.submit(*RUN, lang, False, 3, 0, 0, 0, api_name="/generate_stream").result(timeout=300)


def test_one_sessions_step_does_not_wait_for_anothers(app_url, monkeypatch):
    """Step-through keeps its order within a session only: while session A's step is held inside its handler,
    session B's step is answered. (With one queue slot for every session's steps, B waited for A.)"""
    a, b = Client(app_url, verbose=False), Client(app_url, verbose=False)
    run_in(a)
    run_in(b)
    entered, release = threading.Event(), threading.Event()
    real = views.step_view

    def held(state, lang=None):  # A's step (the only one in Chinese) waits inside the handler until released
        if lang == "zh-CN":
            entered.set()
            assert release.wait(300)
        return real(state, lang)

    monkeypatch.setattr(views, "step_view", held)
    job_a = a.submit("zh-CN", api_name="/step_next")
    try:
        assert entered.wait(120), "session A's step never started"
        tokens_b, caption_b = b.submit("en", api_name="/step_next").result(timeout=120)
        assert caption_b.startswith("Round 1 of "), caption_b
        assert not job_a.done(), "session A's step finished before it was released"
    finally:
        release.set()
    tokens_a, caption_a = job_a.result(timeout=120)
    assert caption_a.startswith("第 1 轮"), caption_a  # A's own step, in A's language


def test_quick_steps_in_one_session_each_start_from_the_last(app_url):
    """Three Next presses sent at once, then Previous: every press moves the cursor once (none reads a stale one),
    so the session ends on round 2, as a session that pressed Next twice, one at a time."""
    quick, calm = Client(app_url, verbose=False), Client(app_url, verbose=False)
    run_in(quick)
    run_in(calm)
    for job in [quick.submit("en", api_name="/step_next") for _ in range(3)]:
        job.result(timeout=120)
    _, after_quick = quick.submit("en", api_name="/step_prev").result(timeout=120)
    for _ in range(2):
        _, after_calm = calm.submit("en", api_name="/step_next").result(timeout=120)
    assert after_quick == after_calm and after_quick.startswith("Round 2 of "), (after_quick, after_calm)


SKIP = {"__type__": "update"}  # an update that leaves the output as it was


def on_page(updates: list) -> list:
    """What the streamed updates leave on the page, output by output (None: never set by them)."""
    shown = [None] * len(updates[0])
    for update in updates:
        shown = [old if new == SKIP else new for old, new in zip(shown, update)]
    return shown


def plot_data(value) -> list | None:
    """The traces of a streamed gr.Plot value; None where the update left the plot as it was."""
    if not isinstance(value, dict) or value.get("type") != "plotly":
        return None
    return json.loads(value["plot"])["data"]


def test_a_runs_first_update_clears_the_previous_runs_charts(client):
    """The charts are redrawn every 0.4 s while a run streams; its first update already replaces the previous
    run's charts with empty ones, so a run stopped at once shows none of the previous run's lines."""
    run_in(client)
    job = client.submit(*RUN[:8], 8, 2, False, 1.0, None, "fixed", "en", False, 3, 0, 0, 0,
                        api_name="/generate_stream")
    job.result(timeout=300)
    first = job.outputs()[0]
    at = RUN_OUTPUTS.index(views.CHARTS[0])  # /generate_stream's outputs, in handlers.RUN_OUTPUTS' order
    charts = first[at : at + len(views.CHARTS)]
    assert all(plot_data(c) is not None for c in charts), [str(c)[:80] for c in charts]
    assert plot_data(charts[0]) == [], "the first update's race chart still has lines"
    empty = [json.loads(gr.Plot().postprocess(f).plot)["data"] for f in views.charts(None, None, "en").values()]
    assert [plot_data(c) for c in charts] == empty


EXPERIMENTS = {  # api name, inputs after (pair, draft, target, prompt), which output is the table
    "/k_sweep": ([0.8, 0, 1.0, 16, 0, 1, 2, None, "en", False], 1),
    "/strategy_race": ([3, 0.0, 0, 1.0, 16, 0, None, "en", False, 3], 1),
    "/distribution_check": ([1.0, 0, 1.0, 1.0, 200, 0, None, "en", False, "fixed", 3, 3], 1),
}


@pytest.mark.parametrize("api", EXPERIMENTS)
def test_an_experiment_that_ends_before_its_first_result_leaves_no_earlier_one(app_url, monkeypatch, api):
    """A K sweep, a race or a distribution check that the time limit (or Stop, or an error) ends before its first
    result must not leave the previous result's plot and table on the page: its first update clears them."""
    client = Client(app_url, verbose=False)
    args, table = EXPERIMENTS[api]
    done = client.submit("shakespeare", "", "", "ROMEO:\n", *args, api_name=api).result(timeout=300)
    assert done[table], "the first experiment shows a table"
    monkeypatch.setenv("SPECDEMO_TIME_LIMIT_S", "0")  # the next one ends at its first target step
    job = client.submit("shakespeare", "", "", "ROMEO:\n", *args, api_name=api)
    job.result(timeout=300)
    shown = on_page(job.outputs())
    assert shown[table] == "", shown
    assert not any(tr.get("y") for tr in plot_data(shown[0]) or []), "the plot still shows a result"


def test_a_distribution_check_refused_for_bad_input_changes_nothing(client):
    """Bad input is refused before anything is drawn: the refused check sends no update, so the page keeps the
    earlier result (it used to clear it first; an experiment that starts and ends before its first result still
    clears it, above)."""
    client.submit("shakespeare", "", "", "ROMEO:\n", *EXPERIMENTS["/distribution_check"][0],
                  api_name="/distribution_check").result(timeout=300)
    args = EXPERIMENTS["/distribution_check"][0]
    job = client.submit("shakespeare", "", "", "  ", *args, api_name="/distribution_check")
    with pytest.raises(Exception, match="The prompt is empty"):
        job.result(timeout=300)
    assert job.outputs() == []


def test_the_experiments_follow_the_pages_strategy_and_ngram(client):
    """The race runs prompt lookup with the page's n-gram size, and the distribution check drafts with the page's
    strategy: with the EAGLE head, whose first round is a plain target step, it samples the reply's token 2."""
    race = client.submit("shakespeare", "", "", "ROMEO:\n", 3, 0.0, 0, 1.0, 12, 0, None, "en", False, 2,
                         api_name="/strategy_race").result(timeout=300)
    names = [row.split("|")[1].strip() for row in race[1].splitlines()[2:] if row.startswith("|")]
    assert "prompt lookup n = 2" in names, names
    args = list(EXPERIMENTS["/distribution_check"][0])
    args[-3] = "eagle"
    _, summary = client.submit("shakespeare", "", "", "ROMEO:\n", *args, api_name="/distribution_check").result(
        timeout=300)
    assert summary.startswith("Samples of token 2 of the reply, the first that the EAGLE head drafts"), summary
    assert "χ² test against p" in summary


# ------------------------------------------------------------------------------------------------ the page

STATUS = "(document.querySelector('#sd-pair-status')?.innerText || '')"


def test_a_failed_pair_load_puts_the_selector_back_on_the_loaded_pair(app_url):
    """A custom pair that fails to load leaves the pair that was loaded working: the selector goes back to it (with
    the one-sentence error still shown), so the next Generate runs it instead of trying the failed pair again."""
    if not os.path.exists(CHROMIUM):
        pytest.skip("Debian chromium is not installed")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_context(viewport={"width": 1400, "height": 1400}, locale="en-US").new_page()
        page.goto(app_url, wait_until="load")
        page.wait_for_function(f"{STATUS}.includes('Loaded')", timeout=120000)
        page.locator("#sd-pair input").click()
        page.locator(f"li[role='option'][data-index='{len(PRESETS)}']").click()  # custom, after the presets
        page.wait_for_function(f"{STATUS}.includes('Enter a draft')", timeout=60000)
        page.locator("#sd-draft-id textarea, #sd-draft-id input").first.fill("nobody/no-such-draft")
        page.locator("#sd-target-id textarea, #sd-target-id input").first.fill("nobody/no-such-target")
        page.click("#sd-load")
        page.wait_for_function(f"{STATUS}.includes('Could not load')", timeout=120000)
        page.wait_for_function("document.querySelector('#sd-pair input').value === 'shakespeare'",
                               timeout=60000)
        assert not page.locator("#sd-draft-id").is_visible()
        set_slider(page, "sd-max-new", 16)  # a short run: what matters is which pair it runs
        page.click("#sd-generate")
        page.wait_for_function("document.querySelector('#sd-stats').innerText.includes('done')", timeout=120000)
        assert "Could not load" in page.evaluate(STATUS), "the error was replaced"
        assert page.input_value("#sd-pair input") == "shakespeare"
        browser.close()
