"""The bench's isolated costs, hot caches, the median of repeated calls: one cached forward (`forward_ms`: a target
step, a draft step, a verify), one step of an EAGLE head or one depth of its draft tree (`head_step_ms`), the target's
verify of a draft tree (`tree_verify_ms`), and one draft step of a strategy (`isolated_draft_ms`; `frontier_width`:
the nodes a tree's head call reads). The ids live on the model's device, and the device is synchronised before each
reading of the clock. Used by both benchmarks and by the evaluation scripts.
"""

from __future__ import annotations

import statistics
import time

import torch

from specdemo.config import SamplingConfig, SpecConfig
from specdemo.engine.speculative import device_sync
from specdemo.engine.sampled_tree import sampled_plan
from specdemo.engine.tree_drafter import tree_shape
from specdemo.models import CachedLM, ModelPair


@torch.inference_mode()
def forward_ms(model, vocab: int, new_tokens: int, context: int = 128, reps: int = 30,
               float32_logits: bool = True, lm=None) -> float:
    """Median time of one cached forward over `new_tokens` tokens after a `context`-token prefix (hot caches).

    The ids live on the model's device, and the device is synchronised before each reading of the clock: on a GPU
    a forward returns once its kernels are queued, so an unsynchronised clock would time the queueing. lm: the
    cache to time it through (a pair's `new_lm`, static or captured); a CachedLM of `model` by default. A static
    cache too small for the prefix shortens it to what fits."""
    if lm is None:
        lm = CachedLM(model, vocab)
    slot = getattr(lm, "slot", None)  # a StaticLM: its cache holds slot.max_len tokens
    if slot is not None:
        context = max(1, min(context, slot.max_len - new_tokens))
    lm.reset()
    if not float32_logits:  # the model's own forward: logits in its dtype (what specdemo did before)
        lm.head32 = None
    device = model.device
    gen = torch.Generator().manual_seed(0)  # drawn on the CPU, so every device times the same ids
    lm.feed(torch.randint(vocab, (context,), generator=gen).to(device))
    x = torch.randint(vocab, (new_tokens,), generator=gen).to(device)
    times = []
    for _ in range(reps):
        device_sync(device)
        t0 = time.perf_counter()
        lm.feed(x, keep_logits=new_tokens)
        device_sync(device)
        times.append(time.perf_counter() - t0)
        lm.crop(context)
    return statistics.median(times) * 1e3


@torch.inference_mode()
def head_step_ms(pair: ModelPair, context: int = 128, reps: int = 30, width: int = 0) -> float:
    """Median time of one EAGLE draft step (head layer, LM rows, argmax, next embedding) after `context` positions
    of true features, the way EagleDrafter drafts its second and later tokens. width > 0: one depth of a draft
    tree instead (TreeDrafter): `width` frontier positions in one head call with a tree mask, their LM rows and
    their top-`width` children."""
    from specdemo.engine.drafters import EagleDrafter

    drafter = EagleDrafter(pair.head, pair.target, SamplingConfig(0.0), pair.vocab_size, context + reps + 8 + width)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(pair.vocab_size, (context + 1,), generator=gen).to(pair.device)
    _, feats = CachedLM(pair.target, pair.vocab_size).feed_features(ids[:-1], layers=drafter.feature_layers)
    g = drafter.read(feats, ids[1:])
    times = []
    for _ in range(reps):
        device_sync(pair.device)
        t0 = time.perf_counter()
        if width:
            n = drafter.cache.length
            mask = torch.cat([torch.ones(width, n, dtype=torch.bool, device=pair.device),
                              torch.eye(width, dtype=torch.bool, device=pair.device)], dim=1)
            x = drafter.head.d2t[drafter.head.logits(g).topk(width, dim=-1).indices[0]]
            out = drafter.head.step(g.expand(width, -1), drafter.embed(x).to(drafter.dtype), drafter.cache,
                                    torch.full((width,), n, device=pair.device), mask)
            drafter.head.logits(out).float().log_softmax(-1).topk(width, dim=-1)
        else:
            x = drafter.head.d2t[drafter.head.logits(g).argmax(-1)]
            g = drafter.step(g, x)
        device_sync(pair.device)
        times.append(time.perf_counter() - t0)
        drafter.cache.crop(context)
    return statistics.median(times) * 1e3


@torch.inference_mode()
def tree_verify_ms(pair: ModelPair, nodes: int, context: int = 128, reps: int = 30) -> float:
    """Median time of one target forward over the last fixed token and a `nodes`-node draft tree (the tree mask of
    a bushy tree: two children per node, breadth first) after `context` cached tokens."""
    from specdemo.engine.tree import DraftTree, tree_attention

    lm = CachedLM(pair.target, pair.vocab_size)
    gen = torch.Generator().manual_seed(0)
    lm.feed(torch.randint(pair.vocab_size, (context,), generator=gen).to(pair.device))
    parents = torch.tensor([i // 2 - 1 for i in range(nodes)], device=pair.device)
    depths = torch.zeros(nodes, dtype=torch.long, device=pair.device)
    for i in range(nodes):
        depths[i] = 1 if parents[i] < 0 else depths[parents[i]] + 1
    tree = DraftTree(parents, depths, torch.ones(nodes, device=pair.device), int(depths.max()))
    x = torch.randint(pair.vocab_size, (nodes + 1,), generator=gen).to(pair.device)
    attention = tree_attention(tree, context, 1, pair.dtype)
    times = []
    for _ in range(reps):
        device_sync(pair.device)
        t0 = time.perf_counter()
        lm.feed_features(x, keep_logits=nodes + 1, tree=attention)
        device_sync(pair.device)
        times.append(time.perf_counter() - t0)
        lm.crop(context)
    return statistics.median(times) * 1e3


def isolated_draft_ms(pair: ModelPair, strategy: str, width: int = 0) -> float | None:
    """One draft step, hot, median: the draft model's cached forward, or the EAGLE head's step with its LM rows
    (None for lookup, which runs no model)."""
    if strategy == "lookup":
        return None
    if strategy == "eagle":
        return head_step_ms(pair)
    if strategy == "tree":
        return head_step_ms(pair, width=width or tree_shape(SpecConfig(strategy="tree"), pair.head,
                                                            cuda=pair.device.type == "cuda")[0])
    return forward_ms(pair.draft, pair.vocab_size, 1)


def frontier_width(shape: tuple[int, int, int], children: str) -> int:
    """The most nodes one head call of a tree run reads after the root's: top-k children expand `topk` nodes a
    depth; a sampled tree expands what sampled_tree.sampled_plan fixes (SmolLM2's (2, 4, 5) on a bf16 CPU: one)."""
    if children == "top":
        return shape[0]
    return max((m for m, _ in sampled_plan(*shape)[1:]), default=1)
