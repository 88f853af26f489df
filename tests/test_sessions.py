"""Sessions of the real app (app.py's demo on localhost) side by side, through gradio_client: what one session does
never waits for another's, and nothing on one session's page outlives the run or the experiment it came from."""

from __future__ import annotations

import threading

from gradio_client import Client

from specdemo import views

RUN = ("shakespeare", "", "", "JULIET:\n", 4, 0.8, 0, 1.0, 40, 1, False, 1.0, None, "fixed")  # /generate_stream


def run_in(client: Client, lang: str = "en") -> None:
    """A finished run in this client's session (the step-through reads it from the session's state)."""
    client.submit(*RUN, lang, False, 3, api_name="/generate_stream").result(timeout=300)


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
