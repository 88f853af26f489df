"""What the Gradio app's events call: input validation, pair loading, the streamed runs, the inspector, the K sweep,
the distribution check, the step-through and the /generate API.

Owns turning UI or API inputs into engine calls and engine events into UI outputs. Each UI handler's arguments
match its event's inputs and its return/yield tuples match its outputs (ui.py wires them). Every expected failure
is raised as `gr.Error` with a plain message in the visitor's language; nothing here builds HTML (render.py) or
figures (plots.py). The UI handlers take the page's language (`lang`) and presenter switch (`presenter`) as their
last inputs, and `redraw` re-renders everything on screen when either changes; the words come from i18n.py.
Per-session state travels in `gr.State` (a dict with the last traces); nothing per-session is module-global.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

import gradio as gr
import torch

from . import i18n, plots, render
from .autoregressive import baseline_steps
from .config import DEFAULT_PRESET, NGRAM_RANGE, PRESETS, STRATEGIES, ConfigError, Limits, SamplingConfig, SpecConfig
from .events import Trace
from .i18n import Msg, Translatable, tr
from .models import ModelLoadError, ModelPair, load_config, load_pair
from .sampling import first_token_samples, warp
from .speculative import PromptError, encode_prompt, finish, run_settings, speculative_rounds
from .theory import best_k, measure
from .ties import explain_divergence
from .weights import load_error, role_name
from .zerogpu import gpu

CUSTOM = "custom"
CHART_EVERY_S = 0.4  # redraw the plotly charts at most this often while streaming (text and stats every round)


class UserError(Translatable, Exception):
    """Bad input or an unavailable model: shown to the person, in their language. Raise it with a catalogue key and
    its params (`UserError("err.range", name=Msg("field.k"), ...)`); a plain sentence is shown as it is."""


# ----------------------------------------------------------------------------------------------- validation


def as_number(name: Msg, value, kind=float, lo=None, hi=None):
    """`value` as a number of `kind` within [lo, hi]; `name` is the field's catalogue entry (Msg("field.k"))."""
    if value is None or (isinstance(value, str) and not value.strip()):
        raise UserError("err.missing", name=name)
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise UserError("err.not_number", name=name, value=repr(str(value)[:40])) from None
    if math.isnan(number) or math.isinf(number):
        raise UserError("err.not_finite", name=name)
    if kind is int:
        if number != int(number):
            raise UserError("err.not_whole", name=name, value=value)
        number = int(number)
    if (lo is not None and number < lo) or (hi is not None and number > hi):
        raise UserError("err.range", name=name, lo=lo, hi=hi, value=value)
    return number


def estimate_parameters(config) -> int:
    """A decoder's parameter count from its config alone (embeddings + attention + MLP), for the size cap."""
    d = getattr(config, "hidden_size", None) or getattr(config, "n_embd", None) or getattr(config, "d_model", 0)
    layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", None) or 0
    vocab = getattr(config, "vocab_size", 0) or 0
    inner = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * d
    mlp = (3 if getattr(config, "intermediate_size", None) else 2) * d * inner
    return int(vocab * d + layers * (4 * d * d + mlp))


NOT_A_REPO_ID = i18n.EN["err.not_a_repo_id"]  # the one refusal of anything that is not a hub repo id (in English)


def is_repo_id(model_id: str) -> bool:
    """owner/name as huggingface_hub's own validator accepts it. Looks only at the string, never at the disk."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if model_id.count("/") != 1:
        return False
    try:
        validate_repo_id(model_id)
    except HFValidationError:
        return False
    return True


def check_custom_ids(draft_id: str, target_id: str, limits: Limits) -> None:
    """The app's one rule for custom model ids, applied before anything is read or downloaded.

    1. Custom ids can be switched off (SPECDEMO_ALLOW_CUSTOM=0).
    2. Unless SPECDEMO_ALLOW_LOCAL=1, both ids must be hub repo ids (`is_repo_id`). Everything else (an absolute or
       relative path, ~, a Windows path, a typo) gets the same message, NOT_A_REPO_ID, decided from the string alone,
       so the answer says nothing about the server's disk. A repo id that also names a folder under the server's
       working directory (transformers would read that folder) is answered as a hub miss, as if the folder were not
       there. The CLI and the Python API do not pass through here: they load paths.
    3. Models over the size cap (SPECDEMO_MAX_PARAMS_M) are refused from their config, before any weights load.
    """
    if not limits.allow_custom:
        raise UserError("err.custom_off")
    hub_only = not limits.allow_local
    if hub_only and not (is_repo_id(draft_id) and is_repo_id(target_id)):
        raise UserError("err.not_a_repo_id")
    for role, model_id in (("draft", draft_id), ("target", target_id)):
        if hub_only and os.path.lexists(model_id):  # answered word for word as transformers' hub miss is
            raise user_error(load_error(model_id, role, OSError(), local=False))
        try:
            config = load_config(model_id, role, local=False if hub_only else None)
        except ModelLoadError as err:
            raise user_error(err) from None
        n = estimate_parameters(config)
        if n > limits.max_params_m * 1_000_000:
            raise UserError("err.too_big", role=role_name(role), model=repr(model_id), billions=f"{n / 1e9:.1f}",
                            cap=limits.max_params_m)


@dataclass(frozen=True)
class Request:
    pair: str | tuple[str, str]
    prompt: str
    sampling: SamplingConfig
    spec: SpecConfig
    run_baseline: bool
    chat: bool | None = None  # wrap the prompt with the chat template; None: the pair's default


def pair_key(pair_name: str, draft_id: str | None, target_id: str | None, limits: Limits) -> str | tuple[str, str]:
    if pair_name == CUSTOM:
        draft_id, target_id = (draft_id or "").strip(), (target_id or "").strip()
        if not draft_id or not target_id:
            raise UserError("err.both_ids")
        check_custom_ids(draft_id, target_id, limits)
        return draft_id, target_id
    if pair_name not in PRESETS:
        raise UserError("err.unknown_pair", name=repr(str(pair_name)[:60]), presets=", ".join(PRESETS))
    return pair_name


def as_strategy(strategy) -> str:
    name = strategy.strip().lower() if isinstance(strategy, str) else strategy
    if name not in STRATEGIES:
        raise UserError("err.strategy", choices=", ".join(STRATEGIES), value=repr(str(strategy)[:40]))
    return name


def has_head(pair_name) -> bool:
    """Whether a pair offers the eagle strategy: only presets that ship an EAGLE head do."""
    return pair_name in PRESETS and bool(PRESETS[pair_name].eagle_head)


def check_head(strategy: str, pair_name, pair: ModelPair | None = None) -> None:
    """Refuse eagle, in one sentence, for a pair without a head: before loading anything (custom pairs, presets
    without one), and after loading (a head that is missing, damaged or made for another target)."""
    if strategy != "eagle":
        return
    if not has_head(pair_name):
        if pair_name in PRESETS:
            raise UserError("err.no_head", name=repr(pair_name), why=Msg("head.none"))
        raise UserError("err.no_head_custom")
    if pair is not None and pair.head is None:
        raise UserError("err.no_head", name=repr(pair_name), why=pair.head_error or Msg("head.none"))


def strategy_choices(pair_name):
    """The strategy selector's choices for a pair: eagle only where the pair has a head (a pure function of the
    preset, so a pair change updates it without loading anything)."""
    choices = [(i18n.label("strategy.fixed"), "fixed"), (i18n.label("strategy.adaptive"), "adaptive"),
               (i18n.label("strategy.lookup"), "lookup")]
    if has_head(pair_name):
        choices.append((i18n.label("strategy.eagle"), "eagle"))
    return choices


def update_strategies(pair_name, strategy):
    """On a pair change: list eagle only where it is offered; a pair without a head falls back to fixed."""
    value = strategy if strategy != "eagle" or has_head(pair_name) else "fixed"
    return gr.update(choices=strategy_choices(pair_name), value=value)


def validate(pair_name, draft_id, target_id, prompt, k, temperature, top_k, top_p, max_new_tokens, seed,
             run_baseline, lenience, limits: Limits | None = None, chat=None, strategy="fixed", ngram=3) -> Request:
    limits = limits or Limits.from_env()
    strategy = as_strategy(strategy)
    check_head(strategy, pair_name)
    ngram = as_number(Msg("field.ngram"), ngram, int, *NGRAM_RANGE)
    if not isinstance(prompt, str) or not prompt.strip():
        raise UserError("err.prompt_empty")
    if len(prompt) > limits.max_prompt_chars:
        raise UserError("err.prompt_chars", n=len(prompt), max=limits.max_prompt_chars)
    k = as_number(Msg("field.k"), k, int, 1, limits.max_k)
    temperature = as_number(Msg("field.temperature"), temperature, float, 0.0, 2.0)
    top_k = as_number(Msg("field.top_k"), top_k, int, 0, 1_000_000)
    top_p = as_number(Msg("field.top_p"), top_p, float, 0.0, 1.0)
    if top_p <= 0.0:
        raise UserError("err.top_p_zero")
    max_new_tokens = as_number(Msg("field.max_new"), max_new_tokens, int, 1, limits.max_new_tokens)
    seed = as_number(Msg("field.seed"), seed, int, 0, 2**63 - 1)
    lenience = as_number(Msg("field.lenience"), lenience, float, 0.0, 1.0)
    if lenience <= 0.0:
        raise UserError("err.lenience_zero")
    try:
        sampling = SamplingConfig(temperature, top_k, top_p)
        spec = SpecConfig(k=k, max_new_tokens=max_new_tokens, seed=seed, lenience=lenience, strategy=strategy,
                          ngram=ngram)
    except ConfigError as err:
        raise UserError(str(err)) from None
    if chat is not None and not isinstance(chat, bool):
        raise UserError("err.chat_value", value=repr(str(chat)[:20]))
    return Request(pair_key(pair_name, draft_id, target_id, limits), prompt, sampling, spec, bool(run_baseline), chat)


def user_error(err: ModelLoadError) -> UserError:
    """A load failure as a UserError that keeps its catalogue entry, so that it reaches the page translated."""
    return UserError(err.key, **err.params) if err.key else UserError(str(err))


def get_pair(key, strategy: str | None = None) -> ModelPair:
    """Load the pair (a failure as one sentence); with a strategy, also refuse one the loaded pair cannot use."""
    try:
        pair = load_pair(key)
    except ModelLoadError as err:
        raise user_error(err) from None
    if strategy is not None:
        check_head(strategy, pair.name, pair)
    return pair


def error_text(err: Exception, lang: str | None = None) -> str:
    """An expected error as one sentence in `lang` (catalogue errors are translated; others keep their text)."""
    if isinstance(err, torch.cuda.OutOfMemoryError):
        return tr("err.oom", lang)
    return err.text(lang) if isinstance(err, Translatable) else str(err)


def user_errors(fn):
    """Turn UserError (and the engine's own input errors, and a GPU out-of-memory) into gr.Error for the UI, in the
    language of the handler's `lang` argument (English when it has none, as for the API)."""
    import functools
    import inspect

    expected = (UserError, PromptError, ConfigError, ModelLoadError, torch.cuda.OutOfMemoryError)
    signature = inspect.signature(fn)

    def convert(err: Exception, args, kwargs) -> gr.Error:
        if isinstance(err, torch.cuda.OutOfMemoryError):
            torch.cuda.empty_cache()
        try:
            lang = signature.bind_partial(*args, **kwargs).arguments.get("lang")
        except TypeError:
            lang = None
        return gr.Error(error_text(err, lang))

    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def gen_wrapper(*args, **kwargs):
            try:
                yield from fn(*args, **kwargs)
            except expected as err:
                raise convert(err, args, kwargs) from None
        return gen_wrapper

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except expected as err:
            raise convert(err, args, kwargs) from None
    return wrapper


# ----------------------------------------------------------------------------------------------- the runs


def one_at_a_time(pair: ModelPair, events: Iterator, deadline: float) -> Iterator:
    """Step an engine generator one event at a time, each under the device lock, so that many sessions share one
    loaded pair without their device work overlapping and a cancelled request never leaves the lock held. Past the
    deadline the last event is marked 'time_limit' and the run ends."""
    while True:
        with pair.lock:
            event = next(events, None)
        if event is None:
            return
        if time.monotonic() > deadline and not event.stop_reason:
            event.stop_reason = "time_limit"
            yield event
            return
        yield event


def run_stream(req: Request, pair: ModelPair, limits: Limits) -> Iterator[tuple[Trace, Trace | None, str]]:
    """Run speculative decoding, then (optionally) the baseline, yielding (spec, base, phase) after every event."""
    chat = pair.chat if req.chat is None else req.chat
    ids = encode_prompt(pair, req.prompt, req.spec.max_new_tokens, chat)
    deadline = time.monotonic() + limits.time_limit_s
    spec = Trace("speculative", req.prompt, ids, run_settings(pair, req.sampling, req.spec) | {"chat": chat})
    for rnd in one_at_a_time(pair, speculative_rounds(pair, ids, req.sampling, req.spec), deadline):
        spec.rounds.append(rnd)
        spec.wall_s = rnd.elapsed_s
        yield spec, None, "speculative"
    finish(pair, spec)
    if not req.run_baseline:
        return
    base = Trace("baseline", req.prompt, ids, run_settings(pair, req.sampling) | {
        "max_new_tokens": req.spec.max_new_tokens, "seed": req.spec.seed, "chat": chat})
    steps = baseline_steps(pair, ids, req.sampling, req.spec.max_new_tokens, req.spec.seed)
    for step in one_at_a_time(pair, steps, deadline):
        base.steps.append(step)
        base.wall_s = step.elapsed_s
        yield spec, base, "baseline"
    finish(pair, base)


def shown_prompt(trace: Trace) -> str:
    """The prompt as the token view shows it: in chat mode the user's message, with the reply below it."""
    return trace.prompt + "\n\n" if trace.settings.get("chat") else trace.prompt


def trace_payload(spec: Trace, base: Trace | None) -> dict:
    return {"speculative": spec.to_dict(), "baseline": base.to_dict() if base is not None else None}


def charts(spec: Trace | None, base: Trace | None, lang: str | None = None, presenter: bool = False) -> tuple:
    """The five run charts (race, acceptance per round, accepted lengths, by position, theory) in one language."""
    figs = (plots.race(spec, base, lang), plots.acceptance_per_round(spec, lang),
            plots.accepted_length_histogram(spec, lang), plots.acceptance_by_position(spec, lang),
            plots.speedup_vs_theory(spec, base, lang=lang))
    return tuple(plots.present(f, presenter) for f in figs)


@gpu
@user_errors
def generate_ui(pair_name, draft_id, target_id, prompt, k, temperature, top_k, top_p, max_new_tokens, seed,
                run_baseline, lenience, chat=None, strategy="fixed", lang=None, presenter=False, ngram=3):
    """The Generate button. Yields (tokens, stats, film strip, 5 charts, trace JSON, state, round slider).

    The trace is downloaded in the browser from the trace JSON (ui.DOWNLOAD_JS): a server file would put its path
    (gradio's cache folder) into the page and the API's answer."""
    limits = Limits.from_env()
    req = validate(pair_name, draft_id, target_id, prompt, k, temperature, top_k, top_p, max_new_tokens, seed,
                   run_baseline, lenience, limits, chat, strategy, ngram)
    pair = get_pair(req.pair, req.spec.strategy)
    if req.spec.lossy:
        gr.Warning(tr("warn.lossy", lang, b=req.spec.lenience))
    skip = gr.skip()
    last_chart = time.monotonic()  # the first update carries only text and stats, so it reaches the page fastest
    spec = base = None
    for spec, base, phase in run_stream(req, pair, limits):
        now = time.monotonic()
        redraw = now - last_chart > CHART_EVERY_S
        if redraw:
            last_chart = now
        status = tr("status.speculative", lang) if phase == "speculative" else (
            tr("status.baseline", lang, n=len(base.steps)))
        if phase == "speculative":
            yield (render.tokens_html(shown_prompt(spec), spec.rounds, lang=lang),
                   render.stats_html(spec, None, status, lang), render.filmstrip_html(spec.rounds, lang=lang),
                   *(charts(spec, None, lang, presenter) if redraw else (skip,) * 5), skip, skip, skip)
        else:
            race = plots.present(plots.race(spec, base, lang), presenter)
            yield (skip, render.stats_html(spec, base, status, lang), skip,
                   *((race,) + (skip,) * 4 if redraw else (skip,) * 5), skip, skip, skip)
    if spec.stop_reason == "time_limit":
        gr.Warning(tr("warn.time_limit", lang, s=limits.time_limit_s))
    payload = trace_payload(spec, base)
    n_rounds = len(spec.rounds)
    yield (render.tokens_html(shown_prompt(spec), spec.rounds, lang=lang),
           render.stats_html(spec, base, render.done_status(spec, lang), lang),
           render.filmstrip_html(spec.rounds, lang=lang), *charts(spec, base, lang, presenter), payload,
           {"spec": spec, "base": base, "cursor": 0},
           gr.update(maximum=max(2, n_rounds), value=1, interactive=n_rounds > 1))  # a slider needs max > min


@gpu
@user_errors
def generate_api(pair: str = DEFAULT_PRESET, prompt: str = "ROMEO:\n", k: int = 4, temperature: float = 0.8,
                 top_k: int = 0, top_p: float = 1.0, max_new_tokens: int = 64, seed: int = 0,
                 baseline: bool = True, lenience: float = 1.0, draft: str = "", target: str = "",
                 chat: bool | None = None, strategy: str = "fixed", ngram: int = 3) -> dict:
    """Run speculative sampling (and the target-only baseline) and return the full trace as JSON.

    pair: a preset name, or "custom" with draft and target model ids. chat: true wraps the prompt (a user message)
    with the target's chat template and returns the assistant's reply; false continues the prompt as raw text;
    null (the default) takes the pair's own default (chat for instruct presets). strategy: "fixed" (K drafts a
    round), "adaptive" (the draft stops when unsure; K is ignored), "lookup" (copy after a matching n-gram of up
    to `ngram` tokens; no draft model) or "eagle" (the pair's EAGLE head drafts from the target's features; the
    embedded pairs only, refused in one sentence elsewhere). Returns {"speculative": trace,
    "baseline": trace or null}; each trace has text, token_ids, rounds (labels, p, q, r, min(1, p/q), top
    candidates, timings) and metrics.
    """
    limits = Limits.from_env()
    req = validate(pair, draft, target, prompt, k, temperature, top_k, top_p, max_new_tokens, seed, baseline,
                   lenience, limits, chat, strategy, ngram)
    loaded = get_pair(req.pair, req.spec.strategy)
    *_, (spec, base, _) = run_stream(req, loaded, limits)  # run to the end; the last snapshot is the whole run
    return trace_payload(spec, base)


# ----------------------------------------------------------------------------------------------- inspection


def _rounds(state) -> list:
    return state["spec"].rounds if state and state.get("spec") else []


def inspect_round(state, round_no, position, lang=None, presenter=False):
    """The round inspector: p, q and the residual at one position, and why that token was kept or resampled."""
    rounds = _rounds(state)
    if not rounds:
        return (plots.present(plots.inspector_empty(lang), presenter),
                f'<div class="sd-caption">{render.trh("reason.generate_first", lang)}</div>')
    idx = min(max(int(round_no or 1), 1), len(rounds)) - 1
    rnd = rounds[idx]
    pos = min(max(int(position or 1), 1), rnd.k + 1)
    if pos == rnd.k + 1 and not rnd.bonus_top and rnd.drafts:
        pos = next((d.position for d in rnd.drafts if d.checked and not d.accepted), rnd.k)
    return (plots.present(plots.inspector(rnd, pos, lang=lang), presenter),
            f'<div class="sd-caption">{render.reason(rnd, pos, lang)}</div>')


def default_position(state, round_no) -> int:
    """Open a round at its most telling position: the rejection if there was one, else the bonus."""
    rounds = _rounds(state)
    if not rounds:
        return 1
    rnd = rounds[min(max(int(round_no or 1), 1), len(rounds)) - 1]
    rejected = [d.position for d in rnd.drafts if d.checked and not d.accepted]
    return rejected[0] if rejected else rnd.k + 1


def select_round(state, round_no, lang=None, presenter=False):
    """A round was chosen: open it at its most telling position and draw the inspector."""
    pos = default_position(state, round_no)
    return (pos, *inspect_round(state, round_no, pos, lang, presenter))


def film_click(state, lang, evt: gr.EventData):
    """A click on a film-strip row carries data-round; select that round in the inspector."""
    data = getattr(evt, "_data", None) or {}
    rounds = _rounds(state)
    try:
        idx = int(data.get("round"))
    except (TypeError, ValueError):
        return gr.skip(), gr.skip()
    if not (0 <= idx < len(rounds)):
        return gr.skip(), gr.skip()
    return idx + 1, render.filmstrip_html(rounds, selected=idx, lang=lang)


STEP_TAB = "step"  # the Step through tab's id (ui.py), which a step key selects


def step_view(state, lang=None) -> tuple:
    """The step-through's text up to the cursor and its caption."""
    rounds = _rounds(state)
    cursor = state.get("cursor", 0) if rounds else 0
    prompt = shown_prompt(state["spec"]) if rounds else ""
    return (render.tokens_html(prompt, rounds, upto=cursor, lang=lang) if rounds else render.tokens_html("", []),
            render.step_caption(rounds, cursor, lang))


def step_round(state, direction: int, lang=None):
    """Step-through for talks: show the text up to the current round and say what happened, in plain words.
    direction: 0 = back to before round 1, -1 = previous round, +1 = next round."""
    rounds = _rounds(state)
    if rounds:
        cursor = 0 if direction == 0 else min(max(state.get("cursor", 0) + direction, 0), len(rounds))
        state = {**state, "cursor": cursor}
    return (state, *step_view(state, lang))


def step_key(state, lang, evt: gr.EventData):
    """A step key on the page (ui.KEYS_JS sends {step: 1, -1 or 0}): step, and show the Step through tab."""
    data = getattr(evt, "_data", None) or {}
    if data.get("step") not in (0, 1, -1) or not _rounds(state):
        return gr.skip(), gr.skip(), gr.skip(), gr.skip()
    return (*step_round(state, data["step"], lang), gr.Tabs(selected=STEP_TAB))


# ----------------------------------------------------------------------------------------------- experiments


def sweep_text(sweep: dict, lang=None) -> str:
    results, best = sweep["results"], max(sweep["results"], key=lambda r: r["speedup"])
    table = tr("sweep.header", lang) + "\n|---:|---:|---:|---:|\n" + "\n".join(
        f"| {r['k']} | {r['tokens_per_s']:.1f} | {r['speedup']:.2f}x | {r['alpha']:.2f} |" for r in results)
    summary = tr("sweep.summary", lang, base=f"{sweep['base_tps']:.1f}", k=best["k"], speedup=f"{best['speedup']:.2f}",
                 alpha=f"{sweep['alpha']:.2f}", c=f"{sweep['c']:.3f}", kb=sweep["kb"], sb=f"{sweep['sb']:.2f}")
    return f"{summary}\n\n{table}"


def sweep_view(sweep: dict | None, lang=None, presenter=False) -> tuple:
    if not sweep:
        return plots.present(plots.k_sweep([], None, None, lang), presenter), ""
    return (plots.present(plots.k_sweep(sweep["results"], sweep["alpha"], sweep["c"], lang), presenter),
            sweep_text(sweep, lang))


def target_only_run(req: Request) -> tuple[ModelPair, list[int], list]:
    """The experiments' common start: the pair, the prompt's ids and a timed target-only run to compare against."""
    pair = get_pair(req.pair)
    ids = encode_prompt(pair, req.prompt, req.spec.max_new_tokens, req.chat)
    with pair.lock:
        base_steps = list(baseline_steps(pair, ids, req.sampling, req.spec.max_new_tokens, req.spec.seed))
    return pair, ids, base_steps


@gpu
@user_errors
def k_sweep_ui(pair_name, draft_id, target_id, prompt, temperature, top_k, top_p, max_new_tokens, seed, k_from, k_to,
               chat=None, lang=None, presenter=False):
    """Run K = k_from..k_to on the same prompt and seed; plot measured and predicted speedup, recommend a K.
    Yields (figure, text, sweep state); the state lets a language switch redraw the result."""
    limits = Limits.from_env()
    k_from = as_number(Msg("field.k_from"), k_from, int, 1, limits.max_k)
    k_to = as_number(Msg("field.k_to"), k_to, int, k_from, limits.max_k)
    req = validate(pair_name, draft_id, target_id, prompt, k_from, temperature, top_k, top_p, max_new_tokens, seed,
                   True, 1.0, limits, chat)
    pair, ids, base_steps = target_only_run(req)
    base_tps = len(base_steps) / base_steps[-1].elapsed_s
    results, all_rounds = [], []
    deadline = time.monotonic() + limits.time_limit_s
    for k in range(k_from, k_to + 1):
        spec = SpecConfig(k=k, max_new_tokens=req.spec.max_new_tokens, seed=req.spec.seed, top_candidates=0)
        with pair.lock:
            rounds = list(speculative_rounds(pair, ids, req.sampling, spec))
        n = sum(len(r.output) for r in rounds)
        tps = n / rounds[-1].elapsed_s
        all_rounds += rounds
        results.append({"k": k, "speedup": tps / base_tps, "tokens_per_s": tps,
                        "alpha": measure(rounds, base_steps)["alpha_empirical"]})
        pooled = measure(all_rounds, base_steps)  # alpha and c over every K swept so far
        alpha, c = pooled["alpha_empirical"], pooled["c"]
        kb, sb = best_k(alpha, c, limits.max_k)
        sweep = {"results": list(results), "alpha": alpha, "c": c, "base_tps": base_tps, "kb": kb, "sb": sb}
        yield (*sweep_view(sweep, lang, presenter), sweep)
        if time.monotonic() > deadline:
            gr.Warning(tr("warn.sweep_time_limit", lang, s=limits.time_limit_s))
            return


RACE_STRATEGIES = ("fixed", "adaptive", "lookup", "eagle")  # eagle where the pair has a head


@gpu
@user_errors
def strategy_race_ui(pair_name, draft_id, target_id, prompt, k, temperature, top_k, top_p, max_new_tokens, seed,
                     chat=None, lang=None, presenter=False):
    """Target-only decoding, then every strategy, on the same prompt and seed, one after another (each timed alone).
    Yields the tokens-over-time chart and a table after every run."""
    limits = Limits.from_env()
    req = validate(pair_name, draft_id, target_id, prompt, k, temperature, top_k, top_p, max_new_tokens, seed,
                   True, 1.0, limits, chat)
    pair, ids, base_steps = target_only_run(req)
    base_ids = [s.token.token_id for s in base_steps]
    base_tps = len(base_steps) / base_steps[-1].elapsed_s
    target_only = tr("race.target_only", lang)
    runs = {target_only: [(s.elapsed_s, i + 1) for i, s in enumerate(base_steps)]}
    rows = [f"| {target_only} | {base_tps:.1f} | 1.00x | {len(base_steps)} | | | |"]
    deadline = time.monotonic() + limits.time_limit_s
    header = tr("race.header", lang) + "\n|---|---:|---:|---:|---:|---:|:---:|\n"

    def view():
        return plots.present(plots.strategy_race(runs, lang), presenter), header + "\n".join(rows)

    yield view()
    for strategy in RACE_STRATEGIES:
        if strategy == "eagle" and pair.head is None:
            continue
        spec = SpecConfig(k=req.spec.k, max_new_tokens=req.spec.max_new_tokens, seed=req.spec.seed,
                          top_candidates=0, strategy=strategy)
        with pair.lock:
            rounds = list(speculative_rounds(pair, ids, req.sampling, spec))
        out_ids = [t.token_id for r in rounds for t in r.output]
        n, drafted = len(out_ids), sum(r.k for r in rounds)
        accepted = sum(r.n_accepted for r in rounds)
        tps = n / rounds[-1].elapsed_s
        points, total = [], 0
        for r in rounds:
            total += len(r.output)
            points.append((r.elapsed_s, total))
        label = tr(f"strategy.{strategy}", lang) + (f" = {spec.k}" if strategy in ("fixed", "eagle") else "")
        runs[label] = points
        if out_ids == base_ids:
            same = tr("race.same", lang)
        elif not req.sampling.greedy:  # sampled runs differ token by token and agree in distribution
            same = tr("race.differs_sampling", lang)
        else:  # at T = 0 say where and why: a bf16 near-tie between a verify and a step, or a bug
            same = divergence_text(explain_divergence(pair, ids, rounds, base_ids), lang)
        rows.append(f"| {label} | {tps:.1f} | {tps / base_tps:.2f}x | {len(rounds)} | "
                    f"{accepted / drafted if drafted else 0:.2f} | {n / len(rounds):.2f} | {same} |")
        yield view()
        if time.monotonic() > deadline:
            gr.Warning(tr("warn.race_time_limit", lang, s=limits.time_limit_s))
            return


DIVERGENCE_KEY = {True: "race.differs_tie", False: "race.differs_bug"}


def divergence_text(d, lang=None) -> str:
    """A T = 0 difference from target-only decoding, in words (a table cell): where, which tokens, both gaps."""
    return tr(DIVERGENCE_KEY[d.near_tie], lang, pos=d.position, spec=render.esc(repr(d.spec_text)), base=render.esc(repr(d.base_text)),
              gv=f"{d.gap_verify:+.3f}", gs=f"{d.gap_step:+.3f}", tol=f"{d.tolerance:.3f}")


def dist_text(dist: dict, lang=None) -> str:
    lossy = tr("dist.lossy", lang, b=dist["lenience"]) if dist["lenience"] < 1 else ""
    return tr("dist.summary", lang, n=dist["n"], tv=f"{dist['tv']:.3f}", tv_ref=f"{dist['tv_ref']:.3f}",
              tv_pq=f"{dist['tv_pq']:.3f}") + lossy


def dist_view(dist: dict | None, lang=None, presenter=False) -> tuple:
    if not dist:
        return gr.skip(), gr.skip()
    fig = plots.distribution(dist["tokens"], dist["p"], dist["freq"], dist["q"], dist["n"], lang)
    return plots.present(fig, presenter), dist_text(dist, lang)


@gpu
@user_errors
def distribution_ui(pair_name, draft_id, target_id, prompt, temperature, top_k, top_p, lenience, n_samples, seed,
                    chat=None, lang=None, presenter=False):
    """Draw N speculative samples of the first generated token and compare their histogram with the exact p.
    Returns (figure, text, distribution state)."""
    limits = Limits.from_env()
    n = as_number(Msg("field.samples"), n_samples, int, 10, limits.max_samples)
    req = validate(pair_name, draft_id, target_id, prompt, 1, temperature, top_k, top_p, 1, seed, False, lenience,
                   limits, chat)
    pair = get_pair(req.pair)
    ids = torch.tensor([encode_prompt(pair, req.prompt, 1, req.chat)], device=pair.device)
    gen = torch.Generator(device=pair.device).manual_seed(req.spec.seed)
    with pair.lock, torch.inference_mode():
        p = warp(pair.target(ids).logits[0, -1, : pair.vocab_size], req.sampling)
        q = warp(pair.draft(ids).logits[0, -1, : pair.vocab_size], req.sampling)
        draws = first_token_samples(p, q, n, gen, req.spec.lenience)
        exact = torch.multinomial(p, n, replacement=True, generator=gen)  # n samples of p itself, for scale
    freq = torch.bincount(draws, minlength=pair.vocab_size).float() / n
    ref = torch.bincount(exact, minlength=pair.vocab_size).float() / n
    top = torch.topk(torch.maximum(p, freq), min(15, pair.vocab_size)).indices.tolist()
    dist = {"n": n, "lenience": req.spec.lenience, "tokens": [pair.token_text(i) for i in top],
            "p": p[top].tolist(), "freq": freq[top].tolist(), "q": q[top].tolist(),
            "tv": 0.5 * (freq - p).abs().sum().item(), "tv_ref": 0.5 * (ref - p).abs().sum().item(),
            "tv_pq": 0.5 * (p - q).abs().sum().item()}
    return (*dist_view(dist, lang, presenter), dist)


# ----------------------------------------------------------------------------------------------- pair selection


def pair_info(desc: dict, lang=None) -> str:
    """The loaded pair in one line (Markdown), from ModelPair.describe()."""
    return tr("pair.loaded", lang, draft=desc["draft"], draft_m=f"{desc['draft_parameters'] / 1e6:.1f}",
              target=desc["target"], target_m=f"{desc['target_parameters'] / 1e6:.1f}", device=desc["device"],
              dtype=desc["dtype"], context=desc["context_window"])


def change_pair(pair_name, draft_id, target_id, lang=None, progress=gr.Progress()):
    """Load the chosen pair with a visible progress indicator. A failure keeps the previous pair working.
    Returns (status, custom box, examples, chat switch, the pair's description for redraw): the switch takes the
    pair's default mode."""
    custom = pair_name == CUSTOM
    examples = PRESETS[pair_name].examples if pair_name in PRESETS else ()
    if custom and not ((draft_id or "").strip() and (target_id or "").strip()):
        return tr("pair.enter_ids", lang), gr.update(visible=True), gr.skip(), gr.skip(), None
    progress(0.1, desc=tr("pair.loading", lang, name=pair_name))
    try:
        pair = get_pair(pair_key(pair_name, draft_id, target_id, Limits.from_env()))
    except UserError as err:
        gr.Warning(err.text(lang))
        return (tr("pair.failed", lang, error=render.esc(err.text(lang))), gr.update(visible=custom), gr.skip(),
                gr.skip(), None)
    progress(1.0, desc=tr("pair.done", lang))
    desc = pair.describe()
    return (pair_info(desc, lang), gr.update(visible=custom),
            gr.Dataset(samples=[[e] for e in examples]) if examples else gr.skip(),
            gr.update(value=pair.chat, interactive=pair.has_chat_template), desc)


# ----------------------------------------------------------------------------------------------- language, presenter


def initial_lang(browser_lang: str | None, request: gr.Request):
    """The page's first language: the browser's (navigator.language, sent by ui.DETECT_JS), else its
    Accept-Language header, else English."""
    header = request.headers.get("accept-language") if request is not None else None
    return i18n.pick(browser_lang, header)


def presenter_layout(on) -> gr.Column:
    """Presenter mode: the page's outer column gets the class that render.CSS enlarges (the charts follow in redraw)."""
    return gr.Column(elem_classes=["sd-present"] if on else [])


TAB_KEYS = ("tab.film", "tab.charts", "tab.sweep", "tab.race", "tab.dist", "tab.step", "tab.export")  # in ui.py's order


def tab_labels(lang) -> tuple:
    """The tabs' labels in `lang`, as plain text (gradio does not re-translate a closed tab's label by itself)."""
    return tuple(gr.Tab(label=tr(key, lang)) for key in TAB_KEYS)


def redraw(lang, presenter, state, round_no, position, sweep, dist, pair_desc) -> tuple:
    """Everything specdemo renders itself, again, in `lang` and presenter size: the run's results stay on screen.
    Returns (legend, keys, tokens, stats, film, 5 charts, inspector plot, reason, step tokens, step caption,
    sweep plot, sweep text, distribution plot, distribution text, pair status)."""
    spec = state.get("spec") if state else None
    base = state.get("base") if state else None
    if spec is not None:
        run = (render.tokens_html(shown_prompt(spec), spec.rounds, lang=lang),
               render.stats_html(spec, base, render.done_status(spec, lang), lang),
               render.filmstrip_html(spec.rounds, lang=lang))
    else:
        run = (render.tokens_html("", [], lang=lang), render.stats_html(None, lang=lang),
               render.filmstrip_html([], lang=lang))
    return (render.legend(lang), render.keys_hint(lang), *run, *charts(spec, base, lang, presenter),
            *inspect_round(state, round_no, position, lang, presenter), *step_view(state, lang),
            *sweep_view(sweep, lang, presenter), *dist_view(dist, lang, presenter),
            pair_info(pair_desc, lang) if pair_desc else gr.skip())
