"""A draft tree's growth as one replay (issue 45, item 2: the drafting captured, for the tree).

Where the head's cache is the pair's shared slot (models/head_graphs.py, HeadSlot), TreeDrafter's tree of top-k
children (tree.grow) would launch its head calls, top-k picks, sorts, frontier masks and rerank one by one from
the host, and read one number a depth to decide whether to go deeper. Here the whole growth is one graph per
(topk, depth, budget, prune_below, cache bucket): from the predicted feature of the round's read, the root's
top-k, each further depth's head call (models/head_graphs.tree_step_over, its mask made in the graph) and top-k,
the next frontier, and the rerank to the best `budget` nodes, each mapped to the target's vocabulary.

Every shape is fixed, so the tree always holds `budget` nodes: the nodes it keeps come first, in breadth-first
order, and the rest pad it (DraftTree.size says how many are real, on the device; the walk and the round's copy
leave the padding out). It keeps the nodes tree.grow keeps: grow stops going deeper where no frontier node
reaches prune_below, and every node it would have added there is below prune_below too, so the rerank's floor
drops them here.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections import OrderedDict

import torch

from specdemo.models.head_graphs import HeadSlot, tree_step_over
from specdemo.models.static_parts import CAPTURED, record

from .judge_graph import pack_tree
from .tree import DraftTree, head_probs

log = logging.getLogger(__name__)
GRAPHS_KEPT = 16  # growth graphs a head slot keeps, over every shape and bucket (the least recently used go)
SHAPES_KEPT = 8  # tree shapes (with their prune_below) a head slot keeps buffers and graphs for


class TreeGraphs:
    """One tree shape's growth graphs over a HeadSlot; `grow` replays the one for the view's cache bucket."""

    def __init__(self, slot: HeadSlot, shape: tuple[int, int, int], prune_below: float):
        self.slot, (self.topk, self.depth, self.budget) = slot, shape
        self.floor = math.log(prune_below) if prune_below > 0 else None
        self.g = torch.zeros(1, slot.head.cfg.hidden_size, dtype=slot.dtype, device=slot.device)
        self.start = torch.zeros((), dtype=torch.long, device=slot.device)
        self.failed = False

    @property
    def room(self) -> int:
        """The head positions a tree writes after the true ones: topk at each depth below the first."""
        return (self.depth - 1) * self.topk

    def _forward(self, length: int):
        slot, head, t, dev = self.slot, self.slot.head, self.topk, self.slot.device
        logp = head.logits(self.g).float().log_softmax(-1)  # [1, V_draft]
        score, ids = (x[0] for x in logp.topk(t))
        ids_all, parents, depths, hps, scores = [ids], [ids.new_full((t,), -1)], [ids.new_ones(t)], \
            [logp[0].gather(0, ids).exp()], [score]
        frontier, slots, visible, g = torch.arange(t, device=dev), None, torch.eye(t, dtype=torch.bool, device=dev), None
        for d in range(1, self.depth):  # as tree.grow's expand and next_frontier, every depth
            feat = self.g.expand(t, -1) if slots is None else g[slots]
            draft = torch.cat(ids_all)[frontier]
            g = tree_step_over(head, feat, slot.embed(head.d2t[draft]).to(slot.dtype), slot.cache, self.start,
                               (d - 1) * t, d, visible, length)
            child_logits = head.logits(g).float()
            child_logq = child_logits.log_softmax(-1)
            c_logp, c_ids = child_logq.topk(t, dim=-1)
            c_score = (torch.cat(scores)[frontier].view(-1, 1) + c_logp).reshape(-1)
            ids_all.append(c_ids.reshape(-1))
            parents.append(frontier.repeat_interleave(t))
            depths.append(torch.full_like(c_score, d + 1, dtype=torch.long))
            hps.append(head_probs(child_logits, child_logq, c_ids, True).reshape(-1))
            scores.append(c_score)
            best = torch.sort(c_score, descending=True, stable=True).indices[:t]
            slots = best // t
            visible = torch.cat([visible[slots], torch.eye(t, dtype=torch.bool, device=dev)], dim=1)
            frontier = t + (d - 1) * t * t + best  # their global indices: this depth's children came after
        return self.padded(*(torch.cat(x) for x in (scores, ids_all, parents, depths, hps)))

    def padded(self, score, ids, parent, dep, hp):
        """tree.rerank with a fixed size: the best `budget` candidates, those below the floor moved to the end (the
        best one always stays), the kept ones in breadth-first order; the padding's parent is the root."""
        n_all, dev = score.shape[0], score.device
        order = torch.sort(score, descending=True, stable=True).indices[: self.budget]
        real = torch.ones(order.shape[0], dtype=torch.bool, device=dev)
        if self.floor is not None:
            real = (score[order] >= self.floor) | (torch.arange(order.shape[0], device=dev) == 0)
        keep = torch.where(real, order, order + n_all).sort().values  # the real ones first, breadth-first
        keep = torch.where(keep >= n_all, keep - n_all, keep)
        size = real.sum()
        new_index = torch.full((n_all + 1,), -1, dtype=torch.long, device=dev)
        new_index[keep] = torch.arange(keep.shape[0], device=dev)
        is_real = torch.arange(keep.shape[0], device=dev) < size
        parents = torch.where(is_real, new_index[parent[keep]], -1)
        depths = torch.where(is_real, dep[keep], 1)
        tokens, hp = self.slot.head.d2t[ids[keep]], hp[keep]
        return tokens, parents, depths, hp, size, pack_tree(tokens, parents, depths, hp, size)

    def _capture(self, length: int):
        slot, dev = self.slot, self.slot.device
        slot.take(slot.scratch)
        self.start.zero_()
        return record(lambda: self._forward(length), dev, slot.pool, slot.stand_in or dev.type != "cuda")

    def grow(self, view, g: torch.Tensor, gen: torch.Generator | None = None
             ) -> tuple[torch.Tensor, DraftTree] | None:
        """The tree from the predicted feature g [1, H] at the view's next position: (target ids [budget], the tree
        with its device size), the graph's own buffers until its next replay; None where the head's cache cannot
        hold it or no graph could be captured (the caller grows it step by step). gen: what a sampled tree's
        draws come from (sampled_graph.py)."""
        slot = self.slot
        end = view.length + self.room
        if end > slot.max_len:
            return None
        b = next(b for b in slot.buckets if b >= end)
        graphs = slot.__dict__.setdefault("trees", OrderedDict())
        key = (id(self), b)  # its graphs read this shape's own input buffers
        if key not in graphs:
            if self.failed:
                return None
            try:
                with torch.profiler.record_function(CAPTURED) if slot.stand_in else contextlib.nullcontext():
                    graphs[key] = self._capture(b)
            except Exception as err:  # noqa: BLE001 - any capture failure leaves the growth step by step
                self.failed = True
                log.warning("the draft tree's growth could not be captured (%s: %s); growing it step by step",
                            type(err).__name__, err)
                slot.take(view)  # the capture wrote through the scratch view: the run's positions come back
                return None
            while len(graphs) > GRAPHS_KEPT:
                graphs.popitem(last=False)
        graphs.move_to_end(key)
        graph, out = graphs[key]
        slot.take(view)
        self.g.copy_(g)
        self.start.fill_(view.length)
        self.before_replay(gen)
        with torch.profiler.record_function(CAPTURED):
            graph.replay()
        return self.result(out)

    def before_replay(self, gen: torch.Generator | None) -> None:
        """What a replay needs drawn first (a tree of top-k children draws nothing)."""

    def result(self, out) -> tuple[torch.Tensor, DraftTree]:
        tokens, parents, depths, head_p, size, packed = out
        return tokens, DraftTree(parents, depths, head_p, self.depth, size=size, packed=packed)


def tree_graphs(slot: HeadSlot, shape: tuple[int, int, int], prune_below: float, make=None, settings=()
                ) -> TreeGraphs:
    """The slot's TreeGraphs for this shape (made on first use, by `make` (slot, shape, prune_below); its graphs
    are captured per cache bucket). The SHAPES_KEPT most recently used shapes (with the `settings` they were made
    for) are kept, with their graphs (a visitor can pick any prune_below)."""
    shapes = slot.__dict__.setdefault("tree_shapes", OrderedDict())
    graphs = slot.__dict__.setdefault("trees", OrderedDict())
    key = (shape, prune_below, *settings)
    if key not in shapes:
        shapes[key] = (make or TreeGraphs)(slot, shape, prune_below)
        while len(shapes) > SHAPES_KEPT:
            old = shapes.popitem(last=False)[1]
            for gk in [gk for gk in graphs if gk[0] == id(old)]:
                del graphs[gk]
    shapes.move_to_end(key)
    return shapes[key]
