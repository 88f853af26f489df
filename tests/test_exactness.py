"""The promise of the algorithm: speculative sampling draws from exactly the target's distribution.

chi-square tests compare thousands of speculative samples with the target's exact (enumerated) distribution: for
the verify step alone, for the joint of the first two tokens on toy models with an 8-token vocabulary, and for the
first token of the embedded Shakespeare pair, for every drafting strategy (fixed, adaptive, lookup). Planted bugs
(q taken unwarped; a lenient b < 1; a stop rule that peeks at the target's p; a drafter that withdraws a token it
already drew) must be caught.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from scipy.stats import chisquare

import specdemo.engine.speculative as speculative
from specdemo.config import SamplingConfig, SpecConfig
from specdemo.engine.drafters import AdaptiveDrafter, ModelDrafter, Proposal
from specdemo.engine.sampling import first_max, residual, sample, verify, warp
from specdemo.engine.speculative import speculative_rounds
from specdemo.models import CachedLM

PASS_P = 1e-3  # a correct sampler fails a given seed set with probability 0.001; the seeds are fixed
BUG_P = 1e-6


def chi2_pvalue(counts: Counter, probs: dict, n: int) -> float:
    """chi-square goodness of fit; cells expected below 5 are pooled so the approximation holds."""
    obs, exp, pool_o, pool_e = [], [], 0, 0.0
    for cell, p in probs.items():
        if n * p >= 5:
            obs.append(counts.get(cell, 0))
            exp.append(n * p)
        else:
            pool_o += counts.get(cell, 0)
            pool_e += n * p
    stray = sum(c for cell, c in counts.items() if cell not in probs)  # samples the target gives probability 0
    pool_o += stray
    if pool_e > 0 or stray:
        obs.append(pool_o)
        exp.append(max(pool_e, 1e-9))
    scale = sum(obs) / sum(exp)
    return float(chisquare(obs, [e * scale for e in exp]).pvalue) if stray == 0 else 0.0


# ------------------------------------------------------------------------------------------------ pure functions


def test_sample_draws_each_row_from_its_distribution_and_never_a_zero(monkeypatch):
    """sample (inverse CDF in float64) against the exact rows: a spread row with zeros between and after its mass,
    a row of one token, a row with a mass of 1e-7 beside a big one, and a large random row (vocabulary-sized, with
    a zeroed tail); chi-square per row, and no token of probability 0 ever drawn, also when every uniform is pushed
    to the top of its range. A planted off-by-one (the token after the drawn one) is caught by the same test."""
    gen = torch.Generator().manual_seed(0)
    big = torch.softmax(torch.randn(4096, generator=gen) * 2, -1)
    big[3000:] = 0
    rows = [torch.tensor([0.0, 0.2, 0.0, 0.5, 0.3, 0.0]), torch.tensor([0.0, 0.0, 1.0, 0.0]),
            torch.tensor([1 - 1e-7, 1e-7, 0.0]), big / big.sum()]
    n = 4000
    for row in rows:
        probs = row.view(1, -1).expand(n, -1)  # n rows at once: one uniform each
        drawn = sample(probs, gen).tolist()
        assert all(row[x] > 0 for x in drawn)
        exact = {(i,): float(v) for i, v in enumerate(row.tolist()) if v > 0}
        if len(exact) == 1:  # nothing to test but that every draw is the one token
            continue
        assert chi2_pvalue(Counter((x,) for x in drawn), exact, n) > PASS_P
        shifted = [min(x + 1, len(row) - 1) for x in drawn]  # planted bug
        assert chi2_pvalue(Counter((x,) for x in shifted), exact, n) < BUG_P
    # every uniform at the largest float below 1: u lands on the row's total, where only rounding decides; the
    # drawn token still has mass, also after a mass too small to move the float64 sum (the last row)
    monkeypatch.setattr(torch, "rand", lambda *size, generator=None, device=None, dtype=None:
                        torch.full(size, 1 - 2 ** -53, device=device, dtype=dtype))
    for row in rows + [torch.tensor([0.5, 0.5, 1e-30, 0.0])]:
        x = int(sample(row.view(1, -1), gen)[0])
        assert row[x] > 0, (row[:8], x)


def test_first_max_is_argmax_ties_included():
    """first_max (torch.max's index, cheaper on a CPU) gives argmax's index, the first of tied maxima, in rows of
    few values (many ties) and on a one-hot."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        x = torch.randint(0, 3, (9, 49152), generator=gen).float()
        assert torch.equal(first_max(x), x.argmax(-1))
        assert torch.equal(first_max(x, keepdim=True), x.argmax(-1, keepdim=True))
    hot = torch.zeros(3, 7).scatter_(1, torch.tensor([[2], [0], [6]]), 1.0)
    assert first_max(hot).tolist() == [2, 0, 6]


def test_warp_greedy_is_one_hot_without_division():
    logits = torch.tensor([[1.0, 3.0, 2.0], [0.0, -1.0, 5.0]])
    probs = warp(logits, SamplingConfig(temperature=0.0))
    assert torch.equal(probs, torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]))
    assert torch.isfinite(probs).all()


@pytest.mark.parametrize("top_k,top_p,expected_support", [(2, 1.0, {0, 1}), (0, 0.6, {0, 1}), (0, 0.5, {0}),
                                                          (3, 0.99, {0, 1, 2}), (1, 1.0, {0})])
def test_warp_filters(top_k, top_p, expected_support):
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    probs = warp(logits, SamplingConfig(temperature=1.0, top_k=top_k, top_p=top_p))[0]
    assert {i for i, v in enumerate(probs.tolist()) if v > 0} == expected_support
    assert abs(probs.sum().item() - 1) < 1e-6
    kept = torch.tensor(sorted(expected_support))
    base = torch.tensor([0.5, 0.3, 0.15, 0.05])[kept]
    assert torch.allclose(probs[kept], base / base.sum(), atol=1e-6)


def test_warp_temperature():
    logits = torch.tensor([[0.0, 1.0, 2.0]])
    probs = warp(logits, SamplingConfig(temperature=0.5))
    assert torch.allclose(probs, torch.softmax(logits / 0.5, -1))


def transformers_warp(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """transformers' own warpers, in the order generate applies them (temperature, top-k, top-p), then softmax."""
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    chain = LogitsProcessorList([TemperatureLogitsWarper(cfg.temperature)])
    if cfg.top_k:
        chain.append(TopKLogitsWarper(cfg.top_k))
    if cfg.top_p < 1.0:
        chain.append(TopPLogitsWarper(cfg.top_p))
    return chain(None, logits.clone()).softmax(-1)


WARP_SETTINGS = [SamplingConfig(t, k, p) for t in (0.3, 1.0, 1.7) for k in (0, 1, 5, 50, 999)
                 for p in (1.0, 0.95, 0.5, 0.1)]


@pytest.mark.parametrize("cfg", WARP_SETTINGS, ids=lambda c: f"T{c.temperature}-k{c.top_k}-p{c.top_p}")
def test_warp_equals_transformers_warpers_on_random_logits(cfg):
    """warp is transformers' TemperatureLogitsWarper, TopKLogitsWarper and TopPLogitsWarper, token for token, on
    logits without ties (random float32 rows): the same support and the same probabilities."""
    logits = torch.randn(16, 1000, generator=torch.Generator().manual_seed(0)) * 3
    ours, theirs = warp(logits, cfg), transformers_warp(logits, cfg)
    assert torch.equal(ours > 0, theirs > 0)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)


def test_warp_keeps_every_token_tied_at_a_filters_edge():
    """At a tie on the edge of the top-k or top-p set, warp keeps every tied token: which of them survives must not
    depend on a sort's order among equal values (bf16 logits tie often). top-k: transformers keeps ties too, and
    the two agree. top-p: transformers' TopPLogitsWarper keeps the tied tokens that its ascending sort happens to
    place last, so at such a tie, and only there, the two differ: here it keeps one of the two 0.3s."""
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.3], [0.3, 0.4, 0.3]]))
    cfg = SamplingConfig(1.0, top_p=0.6)
    assert (warp(logits, cfg) > 0).all()  # 0.4 + either 0.3 reaches 0.6: both 0.3s are the edge, both stay
    torch.testing.assert_close(warp(logits, cfg), logits.softmax(-1))
    assert ((transformers_warp(logits, cfg) > 0).sum(-1) == 2).all()  # transformers: one of the tied pair
    tied_k = torch.tensor([[2.0, 1.0, 1.0, 0.0]])
    k2 = SamplingConfig(1.0, top_k=2)
    assert (warp(tied_k, k2) > 0).tolist() == [[True, True, True, False]]
    torch.testing.assert_close(warp(tied_k, k2), transformers_warp(tied_k, k2))


def test_residual_guards_equal_distributions():
    p = torch.tensor([[0.2, 0.3, 0.5]])
    res = residual(p, p.clone())
    assert torch.allclose(res, p) and torch.isfinite(res).all()
    res = residual(torch.tensor([[0.5, 0.5, 0.0]]), torch.tensor([[0.0, 0.5, 0.5]]))
    assert torch.allclose(res, torch.tensor([[1.0, 0.0, 0.0]]))


def test_verify_is_exact_for_one_position():
    """Draft x ~ q, verify against p: the emitted first token must follow p, with acceptance sum min(p, q)."""
    gen = torch.Generator().manual_seed(0)
    p = torch.tensor([0.05, 0.4, 0.3, 0.2, 0.05, 0.0])
    q = torch.tensor([0.3, 0.1, 0.3, 0.1, 0.1, 0.1])
    bonus = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 1.0])
    p_rows, q_rows = torch.stack([p, bonus]), q.view(1, -1)
    n, counts, accepted = 20000, Counter(), 0
    for _ in range(n):
        x = sample(q_rows, gen)
        v = verify(x, q_rows, p_rows, gen)
        first = int(x[0]) if int(v.n_accepted) == 1 else int(v.next_token)
        counts[first] += 1
        accepted += int(v.n_accepted)
    assert counts[5] == 0, "a token with p = 0 was emitted"
    assert chi2_pvalue(counts, {i: float(v) for i, v in enumerate(p) if v > 0}, n) > PASS_P
    alpha = torch.minimum(p, q).sum().item()
    assert abs(accepted / n - alpha) < 4 * (alpha * (1 - alpha) / n) ** 0.5


def test_verify_greedy_accepts_only_the_argmax():
    p = torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    q = torch.tensor([[0.0, 1.0, 0.0], [0.0, 1.0, 0.0]])
    v = verify(torch.tensor([1, 1]), q, p, None, greedy=True)
    assert int(v.n_accepted) == 1 and int(v.next_token) == 0  # second draft wrong: replaced by target's argmax


# ---------------------------------------------------------------------------------------------- toy model pair


@torch.inference_mode()
def exact_joint(pair, prompt_ids: list[int], cfg: SamplingConfig) -> dict:
    """P(x1, x2 | prompt) under the warped target, by enumeration with full (uncached) forwards."""
    ids = torch.tensor([prompt_ids])
    p1 = warp(pair.target(ids).logits[0, -1, : pair.vocab_size], cfg)
    out = {}
    for x1 in range(pair.vocab_size):
        if p1[x1] == 0:
            continue
        p2 = warp(pair.target(torch.tensor([prompt_ids + [x1]])).logits[0, -1, : pair.vocab_size], cfg)
        for x2 in range(pair.vocab_size):
            if p2[x2] > 0:
                out[(x1, x2)] = float(p1[x1] * p2[x2])
    return out


def speculative_samples(pair, prompt_ids, cfg, k, n, n_tokens=2, lenience=1.0, seed0=0, strategy="fixed",
                        make_drafter=None) -> Counter:
    """n runs with seeds seed0.. -> Counter of their first n_tokens; counts["rejections"] = runs whose first
    round rejected a draft (so the residual was used); counts[("k", j)] = runs whose first round drafted j."""
    counts = Counter()
    for seed in range(seed0, seed0 + n):
        spec = SpecConfig(k=k, max_new_tokens=k + 1, seed=seed, lenience=lenience, top_candidates=0,
                          strategy=strategy)
        drafter = make_drafter() if make_drafter else None
        out: list[int] = []
        for i, rnd in enumerate(speculative_rounds(pair, prompt_ids, cfg, spec, drafter=drafter)):
            counts["rejections"] += i == 0 and rnd.n_accepted < rnd.k
            if i == 0:
                counts[("k", rnd.k)] += 1
            out += [t.token_id for t in rnd.output]
            if len(out) >= n_tokens:
                break
        counts[tuple(out[:n_tokens])] += 1
    return counts


TOY_SETTINGS = [
    SamplingConfig(temperature=1.0),
    SamplingConfig(temperature=0.7, top_k=3),
    SamplingConfig(temperature=1.3, top_p=0.8),
]


@pytest.mark.parametrize("cfg", TOY_SETTINGS, ids=lambda c: f"T{c.temperature}-k{c.top_k}-p{c.top_p}")
def test_toy_joint_distribution_matches_target(toy_pair, cfg):
    prompt = [0, 1]
    exact = exact_joint(toy_pair, prompt, cfg)
    # n = 3000 and no fewer at T = 0.7, top-k 3: the unwarped-q bug planted below, run in that setting, gets p = 5e-21
    # at n = 3000 but 1e-8 at 1500 over these seeds (measured 2026-11-25). At T = 1 that bug changes nothing, and at
    # T = 1.3, top-p 0.8 it moves the joint too little to be seen at 3000; the lenient test planted below is caught
    # at T = 1 with p = 3e-308 at 1000 samples, so those two settings take 2000
    n = 3000 if cfg.top_k == 3 else 2000
    counts = speculative_samples(toy_pair, prompt, cfg, k=3, n=n)
    # the toy draft must disagree with the target often, or this test would not exercise the residual
    assert counts.pop("rejections") > 0.1 * n
    assert chi2_pvalue(drop_k(counts), exact, n) > PASS_P


def drop_k(counts: Counter) -> Counter:
    """The sample counts without the bookkeeping entries."""
    return Counter({c: n for c, n in counts.items() if not (isinstance(c, tuple) and c and c[0] == "k")})


# a prompt with repeats, so that prompt lookup finds something to copy ("a b" occurred before: it proposes "c a b")
LOOKUP_PROMPT = [0, 1, 2, 0, 1]


@pytest.mark.parametrize("strategy", ["adaptive", "lookup"])
@pytest.mark.parametrize("cfg", TOY_SETTINGS, ids=lambda c: f"T{c.temperature}-k{c.top_k}-p{c.top_p}")
def test_toy_joint_distribution_matches_target_for_every_strategy(toy_pair, cfg, strategy):
    """The joint of the first two tokens follows the target for adaptive K and for copied (one-hot q) drafts."""
    prompt = LOOKUP_PROMPT if strategy == "lookup" else [0, 1]
    exact = exact_joint(toy_pair, prompt, cfg)
    # 2000: what goes wrong in a proposer is a draft chosen or withdrawn on the wrong information; the planted peeking
    # and withdrawing rules below are caught at p = 2e-15 and 3e-32 with 2000 and 1000 samples (2026-11-25)
    n = 2000
    # adaptive: the toy draft's confidences (0.2-0.65) make the default threshold stop it at the same K in every run
    # at T = 1 and 1.3; these thresholds sit among its products of confidences, so that the rule's choice depends on
    # the drawn tokens, which is what this test must exercise. Uncalibrated (alpha_hat = conf): the run's calibration
    # starts from a flat prior, so its first round would not read the confidences at all.
    threshold = {1.0: 0.2, 0.7: 0.3, 1.3: 0.2}[cfg.temperature]
    adaptive = (lambda: AdaptiveDrafter(CachedLM(toy_pair.draft, toy_pair.vocab_size), cfg, threshold=threshold, calibrate=False)
                ) if strategy == "adaptive" else None
    counts = speculative_samples(toy_pair, prompt, cfg, k=3, n=n, strategy=strategy, make_drafter=adaptive)
    assert counts.pop("rejections") > 0.1 * n
    if strategy == "adaptive":  # the stop rule really varied K in the first round
        assert len([c for c in counts if isinstance(c, tuple) and c[0] == "k"]) >= 2, counts
    else:  # lookup copied in the first round
        assert counts[("k", 3)] == n
    assert chi2_pvalue(drop_k(counts), exact, n) > PASS_P


class PeekingDrafter(ModelDrafter):
    """PLANTED BUG: a stop rule that reads the target. It stops before the first draft the target would probably
    reject (p(x_t) < q(x_t)), i.e. it withdraws x_t after looking at p_t."""

    def __init__(self, pair, sampling):
        super().__init__(CachedLM(pair.draft, pair.vocab_size), sampling)
        self.pair = pair

    def propose(self, seq, k_max, gen):
        prop = super().propose(seq, k_max, gen)
        ctx, keep = seq.tolist(), 0
        for t in range(prop.k):
            p_t = warp(self.pair.target(torch.tensor([ctx])).logits[0, -1, : self.pair.vocab_size], self.sampling)
            x = int(prop.tokens[t])
            if p_t[x] < prop.q[t, x]:
                break
            keep, ctx = keep + 1, ctx + [x]
        return Proposal(prop.tokens[:keep], prop.q[:keep], "draft")


class WithdrawingDrafter(ModelDrafter):
    """PLANTED BUG: a rule that reads only the draft, but decides about x_t AFTER drawing it: it withdraws a draw
    the draft itself found unlikely (q(x_t) < 0.3). Conditioning on x_t's value skews the position."""

    def propose(self, seq, k_max, gen):
        prop = super().propose(seq, k_max, gen)
        q_x = prop.q.gather(1, prop.tokens.view(-1, 1)).flatten()
        keep = int((q_x >= 0.3).long().cumprod(0).sum())
        return Proposal(prop.tokens[:keep], prop.q[:keep], "draft")


def test_adaptive_stop_rule_keeps_exactness(toy_pair):
    """WHY a stop rule that reads only the draft keeps the output exact, and that this test can tell.

    At position t the emitted token is x_t if r_t < min(1, p_t(x_t)/q_t(x_t)), else a draw from
    norm(max(0, p_t - q_t)); with x_t ~ q_t and r_t ~ U[0, 1) independent of everything else, that token is
    distributed as p_t (the accept/resample identity). A round that stops after t - 1 drafts instead emits a bonus
    token drawn from p_t itself. So each position emits p_t either way, PROVIDED the choice between the two
    mechanisms is made before x_t is drawn, from information independent of r_t: x_1..x_{t-1}, the draft's own
    q's and earlier rounds' outcomes. The adaptive drafter decides whether to draft x_t from the draft's
    confidences at positions 1..t-1 (and a calibration learnt from finished rounds), never from p or r, so
    conditioning on its decision leaves each position's identity intact, and its runs pass the chi-square test.

    A rule that decides after seeing x_t together with p_t (withdraw the draft the target would reject) breaks the
    identity: positions where p(x) < q(x) never reach the residual, so those tokens are over-produced. So does a
    draft-only rule that withdraws x_t after drawing it. Both must fail at p < 1e-6.
    """
    cfg = SamplingConfig(temperature=1.0)
    prompt = [0, 1]
    exact = exact_joint(toy_pair, prompt, cfg)
    n = 2000
    # the real rule, at a threshold where its choice depends on the drawn tokens (see the test above): exact
    counts = speculative_samples(toy_pair, prompt, cfg, k=3, n=n, seed0=10_000, make_drafter=lambda: AdaptiveDrafter(
        CachedLM(toy_pair.draft, toy_pair.vocab_size), cfg, threshold=0.2, calibrate=False))
    counts.pop("rejections")
    assert 0.1 * n < counts[("k", 3)] < 0.9 * n  # it stopped early (at K = 2) in some runs, not in all
    assert chi2_pvalue(drop_k(counts), exact, n) > PASS_P
    # the planted rules: not exact, and caught, each with the samples it needs (over these seeds, 2026-11-25). The
    # peeking rule is the subtle one and sets n for the real rule too: p = 2e-16 at n = 3000, 2e-15 at 2000, 2e-11
    # at 1500, 1e-6 at 1000. The withdrawing rule gets p = 3e-32 at 1000; a bug caught at 1000 is caught at 2000.
    for planted, n_bug in ((lambda: PeekingDrafter(toy_pair, cfg), n),
                           (lambda: WithdrawingDrafter(CachedLM(toy_pair.draft, toy_pair.vocab_size), cfg), 1000)):
        counts = speculative_samples(toy_pair, prompt, cfg, k=3, n=n_bug, make_drafter=planted)
        counts.pop("rejections")
        assert chi2_pvalue(drop_k(counts), exact, n_bug) < BUG_P


def test_toy_planted_bug_unwarped_q_is_caught(toy_pair, monkeypatch):
    """The bug of transformers #32867: the draft samples from warped q but the test uses the unwarped q."""
    cfg = SamplingConfig(temperature=0.4)
    real_verify = speculative.verify

    def buggy_verify(draft_tokens, q_draft, p_target, gen, **kw):
        unwarped = q_draft ** cfg.temperature  # undo the temperature: softmax(l/T)^T is proportional to softmax(l)
        return real_verify(draft_tokens, unwarped / unwarped.sum(-1, keepdim=True), p_target, gen, **kw)

    monkeypatch.setattr(speculative, "verify", buggy_verify)
    prompt = [0, 1]
    # at T = 0.4 the bug is gross: p = 1e-68 at n = 1000 over these seeds (2e-222 at 3000, measured 2026-11-25); the
    # noncentral chi-square puts its chance of passing 1e-6 at this n below 1e-30
    n = 1000
    counts = speculative_samples(toy_pair, prompt, cfg, k=3, n=n)
    counts.pop("rejections")
    assert chi2_pvalue(drop_k(counts), exact_joint(toy_pair, prompt, cfg), n) < BUG_P


def test_toy_lenience_is_lossy_and_detected(toy_pair):
    cfg = SamplingConfig(temperature=1.0)
    prompt = [0, 1]
    n = 1000  # b = 0.3 gives p = 3e-308 at n = 1000 over these seeds (below double precision at 3000; 2026-11-25)
    counts = speculative_samples(toy_pair, prompt, cfg, k=3, n=n, lenience=0.3)
    counts.pop("rejections")
    assert chi2_pvalue(drop_k(counts), exact_joint(toy_pair, prompt, cfg), n) < BUG_P


# ---------------------------------------------------------------------------------------------- embedded pair


@pytest.mark.parametrize("cfg", [SamplingConfig(temperature=1.0, top_k=12), SamplingConfig(temperature=0.8, top_p=0.7)],
                         ids=["T1-k12", "T0.8-p0.7"])
def test_embedded_pair_first_token_matches_target(pair, cfg):
    prompt_ids = pair.encode("ROMEO:\nI")
    # the target's logits as every run computes them (CachedLM: in a bf16 model the 8 best recomputed in float32;
    # transformers' own forward rounds all of them to bf16, which moves top-p's cut by a token at times)
    p1 = warp(CachedLM(pair.target, pair.vocab_size).feed(torch.tensor(prompt_ids))[-1], cfg)
    exact = {(i,): float(v) for i, v in enumerate(p1.tolist()) if v > 0}
    n = 1500
    counts = speculative_samples(pair, prompt_ids, cfg, k=2, n=n, n_tokens=1)
    assert counts.pop("rejections") > 0.05 * n
    assert chi2_pvalue(drop_k(counts), exact, n) > PASS_P
