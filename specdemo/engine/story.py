"""A round as the page shows it, built on the host from the loop's one device-to-host copy: each drafted position's
numbers (p, q, min(1, p/q), r, overlap), the tokens as accepted, rejected, resampled or bonus, a tree's nodes and
path, and the inspector's top candidates. The loop (speculative.py) decides; this module only reads its verdict."""

from __future__ import annotations

from typing import NamedTuple

import torch

from specdemo.models import ModelPair

from .drafters import Proposal
from .events import Candidate, DraftPosition, Token, TreeNode
from .tree import DraftTree
from .walk import TreeVerdict


class Judged(NamedTuple):
    """A round's verdict, on the host: what step 3 of the loop hands to steps 4 and 5."""

    drafts: list[int]  # a chain's k drafts; a tree's kept path (its nodes' tokens, root first)
    n_acc: int  # how many of them the target kept
    next_tok: int  # the target's own token after them: resampled, or the bonus
    p_next: float  # its p
    path: list[int]  # the kept drafts' rows among the proposed ones (a chain: 0..n_acc-1)
    top: list  # the inspector's top candidates per verified row
    rows: tuple | None = None  # a chain: the per-draft numbers (p, q, min(1, p/q), r, overlap)
    nodes: list[TreeNode] | None = None  # a tree: every node, as the page draws it
    p_go: list[float] | None = None  # a tree: at each path step, the chance the walk went on
    leaf: bool = False  # a tree: the walk ended at a leaf (so the target's token is a bonus)
    moved: bool = False  # a tree judged in a graph, which also moved its path's rows in the target's cache


def to_host(*tensors: torch.Tensor) -> list[list[float]]:
    """Copy several small device tensors to Python lists with ONE device-to-host transfer.

    Everything travels as float32, which holds token ids exactly up to 2**24 (every vocabulary in use is smaller).
    """
    sizes = [t.numel() for t in tensors]
    flat = torch.cat([t.reshape(-1).float() for t in tensors]).tolist()
    out, i = [], 0
    for n in sizes:
        out.append(flat[i : i + n])
        i += n
    return out


def candidate_ids(p_rows: torch.Tensor, q_rows: torch.Tensor, m: int) -> torch.Tensor:
    """[rows, 2m] token ids: the top-m under p followed by the top-m under q (duplicates removed on the host)."""
    m = min(m, p_rows.shape[-1])
    if m <= 0:
        return p_rows.new_zeros((p_rows.shape[0], 0), dtype=torch.long)
    return torch.cat([p_rows.topk(m, dim=-1).indices, q_rows.topk(m, dim=-1).indices], dim=-1)


def top_candidates(pair: ModelPair, ids: list, p_vals: list, q_vals: list, width: int) -> list[list[Candidate]]:
    """Rebuild per-position candidate lists from the flat host copies, sorted by max(p, q)."""
    rows = []
    n_rows = len(ids) // width if width else 0
    for i in range(n_rows):
        seen: dict[int, Candidate] = {}
        for j in range(i * width, (i + 1) * width):
            tid = int(ids[j])
            if tid not in seen:
                seen[tid] = Candidate(tid, pair.token_text(tid), p_vals[j], q_vals[j])
        rows.append(sorted(seen.values(), key=lambda c: -max(c.p, c.q)))
    return rows


@torch.inference_mode()
def verdict_tensors(draft_tokens, q_draft, p, v, top_m: int) -> list[torch.Tensor]:
    """What a chain round's one copy carries, still on the device (so that it can be captured: judge_graph.py): the
    drafts, their per-position numbers (p, q, min(1, p/q), r, overlap), the verdict (accepted count and next
    token), the next token's p and, for the inspector, the top_m candidates per position with their p and q."""
    top_tensors = []
    if top_m > 0:
        q_padded = torch.cat([q_draft, torch.zeros_like(p[:1])])  # the bonus position has no draft distribution
        top_ids = candidate_ids(p, q_padded, top_m)
        top_tensors = [top_ids, p.gather(1, top_ids), q_padded.gather(1, top_ids)]
    return [draft_tokens, v.p_of_draft, v.q_of_draft, v.accept_prob, v.r, v.overlap,
            torch.stack([v.n_accepted, v.next_token]), p.view(-1).gather(0, v.n_accepted * p.shape[1] + v.next_token),
            *top_tensors]


def verdict_from_host(pair: ModelPair, host: list[list[float]], top_m: int, width: int) -> tuple:
    """verdict_tensors' lists, as the loop reads them: (drafts, (p, q, min(1, p/q), r, overlap), accepted count, next
    token, its p, top candidates per position); width: the candidates per row (candidate_ids)."""
    draft_list, p_x, q_x, acc, r, overlap, (n_acc, next_tok), (p_next,), *top_host = host
    top = top_candidates(pair, *top_host, width=width) if top_m > 0 else [[] for _ in range(len(draft_list) + 1)]
    return [int(t) for t in draft_list], (p_x, q_x, acc, r, overlap), int(n_acc), int(next_tok), p_next, top


def verdict_on_host(pair: ModelPair, draft_tokens, q_draft, p, v, top_m: int) -> tuple:
    """The round's one device-to-host copy of verdict_tensors, read by verdict_from_host."""
    tensors = verdict_tensors(draft_tokens, q_draft, p, v, top_m)
    width = tensors[8].shape[1] if top_m > 0 else 0
    return verdict_from_host(pair, to_host(*tensors), top_m, width)


def round_tokens(pair: ModelPair, draft_list: list[int], rows: tuple, top: list, n_acc: int, k: int,
                 new_ids: list[int], next_tok: int, p_next: float) -> tuple[list[DraftPosition], list[Token]]:
    """The round as events: every drafted position (judged or not), and the tokens it kept with their labels."""
    p_x, q_x, acc, r, overlap = rows
    positions = [
        DraftPosition(position=t + 1, token_id=tid, text=pair.token_text(tid), q=q_x[t], p=p_x[t], r=r[t],
                      accept_prob=acc[t], overlap=overlap[t], checked=t <= n_acc, accepted=t < n_acc, top=top[t])
        for t, tid in enumerate(draft_list)
    ]
    tokens = [
        Token(d.token_id, d.text, "accepted", d.position, d.p, d.q, d.r, d.accept_prob)
        for d in positions[: min(n_acc, len(new_ids))]
    ]
    if n_acc < k and len(new_ids) > n_acc:
        d = positions[n_acc]
        tokens.append(Token(d.token_id, d.text, "rejected", d.position, d.p, d.q, d.r, d.accept_prob))
        tokens.append(Token(next_tok, pair.token_text(next_tok), "resampled", n_acc + 1, p=p_next))
    elif len(new_ids) > n_acc:
        tokens.append(Token(next_tok, pair.token_text(next_tok), "bonus", k + 1, p=p_next))
    return positions, tokens


def tree_verdict_tensors(tokens: torch.Tensor, tree: DraftTree, p: torch.Tensor, v: TreeVerdict, top_m: int
                         ) -> list[torch.Tensor]:
    """What a tree round's one device-to-host copy carries: the nodes (token, parent, depth, head p, target p), the
    walk (on the path, the chance to go on, q and the chance when tested; where it ended, the target's token there,
    a leaf or not, the tree's real size; its p) and, for the inspector, the top_m under p at every row."""
    top_tensors = []
    if top_m > 0:
        top_ids = p.topk(min(top_m, p.shape[1]), dim=-1).indices
        top_tensors = [top_ids, p.gather(1, top_ids)]
    p_next = p.view(-1).gather(0, v.end_row * p.shape[1] + v.next_token)
    size = tree.size if tree.size is not None else torch.full((), tokens.numel(), device=tokens.device)
    return [tokens, tree.parents, tree.depths, tree.head_p, v.p_of_node, v.on_path, v.p_continue, v.q_of_node,
            v.accept_of_node, torch.stack([v.end_row, v.next_token, v.end_is_leaf.long(), size.long()]), p_next,
            *top_tensors]


def tree_sizes(n: int, top_m: int, vocab: int) -> list[int]:
    """The lengths of tree_verdict_tensors' lists for a tree of n nodes (a flat copy splits by them)."""
    width = min(top_m, vocab) if top_m > 0 else 0
    return [n] * 6 + [n + 1] + [n] * 2 + [4, 1] + ([(n + 1) * width] * 2 if width else [])


def tree_verdict_from_host(pair: ModelPair, host: list[list[float]], tree: DraftTree, top_m: int, width: int
                           ) -> tuple:
    """The round's verdict from the host lists of tree_verdict_tensors. Returns (nodes, path rows, p_go per path row,
    next token, its p, ended at a leaf, top candidates per p row)."""
    (ids, parents, depths, head_p, p_node, on_path, p_go, q_node, acc_node, (end_row, next_tok, leaf, n), (p_next_host,),
     *top_host) = host
    n = int(n)  # a tree grown in a graph is padded to its budget: its first n nodes are real (DraftTree.size)
    ids, parents, depths, head_p, p_node, on_path, q_node, acc_node = (
        x[:n] for x in (ids, parents, depths, head_p, p_node, on_path, q_node, acc_node))
    p_go = p_go[: n + 1]
    assert all(-1 <= a < i for i, a in enumerate(parents)), f"a tree node without its parent: {parents}"
    sampled = tree.drawn is not None
    copied_from = len(ids) if tree.copied_from is None else tree.copied_from
    nodes = [TreeNode(i, int(t), pair.token_text(int(t)), int(a), int(d), hp, pn, bool(o), qn if sampled else None, an,
                      i >= copied_from)
             for i, (t, a, d, hp, pn, o, qn, an) in enumerate(zip(ids, parents, depths, head_p, p_node, on_path,
                                                                    q_node, acc_node))]
    top = [[] for _ in range(len(nodes) + 1)]
    if top_m > 0:
        top = [[Candidate(int(c), pair.token_text(int(c)), pc, 0.0)
                for c, pc in zip(top_host[0][r * width:(r + 1) * width], top_host[1][r * width:(r + 1) * width])]
               for r in range(len(nodes) + 1)]
    path = [nd.id for nd in nodes if nd.on_path]
    return nodes, path, p_go, int(next_tok), p_next_host, bool(leaf), top


@torch.inference_mode()
def tree_verdict_on_host(pair: ModelPair, tokens: torch.Tensor, tree: DraftTree, p: torch.Tensor, v: TreeVerdict,
                         top_m: int) -> tuple:
    """A tree round's one device-to-host copy of tree_verdict_tensors, read by tree_verdict_from_host."""
    tensors = tree_verdict_tensors(tokens, tree, p, v, top_m)
    width = tensors[11].shape[1] if top_m > 0 else 0
    return tree_verdict_from_host(pair, to_host(*tensors), tree, top_m, width)


def tree_round_tokens(pair: ModelPair, nodes: list[TreeNode], path: list[int], p_go: list[float], top: list,
                      new_ids: list[int], next_tok: int, p_next: float, leaf: bool
                      ) -> tuple[list[DraftPosition], list[Token]]:
    """A tree round as events. The positions are the path's nodes (accepted) and, where the walk ended at a node
    with children, the head's likeliest child there (judged and refused: the target drew another token). A node's
    q is its head probability; its accept_prob is its chance to be kept when tested (p for a deterministic child,
    min(1, r/q) for a sampled one); overlap is the chance the walk goes on from its parent to one of its
    children."""
    rows = [0] + [i + 1 for i in path]  # the p rows the walk visited
    positions = []
    for t, i in enumerate(path):
        nd = nodes[i]
        positions.append(DraftPosition(t + 1, nd.token_id, nd.text, nd.head_p, nd.p, 0.0, nd.accept_prob,
                                       p_go[rows[t]], True, True, top[rows[t]]))
    end = path[-1] if path else -1
    children = [nd for nd in nodes if nd.parent == end]
    if not leaf and children:
        best = max(children, key=lambda nd: nd.head_p)
        positions.append(DraftPosition(len(path) + 1, best.token_id, best.text, best.head_p, best.p, 0.0,
                                       best.accept_prob, p_go[rows[-1]], True, False, top[rows[-1]]))
    n_acc = len(path)
    tokens = [Token(d.token_id, d.text, "accepted", d.position, d.p, d.q, None, d.accept_prob)
              for d in positions[: min(n_acc, len(new_ids))]]
    if len(new_ids) > n_acc:
        if not leaf and children:
            refused = positions[n_acc]
            tokens.append(Token(refused.token_id, refused.text, "rejected", refused.position, refused.p, refused.q,
                                None, refused.accept_prob))
        tokens.append(Token(next_tok, pair.token_text(next_tok), "bonus" if leaf else "resampled", n_acc + 1,
                            p=p_next))
    return positions, tokens


def round_story(pair: ModelPair, proposal: Proposal, judged: Judged, new_ids: list[int], stream) -> tuple:
    """Step 5: what the page shows of the round: each drafted position's numbers, the tokens as accepted, rejected,
    resampled or bonus (the kept ones with the text they add to the output), and the bonus position's candidates."""
    j, k = judged, proposal.k
    if proposal.tree is None:
        positions, tokens = round_tokens(pair, j.drafts, j.rows, j.top, j.n_acc, k, new_ids, j.next_tok, j.p_next)
        bonus_top = j.top[k] if j.n_acc == k else []
    else:
        positions, tokens = tree_round_tokens(pair, j.nodes, j.path, j.p_go, j.top, new_ids, j.next_tok, j.p_next,
                                              j.leaf)
        bonus_top = j.top[j.path[-1] + 1 if j.path else 0] if j.leaf else []
    for t in tokens:  # the kept ones, in order, take the text they add to the output
        if t.label != "rejected":
            t.text = stream.push(t.token_id)
    return positions, tokens, bonus_top


