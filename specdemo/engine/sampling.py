"""Pure tensor functions: logits -> warped probabilities -> samples, and the speculative accept/resample step.

Owns the mathematics of one round, with no models and no state: `warp` (temperature, top-k, top-p, and the greedy
one-hot branch at T = 0), `sample`, `residual` and `verify`. Randomness always comes from a `torch.Generator`
passed in, so a run is reproducible from its seed.

Letters follow Leviathan et al. 2023 and transformers: p is the TARGET, q is the DRAFT. (The DeepMind paper,
Chen et al. 2023, uses the opposite letters.) Variables are named `p_target` / `q_draft` to make that explicit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdemo.config import SamplingConfig


def warp(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Rows of logits [..., V] -> rows of probabilities [..., V] in float32, warped by T, top-k and top-p.

    T = 0 is its own branch: a one-hot on the argmax, never a division by a tiny temperature. Otherwise this is
    transformers' TemperatureLogitsWarper, TopKLogitsWarper and TopPLogitsWarper in generate's order, softmaxed
    (tests/test_exactness.py compares them), with one difference: a tie on the edge of the top-p set. Tokens tied
    with the last one top-p keeps are all kept, as top-k keeps ties at its k-th token; transformers keeps those
    of them that its sort happens to place last, so its support there depends on the order of equal values.
    """
    logits = logits.float()
    if cfg.greedy:
        return torch.zeros_like(logits).scatter_(-1, first_max(logits, keepdim=True), 1.0)
    logits = logits / cfg.temperature
    vocab = logits.shape[-1]
    if 0 < cfg.top_k < vocab:
        kth = torch.topk(logits, cfg.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if cfg.top_p < 1.0:
        sorted_logits = torch.sort(logits, dim=-1, descending=True).values
        sorted_probs = sorted_logits.softmax(-1)
        # keep the tokens ranked above the point where the mass before them reaches top_p (the top token always
        # stays), and every token tied with the last of them: the kept set does not depend on the order of ties
        mass_before = torch.cat([torch.zeros_like(sorted_probs[..., :1]), sorted_probs.cumsum(-1)[..., :-1]], -1)
        n_keep = (mass_before < cfg.top_p).sum(-1, keepdim=True)  # >= 1; mass_before never decreases
        edge = sorted_logits.gather(-1, n_keep - 1)
        logits = logits.masked_fill(logits < edge, float("-inf"))
    return logits.softmax(-1)


def first_max(x: torch.Tensor, keepdim: bool = False) -> torch.Tensor:
    """The index of each row's largest value, the first one on a tie: argmax's answer. torch.max over a dimension
    returns the same index (ties included, tested) and costs a third as much on a CPU: 0.11 against 0.34 ms for
    [9, 49152] float32 here (2026-11-25), and a tree round takes it twice."""
    return x.max(-1, keepdim=keepdim).indices


def sample(probs: torch.Tensor, generator: torch.Generator | None, greedy: bool = False,
           u: torch.Tensor | None = None) -> torch.Tensor:
    """One token per row of probs [..., V] -> [...] (long). Greedy takes the argmax and draws nothing.

    By the inverse of each row's cumulative distribution: one uniform u per row, scaled to the row's mass, picks
    the first token whose cumulative mass exceeds u, so token i comes with probability p_i / sum(p) (the sums in
    float64, 1e-16 relative). A token of probability 0 adds no width and is never picked. If rounding puts u on
    the row's total, the token where the cumulative mass first reaches that total is taken: it has mass, since the
    sum rose there. On a CPU this costs about 0.3 ms for a row of 49,152 tokens, where torch.multinomial costs
    about 1.1 ms (2026-11-25), and the tree's walk draws at every node. u: the uniforms [rows, 1] (`uniforms`),
    drawn before a captured replay; None draws them here.
    """
    if greedy:
        return first_max(probs)
    flat = probs.reshape(-1, probs.shape[-1])
    cdf = torch.cumsum(flat, -1, dtype=wide_dtype(flat.device))
    total = cdf[:, -1:].contiguous()
    u = (uniforms(flat.shape[0], generator, flat.device) if u is None else u) * total
    picked = torch.searchsorted(cdf, u, right=True)
    last = torch.searchsorted(cdf, total)  # the first index where the sum reaches its total: a token with mass
    return torch.minimum(picked, last).reshape(probs.shape[:-1])


def wide_dtype(device) -> torch.dtype:
    """The width of the draws' sums and uniforms: float64, float32 on MPS, which has no float64."""
    return torch.float32 if torch.device(device).type == "mps" else torch.float64


def uniforms(rows: int, generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """The uniforms [rows, 1] that `sample` draws, in its width (wide_dtype)."""
    return torch.rand(rows, 1, generator=generator, device=device, dtype=wide_dtype(device))


def residual(p_target: torch.Tensor, q_draft: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)) row-wise. Where p == q the residual is all zero (that row can never reject under the
    exact test); it falls back to p so that the result is always a distribution."""
    res = (p_target - q_draft).clamp_(min=0.0)
    mass = res.sum(-1, keepdim=True)
    safe = mass > torch.finfo(res.dtype).tiny
    return torch.where(safe, res / mass.clamp(min=torch.finfo(res.dtype).tiny), p_target)


@dataclass
class Verdict:
    """What `verify` decided for one round. All tensors stay on the models' device until the caller syncs once."""

    n_accepted: torch.Tensor  # scalar long: the number of leading drafts kept, 0..K
    next_token: torch.Tensor  # scalar long: resampled from the residual at n_accepted, or the bonus from p[K]
    p_of_draft: torch.Tensor  # [K] p_target(x_t)
    q_of_draft: torch.Tensor  # [K] q_draft(x_t)
    accept_prob: torch.Tensor  # [K] min(1, p/q)
    r: torch.Tensor  # [K] the uniforms drawn
    overlap: torch.Tensor  # [K] sum_x min(p_t, q_t): the probability this position would be accepted (alpha_t)


def verify(
    draft_tokens: torch.Tensor,
    q_draft: torch.Tensor,
    p_target: torch.Tensor,
    generator: torch.Generator | None,
    greedy: bool = False,
    lenience: float = 1.0,
    drawn: tuple[torch.Tensor, torch.Tensor | None] | None = None,
) -> Verdict:
    """The modified rejection test of speculative sampling, for all K positions at once.

    draft_tokens [K], q_draft [K, V] (the draft's warped distributions it sampled from), p_target [K+1, V] (the
    target's warped distributions; the last row scores the bonus position). Accept x_t while r_t < min(1, p/q) with
    r_t ~ U[0, lenience); at the first rejection sample from norm(max(0, p_t - q_t)); if none is rejected, sample the
    bonus token from p_target[K]. drawn: (r [K], the residual draw's uniforms [K+1, 1] or None if greedy), as
    `draw_verify` draws them before a captured replay; None draws them here, in the same order.
    """
    k = draft_tokens.shape[0]
    assert q_draft.shape[0] == k and p_target.shape[0] == k + 1, (draft_tokens.shape, q_draft.shape, p_target.shape)
    assert q_draft.shape[-1] == p_target.shape[-1], "draft and target must share the vocabulary"
    idx = draft_tokens.view(k, 1)
    p_x = p_target[:k].gather(1, idx).squeeze(1)
    q_x = q_draft.gather(1, idx).squeeze(1)
    # q(x) > 0 because x was drawn from q; the clamp only protects against a caller passing foreign tokens
    accept_prob = (p_x / q_x.clamp(min=torch.finfo(q_x.dtype).tiny)).clamp(max=1.0)
    r_drawn, u_drawn = drawn if drawn is not None else (None, None)
    r = (torch.rand(k, generator=generator, device=p_target.device) if r_drawn is None else r_drawn) * lenience
    accepted = r < accept_prob
    # the number of leading acceptances: cumprod stays 1 until the first rejection
    n_accepted = accepted.long().cumprod(0).sum()
    # candidates for the next token at every position, chosen by n_accepted without a host sync:
    # rows 0..K-1 are residuals (used if that position rejects), row K is the target itself (the bonus)
    candidates = torch.cat([residual(p_target[:k], q_draft), p_target[k:]], dim=0)
    next_tokens = sample(candidates, generator, greedy=greedy, u=u_drawn)
    overlap = torch.minimum(p_target[:k], q_draft).sum(-1)
    # gather, not next_tokens[n_accepted]: indexing with a 0-dim device tensor would be a host sync on a GPU
    next_token = next_tokens.gather(0, n_accepted.view(1)).squeeze(0)
    return Verdict(n_accepted, next_token, p_x, q_x, accept_prob, r, overlap)



def draw_verify(k: int, generator: torch.Generator | None, device: torch.device, greedy: bool,
                out: tuple[torch.Tensor, torch.Tensor | None] | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The uniforms `verify` draws for k drafts, drawn as it draws them (r, then the next token's unless greedy), so
    that a verify given them decides exactly as one that draws its own from the same generator state. out: the
    buffers to draw into (a captured verdict's inputs), else new tensors."""
    if out is not None:
        torch.rand(out[0].shape, generator=generator, out=out[0])
        if not greedy:
            torch.rand(out[1].shape, generator=generator, out=out[1])
        return out
    r = torch.rand(k, generator=generator, device=device)
    return r, None if greedy else uniforms(k + 1, generator, device)
