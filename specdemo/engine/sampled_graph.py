"""A draft tree of SAMPLED children grown as one replay (issue 45, item 2, for the tree a run drafts at T > 0).

sampled_tree.grow_sampled expands, at each depth, the previous depth's best nodes by cumulative q, as many as its
plan says (sampled_tree.sampled_plan) or fewer where prune_below leaves some out, and stops where none is left;
each expanded node's children are drawn from the head's warped q. Its counts are read on the host, once a depth.
Here every count is the plan's: each depth runs the head over all the rows the plan could expand, and a row that
grow_sampled would not have expanded (its node below prune_below, or a padding node) is dead: its children are
padding. At the end the real nodes are moved to the front, in grow_sampled's breadth-first order, and the padding
after them (DraftTree.size counts the real ones on the device), as in tree_graph.py.

The draws are made by the same uniforms in the same places as grow_sampled's: sampled_tree.plan_uniforms draws
all of a round's before the replay, and a depth's k-th expanded row takes the plan's k-th row of uniforms, dead or
alive. So a replay grows the tree grow_sampled grows from the same generator state, and its walk
(walk.walk_sampled, captured by judge_graph.TreeJudge, reading this growth's buffers) takes its uniforms by each q
row's place in the plan (Drawn.slots), as the eager walk does. (On the CPU's stand-in the two give the same trees,
tested; on CUDA the graph's head runs over more rows and another cache bucket than the steps do, whose rounding may
part them at a near-tie. Either is exact.) Trees that prune a row's children by its own draws
(TreeDrafter.prune_children) or stop at an unsure node (sampled_stop) keep growing step by step; neither is on by
default.
"""

from __future__ import annotations

import math

import torch

from specdemo.config import SamplingConfig
from specdemo.models.head_graphs import HeadSlot, tree_step_over

from .judge_graph import pack_tree
from .sampled_tree import draw_children, plan_parts, plan_sizes, sampled_plan
from .sampling import warp
from .tree import DraftTree, Drawn
from .tree_graph import TreeGraphs, tree_graphs


class SampledTreeGraphs(TreeGraphs):
    """One plan's growth graphs (TreeGraphs) for trees of children drawn from the head's q warped by `sampling`."""

    def __init__(self, slot: HeadSlot, shape: tuple[int, int, int], prune_below: float, sampling: SamplingConfig):
        super().__init__(slot, shape, prune_below)
        self.sampling, self.plan = sampling, sampled_plan(*shape)
        self.depth = len(self.plan)  # the plan never goes deeper than the budget
        dev, (n, rows, self.width) = slot.device, plan_sizes(self.plan)
        # what the round's verdict graph reads (judge_graph.TreeJudge), the same buffers whichever cache bucket's
        # graph grew the tree: the round's uniforms (sampled_tree.plan_uniforms), the tree packed
        # (judge_graph.tree_pack), and what its children were drawn from (q, each q row's p row, each node's column)
        self.u = torch.zeros(n + rows * self.width + 1, dtype=torch.float64, device=dev)
        self.pack = torch.zeros(4 * n + 2, device=dev)
        self.q = torch.zeros(rows, slot.head.d2t.shape[0], device=dev)
        self.rows = torch.zeros(rows, dtype=torch.long, device=dev)
        self.cols = torch.zeros(n, dtype=torch.long, device=dev)
        self.row_slots = torch.arange(rows, device=dev)  # Drawn.slots: each q row is its own place in the plan
        self.blocks, self.walk_u = plan_parts(self.plan, self.u)  # views: each depth's draws, the walk's

    @property
    def room(self) -> int:
        """The head positions the tree writes after the true ones: every row the plan could expand below the root."""
        return sum(m for m, _ in self.plan[1:])

    def _forward(self, length: int):
        slot, head, dev = self.slot, self.slot.head, self.slot.device
        blocks = self.blocks
        logits = head.logits(self.g).float()
        q = warp(logits, self.sampling)
        kids = draw_children(q, blocks[0])  # [1, c]: the root's children, every one real
        c = kids.shape[1]
        ids, parents, depths = [kids.view(-1)], [kids.new_full((c,), -1)], [kids.new_ones(c)]
        hps, scores = [logits.softmax(-1).gather(1, kids).view(-1)], [q.gather(1, kids).log().view(-1)]
        real, qs = [torch.ones(c, dtype=torch.bool, device=dev)], [q]
        row_node, row_live = [kids.new_full((1,), -1)], [torch.ones(1, dtype=torch.bool, device=dev)]
        level, level_row, n_all, offset, visible, g = torch.arange(c, device=dev), None, c, 0, None, None
        for d, (m, c) in enumerate(self.plan[1:], start=1):
            score, is_real = torch.cat(scores)[level], torch.cat(real)[level]
            # grow_sampled's expanded_nodes over the real nodes: the best m by cumulative log q (a stable sort),
            # those below the floor left out; the padding sorts after every real node
            by_score = torch.sort(torch.where(is_real, score, -math.inf), descending=True, stable=True).indices
            best = by_score[torch.sort((~is_real[by_score]).to(torch.uint8), stable=True).indices][:m]
            live = is_real[best] if self.floor is None else is_real[best] & (score[best] >= self.floor)
            chosen = level[best]
            eye = torch.eye(m, dtype=torch.bool, device=dev)
            slots = None if level_row is None else level_row[best]
            visible = eye if slots is None else torch.cat([visible[slots], eye], dim=1)
            feat = self.g.expand(m, -1) if slots is None else g[slots]
            draft = torch.cat(ids)[chosen]
            g = tree_step_over(head, feat, slot.embed(head.d2t[draft]).to(slot.dtype), slot.cache, self.start,
                               offset, d, visible, length)
            logits = head.logits(g).float()
            q = warp(logits, self.sampling)
            kids = draw_children(q, blocks[d])  # [m, c]
            ids.append(kids.reshape(-1))
            parents.append(chosen.repeat_interleave(c))
            depths.append(torch.full((m * c,), d + 1, dtype=torch.long, device=dev))
            hps.append(logits.softmax(-1).gather(1, kids).reshape(-1))
            scores.append((score[best].view(-1, 1) + q.gather(1, kids).log()).reshape(-1))  # the parents' + own
            real.append(live.repeat_interleave(c))
            qs.append(q)
            row_node.append(chosen)
            row_live.append(live)
            level, level_row = n_all + torch.arange(m * c, device=dev), torch.arange(m, device=dev).repeat_interleave(c)
            n_all, offset = n_all + m * c, offset + m
        return self.compacted(*(torch.cat(x) for x in (ids, parents, depths, hps, real, qs, row_node, row_live)))

    def compacted(self, ids, parent, dep, hp, real, q, row_node, row_live):
        """The real nodes first (breadth-first, as grow_sampled numbers them), the padding after them (parent the
        root, depth 1); each q row's p row (-1 for a dead row)."""
        n_all, dev = ids.shape[0], ids.device
        keep = torch.sort((~real).to(torch.uint8), stable=True).indices
        size = real.sum()
        new_index = torch.full((n_all + 1,), -1, dtype=torch.long, device=dev)  # the last: the root's, -1
        new_index[keep] = torch.arange(n_all, device=dev)
        is_real = torch.arange(n_all, device=dev) < size
        parents = torch.where(is_real, new_index[parent[keep]], -1)
        depths = torch.where(is_real, dep[keep], 1)
        cols = ids[keep]
        tokens, hp = self.slot.head.d2t[cols], hp[keep]
        self.pack.copy_(pack_tree(tokens, parents, depths, hp, size))
        self.q.copy_(q)
        self.rows.copy_(torch.where(row_live, new_index[row_node] + 1, -1))
        self.cols.copy_(cols)
        return tokens, parents, depths, hp, size

    def before_replay(self, gen: torch.Generator | None) -> None:
        torch.rand(self.u.shape, generator=gen, out=self.u)  # as sampled_tree.plan_uniforms draws them

    def result(self, out) -> tuple[torch.Tensor, DraftTree]:
        tokens, parents, depths, head_p, size = out
        drawn = Drawn(self.q, self.rows, self.cols, self.slot.head.d2t, self.width, self.row_slots,
                      self.rows.shape[0], self.walk_u, self)
        return tokens, DraftTree(parents, depths, head_p, self.depth, drawn, size=size, packed=self.pack)


def sampled_tree_graphs(slot: HeadSlot, shape: tuple[int, int, int], prune_below: float, sampling: SamplingConfig
                        ) -> SampledTreeGraphs:
    """The slot's SampledTreeGraphs for this plan and these sampling settings (kept as tree_graph.tree_graphs)."""
    return tree_graphs(slot, shape, prune_below, lambda *a: SampledTreeGraphs(*a, sampling),
                       ("sampled", sampling.temperature, sampling.top_k, sampling.top_p))
