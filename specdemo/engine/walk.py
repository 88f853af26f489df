"""The target's verdict on a draft tree: the exact walks that decide which of its nodes the target keeps.

Owns the verdict (`TreeVerdict`), the walk through a tree whose children are deterministic, the head's top-k
(`walk`), and the walk through a tree whose children were drawn from the head, by recursive rejection sampling
(`walk_sampled`; a sampled chain goes to `chain_walk`). It does not own the tree's shape, attention mask or growth
(tree.py), the drafter that proposes trees (tree_drafter.py), the loop that runs the target's forward and calls
these (speculative.py), or how a verdict reads on the page (story.py).

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

from .sampling import sample, uniforms, verify, wide_dtype
from .tree import DraftTree, Drawn


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
         greedy: bool = False, u: torch.Tensor | None = None) -> TreeVerdict:
    """The exact walk through a tree with deterministic children, for all nodes at once, with no host sync.

    tokens [n]; p_target [n + 1, V]: row 0 at the root, row i + 1 at node i. One draw is made at every row up front
    (argmax at T = 0); the walk uses the draws of the rows it visits. Draws at rows it never visits are independent
    of the visited ones, so drawing them changes nothing in the output's distribution. u: those draws' uniforms
    [n + 1, 1] (sampling.uniforms), drawn before a captured replay (judge_graph.TreeJudge); None draws them here."""
    n = tokens.shape[0]
    assert p_target.shape[0] == n + 1 and tree.parents.shape[0] == n, (tokens.shape, p_target.shape)
    draws = sample(p_target, generator, greedy=greedy, u=u)  # [n + 1]
    parent_row = tree.parents + 1  # the p row of each node's parent
    match = tokens == draws[parent_row]  # the target drew this node's token at its parent
    real = None if tree.size is None else torch.arange(n, device=tokens.device) < tree.size  # not the padding
    if real is not None:
        match &= real
    # on the path: matched, and the parent is on the path (the root always is); settles in max_depth passes
    on_path = torch.arange(n + 1, device=tokens.device) == 0  # the root (not `[0] = True`: a host scalar's copy)
    for _ in range(tree.max_depth):
        on_path[1:] = match & on_path[parent_row]
    path = on_path[1:]
    n_accepted = path.long().sum()
    end_row = path_end(on_path, tree)
    next_token = draws.gather(0, end_row.view(1)).squeeze(0)
    has_child = torch.zeros(n + 1, dtype=torch.bool, device=tokens.device).scatter_(0, parent_row, True)
    end_is_leaf = ~has_child.gather(0, end_row.view(1)).squeeze(0)
    p_of_node = p_target[parent_row, tokens]  # not p_target[parent_row]: that copies n whole rows
    p_continue = torch.zeros(n + 1, device=tokens.device).index_add_(
        0, parent_row, p_of_node if real is None else p_of_node * real)  # (a padding node's parent is the root,
    #                                                                       which always has a real child)
    return TreeVerdict(path, n_accepted, end_row, next_token, end_is_leaf, p_of_node, p_continue, draws,
                       torch.ones_like(p_of_node), p_of_node)


def path_end(on_path: torch.Tensor, tree: DraftTree) -> torch.Tensor:
    """The p row where the walk ended: children are distinct, so the path is a chain, and it ends at its deepest."""
    return torch.where(on_path, torch.cat([tree.depths.new_zeros(1), tree.depths]), -1).argmax()


def sibling_slots(parents: torch.Tensor) -> torch.Tensor:
    """[n] long: each node's rank among its siblings in node order (0 for the first child of its parent)."""
    n = parents.shape[0]
    same = parents.view(1, n) == parents.view(n, 1)
    earlier = torch.ones(n, n, dtype=torch.bool, device=parents.device).tril(-1)
    return (same & earlier).sum(1)


def walk_sampled(tokens: torch.Tensor, tree: DraftTree, p_target: torch.Tensor, generator: torch.Generator | None,
                 u: tuple[torch.Tensor, torch.Tensor] | None = None) -> TreeVerdict:
    """The exact walk through a tree whose children were SAMPLED from the head (sampled_tree.grow_sampled), with no
    host sync.

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
    once, for the round's draws.

    u: the walk's uniforms (sampled_uniforms: the tests' and the end draw's); None takes the ones the tree's
    growth drew with its own (Drawn.u, sampled_tree.plan_uniforms), or draws them here. A tree grown in a graph
    (sampled_graph.py) comes padded: nodes past tree.size, and q rows whose `rows` is -1 (rows its plan could have
    expanded and did not), take no part."""
    n, drawn = tokens.shape[0], tree.drawn
    assert p_target.shape[0] == n + 1 and drawn is not None
    if tree.is_chain:
        return chain_walk(tokens, drawn, p_target, generator)
    dev, width, rows_e = tokens.device, max(drawn.width, 1), drawn.rows
    wide = wide_dtype(dev)
    # 1. each row's children by slot (their order of drawing), and the uniforms that test them
    parent_row = tree.parents + 1
    node_ids = torch.arange(n, device=dev)
    at_rows = torch.where(rows_e >= 0, rows_e, n + 1)  # a row the plan did not expand writes past the tree's rows
    row_to_e, node_e, slot, child = children_by_row(tree, at_rows, width, node_ids, parent_row)
    if u is None:
        u = drawn.u if drawn.u is not None else sampled_uniforms(drawn, generator, dev)
    u_rows, u_end = u
    u_rows = u_rows if drawn.slots is None else u_rows.index_select(0, drawn.slots)
    # 2. each child's chance against its row's residual, slot by slot
    ratio, live, q_cs, r, out_scale = residual_tests(p_target, drawn, child, wide)
    # 3. each row accepts its first child that passes; the path follows the accepted children from the root
    ok = (u_rows < ratio) & live
    accepted = torch.where(ok.any(1), child.gather(1, ok.long().argmax(1, keepdim=True)).view(-1), -1)  # first ok
    on_path = torch.arange(n + 1, device=dev) == 0  # the root
    accepted_at = torch.full((n + 2,), -1, dtype=torch.long, device=dev).index_copy_(0, at_rows, accepted)
    for _ in range(tree.max_depth):
        on_path[1:] = (accepted_at[parent_row] == node_ids) & on_path[parent_row]
    path = on_path[1:]
    end_row = path_end(on_path, tree)
    # 4. the round's one draw, at the row where the walk ended
    end_is_leaf, next_token = draw_at_end(p_target, end_row, row_to_e, drawn, r, out_scale, u_end)
    p_of_node = p_target[parent_row, tokens]  # not p_target[parent_row]: that copies n whole rows
    p_go = torch.zeros(n + 2, device=dev, dtype=wide).index_copy_(0, at_rows, 1.0 - (1.0 - ratio).prod(1))[: n + 1]
    draws = torch.full((n + 1,), -1, dtype=torch.long, device=dev).scatter_(0, end_row.view(1), next_token.view(1))
    node_e = node_e.clamp(max=rows_e.shape[0] - 1)  # the padding's (its numbers are never read)
    return TreeVerdict(path, path.long().sum(), end_row, next_token, end_is_leaf, p_of_node, p_go.float(), draws,
                       q_cs[node_e, slot].float(), ratio[node_e, slot].float())


def sampled_uniforms(drawn: Drawn, generator: torch.Generator | None, device: torch.device
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """The uniforms walk_sampled draws, in its order: one row of `width` for each q row (for a planned tree, each
    row its plan could expand: Drawn.planned), then the end draw's (sampling.uniforms)."""
    rows = drawn.planned if drawn.planned is not None else drawn.rows.shape[0]
    u_rows = torch.rand(rows, max(drawn.width, 1), generator=generator, device=device, dtype=wide_dtype(device))
    return u_rows, uniforms(1, generator, device)


def children_by_row(tree: DraftTree, at_rows: torch.Tensor, width: int, node_ids: torch.Tensor,
                    parent_row: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(row_to_e [n + 2]: each p row's q row, -1 without children, and a last entry that the q rows of at_rows [E]
    (each q row's p row, n + 1 for a row its plan did not expand) write to; node_e, slot [n]: each node's q row and
    place among its siblings; child [E, width]: the node at each q row and slot, -1 where the row has fewer). A
    padding node (past tree.size) is put in row E, which is dropped."""
    n_e, n, dev = at_rows.shape[0], tree.parents.shape[0], node_ids.device
    row_to_e = torch.full((n + 2,), -1, dtype=torch.long, device=dev).index_copy_(
        0, at_rows, torch.arange(n_e, device=dev))
    node_e, slot = row_to_e[parent_row], sibling_slots(tree.parents)  # each node's q row and place among siblings
    if tree.size is not None:
        real = node_ids < tree.size
        node_e, slot = torch.where(real, node_e, n_e), torch.where(real, slot, 0)
    child = torch.full((n_e + 1, width), -1, dtype=torch.long, device=dev).index_put_((node_e, slot), node_ids)
    return row_to_e, node_e, slot, child[:n_e]


def residual_tests(p_target: torch.Tensor, drawn: Drawn, child: torch.Tensor, wide: torch.dtype
                   ) -> tuple[torch.Tensor, ...]:
    """(ratio, live, q_cs [E, width]; r [E, W], out_scale [E, 1]): each child's chance, whether it was drawn and its
    q when drawn; the residual left once all of its row's children are refused, on the head's columns and outside."""
    rows_e, has, tiny = drawn.rows, child >= 0, torch.finfo(wide).tiny
    p_e = p_target.index_select(0, rows_e.clamp(min=0))  # [E, V] float32: the whole rows are only summed
    r = p_e.index_select(1, drawn.ids).to(wide)  # [E, W] the residual on the head's columns (unnormalised)
    out_mass = (p_e.sum(-1, keepdim=True, dtype=wide) - r.sum(-1, keepdim=True)).clamp_(min=0.0)  # p outside them
    out_scale = torch.ones_like(out_mass)  # the residual outside them is p times this
    q = drawn.q.to(wide)  # the head's q not yet drawn (unnormalised)
    cols = drawn.cols[child.clamp(min=0)]  # [E, width] each child's column of q
    q_cs, ratios, lives = [], [], []  # per slot [E, 1]: the child's q when drawn, its chance when tested, was it drawn
    for s in range(child.shape[1]):
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
    live = torch.cat(lives, 1)
    ratio = torch.where(live, torch.cat(ratios, 1), 0.0).clamp_(max=1.0)  # [E, width] each child's chance
    return ratio, live, torch.cat(q_cs, 1), r, out_scale


def draw_at_end(p_target: torch.Tensor, end_row: torch.Tensor, row_to_e: torch.Tensor, drawn: Drawn,
                r: torch.Tensor, out_scale: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(end_is_leaf, next_token): the one draw a sampled walk makes, at the row where it ended."""
    # from its last residual, put together whole (p outside the head's columns, times the row's factor), or from p
    # at a row without children (the bonus); where rounding left a residual no mass at all, p, as
    # sampling.residual does
    e = row_to_e.gather(0, end_row.view(1))
    end_is_leaf = (e < 0).squeeze(0)
    e = e.clamp(min=0)
    p_end = p_target.index_select(0, end_row.view(1)).to(r.dtype)  # p at the end row (its p_e row, with children)
    res = (p_end * out_scale.index_select(0, e)).index_copy_(1, drawn.ids, r.index_select(0, e))
    row = torch.where(end_is_leaf | (res.sum() <= 0), p_end, res)
    return end_is_leaf, sample(row, None, u=u).squeeze(0)


def chain_walk(tokens: torch.Tensor, drawn: Drawn, p_target: torch.Tensor, generator: torch.Generator | None
               ) -> TreeVerdict:
    """A sampled chain (one child a row, rows 0..k-1) is walked by the chain's own modified rejection test,
    sampling.verify: walk_sampled with one child a row is that test, and verify does it in fewer operations."""
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
