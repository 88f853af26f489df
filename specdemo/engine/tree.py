"""Draft trees: how a tree of drafted tokens is laid out, checked by the target in one forward, and walked exactly.

Owns the tree's shape (`DraftTree`), the target's tree attention (`tree_attention`), the exact walk that verifies a
tree whose children are deterministic (`walk`) and the head's EAGLE-2 tree builder (`grow`, which may prune nodes
below a cumulative head probability, so an unsure head drafts a smaller tree); and, for T > 0, the
tree whose children are drawn from the head (`sampled_plan`, `grow_sampled`, `Drawn`) with its exact walk by
recursive rejection sampling (`walk_sampled`). It does not own the loop (speculative.py), the drafter that calls
the builders (drafters.TreeDrafter) or how a tree is drawn (render.py).

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

import math
from dataclasses import dataclass

import torch


@dataclass
class DraftTree:
    """A proposed tree, on the device. n nodes in breadth-first order (every parent before its children)."""

    parents: torch.Tensor  # [n] long: the parent's node index, -1 for a child of the root
    depths: torch.Tensor  # [n] long: 1 for a child of the root
    head_p: torch.Tensor  # [n] float32: the head's probability of the node's token given its parent (unwarped)
    max_depth: int  # a bound on depths, known on the host (the loops below run this many times, with no sync)
    drawn: Drawn | None = None  # sampled children only: what they were drawn from (None: the head's top-k)
    is_chain: bool = False  # parents -1, 0, 1, ...: the target's mask is the causal one, and a rollback a crop
    copied_from: int | None = None  # nodes from this index on were grafted by prompt lookup (graft), not the head's

    @staticmethod
    def chain(k: int, device, head_p: torch.Tensor | None = None, drawn: Drawn | None = None) -> DraftTree:
        """The chain of k nodes as a tree: parents -1, 0, 1, ... (drawn: its tokens were sampled)."""
        idx = torch.arange(k, device=device)
        return DraftTree(idx - 1, idx + 1, head_p if head_p is not None else torch.ones(k, device=device), k, drawn,
                         True)


@dataclass
class Drawn:
    """How a sampled tree's children were drawn (grow_sampled; a sampled chain): what walk_sampled tests them with.
    The head's q lives on its own vocabulary (W columns, the draft vocabulary), and only the rows with children
    have one."""

    q: torch.Tensor  # [E, W] float32: the head's warped distribution at each row with children, in `rows` order
    rows: torch.Tensor  # [E] long: the p row of each (0 the root, i + 1 node i)
    cols: torch.Tensor  # [n] long: each node's token as a column of q
    ids: torch.Tensor  # [W] long: the target's token id of each column
    width: int  # the most children a row has (the walk's loop runs this often)


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
    draws: torch.Tensor  # [n + 1] the target's draw at every row (the top-k walk uses the rows it visits; the
    #                      sampled walk draws only at the row where it ended, and is -1 elsewhere)
    q_of_node: torch.Tensor  # [n] the q each node was tested with (1 for a deterministic child)
    accept_of_node: torch.Tensor  # [n] its chance to be accepted when tested: p for a deterministic child,
    #                               min(1, r/q) against the row's residual for a sampled one


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
    p_of_node = p_target[parent_row, tokens]  # not p_target[parent_row]: that copies n whole rows
    p_continue = torch.zeros(n + 1, device=tokens.device).index_add_(0, parent_row, p_of_node)
    return TreeVerdict(path, n_accepted, end_row, next_token, end_is_leaf, p_of_node, p_continue, draws,
                       torch.ones_like(p_of_node), p_of_node)


def sibling_slots(parents: torch.Tensor) -> torch.Tensor:
    """[n] long: each node's rank among its siblings in node order (0 for the first child of its parent)."""
    n = parents.shape[0]
    same = parents.view(1, n) == parents.view(n, 1)
    earlier = torch.ones(n, n, dtype=torch.bool, device=parents.device).tril(-1)
    return (same & earlier).sum(1)


def walk_sampled(tokens: torch.Tensor, tree: DraftTree, p_target: torch.Tensor, generator: torch.Generator | None
                 ) -> TreeVerdict:
    """The exact walk through a tree whose children were SAMPLED from the head (grow_sampled), with no host sync.

    Recursive rejection sampling (SpecInfer's multi-step speculative sampling, arXiv:2305.09781, with the draws
    made without replacement as in Jeon et al.'s recursive speculative decoding, arXiv:2402.14160). At a row with
    target distribution p and children c_1..c_m, drawn in that order from the head's q without replacement:
    test c_1 ~ q_1 = q against r_1 = p, accepting it with probability min(1, r_1(c_1)/q_1(c_1)); on a rejection
    go on with r_2 = norm(max(0, r_1 - q_1)) and c_2 ~ q_2 = q without c_1, renormalised; and so on. An accepted
    child is descended into; if all are rejected the row's token is drawn from the last residual (resampled), and
    at a row with no children from p itself (the bonus). Each step is the modified rejection test of a chain with
    the q that the child was really drawn from, so the row's token follows r_1 = p whatever the children are; a
    rejected child has r(c) < q(c), so it has no mass in any later residual and is never drawn again. The tree's
    shape may depend on the head's draws (which nodes are expanded), never on the target.
    p_continue is, for each row, the chance that the walk goes on to one of its children given these children.

    Work: the head's q is zero outside its own vocabulary (W columns), so the residual changes only there; outside
    it stays p times one factor per row. The loop runs on the W columns of the rows with children, in float64 (a
    peaked head leaves subnormal float32 masses once its top token is set aside); the full rows are put together
    once, for the round's draws."""
    n, drawn = tokens.shape[0], tree.drawn
    assert p_target.shape[0] == n + 1 and drawn is not None
    if tree.is_chain:
        return chain_walk(tokens, drawn, p_target, generator)
    from .sampling import sample

    dev, width, rows_e = tokens.device, max(drawn.width, 1), drawn.rows
    wide = torch.float32 if dev.type == "mps" else torch.float64
    tiny = torch.finfo(wide).tiny
    n_e = rows_e.shape[0]
    parent_row = tree.parents + 1
    node_ids = torch.arange(n, device=dev)
    row_to_e = torch.full((n + 1,), -1, dtype=torch.long, device=dev).index_copy_(0, rows_e,
                                                                                  torch.arange(n_e, device=dev))
    node_e, slot = row_to_e[parent_row], sibling_slots(tree.parents)  # each node's q row and place among siblings
    child = torch.full((n_e, width), -1, dtype=torch.long, device=dev).index_put_((node_e, slot), node_ids)
    has = child >= 0
    u = torch.rand(n_e, width, generator=generator, device=dev, dtype=wide)
    p_e = p_target.index_select(0, rows_e)  # [E, V] float32: the whole rows are only summed, never widened
    r = p_e.index_select(1, drawn.ids).to(wide)  # [E, W] the residual on the head's columns (unnormalised)
    out_mass = (p_e.sum(-1, keepdim=True, dtype=wide) - r.sum(-1, keepdim=True)).clamp_(min=0.0)  # p outside them
    out_scale = torch.ones_like(out_mass)  # the residual outside them is p times this
    q = drawn.q.to(wide)  # the head's q not yet drawn (unnormalised)
    cols = drawn.cols[child.clamp(min=0)]  # [E, width] each child's column of q
    q_cs, ratios, lives = [], [], []  # per slot [E, 1]: the child's q when drawn, its chance when tested, was it drawn
    for s in range(width):
        # every row takes the step as if its earlier children were all refused: a row that accepted one never
        # reads its residual again, and this gives each child its own chance given that it is tested
        col = cols[:, s : s + 1]
        q = q.scatter(1, cols[:, s - 1 : s], 0.0) if s else q  # q without c_1..c_{s-1}
        # what they left is summed, not taken as 1 minus their q: that cancels to 0 once they hold nearly all of it
        q_rest = q.sum(-1, keepdim=True).clamp_(min=tiny)
        q_c = q.gather(1, col) / q_rest
        live = has[:, s : s + 1] & (q_c > 0)  # a child drawn past the head's support (q = 0) was never drawn
        total = (r.sum(-1, keepdim=True) + out_mass * out_scale).clamp_(min=tiny)
        q_cs.append(q_c)
        lives.append(live)
        ratios.append(r.gather(1, col) / (total * q_c.clamp(min=tiny)))
        # refused: r <- max(0, r/|r| - q_s) on the head's columns, r/|r| outside them (where r > q: q is 0 there);
        # a row without a child here (or past its head's support) is only renormalised
        r = refused(r / total, q * (live / q_rest))
        out_scale = out_scale / total
    live, q_cs = torch.cat(lives, 1), torch.cat(q_cs, 1)
    ratio = torch.where(live, torch.cat(ratios, 1), 0.0).clamp_(max=1.0)  # [E, width] each child's chance
    ok = (u < ratio) & live
    accepted = torch.where(ok.any(1), child.gather(1, ok.long().argmax(1, keepdim=True)).view(-1), -1)  # first ok
    on_path = torch.zeros(n + 1, dtype=torch.bool, device=dev)
    on_path[0] = True
    accepted_at = torch.full((n + 1,), -1, dtype=torch.long, device=dev).index_copy_(0, rows_e, accepted)
    for _ in range(tree.max_depth):
        on_path[1:] = (accepted_at[parent_row] == node_ids) & on_path[parent_row]
    path = on_path[1:]
    end_row = torch.where(on_path, torch.cat([tree.depths.new_zeros(1), tree.depths]), -1).argmax()
    # the one draw the round needs, at the row where the walk ended: from its last residual, put together whole
    # (p outside the head's columns, times the row's factor), or from p at a row without children (the bonus);
    # where rounding left a residual no mass at all, p, as sampling.residual does
    e = row_to_e.gather(0, end_row.view(1))
    end_is_leaf = (e < 0).squeeze(0)
    e = e.clamp(min=0)
    p_end = p_target.index_select(0, end_row.view(1)).to(wide)  # p at the end row (row e of p_e, if it has children)
    res = (p_end * out_scale.index_select(0, e)).index_copy_(1, drawn.ids, r.index_select(0, e))
    row = torch.where(end_is_leaf | (res.sum() <= 0), p_end, res)
    next_token = sample(row, generator).squeeze(0)
    p_of_node = p_target[parent_row, tokens]  # not p_target[parent_row]: that copies n whole rows
    p_go = torch.zeros(n + 1, device=dev, dtype=wide).index_copy_(0, rows_e, 1.0 - (1.0 - ratio).prod(1))
    draws = torch.full((n + 1,), -1, dtype=torch.long, device=dev).scatter_(0, end_row.view(1), next_token.view(1))
    return TreeVerdict(path, path.long().sum(), end_row, next_token, end_is_leaf, p_of_node, p_go.float(), draws,
                       q_cs[node_e, slot].float(), ratio[node_e, slot].float())


def chain_walk(tokens: torch.Tensor, drawn: Drawn, p_target: torch.Tensor, generator: torch.Generator | None
               ) -> TreeVerdict:
    """A sampled chain (one child a row, rows 0..k-1) is walked by the chain's own modified rejection test,
    sampling.verify: walk_sampled with one child a row is that test, and verify does it in fewer operations."""
    from .sampling import verify

    k = tokens.shape[0]
    assert drawn.rows.shape[0] == k, "a sampled chain has a q row for each of its k nodes' parents"
    q_full = torch.zeros(k, p_target.shape[1], device=p_target.device).index_copy_(1, drawn.ids, drawn.q)
    v = verify(tokens, q_full, p_target, generator)
    end_row = v.n_accepted
    draws = torch.full((k + 1,), -1, dtype=torch.long, device=tokens.device).scatter_(0, end_row.view(1),
                                                                                      v.next_token.view(1))
    return TreeVerdict(torch.arange(k, device=tokens.device) < end_row, v.n_accepted, end_row, v.next_token,
                       end_row == k, v.p_of_draft, torch.cat([v.accept_prob, v.accept_prob.new_zeros(1)]), draws,
                       v.q_of_draft, v.accept_prob)


def refused(r: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """What is left of a row's normalised residual r on the head's columns once a child drawn from q is refused:
    max(0, r - q) (walk_sampled renormalises it with the rest of the row)."""
    return (r - q).clamp(min=0.0)


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


def gumbel_top(logq: torch.Tensor, m: int, generator: torch.Generator | None) -> torch.Tensor:
    """m draws without replacement from exp(logq) per row [rows, V] -> [rows, m], in draw order (Gumbel-top-k:
    Kool et al. 2019, arXiv:1903.06059). The noise is drawn in float64, so a uniform of exactly 0 is negligible."""
    u = torch.rand(logq.shape, generator=generator, device=logq.device, dtype=torch.float64)
    keys = logq.double() - (-u.log()).log()
    return keys.topk(m, dim=-1).indices


@dataclass
class Grown:
    """The head's tree before tokens are mapped to the target's vocabulary: draft ids and the tree."""

    draft_ids: torch.Tensor  # [n] ids in the head's draft vocabulary
    tree: DraftTree


def grow(root_logits: torch.Tensor, expand, topk: int, depth: int, budget: int, prune_below: float = 0.0,
         log_q=None) -> Grown:
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
    draw: the tree depends only on the context and the head.

    prune_below > 0 also drops every node whose cumulative head probability is below it (the root's likeliest
    child always stays), and stops expanding once no frontier node reaches it, since no descendant could: an unsure
    head then drafts a smaller, shallower tree, which costs fewer head calls and a smaller verify. Deciding to stop
    reads one number per depth on the host: free on a CPU, a sync on a GPU.

    log_q (logits [rows, V_draft] -> log-probabilities; None: the head's log-softmax) is what the children are
    chosen and the nodes scored by, for example the head's q warped by the run's T, top-k and top-p
    (TreeDrafter.warped_scores). head_p stays the head's own softmax either way."""
    dev = root_logits.device
    own = log_q is None

    def head_probs(logits, logq, ids):  # the head's own probabilities of the chosen ids
        return logq.gather(-1, ids).exp() if own else logits.softmax(-1).gather(-1, ids)

    log_q = log_q or (lambda logits: logits.log_softmax(-1))
    root = root_logits.float().view(1, -1)
    logp = log_q(root)
    score, ids = (x[0] for x in logp.topk(topk))  # depth 1: the root's children, best first
    scores, draft_ids, parents, depths, head_p = [score], [ids], [torch.full_like(ids, -1)], [torch.ones_like(ids)], [
        head_probs(root, logp, ids.view(1, -1))[0]]
    frontier = torch.arange(topk, device=dev)  # global candidate indices of the current frontier
    frontier_slots = None  # their parents' slots in the previous frontier
    visible = torch.eye(topk, dtype=torch.bool, device=dev)
    offset = topk  # global index of the first candidate of the next depth
    floor = math.log(prune_below) if prune_below > 0 else None
    reached = 1
    for d in range(1, depth):
        frontier_score = torch.cat(scores)[frontier]
        if floor is not None and float(frontier_score.max()) < floor:
            break  # no child of this frontier can reach prune_below
        child_logits = expand(frontier_slots, draft_ids_at(draft_ids, frontier), visible, d).float()
        child_logq = log_q(child_logits)
        c_logp, c_ids = child_logq.topk(topk, dim=-1)  # [topk frontier, topk children]
        c_score = (frontier_score.view(-1, 1) + c_logp).reshape(-1)
        scores.append(c_score)
        draft_ids.append(c_ids.reshape(-1))
        parents.append(frontier.repeat_interleave(topk))
        depths.append(torch.full_like(c_score, d + 1, dtype=torch.long))
        head_p.append(head_probs(child_logits, child_logq, c_ids).reshape(-1))
        reached = d + 1
        # the next frontier: this depth's best topk candidates (stable: ties go to the earlier one)
        best = torch.sort(c_score, descending=True, stable=True).indices[:topk]
        frontier_slots = best // topk
        frontier = offset + best
        visible = torch.cat([visible[frontier_slots], torch.eye(topk, dtype=torch.bool, device=dev)], dim=1)
        offset += topk * topk
    score, ids, parent, dep, hp = (torch.cat(x) for x in (scores, draft_ids, parents, depths, head_p))
    order = torch.sort(score, descending=True, stable=True).indices[:budget]
    if floor is not None:  # the best node (the root's likeliest child) always stays
        order = order[: max(1, int((score[order] >= floor).sum()))]
    keep = order.sort().values  # breadth-first again
    # renumber the kept parents; a parent left out would map to -2 (checked on the host after the round's copy)
    new_index = torch.full((score.shape[0] + 1,), -2, dtype=torch.long, device=dev)
    new_index[-1] = -1  # index -1 (the root) stays -1
    new_index[keep] = torch.arange(keep.shape[0], device=dev)
    return Grown(ids[keep], DraftTree(new_index[parent[keep]], dep[keep], hp[keep], reached))


def draft_ids_at(draft_ids: list[torch.Tensor], frontier: torch.Tensor) -> torch.Tensor:
    return torch.cat(draft_ids)[frontier]


def grow_sampled(root_logits: torch.Tensor, expand, plan: list[tuple[int, int]], warp_q,
                 generator: torch.Generator | None, draft_to_target: torch.Tensor, prune_below: float = 0.0,
                 prune_children: bool = False, stop_below: float = 0.0) -> Grown:
    """A tree of SAMPLED children, for T > 0 (verified by walk_sampled): each expanded node's children are drawn
    from the head's warped q (`warp_q`: logits [rows, V_draft] -> probabilities, the run's T, top-k and top-p)
    without replacement, in draw order. `plan` (sampled_plan) says how many nodes each depth expands and how many
    children each gets; the nodes expanded are the previous depth's best by cumulative log q, which depends only
    on the head's own draws. `expand` is as for `grow`, for a frontier of any size. Every drawn child is kept.
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
    logits = root_logits.float().view(1, -1)
    q = warp_q(logits)
    kids = gumbel_top(q.log(), plan[0][1], generator)
    keep = first_draws(q, kids, q.new_zeros(1), floor, root=True).view(-1) if by_draws else None
    ids = pick(kids.view(-1), keep)
    hp = logits.softmax(-1)[0, ids]
    draft_ids, parents, depths, head_p = [ids], [torch.full_like(ids, -1)], [torch.ones_like(ids)], [hp]
    scores = [q[0, ids].log()]
    q_of_rows, expanded = [q], [torch.full((1,), -1, device=dev, dtype=torch.long)]
    level = torch.arange(ids.shape[0], device=dev)  # the last depth's nodes (global indices)
    level_slot, visible, offset = None, None, ids.shape[0]  # each level node's parent among the last fed nodes
    reached, width = 1, plan[0][1]
    for d, (m, c) in enumerate(plan[1:], start=1):
        level_scores = torch.cat(scores)[level]
        best = torch.sort(level_scores, descending=True, stable=True).indices[:m]
        if floor is not None:
            m = int((level_scores[best] >= floor).sum())
            if m == 0:
                break  # no node of this depth is likely enough to expand, so no deeper node would be either
            best = best[:m]
        chosen = level[best]
        slots = None if level_slot is None else level_slot[best]
        eye = torch.eye(m, dtype=torch.bool, device=dev)
        visible = eye if slots is None else torch.cat([visible[slots], eye], dim=1)
        logits = expand(slots, torch.cat(draft_ids)[chosen], visible, d).float()
        q = warp_q(logits)
        kids = gumbel_top(q.log(), c, generator)  # [m, c]
        parent_score = torch.cat(scores)[chosen]
        keep = first_draws(q, kids, parent_score, floor).view(-1) if by_draws else None
        if stop_below > 0:  # an unsure node gets no children (the chain's confidence stop)
            sure = (q.max(-1).values >= stop_below).repeat_interleave(c)
            keep = sure if keep is None else keep & sure
        n_kept = m * c if keep is None else int(keep.sum())
        if n_kept == 0:
            break  # every expanded node's first draw fell below prune_below: the tree ends here
        draft_ids.append(pick(kids.reshape(-1), keep))
        parents.append(pick(chosen.repeat_interleave(c), keep))
        depths.append(torch.full((n_kept,), d + 1, dtype=torch.long, device=dev))
        head_p.append(pick(logits.softmax(-1).gather(1, kids).reshape(-1), keep))
        scores.append(pick((parent_score.view(-1, 1) + q.gather(1, kids).log()).reshape(-1), keep))
        rows = None if keep is None else keep.view(m, c)[:, 0]  # the rows that got children (walk_sampled's rows)
        q_of_rows.append(pick(q, rows))
        expanded.append(pick(chosen, rows))
        level = offset + torch.arange(n_kept, device=dev)
        level_slot = pick(torch.arange(m, device=dev).repeat_interleave(c), keep)
        offset += n_kept
        reached, width = d + 1, max(width, c)
    ids = torch.cat(draft_ids)
    drawn = Drawn(torch.cat(q_of_rows), torch.cat(expanded) + 1, ids, draft_to_target, width)
    return Grown(ids, DraftTree(torch.cat(parents), torch.cat(depths), torch.cat(head_p), reached, drawn))


def graft(tokens: list[int], parents: list[int], depths: list[int], head_p: list[float], copy: list[int],
          room: int) -> int:
    """Graft a copied continuation (prompt lookup: what followed the latest earlier occurrence of the last few
    tokens) onto a top-k tree, in place, as one more branch from the root: follow the tree while its nodes spell
    `copy`, then append the rest as a chain (head probability 0: the head did not propose them), at most `room`
    new nodes. Returns how many were added.

    Exact for the top-k walk (tree.walk): the tree stays fixed before the target reads it (the copy depends on the
    fixed tokens only, never on p or a random draw), a node's children stay distinct (a token is appended under a
    node only where no child has it), and every parent comes before its children. It is not for sampled children,
    whose walk needs every child to be a draw from the head's q."""
    node, added = -1, 0
    for t in copy:
        kid = next((i for i, a in enumerate(parents) if a == node and tokens[i] == t), None)
        if kid is None:
            if added == room:
                break
            tokens.append(t)
            parents.append(node)
            depths.append(depths[node] + 1 if node >= 0 else 1)
            head_p.append(0.0)
            kid, added = len(tokens) - 1, added + 1
        node = kid
    return added


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
