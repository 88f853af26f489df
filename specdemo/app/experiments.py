"""The page's three experiments (the K sweep, the strategy race and the distribution check): the handlers behind
their buttons, streamed like a run (handlers.py) but each into its own outputs and state.

Each handler validates the page's inputs (validation.py), runs the experiment from runs.py and draws every result
with views.py. Bad input is refused before anything changes on the page: the fields, the pair's load, and the
prompt against the pair's context window (`fitted`). Once they pass, the handler clears its outputs and state, so
that an experiment that ends before its first result (Stop, the time limit) leaves nothing older on the page, nor
in the state a language switch redraws.
"""

from __future__ import annotations

import gradio as gr

from specdemo.engine.speculative import encode_prompt
from specdemo.i18n import Msg, tr
from specdemo.limits import Limits

from . import runs, stops, views
from .handlers import user_errors
from .validation import as_number, get_pair, validate
from .zerogpu import gpu

SWEEP_OUTPUTS = ("sweep_plot", "sweep_md", "sweep_state")
RACE_OUTPUTS = ("race_plot", "race_md", "race_state")
DIST_OUTPUTS = ("dist_plot", "dist_md", "dist_state")

TIME_LIMIT_KEY = {"sweep_state": "warn.sweep_time_limit", "race_state": "warn.race_time_limit",
                  "dist_state": "warn.time_limit"}


def shown(outputs: tuple[str, ...]) -> tuple[str, ...]:
    """An experiment's outputs that the page draws (not its state)."""
    return tuple(n for n in outputs if not n.endswith("_state"))


def experiment(events, view, state_name: str, lang, limits: Limits, token: str = "", cleared: dict | None = None):
    """Stream an experiment from runs.py: nothing between rounds (a place where Stop ends it), its view and state
    after each result, and a warning if the time limit ended it. Each experiment's handler first checks its inputs
    (a refusal changes nothing), then clears its outputs and state, so that an experiment that ends before its
    first result (Stop, the time limit) leaves no earlier result on the page, nor in the state a redraw reads. Stop
    ends it after the round it lands in (stops.Guard), and gradio's cancel then ends the stream (stops.linger).
    cleared: for an experiment that can still refuse after its first rounds (the distribution check, where no round
    drafts), the clearing update, sent only where it ends without a result by Stop or the time limit, so that its
    refusal too changes nothing."""
    guard, answered, timed_out = stops.Guard(token), False, False
    for item in guard(events):
        if item is None:
            yield {}
        elif item == runs.TIME_LIMIT:
            timed_out = True
            break
        else:
            answered = True
            yield view(item) | {state_name: item}
    if cleared is not None and not answered and (timed_out or guard.cut):
        yield cleared
    if timed_out:
        gr.Warning(tr(TIME_LIMIT_KEY[state_name], lang, s=limits.time_limit_s))
    elif guard.cut:
        yield from stops.linger()


def fitted(req, strategy: str | None = None):
    """The request's pair, loaded, once the prompt fits its context window with the new tokens asked for: runs.py
    checks the prompt only when the experiment starts, after the handler has cleared the previous result."""
    pair = get_pair(req.pair, strategy)
    encode_prompt(pair, req.prompt, req.spec.max_new_tokens, req.chat)
    return pair


@gpu
@user_errors
def k_sweep_ui(pair_name, draft_id, target_id, prompt, temperature, top_k, top_p, max_new_tokens, seed, k_from, k_to,
               chat=None, lang=None, presenter=False, head_id="", run_token=""):
    """Run K = k_from..k_to on the same prompt and seed; plot measured and predicted speedup, recommend a K.
    Streams SWEEP_OUTPUTS; the state lets a language switch redraw the result."""
    limits = Limits.from_env()
    k_from = as_number(Msg("field.k_from"), k_from, int, 1, limits.max_k)
    k_to = as_number(Msg("field.k_to"), k_to, int, k_from, limits.max_k)
    req = validate(pair_name, draft_id, target_id, prompt, k_from, temperature, top_k, top_p, max_new_tokens, seed,
                   True, 1.0, limits, chat, head_id=head_id)
    pair = fitted(req)
    yield views.sweep_view(None, lang, presenter) | {"sweep_state": None}  # see `experiment`
    events = runs.k_sweep(pair, req, limits, k_from, k_to)
    yield from experiment(events, lambda s: views.sweep_view(s, lang, presenter), "sweep_state", lang, limits,
                          run_token)


@gpu
@user_errors
def strategy_race_ui(pair_name, draft_id, target_id, prompt, k, temperature, top_k, top_p, max_new_tokens, seed,
                     chat=None, lang=None, presenter=False, ngram=3, tree_topk=0, tree_depth=0, tree_budget=0,
                     head_id="", run_token=""):
    """Target-only decoding, then every strategy, on the same prompt and seed, one after another (each timed alone),
    with the page's K, lookup n-gram size and tree sizes (0: the head's own). Streams RACE_OUTPUTS: the
    tokens-over-time chart and a table after every run."""
    limits = Limits.from_env()
    req = validate(pair_name, draft_id, target_id, prompt, k, temperature, top_k, top_p, max_new_tokens, seed,
                   True, 1.0, limits, chat, "fixed", ngram, tree_topk, tree_depth, tree_budget, head_id=head_id)
    pair = fitted(req)
    yield views.race_view(None, lang, presenter) | {"race_state": None}  # see `experiment`
    events = runs.strategy_race(pair, req, limits)
    yield from experiment(events, lambda r: views.race_view(r, lang, presenter), "race_state", lang, limits, run_token)


@gpu
@user_errors
def distribution_ui(pair_name, draft_id, target_id, prompt, temperature, top_k, top_p, lenience, n_samples, seed,
                    chat=None, lang=None, presenter=False, strategy="fixed", k=4, ngram=3, tree_topk=0, tree_depth=0,
                    tree_budget=0, head_id="", run_token=""):
    """Draw N speculative samples of the first drafted token with the page's strategy (its K, n-gram size and tree
    sizes), as the engine draws and verifies it, and compare their histogram with the exact p
    (runs.first_token_distribution). Streams DIST_OUTPUTS; unlike the other experiments it clears them only where
    it ends without a result, as it can refuse after its first rounds (see `experiment`)."""
    limits = Limits.from_env()
    n = as_number(Msg("field.samples"), n_samples, int, 10, limits.max_samples)
    req = validate(pair_name, draft_id, target_id, prompt, k, temperature, top_k, top_p, 1, seed, False, lenience,
                   limits, chat, strategy, ngram, tree_topk, tree_depth, tree_budget, head_id=head_id)
    pair = fitted(req, req.spec.strategy)
    events = runs.first_token_distribution(pair, req, n, limits)  # cleared once it cannot refuse (see `experiment`)
    yield from experiment(events, lambda d: views.dist_view(d, lang, presenter), "dist_state", lang, limits, run_token,
                          cleared=views.dist_view(None) | {"dist_state": None})
