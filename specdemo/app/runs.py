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
from dataclasses import replace
from typing import NamedTuple

import torch

from specdemo.config import SpecConfig
from specdemo.engine.autoregressive import baseline_steps
from specdemo.engine.drafters import Proposal
from specdemo.engine.events import Trace, acceptance
from specdemo.engine.sampling import sample, verify
from specdemo.engine.speculative import encode_prompt, finish, run_settings, speculative_rounds, verify_forward
from specdemo.engine.strategy import make_drafter, max_drafts
from specdemo.engine.theory import best_k, measure
from specdemo.engine.ties import divergence_steps
from specdemo.engine.tree_drafter import run_tree_shape
from specdemo.i18n import Msg
from specdemo.limits import Limits
from specdemo.models import ModelPair

from .validation import Request, UserError

TIME_LIMIT = "time_limit"  # an experiment yields this when its deadline ended it before the next result
RACE_STRATEGIES = ("fixed", "adaptive", "lookup", "eagle", "tree")  # eagle and tree where the pair has a head


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


def deadline_of(req: Request, limits: Limits) -> float:
    """When a request's time limit ends: counted from its arrival where it was stamped (on ZeroGPU, where the
    GPU call pays for a load: Request.received), else from now."""
    return (time.monotonic() if req.received is None else req.received) + limits.time_limit_s


def run_stream(req: Request, pair: ModelPair, limits: Limits) -> Iterator[tuple[Trace, Trace | None, str]]:
    """Run speculative decoding, then (optionally) the baseline, yielding (spec, base, phase) after every event.

    A run the time limit ended starts no baseline: its settings say `baseline: not measured`, and the stats say so,
    rather than show a 'measured speedup' from a baseline of one step. A baseline that the time limit cuts short is
    dropped the same way (a last event with no baseline), since part of it measures nothing."""
    chat = pair.chat if req.chat is None else req.chat
    ids = encode_prompt(pair, req.prompt, req.spec.max_new_tokens, chat)
    deadline = deadline_of(req, limits)
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
    if base.stop_reason == TIME_LIMIT:
        spec.settings["baseline"] = "not measured"
        yield spec, None, "speculative"


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
    deadline = deadline_of(req, limits)
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
               "kb": kb, "sb": sb, "k_range": (k_from, k_to)}


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
        if strategy in ("eagle", "tree") and pair.head is None:
            continue
        # the request's settings, each strategy in turn, exact (lenience 1) and without inspector candidates
        spec = replace(req.spec, strategy=strategy, lenience=1.0, top_candidates=0)
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
        # alpha as the stats above the reply count it (events.acceptance): kept drafts over the drafts the target
        # judged, so a tree's unvisited branches do not count against it
        race["entries"] = race["entries"] + [{
            "strategy": strategy, "k": spec.k, "ngram": spec.ngram, "tokens_per_s": len(out_ids) / rounds[-1].elapsed_s,
            "rounds": len(rounds), "alpha": acceptance(rounds)["alpha_empirical"],
            "per_call": len(out_ids) / len(rounds), "points": points, "same": same,
            "tree": run_tree_shape(spec, req.sampling, pair) if strategy == "tree" else None}]
        yield dict(race)


DIST_SEARCH_ROUNDS = 16  # rounds the distribution check runs to reach one that drafts (eagle's first never does)
DIST_CHUNK = 250  # samples the distribution check draws per turn of the device lock


def first_token_distribution(pair: ModelPair, req: Request, n: int, limits: Limits) -> Iterator:
    """N speculative samples of one drafted position, drawn by the engine's own parts with the page's strategy,
    against the exact p that the engine tests them against. A generator, like the experiments: None between
    device turns, then the result dict (or TIME_LIMIT).

    1. The loop runs with the page's strategy and seed, one round per device turn, until the next round drafts:
       at once for the draft model; after the first round for the EAGLE head (a plain target step: the head needs
       the target's features), and after the rounds where prompt lookup finds nothing to copy.
    2. That round's proposal gives q at its first position (the distribution the drafter drew from), and the loop's
       own verify forward over it (speculative.verify_forward: float32 logits, warped the same way) gives p there.
    3. N independent trials of that position, each one round of one draft: x ~ q, then the loop's `verify` keeps x
       or draws from the residual (a tree's first token is the target's own draw at the root, walk.py's row 0).
    Exact sampling gives p itself: `chi2` tests the samples against p (pooled where fewer than 5 are expected)."""
    chat = pair.chat if req.chat is None else req.chat
    ids = encode_prompt(pair, req.prompt, 1, chat)
    deadline = deadline_of(req, limits)
    with pair.lock:  # device work takes the device's turn (a capture elsewhere meanwhile would fail)
        gen = torch.Generator(device=pair.device).manual_seed(req.spec.seed)
    found = yield from round_that_drafts(pair, req, ids, gen, deadline, limits)
    if found is None:
        return
    draws = yield from position_trials(pair, req, found, n, gen, deadline)
    if draws is not None:
        with pair.lock:
            result = distribution_result(pair, req, found, draws, n, gen, len(ids))
        yield result


class Drafted(NamedTuple):
    """The distribution check's drafted position: the proposal, the target's p over it, the tokens fixed before."""

    proposal: Proposal
    p: torch.Tensor  # [2, V]: p at the drafted position (the next row is never read here)
    fixed: list[int]


def round_that_drafts(pair: ModelPair, req: Request, ids: list[int], gen: torch.Generator, deadline: float,
                      limits: Limits) -> Iterator:
    """Steps 1 and 2: the loop's rounds, one per device turn, until a proposal drafts; then the verify forward
    over it, as the loop makes it. A proposal that drafts nothing changes no drafter (lookup, eagle's first round).
    Returns a Drafted, or None after yielding TIME_LIMIT; raises UserError where no round drafts."""
    budget = max(1, min(limits.max_new_tokens, pair.context_window - len(ids)))
    spec = replace(req.spec, max_new_tokens=budget, top_candidates=0)
    target, drafter = pair.new_lm("target"), make_drafter(spec, req.sampling, pair)
    loop = speculative_rounds(pair, ids, req.sampling, spec, target_lm=target, drafter=drafter)
    fixed = list(ids)
    for _ in range(DIST_SEARCH_ROUNDS):
        with pair.lock:
            seq = torch.tensor(fixed, device=pair.device)
            proposal = drafter.propose(seq, min(max_drafts(spec), budget - (len(fixed) - len(ids)) - 1), gen)
            if proposal.k:
                p, *_ = verify_forward(target, seq, proposal, drafter, req.sampling, pair.dtype)
                # kept across turns of the device lock: a captured chain's outputs are its graph's own buffers,
                # which another visitor's round replays over (Proposal), so the trials hold copies
                kept = replace(proposal, tokens=proposal.tokens.clone(), q=proposal.q.clone())
                return Drafted(kept, p[:2], fixed)
            rnd = next(loop)  # the loop's own round, which drafts nothing either
        fixed += [t.token_id for t in rnd.output]
        if rnd.stop_reason or time.monotonic() > deadline:
            break
        yield None
    if time.monotonic() > deadline:
        yield TIME_LIMIT
        return None
    raise UserError("err.dist_no_draft", rounds=DIST_SEARCH_ROUNDS, who=Msg(f"strategy.{req.spec.strategy}"))


def position_trials(pair: ModelPair, req: Request, found: Drafted, n: int, gen: torch.Generator,
                    deadline: float) -> Iterator:
    """Step 3: n trials of the drafted position, DIST_CHUNK per turn of the device lock. Returns the drawn tokens,
    or None after yielding TIME_LIMIT."""
    q, p, greedy = found.proposal.q[:1], found.p, req.sampling.greedy  # q: [1, V]
    tree = found.proposal.tree
    draws = []
    while len(draws) < n:
        yield None
        if time.monotonic() > deadline:
            yield TIME_LIMIT
            return None
        with pair.lock, torch.inference_mode():
            m = min(DIST_CHUNK, n - len(draws))
            if tree is not None:  # the walk draws the target's token at the root, and it is the round's first
                draws += list(sample(p[:1].expand(m, -1), gen, greedy=greedy))
                continue
            xs = q.argmax(-1).expand(m) if greedy else torch.multinomial(q[0], m, True, generator=gen)
            for x in xs:
                v = verify(x.view(1), q, p, gen, greedy=greedy, lenience=req.spec.lenience)
                draws.append(torch.where(v.n_accepted > 0, x, v.next_token))
    return draws


def distribution_result(pair: ModelPair, req: Request, found: Drafted, draws: list, n: int, gen: torch.Generator,
                        prompt_len: int) -> dict:
    """The samples against p: χ², total variation (and that of n samples of p itself, for scale), the top tokens."""
    proposal, fixed = found.proposal, found.fixed
    tree = proposal.tree
    with torch.inference_mode():
        p1, q1 = found.p[0], (None if tree is not None else proposal.q[0])  # a tree's children are not drawn from q
        got = torch.bincount(torch.stack(draws), minlength=pair.vocab_size).double()
        exact = torch.multinomial(p1, n, replacement=True, generator=gen)  # n samples of p itself, for scale
        ref = torch.bincount(exact, minlength=pair.vocab_size).double() / n
        stat, dof, pvalue = chi2(got, p1.double(), n)
        freq = got / n
        top = torch.topk(torch.maximum(p1.double(), freq), min(15, pair.vocab_size)).indices.tolist()
        return {"n": n, "lenience": req.spec.lenience, "tokens": [pair.token_text(i) for i in top],
                "p": p1[top].tolist(), "freq": freq[top].tolist(), "q": None if q1 is None else q1[top].tolist(),
                "tv": 0.5 * (freq - p1).abs().sum().item(), "tv_ref": 0.5 * (ref - p1).abs().sum().item(),
                "tv_pq": None if q1 is None else 0.5 * (p1 - q1).abs().sum().item(),
                "chi2": stat, "dof": dof, "pvalue": pvalue,
                "strategy": req.spec.strategy, "source": proposal.source, "position": len(fixed) - prompt_len + 1,
                "before": pair.decode(fixed[prompt_len:]), "token_ids": top}


def chi2(counts: torch.Tensor, p: torch.Tensor, n: int) -> tuple[float, int, float]:
    """Pearson's chi-square of `counts` [V] (n samples) against p [V]: (statistic, degrees of freedom, p-value).
    Tokens expected fewer than 5 times share one cell, so that the chi-square approximation holds; a sample of a
    token that p gives probability 0 cannot come from p, and gets a p-value of 0."""
    expected = n * p
    if bool((counts[p == 0] > 0).any()):
        return float("inf"), 0, 0.0
    alone = expected >= 5
    obs = torch.cat([counts[alone], counts[~alone].sum().view(1)])
    exp = torch.cat([expected[alone], expected[~alone].sum().view(1)])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    dof = int(obs.numel()) - 1
    stat = float(((obs - exp) ** 2 / exp).sum())
    if dof < 1:
        return stat, 0, 1.0
    return stat, dof, float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                                    torch.tensor(stat / 2, dtype=torch.float64)))
