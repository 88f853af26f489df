"""Draft trees: how a tree of drafted tokens is laid out, masked for the target's one forward, and grown.

Owns the tree's shape (`DraftTree`, and `Drawn` for sampled children), the target's tree attention
(`tree_attention`) and the growth of a tree from the head: EAGLE-2's tree of the head's top-k children (`grow`,
which may prune nodes below a cumulative head probability, so an unsure head drafts a smaller tree), the tree whose
children are drawn from the head for T > 0 grows in sampled_tree.py, and the branch that prompt lookup grafts onto a
top-k tree (`graft`). It does not own the target's walk through a tree (walk.py), the drafter that calls the
builders (tree_drafter.TreeDrafter), the loop (speculative.py) or how a tree is drawn (app/tree_view.py).

A tree is a list of nodes in breadth-first order. Node i holds a drafted token and names its parent: -1 for the
root, the last fixed token, whose target distribution the forward also returns. A chain is the tree with parents
-1, 0, 1, ... . Children of one node are distinct tokens. A tree must be fixed before the target's draws: it may
depend on the context and the head (and the head's own draws), never on the target's p or the round's random
draws, which is what keeps the walk exact (walk.py).
"""

from __future__ import annotations

import functools
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
    # a tree grown in a captured graph (tree_graph.py) has a fixed number of nodes: the first `size` (a device
    # scalar) are real, the rest pad it (parents -1, depth 1) and are never on the walk's path; None: all are real
    size: torch.Tensor | None = None
    packed: torch.Tensor | None = None  # grown in a graph: its tokens, parents, depths, head p, size and a 1 in one
    #                                     float buffer, as judge_graph.tree_pack lays them out for the verdict's graph

    @staticmethod
    def chain(k: int, device, head_p: torch.Tensor | None = None, drawn: Drawn | None = None) -> DraftTree:
        """The chain of k nodes as a tree: parents -1, 0, 1, ... (drawn: its tokens were sampled)."""
        idx = torch.arange(k, device=device)
        return DraftTree(idx - 1, idx + 1, head_p if head_p is not None else torch.ones(k, device=device), k, drawn,
                         True)


@dataclass
class Drawn:
    """How a sampled tree's children were drawn (grow_sampled; a sampled chain): what walk.walk_sampled tests
    them with. The head's q lives on its own vocabulary (W columns, the draft vocabulary), and only the rows with
    children have one."""

    q: torch.Tensor  # [E, W] float32: the head's warped distribution at each row with children, in `rows` order
    rows: torch.Tensor  # [E] long: the p row of each (0 the root, i + 1 node i)
    cols: torch.Tensor  # [n] long: each node's token as a column of q
    ids: torch.Tensor  # [W] long: the target's token id of each column
    width: int  # the most children a row has or, for a planned tree, could have (the walk's loop runs this often)
    # a tree grown from a plan (sampled_plan): its walk draws one row of uniforms for each row the plan could
    # expand (`planned` of them, whether or not it was), and q row e takes the row of its place `slots[e]` in the
    # plan, so the draws' shapes never depend on what the head drew (judge_graph captures them); None: one a q row
    slots: torch.Tensor | None = None
    planned: int | None = None
    u: tuple[torch.Tensor, torch.Tensor] | None = None  # the walk's uniforms, drawn with the growth's (plan_parts)
    owner: object | None = None  # grown in a graph: the graphs whose buffers these are (their verdicts go with them)


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


class TreeForward:
    """What the target's forward over `unseen` fixed tokens and a tree's nodes needs of the tree: the whole mask and
    positions (tree_attention), or each fed row's parent among the fed rows, from which a captured forward makes
    them itself (models/static_parts.tree_made). A forward takes whichever it can use; nothing is built before."""

    def __init__(self, tree: DraftTree, past: int, unseen: int, dtype: torch.dtype):
        self.tree, self.past, self.unseen, self.dtype = tree, past, unseen, dtype

    def attention(self) -> tuple[torch.Tensor, torch.Tensor]:
        return tree_attention(self.tree, self.past, self.unseen, self.dtype)

    def parent_rows(self, width: int) -> torch.Tensor:
        """[width] long, for a forward of `width` >= unseen + n rows: a fixed token's parent is the one before it (-1
        for the first: it sees the cache), a node's is its parent node's row, or the last fixed token's for a child
        of the root; the padding rows after them make a chain."""
        parents, u = self.tree.parents, self.unseen
        head, tail = row_ends(u, parents.shape[0], width, parents.device)
        return torch.cat([head, parents + u, tail])


@functools.lru_cache(maxsize=64)
def row_ends(unseen: int, n: int, width: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """TreeForward.parent_rows' fixed parts, made once per shape: the fixed tokens' chain and the padding's."""
    return (torch.arange(-1, unseen - 1, device=device), torch.arange(unseen + n - 1, width - 1, device=device))


@dataclass
class Grown:
    """The head's tree before tokens are mapped to the target's vocabulary: draft ids and the tree."""

    draft_ids: torch.Tensor  # [n] ids in the head's draft vocabulary
    tree: DraftTree


@dataclass
class Nodes:
    """A tree being grown, one entry per depth: its nodes' draft ids, parents (as places in the breadth-first
    order of all the nodes so far, -1 the root), depths, head probabilities and cumulative scores (log q)."""

    draft_ids: list[torch.Tensor]
    parents: list[torch.Tensor]
    depths: list[torch.Tensor]
    head_p: list[torch.Tensor]
    scores: list[torch.Tensor]

    def add(self, draft_ids, parents, depths, head_p, scores) -> None:
        """Append one depth's nodes."""
        self.draft_ids.append(draft_ids)
        self.parents.append(parents)
        self.depths.append(depths)
        self.head_p.append(head_p)
        self.scores.append(scores)


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
    candidate of every depth then competes for the budget by the same score (`rerank`). Nothing here reads the
    target or a random draw: the tree depends only on the context and the head.

    prune_below > 0 also drops every node whose cumulative head probability is below it (the root's likeliest
    child always stays), and stops expanding once no frontier node reaches it, since no descendant could: an unsure
    head then drafts a smaller, shallower tree, which costs fewer head calls and a smaller verify. Deciding to stop
    reads one number per depth on the host: free on a CPU, a sync on a GPU.

    log_q (logits [rows, V_draft] -> log-probabilities; None: the head's log-softmax) is what the children are
    chosen and the nodes scored by, for example the head's q warped by the run's T, top-k and top-p
    (TreeDrafter.warped_scores). head_p stays the head's own softmax either way."""
    dev, own = root_logits.device, log_q is None
    log_q = log_q or (lambda logits: logits.log_softmax(-1))
    floor = math.log(prune_below) if prune_below > 0 else None
    # 1. depth 1: the root's top-k children, best first
    root = root_logits.float().view(1, -1)
    logp = log_q(root)
    score, ids = (x[0] for x in logp.topk(topk))
    nodes = Nodes([ids], [torch.full_like(ids, -1)], [torch.ones_like(ids)],
                  [head_probs(root, logp, ids.view(1, -1), own)[0]], [score])
    frontier = torch.arange(topk, device=dev)  # global candidate indices of the current frontier
    frontier_slots = None  # their parents' slots in the previous frontier
    visible = torch.eye(topk, dtype=torch.bool, device=dev)
    offset, reached = topk, 1  # offset: global index of the first candidate of the next depth
    # 2. each further depth: every frontier node's own top-k children; the next frontier is the depth's best topk
    for d in range(1, depth):
        frontier_score = torch.cat(nodes.scores)[frontier]
        if floor is not None and float(frontier_score.max()) < floor:
            break  # no child of this frontier can reach prune_below
        child_logits = expand(frontier_slots, draft_ids_at(nodes.draft_ids, frontier), visible, d).float()
        child_logq = log_q(child_logits)
        c_logp, c_ids = child_logq.topk(topk, dim=-1)  # [topk frontier, topk children]
        c_score = (frontier_score.view(-1, 1) + c_logp).reshape(-1)
        nodes.add(c_ids.reshape(-1), frontier.repeat_interleave(topk),
                  torch.full_like(c_score, d + 1, dtype=torch.long),
                  head_probs(child_logits, child_logq, c_ids, own).reshape(-1), c_score)
        reached = d + 1
        frontier, frontier_slots, visible = next_frontier(c_score, visible, offset, topk)
        offset += topk * topk
    # 3. every candidate of every depth competes for the budget
    return rerank(nodes, budget, floor, reached)


def head_probs(logits: torch.Tensor, logq: torch.Tensor, ids: torch.Tensor, own: bool) -> torch.Tensor:
    """The head's own probabilities of the chosen ids (own: logq is the head's log-softmax, so read it there)."""
    return logq.gather(-1, ids).exp() if own else logits.softmax(-1).gather(-1, ids)


def draft_ids_at(draft_ids: list[torch.Tensor], frontier: torch.Tensor) -> torch.Tensor:
    """The draft ids of the candidates at these global indices."""
    return torch.cat(draft_ids)[frontier]


def next_frontier(c_score: torch.Tensor, visible: torch.Tensor, offset: int, topk: int
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(frontier, its parents' slots, visible) for the next depth: this depth's best topk candidates (a stable sort:
    ties go to the earlier one), and the drafted head positions each may attend to."""
    best = torch.sort(c_score, descending=True, stable=True).indices[:topk]
    frontier_slots = best // topk
    visible = torch.cat([visible[frontier_slots], torch.eye(topk, dtype=torch.bool, device=c_score.device)], dim=1)
    return offset + best, frontier_slots, visible


def rerank(nodes: Nodes, budget: int, floor: float | None, reached: int) -> Grown:
    """The best `budget` candidates by cumulative score, those below floor left out, back in breadth-first order.

    A stable sort over the breadth-first order breaks ties towards the shallower node, and a child's score is never
    above its parent's, so the kept nodes always include each kept node's parent."""
    score, ids, parent, dep, hp = (torch.cat(x) for x in (nodes.scores, nodes.draft_ids, nodes.parents,
                                                          nodes.depths, nodes.head_p))
    order = torch.sort(score, descending=True, stable=True).indices[:budget]
    if floor is not None:  # the best node (the root's likeliest child) always stays
        order = order[: max(1, int((score[order] >= floor).sum()))]
    keep = order.sort().values  # breadth-first again
    # renumber the kept parents; a parent left out would map to -2 (checked on the host after the round's copy)
    new_index = torch.full((score.shape[0] + 1,), -2, dtype=torch.long, device=score.device)
    new_index[-1] = -1  # index -1 (the root) stays -1
    new_index[keep] = torch.arange(keep.shape[0], device=score.device)
    return Grown(ids[keep], DraftTree(new_index[parent[keep]], dep[keep], hp[keep], reached))


def graft(tokens: list[int], parents: list[int], depths: list[int], head_p: list[float], copy: list[int],
          room: int) -> int:
    """Graft a copied continuation (prompt lookup: what followed the latest earlier occurrence of the last few
    tokens) onto a top-k tree, in place, as one more branch from the root: follow the tree while its nodes spell
    `copy`, then append the rest as a chain (head probability 0: the head did not propose them), at most `room`
    new nodes. Returns how many were added.

    Exact for the top-k walk (walk.walk): the tree stays fixed before the target reads it (the copy depends on the
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
