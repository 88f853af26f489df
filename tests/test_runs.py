"""The runs behind the app's buttons (specdemo/app/runs.py) share the device: each target forward takes the device lock
on its own, and a deadline ends a run between two forwards. Real models, the embedded pair."""

from __future__ import annotations

import time

import pytest
import torch

from specdemo import SamplingConfig, SpecConfig, speculative_generate
from specdemo.app import runs
from specdemo.app.validation import validate
from specdemo.engine.speculative import speculative_rounds
from specdemo.engine.ties import explain_divergence
from specdemo.limits import Limits

GREEDY = SamplingConfig(temperature=0.0)


def planted_divergence(pair, at: int):
    """A T = 0 run, and the target-only text it is compared with, with the runner-up planted at token `at`."""
    trace = speculative_generate(pair, "ROMEO:\n", GREEDY, SpecConfig(k=4, max_new_tokens=at + 8, top_candidates=0))
    out = trace.output_ids
    with torch.inference_mode():
        logits = pair.target(torch.tensor([trace.prompt_ids + out[:at]])).logits[0, -1, : pair.vocab_size]
    return trace, out[:at] + [int(logits.topk(2).indices[1])] + out[at + 1:]


def test_a_divergence_is_explained_one_locked_forward_at_a_time(pair32):
    """The race's explanation of a T = 0 divergence replays a prefill, one step per token up to it, and every verify
    up to its round. It takes the device lock for one forward at a time and leaves it free in between (where
    another session's round runs, and Stop ends it), and it gives the same answer as explain_divergence."""
    at = 20
    trace, planted = planted_divergence(pair32, at)
    pos = len(trace.prompt_ids) + at
    replayed = next(j for j, r in enumerate(trace.rounds) if r.prefix_len + len(r.output) > pos) + 1
    steps = runs.explained(pair32, trace.prompt_ids, trace.rounds, planted, time.monotonic() + 600)
    pauses = 0
    while True:
        try:
            assert next(steps) is None
        except StopIteration as done:
            result = done.value
            break
        assert pair32.lock.acquire(blocking=False), "the device lock is held between two forwards"
        pair32.lock.release()
        pauses += 1
    assert pauses == (1 + at + replayed) - 1  # a pause between every two of the forwards
    assert result == explain_divergence(pair32, trace.prompt_ids, trace.rounds, planted)
    assert result.position == at


def test_an_explanation_past_the_deadline_ends_after_one_forward(pair32):
    trace, planted = planted_divergence(pair32, 12)
    late = runs.explained(pair32, trace.prompt_ids, trace.rounds, planted, time.monotonic() - 1)
    with pytest.raises(StopIteration) as done:
        next(late)
    assert done.value.value == runs.TIME_LIMIT
    assert not pair32.lock.locked()


# ------------------------------------------------------------------------------------------------ distribution check

COPY = "ROMEO:\nWhat light through yonder window breaks?\nJULIET:\nWhat light through yonder"


def distribution(pair, strategy: str, prompt: str = "ROMEO:\n", n: int = 1000, lenience: float = 1.0, k: int = 3,
                 temperature: float = 1.0, seed: int = 0) -> dict:
    """The Distribution check tab's run, as its handler makes it, to the end."""
    limits = Limits.from_env()
    req = validate("shakespeare", "", "", prompt, k, temperature, 0, 1.0, 1, seed, False, lenience, limits, None,
                   strategy, 3)
    *between, dist = runs.first_token_distribution(pair, req, n, limits)
    assert all(step is None for step in between) and isinstance(dist, dict), dist
    return dist


def engine_round(pair, strategy: str, prompt: str, dist: dict, k: int = 3, temperature: float = 1.0):
    """The engine's own round that drafted the token the check sampled, with its top candidates' p and q."""
    ids = pair.encode(prompt)
    spec = SpecConfig(k=k, max_new_tokens=256, seed=0, top_candidates=20, strategy=strategy)
    for rnd in speculative_rounds(pair, ids, SamplingConfig(temperature), spec):
        if rnd.k:
            assert rnd.prefix_len - len(ids) + 1 == dist["position"], "the check sampled another position"
            return rnd
    raise AssertionError("the engine never drafted")


@pytest.mark.parametrize("strategy,prompt", [("fixed", "ROMEO:\n"), ("adaptive", "ROMEO:\n"), ("lookup", COPY),
                                             ("eagle", "ROMEO:\n"), ("tree", "ROMEO:\n")])
def test_the_distribution_check_samples_the_engines_p_with_the_pages_strategy(pair, strategy, prompt):
    """The check drafts with the page's strategy and tests the samples against the p that the engine's own verify
    forward gives at that position (float32 logits from the bf16 target, as the loop computes them; not a plain
    bf16 forward), and q is the drafter's own. The EAGLE head's first round is a plain target step, so its check
    samples token 2. The samples pass the chi-square test against that p."""
    dist = distribution(pair, strategy, prompt)
    rnd = engine_round(pair, strategy, prompt, dist)
    assert dist["source"] == rnd.source
    assert dist["position"] == (2 if strategy in ("eagle", "tree") else 1)
    engine = {c.token_id: c for c in rnd.drafts[0].top}
    shared = [(i, j) for j, i in enumerate(dist["token_ids"]) if i in engine and engine[i].p > 1e-4]
    assert len(shared) >= 3, (dist["token_ids"], list(engine))
    for token, j in shared:
        assert dist["p"][j] == pytest.approx(engine[token].p, rel=1e-5, abs=1e-7), (strategy, token)
        if strategy != "tree":
            assert dist["q"][j] == pytest.approx(engine[token].q, rel=1e-5, abs=1e-7), (strategy, token)
    assert dist["pvalue"] > 1e-3, dist


def test_the_distribution_checks_chi_square_sees_a_lossy_run(pair):
    """The same check with lenience b = 0.3 (the lossy knob: drafts are kept too often) fails its chi-square test:
    the test has the power to see a sampler that does not follow p."""
    dist = distribution(pair, "fixed", lenience=0.3)
    assert dist["pvalue"] < 1e-6, dist


def test_a_distribution_check_that_finds_no_draft_is_refused_and_changes_nothing(pair, monkeypatch):
    """Where no round drafts (prompt lookup with nothing to copy, here within one round), the check is refused after
    its rounds, in one sentence, and sent nothing before that: the previous result stays (its first update cleared
    it). One that ends without a result by Stop still clears it."""
    import gradio as gr

    from specdemo.app import experiments, stops

    monkeypatch.setattr(runs, "DIST_SEARCH_ROUNDS", 1)
    check = experiments.distribution_ui("shakespeare", "", "", "Why?", 0.8, 0, 1.0, 1.0, 20, 0, strategy="lookup")
    sent = []
    with pytest.raises(gr.Error, match="drafted nothing"):
        sent.extend(check)
    assert sent and all(update == {} for update in sent), sent
    token = stops.new_token()
    stops.stop(token)  # Stop before its first result
    check = experiments.distribution_ui("shakespeare", "", "", "ROMEO:\n", 0.8, 0, 1.0, 1.0, 20, 0, run_token=token)
    assert next(check)["dist_state"] is None
    check.close()


def test_the_distribution_checks_device_work_takes_the_devices_turn(pair, monkeypatch):
    """Its generator and its result's counts and draws run on the pair's device: on a shared GPU they take the
    device lock, as a run's rounds do (a capture by another session meanwhile would fail; found by reading)."""
    held, result = [], runs.distribution_result

    def watched(pair_, *args):
        held.append(pair_.lock.locked())
        return result(pair_, *args)

    monkeypatch.setattr(runs, "distribution_result", watched)
    assert distribution(pair, "fixed", n=50)["n"] == 50
    assert held == [True]


def test_on_zerogpu_a_request_pays_for_its_pair_s_load_out_of_its_time_limit(pair, monkeypatch):
    """On ZeroGPU the time limit counts from the request's arrival (Request.received), not from its first round: a
    run's worker may load the pair first, and the call should end near the GPU time it asked for
    (zerogpu.gpu_seconds). A load that spends the whole limit leaves one round and no baseline. Elsewhere the limit
    counts from the first round, so that a custom pair's download does not eat the run."""
    from specdemo.app import handlers, validation

    def slow_load(key):
        time.sleep(2.2)
        return pair

    monkeypatch.setenv("SPECDEMO_TIME_LIMIT_S", "2")
    monkeypatch.setattr(validation, "load_pair", slow_load)
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    out = handlers.generate_api(pair="shakespeare", prompt="ROMEO:\n", max_new_tokens=48, temperature=0.0)
    spec = out["speculative"]
    assert spec["stop_reason"] == "time_limit" and len(spec["rounds"]) == 1 and out["baseline"] is None
    monkeypatch.setenv("SPACES_ZERO_GPU", "false")
    elsewhere = handlers.generate_api(pair="shakespeare", prompt="ROMEO:\n", max_new_tokens=4, temperature=0.0)
    assert elsewhere["speculative"]["stop_reason"] != "time_limit" and elsewhere["baseline"] is not None


def test_a_baseline_the_time_limit_cuts_short_is_not_measured(pair, monkeypatch):
    """A baseline that the time limit ends is part of one: the run has no baseline and says the speed-up was not
    measured (before, its part gave a 'measured speedup', with no warning). Its steps are the real ones, slowed."""
    import warnings

    from specdemo.app import handlers

    real = runs.baseline_steps

    def slow(*args, **kwargs):
        for step in real(*args, **kwargs):
            time.sleep(0.25)
            yield step

    monkeypatch.setattr(runs, "baseline_steps", slow)
    monkeypatch.setenv("SPECDEMO_TIME_LIMIT_S", "1")
    out = handlers.generate_api(pair="shakespeare", prompt="ROMEO:\n", max_new_tokens=40, temperature=0.0)
    assert out["baseline"] is None and out["speculative"]["stop_reason"] != "time_limit"
    assert out["speculative"]["settings"]["baseline"] == "not measured"
    with warnings.catch_warnings(record=True) as said:  # gr.Warning outside a request: a Python warning
        warnings.simplefilter("always")
        *_, last = handlers.generate_ui("shakespeare", "", "", "ROMEO:\n", 4, 0.0, 0, 1.0, 40, 0, True, 1.0)
    assert "speedup not measured" in last["stats"] and "\u00d7" not in last["stats"]
    assert any("time limit" in str(w.message) for w in said)


def test_a_switch_after_stop_redraws_the_run_as_stopped(pair):
    """A language or presenter switch redraws everything from the session's state (views.everything). A run
    stopped in its baseline said "stopped" until the switch drew a speed-up from part of its baseline; one stopped
    while drafting said "done ()". run_over now marks a stopped run's state, and a redraw draws no baseline part;
    nor does the trace download, which says the run was stopped."""
    from specdemo.app import handlers, views
    from specdemo.app.validation import validate
    from specdemo.limits import Limits

    limits = Limits.from_env()
    req = validate("shakespeare", "", "", "ROMEO:\n", 4, 0.0, 0, 1.0, 60, 0, True, 1.0, limits)
    for cut in ("baseline", "speculative"):
        events = runs.run_stream(req, pair, limits)
        for spec, base, phase in events:
            if phase == cut and (base is not None and len(base.steps) > 3 or cut == "speculative" and
                                 len(spec.rounds) > 2):
                break  # Stop
        events.close()
        state = handlers.run_state(spec, base)
        over = handlers.run_over(state, "en")
        assert over["state"]["stopped"] and "Stopped" in over["stats"]
        redrawn = views.everything("en", True, over["state"], 1, 0, None, None, None, None)
        assert "Stopped" in redrawn["stats"] and "\u00d7" not in redrawn["stats"], (cut, redrawn["stats"])
        running = views.everything("en", False, state, 1, 0, None, None, None, None)  # a switch while it streams
        assert "\u00d7" not in running["stats"], cut
        saved = handlers.trace_of(over["state"])["trace_json"]  # the download: no baseline part, and said stopped
        assert saved["stopped"] and saved["baseline"] is None, cut
        assert len(saved["speculative"]["rounds"]) == len(spec.rounds), cut


def test_an_unplanned_error_is_one_sentence_in_the_visitors_language(caplog, monkeypatch):
    """An error no refusal plans for (here one planted in the run) reached the page as nothing at all (show_error is
    off) and the API as an empty error. Now it is one sentence, in the visitor's language, and its traceback goes
    to the server's log. The first such error found, the tokenizer's on a prompt with a lone surrogate (which a
    page's script or a raw HTTP call can send), is now a refusal that says what is wrong."""
    import gradio as gr

    from specdemo.app import handlers

    with pytest.raises(gr.Error) as err:
        handlers.generate_api(pair="shakespeare", prompt="ROMEO \ud800", max_new_tokens=8)
    assert "Character 7 of the prompt is not valid text" in err.value.message
    with pytest.raises(gr.Error) as err:
        list(handlers.generate_ui("shakespeare", "", "", "\udfffROMEO", 4, 0.0, 0, 1.0, 8, 0, True, 1.0,
                                  lang="zh-CN"))
    assert "提示词的第 1 个字符" in err.value.message

    def broken(*args):
        raise RuntimeError("planted")

    monkeypatch.setattr(handlers.runs, "run_stream", broken)
    with pytest.raises(gr.Error) as err:
        handlers.generate_api(pair="shakespeare", prompt="ROMEO", max_new_tokens=8)
    assert "went wrong on the server" in err.value.message and "RuntimeError" in err.value.message
    with pytest.raises(gr.Error) as err:
        list(handlers.generate_ui("shakespeare", "", "", "ROMEO", 4, 0.0, 0, 1.0, 8, 0, True, 1.0, lang="zh-CN"))
    assert "服务器出错" in err.value.message
    assert any(r.exc_info for r in caplog.records if "unexpected error" in r.getMessage())


def test_stop_ends_a_run_after_its_round_and_its_first_run_over_alone_gives_the_buttons_back(pair):
    """Stop marks the run's token (stops.py): Generate's run and an experiment's end at the next round, with no
    finished view after it (run_over draws the run as stopped); their streams then change nothing while they wait
    for gradio's cancel. Of the run_overs gradio fires after a cancel, only the `.failure`'s changes the page, once."""
    from specdemo.app import experiments, handlers, stops

    token = stops.new_token()
    updates = handlers.generate_ui("shakespeare", "", "", "ROMEO:\n", 1, 0.0, 0, 1.0, 200, 0, True, 1.0,
                                   run_token=token)
    next(updates)  # the first round, on the page
    stops.stop(token)
    assert [next(updates) for _ in range(3)] == [{}] * 3, "the run went on after Stop"  # waiting for the cancel
    updates.close()
    # the run's `.then`, fired by the cancel's completion before the page has finished the cancel, changes nothing;
    # its `.failure`, fired once the page has, gives the buttons back, once
    assert handlers.run_done({"spec": None}, "en", token) == {}
    over = handlers.run_over({"spec": None}, "en", token)
    assert over["go_btn"].interactive and not over["stop_btn"].interactive
    assert handlers.run_over({"spec": None}, "en", token) == {}, "a second run_over of the run changed the page"
    late, other = stops.new_token(), stops.new_token()
    stops.ended(late)  # a run that ended by itself, with Stop too late to stop it: its `.then` gives them back
    stops.stop(late)
    assert handlers.run_done({"spec": None}, "en", late)["go_btn"].interactive
    assert handlers.run_done({"spec": None}, "en", other)["go_btn"].interactive  # a run nobody stopped

    token = stops.new_token()
    sweep = experiments.k_sweep_ui("shakespeare", "", "", "ROMEO:\n", 0.0, 0, 1.0, 64, 0, 1, 8, run_token=token)
    assert next(sweep)["sweep_state"] is None  # the previous result cleared: it has started
    stops.stop(token)
    assert [next(sweep) for _ in range(3)] == [{}] * 3, "the sweep went on after Stop"
    sweep.close()
