"""The EAGLE head's chain of k drafts as one replay (issue 45, item 2: the drafting captured).

Where the head's step is captured (models/head_graphs.py, HeadSlot), EagleDrafter.draft_chain would replay the step
k - 1 times with its picks, warps and copies launched from the host between them. Here the whole chain is one
graph per (k, cache bucket) and sampling setting: from the predicted feature the read left, k times the head's
logits, the warped q (T > 0), the pick (the argmax, or a draw from q with a uniform drawn before the replay), the
draft-to-target id, the next step over the shared head cache; then q over the whole vocabulary (zero outside the
draft vocabulary), all on the device. It has no confidence stop: the verify's graph takes all k + 1 rows anyway
(drafters.EagleDrafter).

Same arithmetic as the step-by-step chain, so at T = 0 the same drafts. At T > 0 the draws come from one block of
k uniforms drawn before the replay instead of one per step: the chain is as exact (each pick is a draw from its q),
but a seed gives other drafts than the step-by-step chain's.
"""

from __future__ import annotations

import contextlib
import logging
from collections import OrderedDict

import torch

from specdemo.config import SamplingConfig
from specdemo.models.head_graphs import HeadSlot, step_over
from specdemo.models.static_parts import CAPTURED, record

from .sampling import sample, uniforms, warp

log = logging.getLogger(__name__)
GRAPHS_KEPT = 24  # chain graphs a head slot keeps, over every setting, k and bucket (the least recently used go)


class ChainGraphs:
    """One sampling setting's chain graphs over a HeadSlot; `draft` replays the one for (k, bucket)."""

    def __init__(self, slot: HeadSlot, sampling: SamplingConfig, vocab: int):
        self.slot, self.sampling, self.vocab = slot, sampling, vocab
        head = slot.head
        self.g = torch.zeros(1, head.cfg.hidden_size, dtype=slot.dtype, device=slot.device)
        self.pos = torch.zeros((), dtype=torch.long, device=slot.device)
        self.failed = False

    def _forward(self, k: int, length: int, u: torch.Tensor | None):
        slot, head, greedy = self.slot, self.slot.head, self.sampling.greedy
        g, tokens, rows = self.g, [], []
        logits = head.logits(g).float()  # [1, V_draft]
        for t in range(k):
            q = None if greedy else warp(logits, self.sampling)
            pick = logits.argmax(-1) if q is None else sample(q, None, u=u[t : t + 1])
            if q is not None:
                rows.append(q)
            tokens.append(head.d2t[pick])
            if t + 1 < k:
                g = step_over(head, g, slot.embed(tokens[-1]).to(slot.dtype), slot.cache, self.pos + t, length)
                logits = head.logits(g).float()
        drafted = torch.cat(tokens)
        if greedy:
            q_full = torch.zeros(k, self.vocab, device=g.device).scatter_(1, drafted.view(-1, 1), 1.0)
        else:
            q_full = torch.zeros(k, self.vocab, device=g.device).index_copy_(1, head.d2t, torch.cat(rows))
        return drafted, q_full

    def _capture(self, k: int, length: int) -> tuple:
        slot, dev = self.slot, self.slot.device
        u = None if self.sampling.greedy else uniforms(k, torch.Generator(device=dev).manual_seed(0), dev)
        slot.take(slot.scratch)  # the capture writes through a view that holds no run's positions
        self.pos.zero_()
        graph, out = record(lambda: self._forward(k, length, u), dev, slot.pool, slot.stand_in or dev.type != "cuda")
        return graph, u, out

    def draft(self, view, g: torch.Tensor, k: int, gen: torch.Generator):
        """k drafts from the predicted feature g [1, H] at the view's next position: (tokens [k], q [k, V]), the
        graph's own buffers until its next replay; None where the head's cache cannot hold them (the caller drafts
        step by step)."""
        slot = self.slot
        if view.length + k - 1 > slot.max_len:
            return None
        b = next(b for b in slot.buckets if b >= view.length + k - 1)
        graphs = slot.chains
        key = (id(self), k, b)
        if key not in graphs:
            if self.failed:
                return None
            try:
                with torch.profiler.record_function(CAPTURED) if slot.stand_in else contextlib.nullcontext():
                    graphs[key] = self._capture(k, b)
            except Exception as err:  # noqa: BLE001 - any capture failure leaves the chain step by step
                self.failed = True
                log.warning("the eagle chain could not be captured (%s: %s); drafting step by step",
                            type(err).__name__, err)
                return None
            while len(graphs) > GRAPHS_KEPT:
                graphs.popitem(last=False)
        graphs.move_to_end(key)
        graph, u, (tokens, q) = graphs[key]
        slot.take(view)
        self.g.copy_(g)
        self.pos.fill_(view.length)
        if u is not None:  # drawn into the graph's input: as `uniforms(k, gen, device)` draws them
            torch.rand(u.shape, generator=gen, out=u)
        with torch.profiler.record_function(CAPTURED):
            graph.replay()
        view.length += k - 1  # the steps after x_1 wrote their positions
        return tokens, q


def chain_graphs(slot: HeadSlot, sampling: SamplingConfig, vocab: int) -> ChainGraphs:
    """The slot's ChainGraphs for this setting (made on first use; their graphs are captured per (k, bucket))."""
    settings = slot.__dict__.setdefault("chain_settings", OrderedDict())
    slot.__dict__.setdefault("chains", OrderedDict())
    key = (sampling.temperature, sampling.top_k, sampling.top_p)
    if key not in settings:
        settings[key] = ChainGraphs(slot, sampling, vocab)
        while len(settings) > 8:
            old = settings.popitem(last=False)[1]
            for gk in [gk for gk in slot.chains if gk[0] == id(old)]:
                del slot.chains[gk]
    settings.move_to_end(key)
    return settings[key]
