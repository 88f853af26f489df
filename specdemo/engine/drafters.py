"""Drafters: who proposes the tokens that the target verifies in a round, as a chain.

Owns the drafter protocol (`Drafter`, what it proposes: `Proposal`, what it hears back: `RoundOutcome`) and the
chain drafters. A drafter proposes up to k_max tokens together with the rows of q it drew them from; the
speculative loop (speculative.py) verifies them, rolls the caches back and emits the events, with no branch per
strategy. It does not own the tree drafter and its sizes (tree_drafter.py), which drafter a run's strategy names
(strategy.make_drafter) or the head itself (models/eagle.py). Letters as in sampling.py: p is the TARGET, q is the
DRAFT.

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
             k_max tokens that followed it. No draft model, and no device sync: it searches an index of a copy of
             the sequence kept on the host (the prompt copied once; the kept tokens handed over in `observe`).
             q is one-hot on each proposed token, so the ratio test accepts x with probability p(x) and the
             residual norm(max(0, p - q)) is p without x: exact at every temperature. With nothing to match it
             proposes nothing, and the round is one plain target step (source "fallback").
  eagle    - a feature-level draft head (EAGLE, Li et al. 2024, arXiv:2401.15077; specdemo/models/eagle.py): one
             decoder layer that reads the target's own last hidden states for the fixed prefix and the embedding of
             the next token, predicts the next hidden state, and turns it into q through the target's LM head rows
             for a draft vocabulary (FR-Spec, arXiv:2502.14856). q is zero outside that vocabulary; the residual
             norm(max(0, p - q)) covers those tokens, so the output stays exact. It drafts up to K tokens a
             round: from the second draft on, it stops where its top probability (`confidence`, as adaptive's) is
             below the head's `stop_below`, read before that token is drawn (a dynamic draft length, as in
             SpecDec++, arXiv:2405.19715; EAGLE-2 shows a head's confidence tracks its acceptance), except where
             its chain is captured, where the stop would save nothing (EagleDrafter). The first
             round has no target features yet: it is one plain target step that reads the prompt
             (source "prefill").
  tree     - the EAGLE head drafts a tree instead of a chain: tree_drafter.TreeDrafter, an EagleDrafter.

The loop tells every drafter the outcome of each round (`observe`, a `RoundOutcome`): the tokens kept and, for a
drafter that asks for them (`wants_features`), the target's features at the positions it kept (its last hidden
states, after the outputs of the drafter's `feature_layers` if it names any). Each drafter rolls its own caches
back there; the loop has no branch per strategy.

A drafter's stop rule may depend on anything the draft model computes and on earlier rounds (whose tokens are
fixed), but never on the target's p at the positions being drafted nor on the round's uniforms r.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from specdemo.config import SamplingConfig
from specdemo.models import CachedLM
from specdemo.models.eagle import HeadCache

from .chain_graph import chain_graphs
from .sampling import sample, warp
from .tree import DraftTree

ADAPTIVE_MAX_K = 12  # the adaptive drafter's cap (it chooses K per round), lowered to the server's K limit
ADAPTIVE_THRESHOLD = 0.3  # stop once the estimated chance that all drafts so far survive falls below this


@dataclass
class Proposal:
    """What a drafter proposes for one round. `tokens` [k] and `q` [k, V] stay on the device."""

    tokens: torch.Tensor  # [k] long
    q: torch.Tensor  # [k, V] float32: the distributions the tokens were drawn from (one-hot for copied tokens)
    source: str  # "draft" (the draft model), "eagle" (the feature head), "lookup" (copied from the sequence),
    #              "tree" (the head's draft tree), "fallback" (lookup found nothing), "prefill" (eagle's first round:
    #              no target features yet)
    copied_from: int | None = None  # lookup: index in prompt + output of the first copied token
    ngram: int | None = None  # lookup: the size of the n-gram that matched
    unsure: tuple[float, float] | None = None  # eagle: its confidence stop ended the round early, at (the head's
    #                                            top probability for the next position, its stop_below)
    tree: DraftTree | None = None  # a draft tree (tree.py): the tokens are its nodes, verified by walk.py; None: a
    #                                chain, verified by the modified rejection test with q

    @property
    def k(self) -> int:
        return int(self.tokens.shape[0])


def one_hot(tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[k] token ids -> [k, V] float32 rows, each all its mass on its token (the q of a greedy or copied draft)."""
    return torch.zeros(tokens.numel(), vocab_size, device=tokens.device).scatter_(1, tokens.view(-1, 1), 1.0)


def confidence(logits: torch.Tensor, q: torch.Tensor | None) -> float:
    """A drafter's top probability at one position: of its warped q at T > 0, of its unwarped softmax at T = 0
    (q is None there: the warped q is one-hot). It reads the drafter's own output only, never p or r.

    The one host read a drafter makes while drafting: a stop rule decides on the host whether to draft the next
    token, so it reads one number per position it decides at (adaptive: after every draft; eagle with a
    stop_below: before every draft but the first). On a CPU that costs nothing; on a GPU each is a sync that waits
    for the draft step just queued. Where the head's chain is captured (a GPU's graphs, or their stand-in) the
    eagle chain has no stop: it drafts all K in one replay and the verify's graph takes K + 1 rows whatever the
    stop would say, so stopping would save nothing there and lose the drafts after it (EagleDrafter).
    Elsewhere the read is kept, since drafting all K would spend the draft forwards the stop exists to save."""
    if q is None:
        return float(logits.float().softmax(-1).max())
    return float(q.max())


@dataclass
class RoundOutcome:
    """What the loop tells a drafter after each round, once the round's tokens are fixed."""

    n_accepted: int  # drafts the target kept
    k: int  # drafts proposed
    seq_len: int  # tokens fixed now (prompt + output); the last one is the round's new token, unseen by the target
    features: torch.Tensor | None = None  # [m, (L+1) H]: the target's features at positions start..seq_len-2
    start: int = 0  # the position of features[0]
    kept: tuple[int, ...] = ()  # the round's new tokens (already on the host): seq[seq_len - len(kept):]


class Drafter:
    """The interface. `propose` may read the fixed sequence `seq` [N] and draw from `gen`; `observe` hears how the
    round ended and rolls the drafter's own caches back. `wants_features`: the loop passes the target's hidden
    states in `observe` (they cost nothing extra, but are only kept when asked for), with the outputs of its decoder
    layers `feature_layers` (0-based) before the last hidden state."""

    name = "base"
    wants_features = False
    feature_layers: tuple[int, ...] = ()

    def propose(self, seq: torch.Tensor, k_max: int, gen: torch.Generator) -> Proposal:
        raise NotImplementedError

    def observe(self, outcome: RoundOutcome) -> None:
        """Told after every round what the target kept (the tokens are fixed by then)."""


class ModelDrafter(Drafter):
    """The draft model drafts autoregressively from its warped q; `should_stop` may end the round early."""

    name = "fixed"

    def __init__(self, draft_lm: CachedLM, sampling: SamplingConfig):
        self.lm = draft_lm
        self.lm.reset()
        self.sampling = sampling

    def observe(self, outcome: RoundOutcome) -> None:
        # roll back: keep the cached tokens that are still part of the sequence (the newest is fed next round)
        self.lm.crop(min(self.lm.length, outcome.seq_len - 1))

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

    def alpha_hat(self, conf: float) -> tuple[float, int]:
        b = min(int(conf * self.BINS), self.BINS - 1)
        return (self.accepted[b] / self.judged[b] if self.calibrate else conf), b

    def should_stop(self, logits, q, t) -> bool:
        alpha, b = self.alpha_hat(confidence(logits, q))
        self.bins.append(b)
        self.survive *= alpha
        return self.survive < self.threshold

    def observe(self, outcome: RoundOutcome) -> None:
        super().observe(outcome)
        # the judged positions of the finished round: the first n_accepted were kept, the next one (if any) rejected
        for t, b in enumerate(self.bins[: outcome.n_accepted + 1]):
            self.judged[b] += 1
            self.accepted[b] += t < outcome.n_accepted


class LookupDrafter(Drafter):
    """Prompt lookup: copy what followed the latest earlier occurrence of the sequence's last n tokens.

    It searches `host`, a copy of prompt + output on the host: the prompt is copied once, in the run's first round,
    and each round's kept tokens arrive with `observe`. `latest` maps every n-gram (n <= ngram) that has a token
    after it to where that token stands, for its latest occurrence, and grows as tokens arrive; a search is then
    `ngram` dictionary lookups, with no device sync and no scan of the sequence."""

    name = "lookup"

    def __init__(self, vocab_size: int, ngram: int):
        self.vocab_size = vocab_size
        self.ngram = ngram
        self.host: list[int] | None = None  # prompt + output, on the host
        self.latest: dict[tuple[int, ...], int] = {}  # n-gram -> index of the token after its latest occurrence
        self.indexed = 0  # the n-grams ending before this index are in `latest`

    def find(self, tokens: list[int]) -> tuple[int, int] | None:
        """(start of the copy, n) for the longest n <= ngram whose last n-gram of `tokens` occurs earlier with a
        continuation, at its latest occurrence (the most local context). `tokens` extends the previous call's."""
        # 1. index the n-grams that now have a token after them: those ending at index end <= len(tokens) - 2
        for end in range(self.indexed, len(tokens) - 1):
            for n in range(1, min(self.ngram, end + 1) + 1):
                self.latest[tuple(tokens[end + 1 - n : end + 1])] = end + 1  # a later occurrence replaces it
        self.indexed = max(self.indexed, len(tokens) - 1)
        # 2. the last n tokens, longest n first
        for n in range(min(self.ngram, len(tokens) - 1), 0, -1):
            start = self.latest.get(tuple(tokens[len(tokens) - n :]))
            if start is not None:
                return start, n
        return None

    def sync(self, seq: torch.Tensor) -> None:
        """Keep `host` equal to seq: the prompt's one copy to the host in the run's first round; `observe` adds
        each round's kept tokens after that."""
        if self.host is None:
            self.host = seq.tolist()
        assert len(self.host) == seq.numel(), ("lookup's host copy missed tokens", len(self.host), seq.numel())

    def propose(self, seq: torch.Tensor, k_max: int, gen: torch.Generator) -> Proposal:
        self.sync(seq)
        empty = torch.empty(0, self.vocab_size, device=seq.device)
        found = self.find(self.host) if k_max > 0 else None
        if found is None:
            return Proposal(seq.new_empty(0), empty, "fallback")
        start, n = found
        tokens = seq[start : start + k_max]
        q = one_hot(tokens, self.vocab_size)
        return Proposal(tokens, q, "lookup", copied_from=start, ngram=n)

    def observe(self, outcome: RoundOutcome) -> None:
        if self.host is not None:
            self.host.extend(outcome.kept)


class DraftedChain(NamedTuple):
    """What EagleDrafter.draft_chain drafted."""

    tokens: torch.Tensor  # [k] target ids
    picks: torch.Tensor  # [k] the same tokens as draft-vocabulary ids
    q: torch.Tensor | None  # [k, V_draft] the warped rows they were drawn from (None: greedy, the argmax)
    unsure: tuple[float, float] | None  # the confidence stop's (conf, stop_below), if it ended the chain early
    head_p: torch.Tensor | None  # [k] the head's unwarped probability of each token, if asked for


class EagleDrafter(Drafter):
    """Draft with the EAGLE head from the target's features (models/eagle.py says what the head computes).

    The head keeps its own KV cache, one position j per pair (target feature f_j, token x_{j+1}). Positions of the
    fixed sequence carry the target's TRUE features, handed over by `observe`; a round's drafts continue from
    the head's predicted features and are cropped away afterwards, exactly like a draft model's cache."""

    name = "eagle"
    wants_features = True

    def __init__(self, head, target, sampling: SamplingConfig, vocab_size: int, capacity: int, slot=None):
        self.head, self.sampling, self.vocab_size = head, sampling, vocab_size
        self.embed = head.embedder(target)  # the target's embedding, or the head's own (a published EAGLE-3 head's)
        self.published = getattr(head, "published_name", None)  # a published head's name, for the captions
        self.dtype, self.device = head.lm_rows.dtype, head.lm_rows.device
        # slot: the pair's shared head cache with its captured chain step (models/head_graphs.py), where it has one
        self.slot = slot if slot is not None and slot.max_len >= capacity else None
        self.cache = self.slot.view() if self.slot else HeadCache(head.cfg, capacity, self.device, self.dtype)
        self.feature_layers = head.cfg.feature_layers  # the target layers it reads besides the last
        self.pending: list[torch.Tensor] = []  # true features not yet read by the head, from position cache.length
        self.true_len = 0  # head positions that carry true features (the rest of a round is cropped off)
        # the head's confidence stop (0: it always drafts k_max tokens). 0 where the drafter has the pair's head
        # slot, whose chain is one replay (falling back to replayed steps): there all K drafts cost one replay and
        # the verify's graph takes K + 1 rows whatever the stop says, so a stop would only throw verified drafts
        # away (docs/decisions.md, "the captured chain judges every draft")
        self.stop_below = 0.0 if self.slot else head.cfg.stop_below

    def step(self, feat: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Head positions for (feat [n, H], tokens [n]) -> the last one's predicted feature [1, H]."""
        return self.head.step(feat.to(self.dtype), self.embed(tokens).to(self.dtype), self.cache)[-1:]

    def advance(self, g: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One chain step from (g [1, H], x [1]): the next predicted feature and its float32 logits [1, V_draft], by
        one replay of the captured step where the drafter has a slot, eagerly otherwise."""
        if self.slot:
            return self.slot.step(self.cache, g, x)
        g = self.step(g, x)
        return g, self.head.logits(g).float()

    def read(self, feats: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """As `step`, at accepted positions: from the target's features (with its feature layers' outputs); by one
        replay where the drafter has a slot and the round kept at most its K + 1 (models/head_graphs.py)."""
        if self.slot:
            g = self.slot.read(self.cache, feats if feats.dtype == self.dtype else feats.to(self.dtype), tokens)
            if g is not None:
                return g
        return self.step(self.head.true_feature(feats.to(self.dtype)), tokens)

    @torch.inference_mode()  # the embedding is the target's, whose weights may require grad: record no graph
    def propose(self, seq: torch.Tensor, k_max: int, gen: torch.Generator) -> Proposal:
        empty = torch.empty(0, self.vocab_size, device=seq.device)
        if not self.pending and self.cache.length == 0:  # round one: the target has not read the prompt yet
            return Proposal(seq.new_empty(0), empty, "prefill")
        if k_max <= 0:
            return Proposal(seq.new_empty(0), empty, "eagle")
        if self.slot:  # the shared head cache holds this run's positions from here to the round's end
            self.slot.take(self.cache)
        g = self.read_pending(seq)
        if self.slot:  # the whole chain as one replay (engine/chain_graph.py)
            drafted = chain_graphs(self.slot, self.sampling, self.vocab_size).draft(self.cache, g, k_max, gen)
            if drafted is not None:
                return Proposal(drafted[0], drafted[1], "eagle")
        chain = self.draft_chain(g, k_max, gen, self.sampling.greedy)
        if chain.q is None:
            q_draft = one_hot(chain.tokens, self.vocab_size)
        else:  # q over the whole vocabulary: zero outside the draft vocabulary
            q_draft = torch.zeros(chain.q.shape[0], self.vocab_size, device=seq.device).index_copy_(
                1, self.head.d2t, chain.q)
        return Proposal(chain.tokens, q_draft, "eagle", unsure=chain.unsure)

    def read_pending(self, seq: torch.Tensor) -> torch.Tensor:
        """Read the true features of the newly fixed positions j with their next tokens x_{j+1}, in one step; return
        the predicted feature that the first draft comes from."""
        feats = self.pending[0] if len(self.pending) == 1 else torch.cat(self.pending)
        start = self.cache.length
        assert start + feats.shape[0] == seq.numel() - 1, (start, feats.shape, seq.numel())
        g = self.read(feats, seq[start + 1 :])
        self.pending, self.true_len = [], self.cache.length
        return g

    def draft_chain(self, g: torch.Tensor, k_max: int, gen: torch.Generator, greedy: bool, head_p: bool = False):
        """Draft up to k_max tokens from the predicted feature g: feature -> q over the draft vocabulary -> token
        (the argmax if greedy, else a draw from the warped q); then go on from the prediction."""
        tokens, rows, probs, picks, unsure = [], [], [], [], None
        logits = self.head.logits(g).float()  # [1, V_draft]
        for t in range(k_max):
            q = None if greedy else warp(logits, self.sampling)
            if t and self.stop_below and (conf := confidence(logits, q)) < self.stop_below:
                unsure = (conf, self.stop_below)
                break  # unsure of x_{t+1}: leave that position to the target (its bonus token)
            pick = logits.argmax(-1) if q is None else sample(q, gen)
            if q is not None:
                rows.append(q)
            if head_p:
                probs.append(logits.softmax(-1).gather(1, pick.view(1, 1)).view(1))
            x = self.head.d2t[pick]  # draft id -> target id
            tokens.append(x)
            picks.append(pick.view(1))
            if t + 1 == k_max:
                break
            g, logits = self.advance(g, x)
        return DraftedChain(torch.cat(tokens), torch.cat(picks), None if greedy else torch.cat(rows), unsure,
                            torch.cat(probs) if head_p else None)

    def observe(self, outcome: RoundOutcome) -> None:
        self.cache.crop(self.true_len)  # drop the drafted positions: they were read from predicted features
        if outcome.features is not None and outcome.features.shape[0]:
            assert outcome.start == self.true_len + sum(f.shape[0] for f in self.pending), outcome.start
            self.pending.append(outcome.features)
