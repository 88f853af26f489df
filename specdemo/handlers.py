"""What the Gradio app's events call: input validation, pair loading, the streamed runs, the inspector, the K sweep,
the distribution check, the step-through and the /generate API.

Owns turning UI or API inputs into engine calls and engine events into UI outputs. Each UI handler's arguments
match its event's inputs and its return/yield tuples match its outputs (ui.py wires them). Every expected failure
is raised as `gr.Error` with a plain message; nothing here builds HTML (render.py) or figures (plots.py).
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

from . import plots, render
from .autoregressive import baseline_steps
from .config import DEFAULT_PRESET, NGRAM_RANGE, PRESETS, STRATEGIES, ConfigError, Limits, SamplingConfig, SpecConfig
from .events import Trace
from .models import ModelLoadError, ModelPair, load_pair
from .sampling import first_token_samples, warp
from .speculative import PromptError, encode_prompt, finish, run_settings, speculative_rounds
from .theory import best_k, measure
from .zerogpu import gpu

CUSTOM = "custom"
CHART_EVERY_S = 0.4  # redraw the plotly charts at most this often while streaming (text and stats every round)


class UserError(Exception):
    """Bad input or an unavailable model: shown to the person as it is."""


# ----------------------------------------------------------------------------------------------- validation


def as_number(name: str, value, kind=float, lo=None, hi=None):
    if value is None or (isinstance(value, str) and not value.strip()):
        raise UserError(f"{name} is missing.")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise UserError(f"{name} must be a number, got {str(value)[:40]!r}.") from None
    if math.isnan(number) or math.isinf(number):
        raise UserError(f"{name} must be a finite number.")
    if kind is int:
        if number != int(number):
            raise UserError(f"{name} must be a whole number, got {value}.")
        number = int(number)
    if (lo is not None and number < lo) or (hi is not None and number > hi):
        raise UserError(f"{name} must be between {lo} and {hi}, got {value}.")
    return number


def estimate_parameters(config) -> int:
    """A decoder's parameter count from its config alone (embeddings + attention + MLP), for the size cap."""
    d = getattr(config, "hidden_size", None) or getattr(config, "n_embd", None) or getattr(config, "d_model", 0)
    layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", None) or 0
    vocab = getattr(config, "vocab_size", 0) or 0
    inner = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * d
    mlp = (3 if getattr(config, "intermediate_size", None) else 2) * d * inner
    return int(vocab * d + layers * (4 * d * d + mlp))


NOT_A_REPO_ID = ("Custom models are Hugging Face Hub repo ids of the form owner/name, for example "
                 "openai-community/gpt2. This server does not load models from paths.")


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
        raise UserError("Custom model ids are switched off on this server (SPECDEMO_ALLOW_CUSTOM=0). "
                        "Pick one of the presets.")
    hub_only = not limits.allow_local
    if hub_only and not (is_repo_id(draft_id) and is_repo_id(target_id)):
        raise UserError(NOT_A_REPO_ID)
    from transformers import AutoConfig

    from .models import _friendly, offline_for

    for role, model_id in (("draft", draft_id), ("target", target_id)):
        if hub_only and os.path.lexists(model_id):  # answered word for word as transformers' hub miss is
            raise UserError(str(_friendly(model_id, role, OSError(), local=False)))
        try:
            config = AutoConfig.from_pretrained(model_id, trust_remote_code=False,
                                                local_files_only=offline_for(model_id))
        except Exception as err:
            raise UserError(str(_friendly(model_id, role, err, local=False if hub_only else None))) from None
        n = estimate_parameters(config)
        if n > limits.max_params_m * 1_000_000:
            raise UserError(f"The {role} model {model_id!r} has about {n / 1e9:.1f}B parameters, over this server's "
                            f"cap of {limits.max_params_m}M (SPECDEMO_MAX_PARAMS_M).")


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
            raise UserError("Enter both a draft and a target model id for a custom pair.")
        check_custom_ids(draft_id, target_id, limits)
        return draft_id, target_id
    if pair_name not in PRESETS:
        raise UserError(f"Unknown model pair {str(pair_name)[:60]!r}; choose one of {', '.join(PRESETS)} or custom.")
    return pair_name


def as_strategy(strategy) -> str:
    name = strategy.strip().lower() if isinstance(strategy, str) else strategy
    if name not in STRATEGIES:
        raise UserError(f"Strategy must be one of {', '.join(STRATEGIES)}, got {str(strategy)[:40]!r}.")
    return name


def validate(pair_name, draft_id, target_id, prompt, k, temperature, top_k, top_p, max_new_tokens, seed,
             run_baseline, lenience, limits: Limits | None = None, chat=None, strategy="fixed", ngram=3) -> Request:
    limits = limits or Limits.from_env()
    strategy = as_strategy(strategy)
    ngram = as_number("Lookup n-gram size", ngram, int, *NGRAM_RANGE)
    if not isinstance(prompt, str) or not prompt.strip():
        raise UserError("The prompt is empty. Type a few words for the models to continue.")
    if len(prompt) > limits.max_prompt_chars:
        raise UserError(f"The prompt is {len(prompt)} characters; this server accepts up to {limits.max_prompt_chars}.")
    k = as_number("K", k, int, 1, limits.max_k)
    temperature = as_number("Temperature", temperature, float, 0.0, 2.0)
    top_k = as_number("Top-k", top_k, int, 0, 1_000_000)
    top_p = as_number("Top-p", top_p, float, 0.0, 1.0)
    if top_p <= 0.0:
        raise UserError("Top-p must be above 0 (1 switches it off).")
    max_new_tokens = as_number("Max new tokens", max_new_tokens, int, 1, limits.max_new_tokens)
    seed = as_number("Seed", seed, int, 0, 2**63 - 1)
    lenience = as_number("Lenience", lenience, float, 0.0, 1.0)
    if lenience <= 0.0:
        raise UserError("Lenience must be above 0 (1 is exact).")
    try:
        sampling = SamplingConfig(temperature, top_k, top_p)
        spec = SpecConfig(k=k, max_new_tokens=max_new_tokens, seed=seed, lenience=lenience, strategy=strategy,
                          ngram=ngram)
    except ConfigError as err:
        raise UserError(str(err)) from None
    if chat is not None and not isinstance(chat, bool):
        raise UserError(f"chat must be true, false or null (the pair's default), got {str(chat)[:20]!r}.")
    return Request(pair_key(pair_name, draft_id, target_id, limits), prompt, sampling, spec, bool(run_baseline), chat)


def get_pair(key) -> ModelPair:
    try:
        return load_pair(key)
    except ModelLoadError as err:
        raise UserError(str(err)) from None


def user_errors(fn):
    """Turn UserError (and the engine's own input errors, and a GPU out-of-memory) into gr.Error for the UI."""
    import functools
    import inspect

    expected = (UserError, PromptError, ConfigError, ModelLoadError, torch.cuda.OutOfMemoryError)

    def convert(err: Exception) -> gr.Error:
        if isinstance(err, torch.cuda.OutOfMemoryError):
            torch.cuda.empty_cache()
            return gr.Error("The GPU ran out of memory for this request. Try fewer tokens or a smaller pair.")
        return gr.Error(str(err))

    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def gen_wrapper(*args, **kwargs):
            try:
                yield from fn(*args, **kwargs)
            except expected as err:
                raise convert(err) from None
        return gen_wrapper

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except expected as err:
            raise convert(err) from None
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


def charts(spec: Trace | None, base: Trace | None) -> tuple:
    return (plots.race(spec, base), plots.acceptance_per_round(spec), plots.accepted_length_histogram(spec),
            plots.acceptance_by_position(spec), plots.speedup_vs_theory(spec, base))


@gpu
@user_errors
def generate_ui(pair_name, draft_id, target_id, prompt, k, temperature, top_k, top_p, max_new_tokens, seed,
                run_baseline, lenience, chat=None, strategy="fixed", ngram=3):
    """The Generate button. Yields (tokens, stats, film strip, 5 charts, trace JSON, state, round slider).

    The trace is downloaded in the browser from the trace JSON (ui.DOWNLOAD_JS): a server file would put its path
    (gradio's cache folder) into the page and the API's answer."""
    limits = Limits.from_env()
    req = validate(pair_name, draft_id, target_id, prompt, k, temperature, top_k, top_p, max_new_tokens, seed,
                   run_baseline, lenience, limits, chat, strategy, ngram)
    pair = get_pair(req.pair)
    if req.spec.lossy:
        gr.Warning(f"Lenience b = {req.spec.lenience} < 1: this run is lossy and will not follow the target's "
                   "distribution.")
    skip = gr.skip()
    last_chart = time.monotonic()  # the first update carries only text and stats, so it reaches the page fastest
    spec = base = None
    for spec, base, phase in run_stream(req, pair, limits):
        now = time.monotonic()
        redraw = now - last_chart > CHART_EVERY_S
        if redraw:
            last_chart = now
        status = f"running {phase}..." if phase == "speculative" else (
            f"running the target-only baseline: {len(base.steps)} tokens")
        if phase == "speculative":
            yield (render.tokens_html(shown_prompt(spec), spec.rounds), render.stats_html(spec, None, status),
                   render.filmstrip_html(spec.rounds), *(charts(spec, None) if redraw else (skip,) * 5),
                   skip, skip, skip)
        else:
            yield (skip, render.stats_html(spec, base, status), skip,
                   *((plots.race(spec, base),) + (skip,) * 4 if redraw else (skip,) * 5), skip, skip, skip)
    stop = spec.stop_reason
    if stop == "time_limit":
        gr.Warning(f"Stopped at this server's time limit of {limits.time_limit_s} s per request.")
    payload = trace_payload(spec, base)
    n_rounds = len(spec.rounds)
    yield (render.tokens_html(shown_prompt(spec), spec.rounds), render.stats_html(spec, base, f"done ({stop})"),
           render.filmstrip_html(spec.rounds), *charts(spec, base), payload,
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
    round), "adaptive" (the draft stops when unsure; K is ignored) or "lookup" (copy after a matching n-gram of up
    to `ngram` tokens; no draft model). Returns {"speculative": trace,
    "baseline": trace or null}; each trace has text, token_ids, rounds (labels, p, q, r, min(1, p/q), top
    candidates, timings) and metrics.
    """
    limits = Limits.from_env()
    req = validate(pair, draft, target, prompt, k, temperature, top_k, top_p, max_new_tokens, seed, baseline,
                   lenience, limits, chat, strategy, ngram)
    loaded = get_pair(req.pair)
    *_, (spec, base, _) = run_stream(req, loaded, limits)  # run to the end; the last snapshot is the whole run
    return trace_payload(spec, base)


# ----------------------------------------------------------------------------------------------- inspection


def _rounds(state) -> list:
    return state["spec"].rounds if state and state.get("spec") else []


def inspect_round(state, round_no, position):
    """The round inspector: p, q and the residual at one position, and why that token was kept or resampled."""
    rounds = _rounds(state)
    if not rounds:
        return plots.inspector_empty(), "Generate first, then pick a round in the film strip."
    idx = min(max(int(round_no or 1), 1), len(rounds)) - 1
    rnd = rounds[idx]
    pos = min(max(int(position or 1), 1), rnd.k + 1)
    if pos == rnd.k + 1 and not rnd.bonus_top and rnd.drafts:
        pos = next((d.position for d in rnd.drafts if d.checked and not d.accepted), rnd.k)
    return plots.inspector(rnd, pos), f'<div class="sd-caption">{render.reason(rnd, pos)}</div>'


def default_position(state, round_no) -> int:
    """Open a round at its most telling position: the rejection if there was one, else the bonus."""
    rounds = _rounds(state)
    if not rounds:
        return 1
    rnd = rounds[min(max(int(round_no or 1), 1), len(rounds)) - 1]
    rejected = [d.position for d in rnd.drafts if d.checked and not d.accepted]
    return rejected[0] if rejected else rnd.k + 1


def select_round(state, round_no):
    """A round was chosen: open it at its most telling position and draw the inspector."""
    pos = default_position(state, round_no)
    return (pos, *inspect_round(state, round_no, pos))


def film_click(state, evt: gr.EventData):
    """A click on a film-strip row carries data-round; select that round in the inspector."""
    data = getattr(evt, "_data", None) or {}
    rounds = _rounds(state)
    try:
        idx = int(data.get("round"))
    except (TypeError, ValueError):
        return gr.skip(), gr.skip()
    if not (0 <= idx < len(rounds)):
        return gr.skip(), gr.skip()
    return idx + 1, render.filmstrip_html(rounds, selected=idx)


def step_round(state, direction: int):
    """Step-through for talks: show the text up to the current round and say what happened, in plain words."""
    rounds = _rounds(state)
    if not rounds:
        return state, render.tokens_html("", []), "Generate first; then step through the rounds one at a time."
    cursor = 0 if direction == 0 else min(max(state.get("cursor", 0) + direction, 0), len(rounds))
    state = {**state, "cursor": cursor}
    prompt = shown_prompt(state["spec"])
    if cursor == 0:
        return state, render.tokens_html(prompt, []), f"Before round 1: only the prompt. {len(rounds)} rounds follow."
    rnd = rounds[cursor - 1]
    caption = f"Round {cursor} of {len(rounds)}: {rnd.caption}."
    return state, render.tokens_html(prompt, rounds, upto=cursor), caption


# ----------------------------------------------------------------------------------------------- experiments


@gpu
@user_errors
def k_sweep_ui(pair_name, draft_id, target_id, prompt, temperature, top_k, top_p, max_new_tokens, seed, k_from, k_to,
               chat=None):
    """Run K = k_from..k_to on the same prompt and seed; plot measured and predicted speedup, recommend a K."""
    limits = Limits.from_env()
    k_from = as_number("First K", k_from, int, 1, limits.max_k)
    k_to = as_number("Last K", k_to, int, k_from, limits.max_k)
    req = validate(pair_name, draft_id, target_id, prompt, k_from, temperature, top_k, top_p, max_new_tokens, seed,
                   True, 1.0, limits, chat)
    pair = get_pair(req.pair)
    ids = encode_prompt(pair, req.prompt, req.spec.max_new_tokens, req.chat)
    with pair.lock:
        base_steps = list(baseline_steps(pair, ids, req.sampling, req.spec.max_new_tokens, req.spec.seed))
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
        best = max(results, key=lambda r: r["speedup"])
        table = "| K | tokens/s | speedup | alpha |\n|---:|---:|---:|---:|\n" + "\n".join(
            f"| {r['k']} | {r['tokens_per_s']:.1f} | {r['speedup']:.2f}x | {r['alpha']:.2f} |" for r in results)
        kb, sb = best_k(alpha, c, limits.max_k)
        text = (f"Baseline {base_tps:.1f} tokens/s. Measured best: **K = {best['k']}** ({best['speedup']:.2f}x). "
                f"Theory with alpha = {alpha:.2f}, c = {c:.3f}: best K = {kb} ({sb:.2f}x).\n\n{table}")
        yield plots.k_sweep(results, alpha, c), text
        if time.monotonic() > deadline:
            gr.Warning(f"K sweep stopped at this server's time limit ({limits.time_limit_s} s).")
            return


RACE_STRATEGIES = ("fixed", "adaptive", "lookup")


@gpu
@user_errors
def strategy_race_ui(pair_name, draft_id, target_id, prompt, k, temperature, top_k, top_p, max_new_tokens, seed,
                     chat=None):
    """Target-only decoding, then every strategy, on the same prompt and seed, one after another (each timed alone).
    Yields the tokens-over-time chart and a table after every run."""
    limits = Limits.from_env()
    req = validate(pair_name, draft_id, target_id, prompt, k, temperature, top_k, top_p, max_new_tokens, seed,
                   True, 1.0, limits, chat)
    pair = get_pair(req.pair)
    ids = encode_prompt(pair, req.prompt, req.spec.max_new_tokens, req.chat)
    with pair.lock:
        base_steps = list(baseline_steps(pair, ids, req.sampling, req.spec.max_new_tokens, req.spec.seed))
    base_ids = [s.token.token_id for s in base_steps]
    base_tps = len(base_steps) / base_steps[-1].elapsed_s
    runs = {"target only": [(s.elapsed_s, i + 1) for i, s in enumerate(base_steps)]}
    rows = [f"| target only | {base_tps:.1f} | 1.00x | {len(base_steps)} | | | |"]
    deadline = time.monotonic() + limits.time_limit_s
    header = ("| run | tokens/s | speedup | target calls | acceptance | mean accepted length | same text as "
              "target only |\n|---|---:|---:|---:|---:|---:|:---:|\n")
    yield plots.strategy_race(runs), header + "\n".join(rows)
    for strategy in RACE_STRATEGIES:
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
        label = f"{strategy} (K = {spec.k})" if strategy == "fixed" else strategy
        runs[label] = points
        same = "yes" if out_ids == base_ids else ("no (sampling)" if not req.sampling.greedy else "**NO**")
        rows.append(f"| {label} | {tps:.1f} | {tps / base_tps:.2f}x | {len(rounds)} | "
                    f"{accepted / drafted if drafted else 0:.2f} | {n / len(rounds):.2f} | {same} |")
        yield plots.strategy_race(runs), header + "\n".join(rows)
        if time.monotonic() > deadline:
            gr.Warning(f"The race stopped at this server's time limit ({limits.time_limit_s} s).")
            return


@gpu
@user_errors
def distribution_ui(pair_name, draft_id, target_id, prompt, temperature, top_k, top_p, lenience, n_samples, seed,
                    chat=None):
    """Draw N speculative samples of the first generated token and compare their histogram with the exact p."""
    limits = Limits.from_env()
    n = as_number("Samples", n_samples, int, 10, limits.max_samples)
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
    tv = 0.5 * (freq - p).abs().sum().item()
    tv_ref = 0.5 * (ref - p).abs().sum().item()
    tv_pq = 0.5 * (p - q).abs().sum().item()
    top = torch.topk(torch.maximum(p, freq), min(15, pair.vocab_size)).indices.tolist()
    fig = plots.distribution([pair.token_text(i) for i in top], p[top].tolist(), freq[top].tolist(), q[top].tolist(),
                             f"First token: {n} speculative samples vs the target's exact p")
    lossy = (f" **Lossy:** lenience b = {req.spec.lenience} skews the samples toward the draft."
             if req.spec.lossy else "")
    text = (f"Total variation distance between the {n} speculative samples and p: **{tv:.3f}**. "
            f"For scale, {n} samples drawn from p itself land at {tv_ref:.3f}; the draft q alone is {tv_pq:.3f} "
            f"from p.{lossy}")
    return fig, text


# ----------------------------------------------------------------------------------------------- pair selection


def pair_info(pair: ModelPair) -> str:
    d = pair.describe()
    return (f"**Loaded** `{d['draft']}` ({d['draft_parameters'] / 1e6:.1f}M) drafting for `{d['target']}` "
            f"({d['target_parameters'] / 1e6:.1f}M) on {d['device']} ({d['dtype']}), context {d['context_window']} "
            f"tokens.")


def change_pair(pair_name, draft_id, target_id, progress=gr.Progress()):
    """Load the chosen pair with a visible progress indicator. A failure keeps the previous pair working.
    Returns (status, custom box, examples, chat switch): the switch takes the pair's default mode."""
    custom = pair_name == CUSTOM
    examples = PRESETS[pair_name].examples if pair_name in PRESETS else ()
    if custom and not ((draft_id or "").strip() and (target_id or "").strip()):
        return "Enter a draft and a target model id, then press Load.", gr.update(visible=True), gr.skip(), gr.skip()
    progress(0.1, desc=f"Loading {pair_name}...")
    try:
        pair = get_pair(pair_key(pair_name, draft_id, target_id, Limits.from_env()))
    except UserError as err:
        gr.Warning(str(err))
        return f"**Could not load:** {render.esc(str(err))}", gr.update(visible=custom), gr.skip(), gr.skip()
    progress(1.0, desc="Loaded")
    return (pair_info(pair), gr.update(visible=custom),
            gr.Dataset(samples=[[e] for e in examples]) if examples else gr.skip(),
            gr.update(value=pair.chat, interactive=pair.has_chat_template))

