"""Why two greedy decodings of the same target can differ: the first position where they part, and the logit gap there.

Owns `explain_divergence`: given a speculative run and the target-only run at T = 0, it finds the first differing
token and recomputes the target's logits of the two tokens there in both computations, the one-token steps of
target-only decoding and the (K+1)-token verify forwards of the speculative run, recomputed with eager forwards of
the same inputs (a tree round's path as a chain; on a static or captured pair not the run's own kernels, so the gap
there is close to the run's, not always the same bits). In bf16 the two sum in different orders; where the
target's two best logits lie within that rounding, either may come out on top.
`divergence_steps` does the same one forward at a time (a generator), so that a server can take its device lock
per forward, as its runs do (runs.explained). It does not decide what to show (render.py and the handlers do).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from specdemo.models import CachedLM, ModelPair

from .events import Round


@dataclass
class Divergence:
    position: int  # index in the output (0 = the first new token)
    spec_token: int
    base_token: int
    spec_text: str
    base_text: str
    gap_verify: float  # logit(spec_token) - logit(base_token) in the speculative run's verify forward
    gap_step: float  # the same difference in target-only decoding's one-token step
    logit: float  # the size of the two logits (the step's logit of base_token)

    @property
    def tolerance(self) -> float:
        """Four bf16 steps (8 bits of mantissa) at the logits' size: how far two summation orders can move them."""
        return 4 * 2.0 ** (math.floor(math.log2(max(abs(self.logit), 1e-3))) - 7)

    @property
    def near_tie(self) -> bool:
        """Both computations put the two tokens within bf16 rounding of each other (a tie either could break)."""
        return abs(self.gap_verify) <= self.tolerance and abs(self.gap_step) <= self.tolerance

    def to_dict(self) -> dict:
        return asdict(self) | {"near_tie": self.near_tie, "tolerance": self.tolerance}


def explain_divergence(pair: ModelPair, prompt_ids: list[int], rounds: list[Round], base_ids: list[int]
                       ) -> Divergence | None:
    """None when the speculative output equals the target-only output (or one is a prefix of the other, which
    only a stop can cause)."""
    steps = divergence_steps(pair, prompt_ids, rounds, base_ids)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def divergence_steps(pair: ModelPair, prompt_ids: list[int], rounds: list[Round], base_ids: list[int]):
    """explain_divergence as a generator: it yields None after every target forward (the prefill, each one-token
    step, each replayed verify) and returns the Divergence (or None)."""
    spec_ids = [t.token_id for r in rounds for t in r.output]
    i = next((j for j, (a, b) in enumerate(zip(spec_ids, base_ids)) if a != b), None)
    if i is None:
        return None
    a, b = spec_ids[i], base_ids[i]
    pos = len(prompt_ids) + i  # the index in prompt + output of the differing token

    def feed(lm: CachedLM, ids: list[int], keep: int = 1) -> torch.Tensor:
        with torch.inference_mode():
            return lm.feed(torch.tensor(ids, device=pair.device), keep_logits=keep)

    # 1. target-only: prefill the prompt, then one token a step, as baseline_generate does
    lm = CachedLM(pair.target, pair.vocab_size)
    seq = prompt_ids + base_ids
    logits = feed(lm, prompt_ids)[-1]
    for t in range(len(prompt_ids), pos):
        yield
        logits = feed(lm, [seq[t]])[-1]
    gap_step, size = float(logits[a] - logits[b]), float(logits[b])
    # 2. speculative: replay the verify forwards (same inputs, same cache crops) up to the round that parted
    lm = CachedLM(pair.target, pair.vocab_size)
    seq = prompt_ids + spec_ids
    gap_verify = float("nan")
    for rnd in rounds:
        yield
        drafts = [d.token_id for d in rnd.drafts]
        fed = seq[lm.length : rnd.prefix_len] + drafts
        logits = feed(lm, fed, len(drafts) + 1)
        kept_to = rnd.prefix_len + len(rnd.output)
        if kept_to > pos:  # the differing token was emitted in this round, from row pos - prefix_len
            row = logits[pos - rnd.prefix_len]
            gap_verify = float(row[a] - row[b])
            break
        lm.crop(kept_to - 1)
    return Divergence(i, a, b, pair.token_text(a), pair.token_text(b), gap_verify, gap_step, size)
