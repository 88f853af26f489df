"""A round's verdict as one replay (issue 45, item 3: judged on the device, read once): a chain's (ChainJudge) and a
tree's (TreeJudge: the walk of walk.walk for top-k children, of walk.walk_sampled for sampled children grown in a
graph, sampled_graph.py; a sampled tree grown step by step is walked eagerly).

Where the target's forwards are captured (`graphs` on CUDA; the graphs' stand-in on a CPU, for tests), a chain's
step 3 runs as one graph per number of drafts k: the target's last hidden states -> its LM head's logits -> warped
p -> the modified rejection test (sampling.verify) -> the numbers the round's one copy carries
(story.verdict_tensors), flattened into one buffer. The operators between them (about a hundred at T > 0) stop
being launched one by one from the host.

The randomness is drawn outside the graph, before the replay, by the same calls in the same order as an eager
verify makes them (sampling.draw_verify), so a replay decides exactly what the eager judge decides from the same
generator state; the sampling settings (T, top-k, top-p, lenience, the inspector's top_m) are fixed per graph and
key its cache. A capture that fails leaves the eager judge in place, with one log line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import weakref
from collections import OrderedDict

import torch

from specdemo.config import SamplingConfig
from specdemo.models.lm import head_logits
from specdemo.models.static_parts import CAPTURED, ReplayStandIn, record, shared_pool

from .sampling import Verdict, draw_verify, uniforms, verify, warp
from .story import tree_sizes, tree_verdict_tensors, verdict_tensors
from .tree import DraftTree, Drawn
from .walk import walk, walk_sampled

log = logging.getLogger(__name__)
SETTINGS_KEPT = 8  # the sampling settings whose verdict graphs a pair keeps (the least recently used go first)
GRAPHS_KEPT = 16  # a setting's tree verdict graphs kept (one per tree size and depth, or per sampled plan)


def captured(forward, stand_in: bool, slot) -> tuple[object, torch.Tensor]:
    """A verdict's graph (CUDA) or its stand-in, and its flat output: `forward` returns (flat, flat)."""
    # one pool for every verdict graph of the slot: each one's inputs live outside it, and its output is read right
    # after its replay, so no graph needs another's memory to survive
    pool = shared_pool(slot, "judge_pool", cuda=not stand_in)
    graph, out = record(forward, slot.device, pool, stand_in)
    return graph, out[0]


class ChainJudge:
    """The captured verdicts of one sampling setting, one graph per k: `judge` fills the graph's inputs, draws the
    uniforms, replays and copies the flat result to the host once."""

    def __init__(self, sampling: SamplingConfig, lenience: float, top_m: int, slot, stand_in: bool):
        self.sampling, self.lenience, self.top_m, self.vocab = sampling, lenience, top_m, slot.vocab_size
        self.device, self.stand_in, self.slot = slot.device, stand_in, slot
        self.graphs: dict[int, tuple] = {}
        self.failed = False

    def _capture(self, k: int) -> tuple:
        dev, greedy, slot = self.device, self.sampling.greedy, self.slot
        hidden = torch.zeros(k + 1, slot.model.config.hidden_size, dtype=slot.dtype, device=dev)
        tokens = torch.zeros(k, dtype=torch.long, device=dev)
        q = torch.full((k, self.vocab), 1.0 / self.vocab, device=dev)
        r, u = draw_verify(k, torch.Generator(device=dev).manual_seed(0), dev, greedy)

        def forward():
            logits = head_logits(slot.model, slot.head32, hidden, self.vocab)
            p = warp(logits, self.sampling)
            v: Verdict = verify(tokens, q, p, None, greedy=greedy, lenience=self.lenience, drawn=(r, u))
            flat = torch.cat([t.reshape(-1).float() for t in verdict_tensors(tokens, q, p, v, self.top_m)])
            return flat, flat

        graph, out = captured(forward, self.stand_in, self.slot)
        return graph, hidden, tokens, q, r, u, out

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The target's float32 logits of its last hidden states, as its LM head gives them (the eager judge's)."""
        return head_logits(self.slot.model, self.slot.head32, hidden, self.vocab)

    @torch.inference_mode()
    def judge(self, hidden: torch.Tensor, tokens: torch.Tensor, q: torch.Tensor, gen: torch.Generator
              ) -> list[float] | None:
        """The flat host copy of verdict_tensors for (the target's last hidden states [k+1, H], drafts [k], q
        [k, V]); None where no graph could be captured (the caller judges eagerly, from `logits`)."""
        k = tokens.numel()
        if k not in self.graphs:
            if self.failed:
                return None
            try:  # once per (settings, k): on the stand-in its buffers and run count as captured work, not a round's
                with torch.profiler.record_function(CAPTURED) if self.stand_in else contextlib.nullcontext():
                    self.graphs[k] = self._capture(k)
            except Exception as err:  # noqa: BLE001 - any capture failure falls back to the eager judge
                self.failed = True
                log.warning("the chain's verdict could not be captured (%s: %s); judging eagerly",
                            type(err).__name__, err)
                return None
        graph, g_hidden, g_tokens, g_q, g_r, g_u, out = self.graphs[k]
        g_hidden.copy_(hidden)
        g_tokens.copy_(tokens)
        g_q.copy_(q)
        draw_verify(k, gen, self.device, self.sampling.greedy, out=(g_r, g_u))
        graph.replay()
        return out.tolist()


def chain_judge(pair, sampling: SamplingConfig, lenience: float, top_m: int) -> ChainJudge | None:
    """The pair's ChainJudge for these settings, where its target's forwards are captured (or stood in for); None
    elsewhere. Kept on the target's static slot, so that runs with the same settings share the graphs; the
    SETTINGS_KEPT most recently used settings are kept."""
    slot = (getattr(pair, "static_slots", None) or {}).get("target")
    if slot is None or not slot.graphs or slot.head32 is None:
        return None
    judges = slot.__dict__.setdefault("judges", OrderedDict())
    key = (sampling.temperature, sampling.top_k, sampling.top_p, lenience, top_m)
    if key not in judges:
        stand_in = isinstance(next(iter(slot.graphs.values())).graph, ReplayStandIn)
        judges[key] = ChainJudge(sampling, lenience, top_m, slot, stand_in)
        while len(judges) > SETTINGS_KEPT:  # a public page's visitors pick many settings: the oldest graphs go
            judges.popitem(last=False)
    judges.move_to_end(key)
    return judges[key]


class TreeJudge:
    """The captured verdicts of trees for one sampling setting: of top-k children (walk.walk), one graph per (nodes,
    depth bound); of sampled children grown in a graph (walk.walk_sampled), one per plan's buffers. Each runs the
    target's LM head over the verify's last hidden states, the warp, the walk with its uniforms
    drawn before the replay (as the eager walk draws them), story.tree_verdict_tensors flat, and the roll-back of
    the target's cache: the path's rows move up behind the fixed tokens (as StaticLM.keep_rows moves them; a
    depth past the path moves a row past what the round keeps, which the next forward overwrites)."""

    def __init__(self, sampling: SamplingConfig, top_m: int, slot, stand_in: bool):
        self.sampling, self.top_m, self.vocab = sampling, top_m, slot.vocab_size
        self.device, self.stand_in, self.slot = slot.device, stand_in, slot
        self.graphs: OrderedDict[tuple, tuple] = OrderedDict()
        self.failed = False

    def _capture(self, n: int, max_depth: int, drawn: Drawn | None, packed: torch.Tensor | None) -> tuple:
        dev, greedy, slot = self.device, self.sampling.greedy, self.slot
        hidden = torch.zeros(n + 1, slot.model.config.hidden_size, dtype=slot.dtype, device=dev)
        # the tree in one float buffer (tree_pack): tokens, parents, depths, head p, the real size, and 1 to move
        # the rows (0 while capturing: the capture's own moves put each row onto itself)
        # a sampled tree grown in a graph is read where its growth left it (sampled_graph.py: its pack, q, rows,
        # columns and uniforms, the same buffers every round)
        pack = packed if drawn else torch.cat([torch.zeros(n), torch.full((n,), -1.0), torch.ones(2 * n),
                                               torch.tensor([n, 0.0])]).to(dev)
        base = torch.zeros((), dtype=torch.long, device=dev)  # the first node's slot in the cache: start + unseen
        u = None if greedy or drawn else uniforms(n + 1, torch.Generator(device=dev).manual_seed(0), dev)

        def forward():
            p = warp(head_logits(slot.model, slot.head32, hidden, self.vocab), self.sampling)
            tokens, parents, depths = (pack[i * n : (i + 1) * n].long() for i in range(3))
            tree = DraftTree(parents, depths, pack[3 * n : 4 * n], max_depth, drawn, size=pack[4 * n].long())
            v = walk_sampled(tokens, tree, p, None, u=drawn.u) if drawn else walk(tokens, tree, p, None, greedy, u)
            flat = torch.cat([t.reshape(-1).float() for t in tree_verdict_tensors(tokens, tree, p, v, self.top_m)])
            by_depth = torch.arange(1, max_depth + 1, device=dev).view(-1, 1)
            node = (v.on_path.view(1, n) & (depths.view(1, n) == by_depth)).long().argmax(1)  # the path's node at
            src = base + node  # each depth's (garbage past its end), moved up to follow the fixed tokens
            dst = torch.where(pack[4 * n + 1] > 0, base + by_depth.view(-1) - 1, src)
            for k_cache, v_cache in slot.kv:
                for t in (k_cache, v_cache):
                    t.index_copy_(2, dst, t.index_select(2, src))
            return flat, flat

        if drawn:  # the capture's own runs must not move the rows (its replays will), so no flag while capturing
            pack[-1] = 0.0
        graph, out = captured(forward, self.stand_in, slot)
        if drawn:
            pack[-1] = 1.0
        return graph, hidden, pack, base, u, out, drawn

    @torch.inference_mode()
    def judge(self, hidden: torch.Tensor, tokens: torch.Tensor, tree: DraftTree, gen: torch.Generator, base: int
              ) -> list[list[float]] | None:
        """tree_verdict_tensors' host lists for (the target's last hidden states [n+1, H], the nodes [n], their tree),
        by one replay and one copy, with the target's cache rolled back on the device (its path's rows moved to
        start at slot `base`, the first after the fixed tokens); None where no graph could be captured (the caller
        judges eagerly, and moves the rows itself). A tree of sampled children (walk.walk_sampled) must have been
        grown in a graph (sampled_graph.py: a q row for every row of its plan, each in its plan's place)."""
        n, drawn = tokens.numel(), tree.drawn
        key = (n, tree.max_depth) if drawn is None else (n, tree.max_depth, id(tree.packed))
        if key not in self.graphs:
            if self.failed:
                return None
            try:  # once per (settings, n, depth[, plan]): on the stand-in not a round's work
                with torch.profiler.record_function(CAPTURED) if self.stand_in else contextlib.nullcontext():
                    plain = None if drawn is None else dataclasses.replace(drawn, owner=None)  # no hold on it
                    self.graphs[key] = self._capture(n, tree.max_depth, plain, tree.packed)
                if drawn is not None and drawn.owner is not None:  # a plan's graphs let go: its verdicts go too
                    weakref.finalize(drawn.owner, self.graphs.pop, key, None)
                while len(self.graphs) > GRAPHS_KEPT:  # a sampled tree's graphs are its plan's, and plans come and go
                    self.graphs.popitem(last=False)
            except Exception as err:  # noqa: BLE001 - any capture failure falls back to the eager walk
                self.failed = True
                log.warning("the tree's verdict could not be captured (%s: %s); judging eagerly",
                            type(err).__name__, err)
                return None
        self.graphs.move_to_end(key)
        graph, g_hidden, pack, g_base, u, out, sampled = self.graphs[key]
        g_hidden.copy_(hidden)
        if sampled is None:  # (a sampled tree's growth left it in place)
            pack.copy_(tree.packed if tree.packed is not None else tree_pack(tokens, tree))
        g_base.fill_(base)
        if u is not None:  # as walk draws them: sampling.uniforms(n + 1, gen, device)
            torch.rand(u.shape, generator=gen, out=u)
        graph.replay()
        flat, lists, i = out.tolist(), [], 0
        for size in tree_sizes(n, self.top_m, self.vocab):
            lists.append(flat[i : i + size])
            i += size
        return lists

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """As ChainJudge.logits."""
        return head_logits(self.slot.model, self.slot.head32, hidden, self.vocab)

    def width(self) -> int:
        return min(self.top_m, self.vocab) if self.top_m > 0 else 0


def tree_pack(tokens: torch.Tensor, tree: DraftTree) -> torch.Tensor:
    """A tree in TreeJudge's one float buffer (pack_tree). A tree grown in a graph comes packed (DraftTree.packed)."""
    size = tree.size if tree.size is not None else torch.full((), tokens.numel(), device=tokens.device)
    return pack_tree(tokens, tree.parents, tree.depths, tree.head_p, size)


def pack_tree(tokens: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor, head_p: torch.Tensor,
              size: torch.Tensor) -> torch.Tensor:
    """TreeJudge's one float buffer: tokens, parents, depths, head p (n each), then the real size and a 1 (move the
    rows; float32 holds ids and indices exactly up to 2**24)."""
    return torch.cat([tokens.float(), parents.float(), depths.float(), head_p.float(), size.float().view(1),
                      size.new_ones(1).float()])


def tree_judge(pair, sampling: SamplingConfig, top_m: int) -> TreeJudge | None:
    """The pair's TreeJudge for these settings where its target's forwards are captured (as chain_judge)."""
    slot = (getattr(pair, "static_slots", None) or {}).get("target")
    if slot is None or not slot.graphs or slot.head32 is None:
        return None
    judges = slot.__dict__.setdefault("tree_judges", OrderedDict())
    key = (sampling.temperature, sampling.top_k, sampling.top_p, top_m)
    if key not in judges:
        stand_in = isinstance(next(iter(slot.graphs.values())).graph, ReplayStandIn)
        judges[key] = TreeJudge(sampling, top_m, slot, stand_in)
        while len(judges) > SETTINGS_KEPT:
            judges.popitem(last=False)
    judges.move_to_end(key)
    return judges[key]


def candidate_width(top_m: int, vocab: int) -> int:
    """The inspector's candidates per row in verdict_tensors: the top_m under p and the top_m under q."""
    return 2 * min(top_m, vocab) if top_m > 0 else 0


def split_flat(flat: list[float], k: int, top_m: int, vocab: int) -> list[list[float]]:
    """verdict_tensors' lists from the flat copy of k drafts: six per-draft rows, the verdict's two numbers, the next
    token's p, and the candidates' ids, p and q over k + 1 rows."""
    width = 2 * min(top_m, vocab) if top_m > 0 else 0
    sizes = [k] * 6 + [2, 1] + ([(k + 1) * width] * 3 if width else [])
    assert sum(sizes) == len(flat), (sizes, len(flat))
    out, i = [], 0
    for n in sizes:
        out.append(flat[i : i + n])
        i += n
    return out
