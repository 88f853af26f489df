"""The runs behind every button: a streamed generation and its baseline, the K sweep, the strategy race and the
first-token distribution check, each sharing the device with every other session.

Owns how a run uses the device. Every round (or target-only step) takes the device lock on its own, the deadline is
checked after every round, and every run is a generator that yields between rounds. So other sessions' rounds
interleave with a long experiment, and Stop (a cancelled event) ends any run between two rounds. It builds no output:
views.py turns what the runs yield into the page, and handlers.py wires the two.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch

from .autoregressive import baseline_steps
from .config import Limits, SpecConfig
from .events import Trace
from .models import ModelPair
from .sampling import first_token_samples, warp
from .speculative import encode_prompt, finish, run_settings, speculative_rounds
from .theory import best_k, measure
from .ties import divergence_steps
from .validation import Request

TIME_LIMIT = "time_limit"  # an experiment yields this when its deadline ended it before the next result
RACE_STRATEGIES = ("fixed", "adaptive", "lookup", "eagle")  # eagle where the pair has a head


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
            event.stop_reason = TIME_LIMIT
            yield event
            return
        yield event


def run_stream(req: Request, pair: ModelPair, limits: Limits) -> Iterator[tuple[Trace, Trace | None, str]]:
    """Run speculative decoding, then (optionally) the baseline, yielding (spec, base, phase) after every event.

    A run the time limit ended starts no baseline: its settings say `baseline: not measured`, and the stats say so,
    rather than show a 'measured speedup' from a baseline of one step."""
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
    if spec.stop_reason == TIME_LIMIT:
        spec.settings["baseline"] = "not measured"
        return
    base = Trace("baseline", req.prompt, ids, run_settings(pair, req.sampling) | {
        "max_new_tokens": req.spec.max_new_tokens, "seed": req.spec.seed, "chat": chat})
    steps = baseline_steps(pair, ids, req.sampling, req.spec.max_new_tokens, req.spec.seed)
    for step in one_at_a_time(pair, steps, deadline):
        base.steps.append(step)
        base.wall_s = step.elapsed_s
        yield spec, base, "baseline"
    finish(pair, base)


# ------------------------------------------------------------------------------------------------- experiments
# Each experiment is a generator: None between rounds (a place for Stop and for other sessions), a result dict
# after each finished run, and TIME_LIMIT if the deadline ends it. `yield from` runs one timed run of the pair.


def collected(pair: ModelPair, events: Iterator, deadline: float):
    """Run an engine generator one locked event at a time, yielding None after each; returns the events."""
    out = []
    for event in one_at_a_time(pair, events, deadline):
        out.append(event)
        yield None
    return out


def explained(pair: ModelPair, ids: list[int], rounds: list, base_ids: list[int], deadline: float):
    """Where and why a T = 0 run parted from target-only decoding (ties.divergence_steps): one target forward at a
    time under the device lock (a replay can take a prefill, hundreds of steps and every verify), yielding None
    after each; returns the Divergence, or TIME_LIMIT once the deadline has passed."""
    steps = divergence_steps(pair, ids, rounds, base_ids)
    while True:
        with pair.lock:
            try:
                next(steps)
            except StopIteration as done:
                return done.value
        if time.monotonic() > deadline:
            steps.close()
            return TIME_LIMIT
        yield None


def cut_short(events: list) -> bool:
    return not events or events[-1].stop_reason == TIME_LIMIT


def experiment_start(pair: ModelPair, req: Request, limits: Limits):
    """The prompt's ids, the deadline, and a timed target-only run to compare against (None if the time ran out)."""
    ids = encode_prompt(pair, req.prompt, req.spec.max_new_tokens, req.chat)
    deadline = time.monotonic() + limits.time_limit_s
    steps = baseline_steps(pair, ids, req.sampling, req.spec.max_new_tokens, req.spec.seed)
    base = yield from collected(pair, steps, deadline)
    return ids, deadline, (None if cut_short(base) else base)


def k_sweep(pair: ModelPair, req: Request, limits: Limits, k_from: int, k_to: int) -> Iterator:
    """K = k_from..k_to on the same prompt and seed. After each K: the measured speedups so far, alpha and c pooled
    over every K swept, and the K the cost model recommends."""
    ids, deadline, base = yield from experiment_start(pair, req, limits)
    if base is None:
        yield TIME_LIMIT
        return
    base_tps = len(base) / base[-1].elapsed_s
    results, all_rounds = [], []
    for k in range(k_from, k_to + 1):
        spec = SpecConfig(k=k, max_new_tokens=req.spec.max_new_tokens, seed=req.spec.seed, top_candidates=0)
        rounds = yield from collected(pair, speculative_rounds(pair, ids, req.sampling, spec), deadline)
        if cut_short(rounds):
            yield TIME_LIMIT
            return
        tps = sum(len(r.output) for r in rounds) / rounds[-1].elapsed_s
        all_rounds += rounds
        results.append({"k": k, "speedup": tps / base_tps, "tokens_per_s": tps,
                        "alpha": measure(rounds, base)["alpha_empirical"]})
        pooled = measure(all_rounds, base)  # alpha and c over every K swept so far
        kb, sb = best_k(pooled["alpha_empirical"], pooled["c"], limits.max_k)
        yield {"results": list(results), "alpha": pooled["alpha_empirical"], "c": pooled["c"], "base_tps": base_tps,
               "kb": kb, "sb": sb}


def strategy_race(pair: ModelPair, req: Request, limits: Limits) -> Iterator:
    """Target-only decoding, then every strategy the pair offers, on the same prompt and seed, one after another
    (each timed alone). After each run: the race so far, as data that views.race_view draws in any language.
    At T = 0 a text that parts from the target's carries the measured reason (ties.explain_divergence)."""
    ids, deadline, base = yield from experiment_start(pair, req, limits)
    if base is None:
        yield TIME_LIMIT
        return
    base_ids = [s.token.token_id for s in base]
    race = {"base_tps": len(base) / base[-1].elapsed_s, "base_n": len(base),
            "base_points": [(s.elapsed_s, i + 1) for i, s in enumerate(base)], "entries": []}
    yield dict(race)
    for strategy in RACE_STRATEGIES:
        if strategy == "eagle" and pair.head is None:
            continue
        spec = SpecConfig(k=req.spec.k, max_new_tokens=req.spec.max_new_tokens, seed=req.spec.seed,
                          top_candidates=0, strategy=strategy)
        rounds = yield from collected(pair, speculative_rounds(pair, ids, req.sampling, spec), deadline)
        if cut_short(rounds):
            yield TIME_LIMIT
            return
        out_ids = [t.token_id for r in rounds for t in r.output]
        points, total = [], 0
        for r in rounds:
            total += len(r.output)
            points.append((r.elapsed_s, total))
        if out_ids == base_ids:
            same = "same"
        elif not req.sampling.greedy:  # sampled runs differ token by token and agree in distribution
            same = "sampling"
        else:  # at T = 0 say where and why: a bf16 near-tie between a verify and a step, or a bug
            same = yield from explained(pair, ids, rounds, base_ids, deadline)
            if same == TIME_LIMIT:
                yield TIME_LIMIT
                return
        drafted = sum(r.k for r in rounds)
        race["entries"] = race["entries"] + [{
            "strategy": strategy, "k": spec.k, "tokens_per_s": len(out_ids) / rounds[-1].elapsed_s,
            "rounds": len(rounds), "accepted": sum(r.n_accepted for r in rounds) / drafted if drafted else 0.0,
            "per_call": len(out_ids) / len(rounds), "points": points, "same": same}]
        yield dict(race)


def first_token_distribution(pair: ModelPair, req: Request, n: int) -> dict:
    """N speculative samples of the first generated token against the exact p (one device turn: two forwards)."""
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
    return {"n": n, "lenience": req.spec.lenience, "tokens": [pair.token_text(i) for i in top],
            "p": p[top].tolist(), "freq": freq[top].tolist(), "q": q[top].tolist(),
            "tv": 0.5 * (freq - p).abs().sum().item(), "tv_ref": 0.5 * (ref - p).abs().sum().item(),
            "tv_pq": 0.5 * (p - q).abs().sum().item()}
