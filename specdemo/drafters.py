"""Drafters: who proposes the tokens that the target verifies in a round.

Owns the drafting strategies and nothing else. A drafter proposes up to k_max tokens together with the rows of q
it drew them from; the speculative loop (speculative.py) verifies them, rolls the caches back and emits the events,
with no branch per strategy. Letters as in sampling.py: p is the TARGET, q is the DRAFT.

  fixed    - the draft model drafts exactly k_max tokens (the algorithm of Leviathan et al. 2023 / Chen et al. 2023).
  adaptive - the draft model drafts until its own confidence says the next draft would probably be rejected:
             after drafting x_t it stops when prod_{i<=t} alpha_hat(conf_i) < threshold, where conf_i is the draft's
             top probability at position i (its unwarped softmax at T = 0, where the warped q is one-hot) and
             alpha_hat is the acceptance rate of earlier rounds' drafts at that confidence. The product
             estimates the chance that every draft so far survives the target; once that is low, one more draft
             forward costs more than the tokens it is expected to add. The rule reads only the draft's own
             distributions, never p or the uniforms r, so the output stays exactly the target's (see
             tests/test_exactness.py::test_adaptive_stop_rule_keeps_exactness).
  lookup   - prompt lookup decoding (Saxena 2023; transformers' `prompt_lookup_num_tokens`): find the latest earlier
             occurrence of the last n tokens of prompt + output (n = ngram, then shorter), and propose the up to
             k_max tokens that followed it. No draft model. q is one-hot on each proposed token, so the ratio test
             accepts x with probability p(x) and the residual norm(max(0, p - q)) is p without x: exact at every
             temperature. With nothing to match it proposes nothing, and the round is one plain target step
             (source "fallback").

A drafter's stop rule may depend on anything the draft model computes and on earlier rounds (whose tokens are
fixed), but never on the target's p at the positions being drafted nor on the round's uniforms r.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import SamplingConfig, SpecConfig
from .models import CachedLM
from .sampling import sample, warp

ADAPTIVE_MAX_K = 12  # the adaptive drafter's cap: it chooses K per round, so the run's K does not apply
ADAPTIVE_THRESHOLD = 0.3  # stop once the estimated chance that all drafts so far survive falls below this


@dataclass
class Proposal:
    """What a drafter proposes for one round. `tokens` [k] and `q` [k, V] stay on the device."""

    tokens: torch.Tensor  # [k] long
    q: torch.Tensor  # [k, V] float32: the distributions the tokens were drawn from (one-hot for copied tokens)
    source: str  # "draft" (the draft model), "lookup" (copied from the sequence), "fallback" (nothing proposed)
    copied_from: int | None = None  # lookup: index in prompt + output of the first copied token
    ngram: int | None = None  # lookup: the size of the n-gram that matched

    @property
    def k(self) -> int:
        return int(self.tokens.shape[0])


def one_hot(tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[k] token ids -> [k, V] float32 rows, each all its mass on its token (the q of a greedy or copied draft)."""
    return torch.zeros(tokens.numel(), vocab_size, device=tokens.device).scatter_(1, tokens.view(-1, 1), 1.0)


class Drafter:
    """The interface. `propose` may read the fixed sequence `seq` [N] and draw from `gen`."""

    name = "base"
    uses_draft_model = False

    def propose(self, seq: torch.Tensor, k_max: int, gen: torch.Generator) -> Proposal:
        raise NotImplementedError

    def observe(self, n_accepted: int, k: int) -> None:
        """Told after every round how many of its k drafts the target kept (the tokens are fixed by then)."""


class ModelDrafter(Drafter):
    """The draft model drafts autoregressively from its warped q; `should_stop` may end the round early."""

    name = "fixed"
    uses_draft_model = True

    def __init__(self, draft_lm: CachedLM, sampling: SamplingConfig):
        self.lm = draft_lm
        self.sampling = sampling

    def should_stop(self, logits: torch.Tensor, q: torch.Tensor, t: int) -> bool:
        return False

    def propose(self, seq: torch.Tensor, k_max: int, gen: torch.Generator) -> Proposal:
        greedy = self.sampling.greedy
        # feed what the draft has not seen (1 token, or 2 after an all-accepted round), then draft token by token
        pending = seq[self.lm.length :]
        tokens, rows = [], []
        for t in range(k_max):
            logits = self.lm.feed(pending)  # [1, V]
            if greedy:  # argmax; the one-hot q rows are built once for the whole round below
                x = logits.argmax(-1)
            else:
                q = warp(logits, self.sampling)  # [1, V]
                x = sample(q, gen)  # [1]
                rows.append(q)
            tokens.append(x)
            # the rule sees x_1..x_t and the draft's own distributions; it decides whether to draft x_{t+1}
            if self.should_stop(logits, rows[-1] if rows else None, t) or t + 1 == k_max:
                break
            pending = x
        if not tokens:
            return Proposal(seq.new_empty(0), torch.empty(0, self.lm.vocab_size, device=seq.device), "draft")
        drafted = torch.cat(tokens)
        if greedy:
            q_draft = one_hot(drafted, self.lm.vocab_size)
        else:
            q_draft = torch.cat(rows)
        return Proposal(drafted, q_draft, "draft")


class AdaptiveDrafter(ModelDrafter):
    """Draft while the estimated chance that every draft so far survives stays >= threshold.

    After drafting x_t the drafter reads the draft's confidence conf_t (its top probability at position t: from
    the warped q at T > 0, from the unwarped softmax at T = 0, where q is one-hot) and turns it into an estimated
    acceptance probability with a calibration learnt during the run: the accepted / judged drafts of earlier
    rounds, per confidence bin (a prior of PRIOR_ALPHA over PRIOR_WEIGHT pseudo-drafts to start). It drafts
    x_{t+1} only while prod_{i<=t} alpha_hat(conf_i) >= threshold. Every input to that decision is the draft's own
    output or a finished round's outcome; none is the target's p or the uniforms r of the round being drafted.
    """

    name = "adaptive"
    BINS = 10
    PRIOR_ALPHA, PRIOR_WEIGHT = 0.7, 2.0

    def __init__(self, draft_lm: CachedLM, sampling: SamplingConfig, threshold: float = ADAPTIVE_THRESHOLD,
                 calibrate: bool = True):
        super().__init__(draft_lm, sampling)
        self.threshold = threshold
        self.calibrate = calibrate
        self.accepted = [self.PRIOR_ALPHA * self.PRIOR_WEIGHT] * self.BINS
        self.judged = [self.PRIOR_WEIGHT] * self.BINS
        self.bins: list[int] = []  # the confidence bin of each draft of the current round
        self.survive = 1.0

    def propose(self, seq: torch.Tensor, k_max: int, gen: torch.Generator) -> Proposal:
        self.survive, self.bins = 1.0, []
        return super().propose(seq, k_max, gen)

    def confidence(self, logits: torch.Tensor, q: torch.Tensor | None) -> float:
        if q is None:  # greedy: the unwarped softmax's top probability
            return float(logits.float().softmax(-1).max())
        return float(q.max())

    def alpha_hat(self, conf: float) -> tuple[float, int]:
        b = min(int(conf * self.BINS), self.BINS - 1)
        return (self.accepted[b] / self.judged[b] if self.calibrate else conf), b

    def should_stop(self, logits, q, t) -> bool:
        alpha, b = self.alpha_hat(self.confidence(logits, q))
        self.bins.append(b)
        self.survive *= alpha
        return self.survive < self.threshold

    def observe(self, n_accepted: int, k: int) -> None:
        # the judged positions of the finished round: the first n_accepted were kept, the next one (if any) rejected
        for t, b in enumerate(self.bins[: n_accepted + 1]):
            self.judged[b] += 1
            self.accepted[b] += t < n_accepted


class LookupDrafter(Drafter):
    """Prompt lookup: copy what followed the latest earlier occurrence of the sequence's last n tokens."""

    name = "lookup"

    def __init__(self, vocab_size: int, ngram: int):
        self.vocab_size = vocab_size
        self.ngram = ngram

    def find(self, seq: torch.Tensor) -> tuple[int, int] | None:
        """(start of the copy, n) for the longest n <= ngram whose last-n-gram occurs earlier with a continuation."""
        length = seq.numel()
        for n in range(min(self.ngram, length - 1), 0, -1):
            tail = seq[length - n :]
            # every window of n tokens that ends before the last token, so at least one token follows it
            windows = seq[: length - 1].unfold(0, n, 1)  # [length - n, n]
            hits = (windows == tail).all(-1).nonzero().flatten()
            if hits.numel():
                return int(hits[-1]) + n, n  # the latest occurrence: the most local context
        return None

    def propose(self, seq: torch.Tensor, k_max: int, gen: torch.Generator) -> Proposal:
        empty = torch.empty(0, self.vocab_size, device=seq.device)
        found = self.find(seq) if k_max > 0 else None
        if found is None:
            return Proposal(seq.new_empty(0), empty, "fallback")
        start, n = found
        tokens = seq[start : start + k_max]
        q = one_hot(tokens, self.vocab_size)
        return Proposal(tokens, q, "lookup", copied_from=start, ngram=n)


def make_drafter(spec: SpecConfig, sampling: SamplingConfig, vocab_size: int, draft_lm: CachedLM | None) -> Drafter:
    """The drafter for spec.strategy. draft_lm is needed by the strategies that use the draft model."""
    if spec.strategy == "lookup":
        return LookupDrafter(vocab_size, spec.ngram)
    assert draft_lm is not None, f"strategy {spec.strategy!r} needs the draft model"
    if spec.strategy == "adaptive":
        return AdaptiveDrafter(draft_lm, sampling)
    return ModelDrafter(draft_lm, sampling)


def max_drafts(spec: SpecConfig) -> int:
    """The most tokens a round may propose under spec: K, except for adaptive, which picks K itself."""
    return ADAPTIVE_MAX_K if spec.strategy == "adaptive" else spec.k
