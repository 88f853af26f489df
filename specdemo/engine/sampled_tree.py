"""Draft trees of SAMPLED children (T > 0): the plan of a tree's shape, the draws, and the growth step by step.

Owns `sampled_plan` (how many nodes each depth expands and how many children each gets, fixed before drafting),
the round's uniforms (`plan_uniforms`, `plan_parts`: every draw a round could make, drawn at once), the draws
without replacement (`draw_children`), and `grow_sampled`, which grows a tree from the head one depth at a time,
with the rules that prune it (`first_draws`, `kept_draws`). It does not own the tree's layout (tree.py), the walk
that verifies it (walk.walk_sampled), the same growth as one replay (sampled_graph.py) or the drafter
(tree_drafter.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from .sampling import sample, wide_dtype
from .tree import DraftTree, Drawn, Grown, Nodes


def sampled_plan(topk: int, depth: int, budget: int) -> list[tuple[int, int]]:
    """The shape of a sampled tree, fixed before drafting: (nodes expanded, children each) for each depth.

    The root is expanded with up to topk children; each further depth expands up to topk of the previous depth's
    nodes (the head's likeliest paths), with topk children each, as far as the budget allows while keeping one node
    for every deeper depth, so that the tree reaches min(depth, budget) deep and holds at most `budget` nodes.
    Every child drawn at an expanded node is kept: which children a node has never depends on what was drawn."""
    depth = min(depth, budget)
    plan, used, frontier = [], 0, 1
    for d in range(depth):
        room = budget - used - (depth - d - 1)
        children = min(topk, room)
        expanded = max(1, min(topk, frontier, room // children))
        plan.append((expanded, children))
        used += expanded * children
        frontier = expanded * children
    return plan


def plan_sizes(plan: list[tuple[int, int]]) -> tuple[int, int, int]:
    """(nodes, rows, width) of a plan: the children it could draw, the rows it could expand (the root's included)
    and the most children a row gets."""
    return sum(m * c for m, c in plan), sum(m for m, _ in plan), max(c for _, c in plan)


def plan_uniforms(plan: list[tuple[int, int]], generator: torch.Generator | None, device) -> torch.Tensor:
    """Every uniform a round with a sampled tree draws, at once before its first draw (float64; plan_parts splits
    them): the growth's c for each of the m rows that each depth of `plan` could expand, depth by depth, then its
    walk's (walk.walk_sampled): a row of the plan's widest c for each of those rows, and the end draw's. The tree
    takes what its rows use and leaves the rest, so what a round draws never depends on what the head drew, and a
    captured round (sampled_graph.py) draws the same uniforms, in one call, as a round step by step."""
    nodes, rows, width = plan_sizes(plan)
    return torch.rand(nodes + rows * width + 1, generator=generator, device=device, dtype=wide_dtype(device))


def plan_parts(plan: list[tuple[int, int]], u: torch.Tensor
               ) -> tuple[list[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """plan_uniforms' draws as views: one [m, c] block a depth for the growth, and the walk's ([rows, width] for
    its tests, [1, 1] for its end draw)."""
    blocks, i = [], 0
    for m, c in plan:
        blocks.append(u[i : i + m * c].view(m, c))
        i += m * c
    _, rows, width = plan_sizes(plan)
    return blocks, (u[i : i + rows * width].view(rows, width), u[-1:].view(1, 1))


def draw_children(q: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """c draws without replacement from each row of q [rows, V] -> [rows, c] long, in draw order: draw s takes
    uniform u[:, s] by the inverse of the cumulative q left once draws 1..s-1 are set aside (as sampling.sample,
    sums in float64). Where nothing of q is left (its support had fewer than c tokens) a draw takes the first token
    not drawn yet: it has q = 0 and is never accepted (walk.walk_sampled). c passes over the row, and c uniforms a
    row, where the Gumbel-top-k draws it replaced drew V (docs/decisions.md, "sampled children by successive
    draws")."""
    left, picks = q.to(u.dtype), []  # float64 (float32 on MPS, as plan_uniforms draws u)
    rows, c = u.shape
    for s in range(c):
        pick = sample(left, None, u=u[:, s : s + 1]).view(rows, 1)
        if s:  # q's first draw always has mass; a later one may find none left: the first of 0..s not drawn yet
            taken = torch.cat(picks, 1).view(rows, 1, s)
            free = (torch.arange(s + 1, device=q.device).view(1, s + 1, 1) != taken).all(-1)
            pick = torch.where(left.sum(-1, keepdim=True) > 0, pick, free.long().argmax(-1, keepdim=True))
        picks.append(pick)
        if s + 1 < c:
            left = left.scatter(1, pick, 0.0)
    return torch.cat(picks, 1)


@dataclass
class SampledNodes(Nodes):
    """grow_sampled's tree being grown: also, per depth, the q rows its children were drawn from, the nodes (global
    indices, -1 the root) they were drawn at, and those rows' places in the plan (Drawn.slots)."""

    q_rows: list[torch.Tensor] = field(default_factory=list)
    expanded: list[torch.Tensor] = field(default_factory=list)
    slots: list[torch.Tensor] = field(default_factory=list)

    def add_draws(self, depth: int, chosen: torch.Tensor, logits: torch.Tensor, q: torch.Tensor, kids: torch.Tensor,
                  parent_score: torch.Tensor, keep: torch.Tensor | None, m: int, n_kept: int,
                  row_slots: torch.Tensor) -> None:
        """Append one depth's kept draws: kids [m, c], drawn from q [m, V_draft] at the m nodes `chosen`, whose
        rows are row_slots [m] in the plan."""
        c = kids.shape[1]
        self.add(pick(kids.reshape(-1), keep), pick(chosen.repeat_interleave(c), keep),
                 torch.full((n_kept,), depth, dtype=torch.long, device=kids.device),
                 pick(logits.softmax(-1).gather(1, kids).reshape(-1), keep),
                 pick((parent_score.view(-1, 1) + q.gather(1, kids).log()).reshape(-1), keep))
        rows = None if keep is None else keep.view(m, c)[:, 0]  # the rows that got children (walk_sampled's rows)
        self.q_rows.append(pick(q, rows))
        self.expanded.append(pick(chosen, rows))
        self.slots.append(pick(row_slots, rows))


def grow_sampled(root_logits: torch.Tensor, expand, plan: list[tuple[int, int]], warp_q,
                 generator: torch.Generator | None, draft_to_target: torch.Tensor, prune_below: float = 0.0,
                 prune_children: bool = False, stop_below: float = 0.0) -> Grown:
    """A tree of SAMPLED children, for T > 0 (verified by walk.walk_sampled): each expanded node's children are
    drawn from the head's warped q (`warp_q`: logits [rows, V_draft] -> probabilities, the run's T, top-k and
    top-p) without replacement, in draw order. `plan` (sampled_plan) says how many nodes each depth expands and how
    many children each gets; the nodes expanded are the previous depth's best by cumulative log q, which depends
    only on the head's own draws. `expand` is as for `grow`, for a frontier of any size. Every drawn child is kept.
    draft_to_target [V_draft]: the target's id of each draft id (the Drawn's column ids).

    prune_below > 0: a node is expanded only if its cumulative q reaches it, and the tree stops growing where none
    does. This decides which rows get children from the head's own draws, never from the target; it never drops a
    drawn child for what that child turned out to be, since a row's children must be its first draws, in order,
    for walk_sampled's tests (a child kept or dropped by its own q would no longer be a draw from q).

    prune_children (with prune_below > 0): the s-th draw of a row is kept only if the draws before it leave it an
    expected cumulative q, parent's cumulative q x E[q(c_s) | c_1..c_{s-1}] = cum x sum(q_left^2) / sum(q_left),
    of at least prune_below, as a top-k tree keeps a child whose cumulative probability reaches it. The rule
    reads the earlier draws only, so the kept children are the row's first m draws for an m fixed before the
    m-th is seen: still draws without replacement from q. The root keeps its first draw whatever.

    stop_below > 0: an expanded node below the root whose warped q has its top below it gets no children: the
    chain's confidence stop (drafters.confidence, EagleDrafter.draft_chain), where the head is unsure of the next
    token and leaves it to the target. It reads the head's own q, never a draw or the target."""
    dev = root_logits.device
    floor = math.log(prune_below) if prune_below > 0 else None
    by_draws = prune_children and floor is not None
    blocks, walk_u = plan_parts(plan, plan_uniforms(plan, generator, dev))  # the round's every draw, up front
    # 1. the root's children: its first draws
    nodes = root_draws(root_logits, warp_q, blocks[0], floor, by_draws)
    level = torch.arange(nodes.draft_ids[0].shape[0], device=dev)  # the last depth's nodes (global indices)
    level_slot, visible, offset = None, None, level.shape[0]  # each level node's parent among the last fed nodes
    reached, first_row = 1, 1  # first_row: the plan's place of the next depth's first row
    # 2. each further depth: expand the last depth's best nodes, draw their children, keep what the rules keep
    for d, (m, c) in enumerate(plan[1:], start=1):
        best, m = expanded_nodes(torch.cat(nodes.scores)[level], m, floor)
        if m == 0:
            break  # no node of this depth is likely enough to expand, so no deeper node would be either
        chosen = level[best]
        slots = None if level_slot is None else level_slot[best]
        eye = torch.eye(m, dtype=torch.bool, device=dev)
        visible = eye if slots is None else torch.cat([visible[slots], eye], dim=1)
        logits = expand(slots, torch.cat(nodes.draft_ids)[chosen], visible, d).float()
        q = warp_q(logits)
        kids = draw_children(q, blocks[d][:m])  # [m, c]
        parent_score = torch.cat(nodes.scores)[chosen]
        keep = kept_draws(q, kids, parent_score, floor, by_draws, stop_below)
        n_kept = m * c if keep is None else int(keep.sum())
        if n_kept == 0:
            break  # every expanded node's first draw fell below prune_below: the tree ends here
        nodes.add_draws(d + 1, chosen, logits, q, kids, parent_score, keep, m, n_kept,
                        first_row + torch.arange(m, device=dev))
        level = offset + torch.arange(n_kept, device=dev)
        level_slot = pick(torch.arange(m, device=dev).repeat_interleave(c), keep)
        offset += n_kept
        reached, first_row = d + 1, first_row + plan[d][0]
    # 3. the tree, with what its children were drawn from (what walk_sampled tests them with)
    ids = torch.cat(nodes.draft_ids)
    _, rows, width = plan_sizes(plan)
    drawn = Drawn(torch.cat(nodes.q_rows), torch.cat(nodes.expanded) + 1, ids, draft_to_target, width,
                  torch.cat(nodes.slots), rows, walk_u)
    return Grown(ids, DraftTree(torch.cat(nodes.parents), torch.cat(nodes.depths), torch.cat(nodes.head_p), reached,
                                drawn))


def root_draws(root_logits: torch.Tensor, warp_q, u: torch.Tensor, floor: float | None, by_draws: bool
               ) -> SampledNodes:
    """The sampled tree's first depth: the root's first c draws from q, by the uniforms u [1, c] (by_draws: those
    first_draws keeps)."""
    logits = root_logits.float().view(1, -1)
    q = warp_q(logits)
    kids = draw_children(q, u)
    keep = first_draws(q, kids, q.new_zeros(1), floor, root=True).view(-1) if by_draws else None
    ids = pick(kids.view(-1), keep)
    hp = logits.softmax(-1)[0, ids]
    none = torch.full((1,), -1, device=root_logits.device, dtype=torch.long)
    return SampledNodes([ids], [torch.full_like(ids, -1)], [torch.ones_like(ids)], [hp], [q[0, ids].log()], [q],
                        [none], [none + 1])


def expanded_nodes(level_scores: torch.Tensor, m: int, floor: float | None) -> tuple[torch.Tensor, int]:
    """(best, m): which of the last depth's nodes to expand, by cumulative log q: its best m, less those below floor
    (m then counts the rest; 0: none)."""
    best = torch.sort(level_scores, descending=True, stable=True).indices[:m]
    m = best.shape[0]  # (a level may hold fewer nodes than the plan's m where sampled_stop left rows childless)
    if floor is not None:
        m = int((level_scores[best] >= floor).sum())
        best = best[:m]
    return best, m


def kept_draws(q: torch.Tensor, kids: torch.Tensor, parent_score: torch.Tensor, floor: float | None, by_draws: bool,
               stop_below: float) -> torch.Tensor | None:
    """[m * c] bool, which draws of kids [m, c] to keep (None: all): first_draws' prefix of each row if by_draws,
    and none below a node whose q's top is under stop_below (the chain's confidence stop)."""
    keep = first_draws(q, kids, parent_score, floor).view(-1) if by_draws else None
    if stop_below > 0:  # an unsure node gets no children
        sure = (q.max(-1).values >= stop_below).repeat_interleave(kids.shape[1])
        keep = sure if keep is None else keep & sure
    return keep


def pick(x: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    return x if keep is None else x[keep]


def first_draws(q: torch.Tensor, kids: torch.Tensor, parent_score: torch.Tensor, floor: float,
                root: bool = False) -> torch.Tensor:
    """[rows, c] bool: which of each row's draws (kids, in draw order from q [rows, V]) grow_sampled keeps with
    prune_children: draw s while parent_score (the row's cumulative log q) + log E[q(c_s) | c_1..c_{s-1}] >= floor,
    where E[q(c_s) | ...] = sum(q_left^2) / sum(q_left) over the q not yet drawn. A prefix of each row's draws,
    decided before each kept draw is looked at; the root keeps its first."""
    qd = q.double()
    qk = qd.gather(1, kids)
    mass_before = qk.cumsum(1) - qk
    sq_before = (qk * qk).cumsum(1) - qk * qk
    left = (qd.sum(-1, keepdim=True) - mass_before).clamp(min=torch.finfo(torch.float64).tiny)
    expected = ((qd * qd).sum(-1, keepdim=True) - sq_before).clamp(min=0.0) / left
    ok = parent_score.double().view(-1, 1) + expected.log() >= floor
    if root:
        ok[:, 0] = True
    return ok.long().cumprod(1).bool()
