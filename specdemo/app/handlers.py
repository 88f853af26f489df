"""What the Gradio app's events call: thin functions from a page's inputs to the names of the outputs they update.

Owns the event functions: each validates its inputs (validation.py), runs (runs.py) and draws (views.py), and returns
or yields a dict keyed by output name; ui.py wires the names to its components (`ui.named`). Every expected failure
is raised as `gr.Error` with a plain message in the visitor's language. The UI handlers take the page's language
(`lang`) and presenter switch (`presenter`) as inputs, and `redraw` re-renders everything on screen when either
changes. Per-session state travels in `gr.State` (the last traces, sweep, race and distribution) and is updated with
what is on screen at every yield, so that Stop or an error never leaves the inspector on an older run.
"""

from __future__ import annotations

import dataclasses
import html
import logging
import time

import gradio as gr
import torch

from specdemo import i18n
from specdemo.config import DEFAULT_PRESET, PRESETS, ConfigError
from specdemo.engine.events import Trace
from specdemo.engine.speculative import PromptError
from specdemo.i18n import tr
from specdemo.limits import Limits
from specdemo.models import ModelLoadError
from specdemo.models.lm import release_cuda_cache

from . import plots, render, runs, stops, views
from .session_locks import redraw_turn, session_turn
from .validation import CUSTOM, UserError, error_text, get_pair, has_head, pair_key, validate
from .zerogpu import gpu, pair_summary

log = logging.getLogger("specdemo")

# While a run streams, the page gets at most one update per UPDATE_INTERVAL_S (about 20 a second, what a browser
# draws; fewer where an update takes longer than that to build: `coalesced`). On a GPU the engine yields hundreds of
# rounds a second, and an update per round would queue up faster than the page can draw it. The rounds in between are
# not lost: each update carries the whole run so far (its state, text and film strip), and the first round, the first
# step of the baseline and the finished run are always sent at once. Read on every round, so a test may set it
# (0: an update per round).
UPDATE_INTERVAL_S = 0.05
CHART_EVERY_S = 0.4  # redraw the plotly charts at most this often while streaming (text and stats every update)
STEP_TAB = "step"  # the Step through tab's id (ui.py), which a step key selects

# The outputs each event may update, by name (ui.py's components of the same names, in this order).
RUN_OUTPUTS = ("tokens", "stats", "film", *views.CHARTS, "trace_json", "state", "round_sl", "pos_sl", "insp_plot",
               "insp_reason", "step_tokens", "step_caption")
INSPECT_OUTPUTS = ("pos_sl", "insp_plot", "insp_reason")
STEP_OUTPUTS = ("state", "step_tokens", "step_caption")
PAIR_OUTPUTS = ("pair_status", "custom_box", "examples", "chat", "pair_state", "k", "temperature", "max_new",
                "pair", "draft", "target", "head", "strategy")
REDRAW_OUTPUTS = ("legend", "keys", "tokens", "stats", "film", *views.CHARTS, "insp_plot", "insp_reason",
                  "step_tokens", "step_caption", "sweep_plot", "sweep_md", "dist_plot", "dist_md", "race_plot",
                  "race_md", "pair_status")
TAB_OUTPUTS = tuple(views.TABS)


def user_errors(fn):
    """Turn UserError (and the engine's own input errors, and a GPU out-of-memory) into gr.Error for the UI, in the
    language of the handler's `lang` argument (English when it has none, as for the API)."""
    import functools
    import inspect

    expected = (UserError, PromptError, ConfigError, ModelLoadError, torch.cuda.OutOfMemoryError)
    signature = inspect.signature(fn)
    on_page = "lang" in signature.parameters  # a page's handler (an API's answer is JSON: its text stays as it is)

    def lang_of(args, kwargs) -> str | None:
        try:
            return signature.bind_partial(*args, **kwargs).arguments.get("lang")
        except TypeError:
            return None

    def convert(err: Exception, args, kwargs) -> gr.Error:
        """The refusal as the visitor reads it, and one line in the server's log (in English): a refusal is planned,
        so gradio prints no traceback for it (print_exception=False); a traceback in the log is for the unplanned."""
        if isinstance(err, torch.cuda.OutOfMemoryError):
            release_cuda_cache()
        lang = lang_of(args, kwargs)
        log.info("refused (%s): %s", fn.__name__, error_text(err, None))
        text = error_text(err, lang)
        if on_page:  # gradio's toast draws its message as HTML, and some messages quote what was typed
            text = html.escape(text, quote=False)
        return gr.Error(text, print_exception=False)

    def unplanned(err: Exception, args, kwargs) -> gr.Error:
        """Anything else (a bug): its traceback in the log, and one sentence for the visitor, where gradio would
        show nothing (show_error is off) or an empty error."""
        log.exception("unexpected error in %s", fn.__name__)
        return gr.Error(tr("err.unexpected", lang_of(args, kwargs), error=type(err).__name__), print_exception=False)

    def as_gr_error(err: Exception, args, kwargs) -> gr.Error:
        """gradio's own errors as they are, planned refusals (`expected`) converted, anything else `unplanned`."""
        if isinstance(err, gr.Error):
            return err
        return convert(err, args, kwargs) if isinstance(err, expected) else unplanned(err, args, kwargs)

    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def gen_wrapper(*args, **kwargs):
            try:
                yield from fn(*args, **kwargs)
            except Exception as err:  # noqa: BLE001 - each said in one sentence (as_gr_error)
                raise as_gr_error(err, args, kwargs) from None
        return gen_wrapper

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 - each said in one sentence (as_gr_error)
            raise as_gr_error(err, args, kwargs) from None
    return wrapper


# ----------------------------------------------------------------------------------------------- the main run


def snapshot(trace: Trace | None) -> Trace | None:
    """The trace as it is now: the run goes on appending to its lists after this update is sent (after a Stop too)."""
    return None if trace is None else dataclasses.replace(trace, rounds=list(trace.rounds), steps=list(trace.steps),
                                                          settings=dict(trace.settings))


def run_state(spec, base) -> dict:
    """The session's state for a run as far as it went: what clicks, the step-through and the download read."""
    return {"spec": snapshot(spec), "base": snapshot(base), "cursor": 0}


def on_screen(spec, base, first: bool, lang=None, presenter=False) -> dict:
    """The run as far as it went, everywhere the page keeps it apart from the text: the state that clicks, the
    trace download and redraws read, and the step-through before its first round (every update), and with the first
    update the inspector on round 1 and no trace, so that nothing shows the previous run after a Stop or an error."""
    state = run_state(spec, base)
    out = {"state": state, "round_sl": views.round_slider(state, reset=first)} | views.step_view(state, lang)
    if first:
        out |= {"trace_json": None} | views.opened_round(state, 1, lang, presenter)
    return out


@gpu
@user_errors
def generate_ui(pair_name, draft_id, target_id, prompt, k, temperature, top_k, top_p, max_new_tokens, seed,
                run_baseline, lenience, chat=None, strategy="fixed", lang=None, presenter=False, ngram=3, tree_topk=0,
                tree_depth=0, tree_budget=0, head_id="", run_token=""):
    """The Generate button: streams RUN_OUTPUTS, coalesced to one update per UPDATE_INTERVAL_S at most (`coalesced`).
    The text, stats and state change with every update; the charts every CHART_EVERY_S. While the baseline runs,
    its cards wait (a speed-up from part of it would move) and a bar under them counts its tokens
    (render.progress_bar); the finished run opens the inspector on its first tree round (views.finished). The trace
    is downloaded in the browser from the trace JSON (page_js.DOWNLOAD_JS, after `trace_of`): a server file would
    put its path (gradio's cache folder) into the page and the API's answer. Stop ends it after its round (stops.py)."""
    limits = Limits.from_env()
    req = validate(pair_name, draft_id, target_id, prompt, k, temperature, top_k, top_p, max_new_tokens, seed,
                   run_baseline, lenience, limits, chat, strategy, ngram, tree_topk, tree_depth, tree_budget,
                   head_id=head_id)
    pair = get_pair(req.pair, req.spec.strategy)
    if req.spec.lossy:
        gr.Warning(tr("warn.lossy", lang, b=req.spec.lenience))
    drawn = None  # when the charts were last sent; the first update carries empty charts (built once), so it is fast
    spec = base = None
    guard = stops.Guard(run_token)
    for spec, base, phase, started in coalesced(guard(runs.run_stream(req, pair, limits))):
        first, redraw = drawn is None, drawn is not None and time.monotonic() - drawn > CHART_EVERY_S
        if phase == "speculative":
            out = views.run_view(spec, None, tr("status.speculative", lang), lang)
            if redraw:
                out |= views.charts(spec, None, lang, presenter)
            elif first:  # nothing shows the previous run's charts, even if this run stops before the next redraw
                out |= views.empty_charts(lang, presenter)
        else:
            out = views.baseline_stats(spec, base, lang)
            if started:  # the whole speculative run, whose last rounds the coalesced updates may not have shown
                out = views.run_view(spec, None, lang=lang) | views.charts(spec, base, lang, presenter) | out
                redraw = True
            elif redraw:
                out["race"] = plots.present(plots.race(spec, base, lang), presenter)
        yield out | on_screen(spec, base, first, lang, presenter)
        if first or redraw:  # counted from when they were sent: the run gets CHART_EVERY_S to itself between redraws
            drawn = time.monotonic()
    if guard.cut:
        yield from stops.linger()
        return
    if spec.stop_reason == runs.TIME_LIMIT or spec.settings.get("baseline") == "not measured":  # either phase
        gr.Warning(tr("warn.time_limit", lang, s=limits.time_limit_s))
    state = run_state(spec, base)
    yield (views.finished(spec, base, state, lang, presenter)
           | {"state": state, "trace_json": views.trace_payload(spec, base)})


def coalesced(stream):
    """runs.run_stream's (spec, base, phase) at the rate a page can draw: the first event of each phase at once
    (with started=True), then an event only once UPDATE_INTERVAL_S has passed since the last one was handed on, or
    as long as that one took to build and send if it took longer (a long run's text and film strip take longer to
    draw), so that the page takes about half the run's time at most. The events in between are dropped, not
    their rounds: spec and base are the run's own traces, and each event handed on holds every round so far. The
    run's last events may be dropped too; the caller's final update, after the stream ends, shows the whole run.
    Between two events handed on the run goes on without a yield, so Stop ends it at the next one (other sessions
    still get the device between rounds: runs.py locks per round). UPDATE_INTERVAL_S = 0 hands on every event."""
    phase, sent, took = None, 0.0, 0.0
    for spec, base, now_phase in stream:
        started = now_phase != phase
        if started or UPDATE_INTERVAL_S <= 0 or time.monotonic() - sent >= max(UPDATE_INTERVAL_S, took):
            phase, handed = now_phase, time.monotonic()
            yield spec, base, now_phase, started
            sent = time.monotonic()  # counted from when the update has been built and sent
            took = sent - handed


BUTTON_OUTPUTS = (*views.RUN_BUTTONS, "stop_btn")
OVER_OUTPUTS = (*BUTTON_OUTPUTS, "stats", "tokens", "film", "step_tokens", "step_caption", "state")  # run_over's
STARTED_OUTPUTS = (*BUTTON_OUTPUTS, "run_token", "run_mark")


def run_started() -> dict:
    return views.run_buttons(True) | dict.fromkeys(("run_token", "run_mark"), stops.new_token())  # state, page


def stop_run(token: str = "") -> dict:
    """Stop: marks the run, whose loop ends after its round (stops.py), while gradio cancels its event. Only Stop
    goes off: the others come back with run_over, once the run has ended and let go of the page's events."""
    stops.stop(token)
    return {"stop_btn": gr.Button(interactive=False)}


def run_over(state, lang=None, token: str = "") -> dict:
    """After a model run, however it ended: the buttons as before the run, and where Stop cut a Generate short, the
    stats say so (views.stopped_view), once the cancelled stream has closed. ui.model_run wires it to `.failure`
    and `run_done` to `.then`: gradio 6.31's frontend runs only `.failure` after an event that raised, and both
    after a cancel, where only the first does anything (stops.py). Naming the stats also replaces gradio's red
    "Error" pill there. A stopped run is marked so in the state, so that a redraw (a language or presenter switch)
    says "stopped" again instead of drawing figures from its part (views.everything)."""
    if not stops.close(token):  # a second run_over of the run (gradio fires both after a cancel)
        return {}
    stopped = views.stopped_view(state, lang)
    return views.run_buttons(False) | stopped | ({"state": state | {"stopped": True}} if stopped else {})


def run_done(state, lang=None, token: str = "") -> dict:
    """run_over from a run's `.then`, where that may give the buttons back (stops.then_may_act)."""
    return run_over(state, lang, token) if stops.then_may_act(token) else {}


def refuse_busy(busy: bool, lang=None) -> None:
    """A Generate asked for from the prompt (Shift+Enter) while a run is going: page_js.SUBMIT_JS found the button
    disabled, and this says so in one sentence (the running run goes on)."""
    if busy:
        gr.Warning(tr("warn.busy", lang))


def trace_of(state) -> dict:
    """The trace of the run in the session's state, for the download (the state follows what is on screen)."""
    spec, base = (state.get("spec"), state.get("base")) if state else (None, None)
    return {"trace_json": views.trace_payload(spec, base, bool(state and state.get("stopped")))}


@gpu
@user_errors
def generate_api(pair: str = DEFAULT_PRESET, prompt: str = PRESETS[DEFAULT_PRESET].examples[0], k: int = 4,
                 temperature: float = 0.8, top_k: int = 0, top_p: float = 1.0, max_new_tokens: int = 64, seed: int = 0,
                 baseline: bool = True, lenience: float = 1.0, draft: str = "", target: str = "",
                 chat: bool | None = None, strategy: str = "", ngram: int = 3, tree_topk: int = 0,
                 tree_depth: int = 0, tree_budget: int = 0, tree_prune: float = -1.0, tree_lookup: int = 0,
                 head: str = "") -> dict:
    """Run speculative sampling (and the target-only baseline) and return the full trace as JSON.

    pair: a preset name, or "custom" with draft and target model ids. chat: true wraps the prompt (a user message)
    with the target's chat template and returns the assistant's reply; false continues the prompt as raw text;
    null (the default) takes the pair's own default (chat for instruct presets). strategy: "" (the default) takes
    the pair's own, the one the page opens it with (tree for smollm2-135m, fixed for shakespeare and custom
    pairs); "fixed" (K drafts a round), "adaptive" (the draft stops when unsure; K is ignored), "lookup" (copy
    after a matching n-gram of up to `ngram` tokens; no draft model), "eagle" (the pair's EAGLE head drafts up
    to K tokens from the target's features; pairs with a head only, refused in one sentence elsewhere) or "tree"
    (the head drafts a tree, EAGLE-2: `tree_topk` children per node and nodes expanded per depth, `tree_depth` deep,
    at most `tree_budget` nodes, the server's SPECDEMO_MAX_TREE at most; 0 takes the head's own size; nodes whose
    cumulative head probability is below `tree_prune` are left out, 0 for none, a negative number (the default)
    for the run's own (the head's; none at T = 0 where graphs grow it); `tree_lookup` (0-16, 0: none) grafts up to
    that many tokens found by prompt lookup onto each top-k tree, nodes marked "copied"; K is not used; a tree
    round's JSON lists its nodes: id, text, parent, depth, head_p, p, on_path). head: a published EAGLE-3 head (vLLM's
    speculators format, a Hub id) for a custom pair, which drafts `eagle` and `tree` with it, checked first. Returns
    {"speculative": trace, "baseline": trace or null}; each trace has text, token_ids, rounds (labels, p, q, r,
    min(1, p/q), top candidates, timings) and metrics. A run that the time limit ended has no baseline: its
    settings say "baseline": "not measured".
    """
    limits = Limits.from_env()
    req = validate(pair, draft, target, prompt, k, temperature, top_k, top_p, max_new_tokens, seed, baseline,
                   lenience, limits, chat, strategy, ngram, tree_topk, tree_depth, tree_budget, tree_prune,
                   tree_lookup, head_id=head)
    loaded = get_pair(req.pair, req.spec.strategy)
    *_, (spec, base, _) = runs.run_stream(req, loaded, limits)  # run to the end; the last snapshot is the whole run
    return views.trace_payload(spec, base)


# ----------------------------------------------------------------------------------------------- inspection


def select_round(state, round_no, lang=None, presenter=False) -> dict:
    """A round was chosen: open it at its most telling position and draw the inspector."""
    return views.opened_round(state, round_no, lang, presenter)


def inspect_round(state, round_no, position, lang=None, presenter=False) -> dict:
    return views.inspector(state, round_no, position, lang, presenter)


def film_click(state, lang, evt: gr.EventData) -> dict:
    """A click on a film-strip row carries data-round; select that round in the inspector."""
    data = getattr(evt, "_data", None) or {}
    rounds = views.rounds_of(state)
    try:
        idx = int(data.get("round"))
    except (TypeError, ValueError):
        return {}
    if not (0 <= idx < len(rounds)):
        return {}
    return {"round_sl": idx + 1, "film": render.filmstrip_html(rounds, selected=idx, lang=lang)}


def step_round(state, direction: int, lang=None, request: gr.Request = None) -> dict:
    """Step-through for talks: show the text up to the current round and say what happened, in plain words.
    direction: 0 = back to before round 1, -1 = previous round, +1 = next round.

    Steps run side by side across sessions (ui.py gives them no queue limit); within a session they take turns
    under the session's lock and move the cursor in the state itself, so that a quick second press, whose event
    read the same state object, starts from the cursor the first one wrote. (The page sends its step keys one at a
    time, page_js.KEYS_JS, so that their views land in the order pressed.)"""
    with session_turn(request):
        rounds = views.rounds_of(state)
        if rounds:
            state["cursor"] = 0 if direction == 0 else min(max(state.get("cursor", 0) + direction, 0), len(rounds))
        return {"state": state} | views.step_view(state, lang)


def step_button(direction: int):
    """The handler of one step button (0: first, -1: previous, +1: next)."""

    def step(state, lang, request: gr.Request = None) -> dict:
        return step_round(state, direction, lang, request)

    step.__name__ = STEP_NAMES[direction]
    return step


STEP_NAMES = {0: "step_first", -1: "step_prev", 1: "step_next"}  # the step buttons' handlers (and API names)


def step_key(state, lang, evt: gr.EventData, request: gr.Request = None) -> dict:
    """A step key on the page (page_js.KEYS_JS sends {step: 1, -1 or 0}): step, and show the Step through tab."""
    data = getattr(evt, "_data", None) or {}
    if data.get("step") not in (0, 1, -1) or not views.rounds_of(state):
        return {}
    return step_round(state, data["step"], lang, request) | {"tabs": gr.Tabs(selected=STEP_TAB)}


# ----------------------------------------------------------------------------------------------- the pair


def update_strategies(pair_name, strategy, held="", loaded=None):
    """On a pair change: eagle and tree only where a head offers them. A pair without one falls back to fixed and
    holds the strategy it had, which a pair with a head takes back (as a failed custom pair's selector goes back).
    A custom pair has a head where the pair state (`loaded`) is a custom pair loaded with one."""
    head = pair_name == CUSTOM == (loaded or {}).get("chosen", {}).get("pair") and bool((loaded or {}).get("head"))
    choices, offered = views.strategy_choices(pair_name, head), has_head(pair_name) or head
    if strategy in ("eagle", "tree") and not offered:
        return gr.update(choices=choices, value="fixed"), strategy
    back = held if held and offered else strategy
    return gr.update(choices=choices, value=back), "" if back == held else held


def change_pair(pair_name, draft_id, target_id, lang=None, loaded=None, head_id="", progress=gr.Progress(),
                keep_settings: bool = False) -> dict:
    """Load the chosen pair with a visible progress indicator. A failure keeps the previous pair working, and puts
    the selector (and a custom pair's ids) back on it with the one-sentence error, so that the next Generate runs
    the pair that is loaded, not the one that failed. `loaded`: the pair state, the loaded pair's description with
    the selector values that chose it ("chosen"); a change back to those values loads nothing.
    Updates PAIR_OUTPUTS: the chat switch takes the pair's default mode, and K, the temperature and the token budget
    a preset's page defaults; with keep_settings (open_pair) those stay as the visitor left them."""
    custom = pair_name == CUSTOM
    examples = PRESETS[pair_name].examples if pair_name in PRESETS else ()
    chosen = {"pair": pair_name} | ({"draft": (draft_id or "").strip(), "target": (target_id or "").strip()}
                                    if custom else {}) | ({"head": head_id.strip()} if custom and head_id else {})
    if loaded and loaded.get("chosen") == chosen:  # it is loaded: the selector was put back on it after a failure
        return {}
    if custom and not (chosen["draft"] and chosen["target"]):
        return {"pair_status": tr("pair.enter_ids", lang), "custom_box": gr.update(visible=True)}
    progress(0.1, desc=tr("pair.loading", lang, name=pair_name))
    try:
        pair = pair_summary(pair_key(pair_name, draft_id, target_id, Limits.from_env(), head_id))
    except UserError as err:
        gr.Warning(said := render.esc(err.text(lang)))  # the toast draws HTML; the sentence may quote a typed id
        out = {"pair_status": tr("pair.failed", lang, error=said)}
        back = (loaded or {}).get("chosen")
        if back is None:  # nothing loaded yet to go back to
            return out | {"custom_box": gr.update(visible=custom)}
        line = views.pair_line(back["pair"], back.get("draft", ""), back.get("target", ""))
        # the head field goes back too (empty where the loaded pair has none), so the next run is the loaded pair's
        return out | {"head": ""} | back | {"pair": gr.update(value=back["pair"], info=line),
                                            "custom_box": gr.update(visible=back["pair"] == CUSTOM)}
    progress(1.0, desc=tr("pair.done", lang))
    desc = pair.desc | {"chosen": chosen}
    chat = {} if keep_settings else {"value": pair.chat}
    out = {"pair_status": views.pair_info(desc, lang), "custom_box": gr.update(visible=custom), "pair_state": desc,
           "pair": gr.update(info=views.pair_line(pair_name, draft_id, target_id)),
           "chat": gr.update(**chat, interactive=pair.has_chat_template)}
    if examples:
        out["examples"] = gr.Dataset(samples=[[e] for e in examples])
    if custom:  # a custom pair drafts with eagle and tree where it was given a head (views.strategy_choices)
        out["strategy"] = gr.update(choices=views.strategy_choices(pair_name, pair.has_head))
    if pair_name in PRESETS and not keep_settings:  # the preset's own page defaults (config.PairPreset)
        out |= views.preset_defaults(pair_name, Limits.from_env())
    return out


def open_pair(pair_name, draft_id, target_id, lang=None, loaded=None, head_id="", progress=gr.Progress()) -> dict:
    """change_pair for the page's first load. The page is built with the pair's own settings already in place, and
    the load can take seconds (a Space's first visitor loads the models): a temperature, K, token budget or chat
    setting changed meanwhile must not be put back to the preset's when it finishes, or the next Generate would run
    with a setting the page no longer shows."""
    return change_pair(pair_name, draft_id, target_id, lang, loaded, head_id, progress, keep_settings=True)


# ----------------------------------------------------------------------------------------------- language, presenter


def initial_lang(browser_lang: str | None, request: gr.Request):
    """The page's first language: the browser's (page_js.DETECT_JS), else its Accept-Language header, else English."""
    header = request.headers.get("accept-language") if request is not None else None
    return i18n.pick(browser_lang, header)


def presenter_layout(on) -> gr.Column:
    """Presenter mode: the page's outer column gets the class that style.CSS enlarges (the charts follow in redraw)."""
    return gr.Column(elem_classes=["sd-present"] if on else [])


def redraw(lang, presenter, state, round_no, position, sweep, dist, race, pair_desc, request: gr.Request = None
           ) -> dict:
    """Everything specdemo renders itself, again, in `lang` and presenter size (REDRAW_OUTPUTS).

    It draws the step view from the cursor, so it takes the session's step lock (step_round): a key press that
    lands during a switch's redraw waits for it or goes first, and each draws the cursor as the other left it, never
    the one the redraw's event read before it. (Their replies travel apart, so a press's view may still land first.)"""
    with redraw_turn(request):  # at most two at once over all sessions (session_locks.REDRAWS)
        return views.everything(lang, presenter, state, round_no, position, sweep, dist, race, pair_desc)


def notice_in(notices, lang):
    """The page's notice (ui.build_demo: why the default pair is missing) in `lang`; nothing where there is none."""
    return notices.get(i18n.normalize(lang), notices[i18n.DEFAULT]) if notices else gr.skip()
