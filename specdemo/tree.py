"""Draft trees: how a tree of drafted tokens is laid out, checked by the target in one forward, and walked exactly.

Owns the tree's shape (`DraftTree`), the target's tree attention (`tree_attention`), the exact walk that verifies a
tree whose children are deterministic (`walk`) and the head's EAGLE-2 tree builder (`grow`). It does not own the
loop (speculative.py), the drafter that calls `grow` (drafters.TreeDrafter) or how a tree is drawn (render.py).

A tree is a list of nodes in breadth-first order. Node i holds a drafted token and names its parent: -1 for the
root, the last fixed token, whose target distribution the forward also returns. A chain is the tree with parents
-1, 0, 1, ... . Children of one node are distinct tokens.

The walk (EAGLE-2, arXiv:2406.16858, `evaluate_posterior`; SGLang's tree sampling; SpecInfer, arXiv:2305.09781,
for the tree forward): start at the root; at each node draw the target's token y from its warped p at that node
(the same T, top-k and top-p as everywhere). If y is one of the node's children, descend to it; otherwise y ends
the round as the target's correction. At a leaf, y is the bonus token. Every emitted token is a draw from p given
the tokens before it, so the output follows the target exactly, whatever the tree is, as long as the tree was
fixed before the target's draws: it may depend on the context and the head, never on p or on the round's random
draws. This is the modified rejection test with q = 1 on each deterministic child (accept x with probability
min(1, p(x)/1) = p(x); the residual norm(max(0, p - 1[x])) is p without x). For a fixed tree it keeps, on
average, the sum over nodes of the target's probability of the path to that node. At T = 0 it is the argmax walk.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class DraftTree:
    """A proposed tree, on the device. n nodes in breadth-first order (every parent before its children)."""

    parents: torch.Tensor  # [n] long: the parent's node index, -1 for a child of the root
    depths: torch.Tensor  # [n] long: 1 for a child of the root
    head_p: torch.Tensor  # [n] float32: the head's probability of the node's token given its parent (unwarped)
    max_depth: int  # a bound on depths, known on the host (the loops below run this many times, with no sync)

    @staticmethod
    def chain(k: int, device, head_p: torch.Tensor | None = None) -> DraftTree:
        """The chain of k nodes as a tree: parents -1, 0, 1, ..."""
        idx = torch.arange(k, device=device)
        return DraftTree(idx - 1, idx + 1, head_p if head_p is not None else torch.ones(k, device=device), k)


def ancestors(parents: torch.Tensor, max_depth: int) -> torch.Tensor:
    """[n, n] bool: entry (i, j) is True where node j is node i or one of its ancestors. No host sync."""
    n = parents.shape[0]
    seen = torch.eye(n + 1, dtype=torch.bool, device=parents.device)[:n]  # column n: the root, dropped at the end
    cur = torch.where(parents >= 0, parents, n)
    up = torch.cat([parents, parents.new_full((1,), -1)])  # the parent of each node, and of the root (-1)
    for _ in range(max_depth):
        seen.scatter_(1, cur.view(-1, 1), True)
        nxt = up[cur]
        cur = torch.where(nxt >= 0, nxt, n)
    return seen[:, :n]


def tree_attention(tree: DraftTree, past: int, unseen: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's float 4D mask [1, 1, q, kv] and position ids [1, q] for a forward over `unseen` fixed tokens
    followed by the tree's nodes, on top of `past` cached tokens (q = unseen + n, kv = past + q exactly).

    0 where a position may attend, the dtype's minimum elsewhere: a fixed token sees the cache and the fixed tokens
    up to itself; a node sees the whole prefix, its ancestors and itself. A node's position is the prefix length
    plus its depth minus one, so each node sits where it would sit in a chain."""
    n, dev = tree.parents.shape[0], tree.parents.device
    q, prefix = unseen + n, past + unseen
    allowed = torch.zeros(q, past + q, dtype=torch.bool, device=dev)
    allowed[:, :past] = True
    allowed[:unseen, past:prefix] = torch.ones(unseen, unseen, dtype=torch.bool, device=dev).tril()
    allowed[unseen:, past:prefix] = True
    allowed[unseen:, prefix:] = ancestors(tree.parents, tree.max_depth)
    mask = torch.full((q, past + q), torch.finfo(dtype).min, dtype=dtype, device=dev).masked_fill_(allowed, 0.0)
    positions = torch.cat([torch.arange(past, prefix, device=dev), prefix - 1 + tree.depths])
    return mask.view(1, 1, q, past + q), positions.view(1, q)


@dataclass
class TreeVerdict:
    """What the walk decided. All tensors stay on the device until the round's one copy to the host."""

    on_path: torch.Tensor  # [n] bool: the nodes the target descended through
    n_accepted: torch.Tensor  # scalar long: the path's length
    end_row: torch.Tensor  # scalar long: the p row where the walk ended (0 the root, i + 1 node i)
    next_token: torch.Tensor  # scalar long: the target's draw there (a correction, or a bonus at a leaf)
    end_is_leaf: torch.Tensor  # scalar bool: the walk ended at a node without children (so next_token is a bonus)
    p_of_node: torch.Tensor  # [n] the target's p of each node's token at its parent
    p_continue: torch.Tensor  # [n + 1] the target's p of all children of each row together: its chance to go on
    draws: torch.Tensor  # [n + 1] the target's draw at every row (only the walked rows' draws are used)


def walk(tokens: torch.Tensor, tree: DraftTree, p_target: torch.Tensor, generator: torch.Generator | None,
         greedy: bool = False) -> TreeVerdict:
    """The exact walk through a tree with deterministic children, for all nodes at once, with no host sync.

    tokens [n]; p_target [n + 1, V]: row 0 at the root, row i + 1 at node i. One draw is made at every row up front
    (argmax at T = 0); the walk uses the draws of the rows it visits. Draws at rows it never visits are independent
    of the visited ones, so drawing them changes nothing in the output's distribution."""
    n = tokens.shape[0]
    assert p_target.shape[0] == n + 1 and tree.parents.shape[0] == n, (tokens.shape, p_target.shape)
    from .sampling import sample

    draws = sample(p_target, generator, greedy=greedy)  # [n + 1]
    parent_row = tree.parents + 1  # the p row of each node's parent
    match = tokens == draws[parent_row]  # the target drew this node's token at its parent
    # on the path: matched, and the parent is on the path (the root always is); settles in max_depth passes
    on_path = torch.zeros(n + 1, dtype=torch.bool, device=tokens.device)
    on_path[0] = True
    for _ in range(tree.max_depth):
        on_path[1:] = match & on_path[parent_row]
    path = on_path[1:]
    n_accepted = path.long().sum()
    # children are distinct, so the path is a chain: its deepest node is where the walk ended
    end_row = torch.where(on_path, torch.cat([tree.depths.new_zeros(1), tree.depths]), -1).argmax()
    next_token = draws.gather(0, end_row.view(1)).squeeze(0)
    has_child = torch.zeros(n + 1, dtype=torch.bool, device=tokens.device).scatter_(0, parent_row, True)
    end_is_leaf = ~has_child.gather(0, end_row.view(1)).squeeze(0)
    p_of_node = p_target[parent_row].gather(1, tokens.view(-1, 1)).squeeze(1)
    p_continue = torch.zeros(n + 1, device=tokens.device).index_add_(0, parent_row, p_of_node)
    return TreeVerdict(path, n_accepted, end_row, next_token, end_is_leaf, p_of_node, p_continue, draws)


@dataclass
class Grown:
    """The head's tree before tokens are mapped to the target's vocabulary: draft ids and the tree."""

    draft_ids: torch.Tensor  # [n] ids in the head's draft vocabulary
    tree: DraftTree


def grow(root_logits: torch.Tensor, expand, topk: int, depth: int, budget: int) -> Grown:
    """EAGLE-2's tree (Li et al. 2024, arXiv:2406.16858): expand by cumulative head probability, then rerank.

    root_logits [V_draft]: the head's logits for the first drafted position. `expand(parent_slots, draft_ids,
    visible, depth)` runs the head over one depth's frontier (topk nodes, in one call with a tree mask) and returns
    their logits [topk, V_draft]; `parent_slots` [topk] are the nodes' parents among the previous frontier (None
    at depth 1, where every parent is the root) and `visible` [topk, d * topk] says which drafted head positions
    each new one may attend to (its ancestors and itself).

    Depth 1 holds the root's top-k children. At each further depth, the top-k nodes of the previous depth by
    cumulative log-probability (the sum along the path) are expanded, each with its own top-k children. Every
    candidate of every depth then competes for the budget by the same score; a stable sort over the
    breadth-first order breaks ties towards the shallower node, and a child's score is never above its
    parent's, so the kept nodes always include each kept node's parent. Nothing here reads the target or a random
    draw: the tree depends only on the context and the head."""
    dev = root_logits.device
    logp = root_logits.float().log_softmax(-1)
    score, ids = logp.topk(topk)  # depth 1: the root's children, best first
    scores, draft_ids, parents, depths, head_p = [score], [ids], [torch.full_like(ids, -1)], [torch.ones_like(ids)], [
        score.exp()]
    frontier = torch.arange(topk, device=dev)  # global candidate indices of the current frontier
    frontier_slots = None  # their parents' slots in the previous frontier
    visible = torch.eye(topk, dtype=torch.bool, device=dev)
    offset = topk  # global index of the first candidate of the next depth
    for d in range(1, depth):
        child_logp = expand(frontier_slots, draft_ids_at(draft_ids, frontier), visible, d).float().log_softmax(-1)
        c_logp, c_ids = child_logp.topk(topk, dim=-1)  # [topk frontier, topk children]
        c_score = (torch.cat(scores)[frontier].view(-1, 1) + c_logp).reshape(-1)
        scores.append(c_score)
        draft_ids.append(c_ids.reshape(-1))
        parents.append(frontier.repeat_interleave(topk))
        depths.append(torch.full_like(c_score, d + 1, dtype=torch.long))
        head_p.append(c_logp.exp().reshape(-1))
        # the next frontier: this depth's best topk candidates (stable: ties go to the earlier one)
        best = torch.sort(c_score, descending=True, stable=True).indices[:topk]
        frontier_slots = best // topk
        frontier = offset + best
        visible = torch.cat([visible[frontier_slots], torch.eye(topk, dtype=torch.bool, device=dev)], dim=1)
        offset += topk * topk
    score, ids, parent, dep, hp = (torch.cat(x) for x in (scores, draft_ids, parents, depths, head_p))
    keep = torch.sort(score, descending=True, stable=True).indices[:budget].sort().values  # breadth-first again
    # renumber the kept parents; a parent left out would map to -2 (checked on the host after the round's copy)
    new_index = torch.full((score.shape[0] + 1,), -2, dtype=torch.long, device=dev)
    new_index[-1] = -1  # index -1 (the root) stays -1
    new_index[keep] = torch.arange(keep.shape[0], device=dev)
    return Grown(ids[keep], DraftTree(new_index[parent[keep]], dep[keep], hp[keep], depth))


def draft_ids_at(draft_ids: list[torch.Tensor], frontier: torch.Tensor) -> torch.Tensor:
    return torch.cat(draft_ids)[frontier]
