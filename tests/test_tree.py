"""Draft trees (EAGLE-2): the head proposes a tree, the target checks all of it in one forward, and the exact walk
keeps a path. The promises tested here:

- the walk is exact: chi-square against the enumerated target distribution on the toy pair (every tree shape) and
  on the Shakespeare pair (T = 1, and T = 0.7 with top-k 20 and top-p 0.9), with rounds that end at the root, at
  depth 1 and at a leaf; a planted lossy rule (the ratio test min(1, p/q) with the head's softmax q on its top-k
  children) is caught by the same test;
- greedy identity with the target's own greedy output for a chain (top-k 1), bushy trees and a budget of 1;
- the caches: after tree rounds the target's next logits equal a fresh forward over the kept sequence, and the
  head's cache equals a fresh pass over the target's true features;
- the tree itself: children distinct, every kept node's parent kept, nothing read from p or the round's draws;
- bad sizes are refused in one sentence, and a pair without a head refuses `tree` as it refuses `eagle`.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter

import pytest
import torch
from test_eagle import exact_joint3, random_head
from test_exactness import BUG_P, PASS_P, chi2_pvalue

import specdemo.engine.speculative as speculative
from specdemo import SamplingConfig, SpecConfig, baseline_generate, speculative_generate
from specdemo.app import tree_view
from specdemo.config import ConfigError
from specdemo.engine import captions
from specdemo.engine.sampling import residual, sample, warp
from specdemo.engine.speculative import speculative_rounds
from specdemo.engine.strategy import make_drafter
from specdemo.engine.sampled_tree import draw_children, first_draws, grow_sampled, sampled_plan
from specdemo.engine.tree import DraftTree, Drawn, ancestors, graft, grow, tree_attention
from specdemo.engine.tree_drafter import TreeDrafter, tree_shape
from specdemo.engine.walk import TreeVerdict, walk, walk_sampled
from specdemo.models import CachedLM, StrategyUnavailable

GREEDY = SamplingConfig(temperature=0.0)


@pytest.fixture
def one_thread():
    """The statistical tests run thousands of tiny forwards, where a second thread costs more than it brings (and
    on a busy machine much more): one thread for them, the process's own count restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tree_drafter(pair, head, cfg, shape, children="top", warped_scores=False):
    def make():
        drafter = TreeDrafter(head, pair.target, cfg, pair.vocab_size, pair.context_window + 1, shape, children)
        drafter.warped_scores = warped_scores
        return drafter

    return make


def tree_samples(pair, prompt_ids, cfg, shape, n, make_drafter=None, seed0=0, cells=(0, 3), children="top"
                 ) -> tuple[Counter, Counter]:
    """n runs with seeds seed0..: Counter of tokens [cells) of each run's output, and Counter of how each run's
    first tree round ended: ("root" | "inner" | "leaf", path length)."""
    counts, ends = Counter(), Counter()
    depth = shape[1]
    for seed in range(seed0, seed0 + n):
        spec = SpecConfig(max_new_tokens=depth + 2, seed=seed, top_candidates=0, strategy="tree", tree_topk=shape[0],
                          tree_depth=depth, tree_budget=shape[2], tree_children=children)
        out: list[int] = []
        first = True
        for rnd in speculative_rounds(pair, prompt_ids, cfg, spec, drafter=make_drafter() if make_drafter else None):
            if rnd.source == "tree" and first:
                leaf = any(t.label == "bonus" for t in rnd.tokens)
                ends[("leaf" if leaf else "root" if rnd.n_accepted == 0 else "inner", rnd.n_accepted)] += 1
                first = False
            out += [t.token_id for t in rnd.output]
            if len(out) >= cells[1]:
                break
        counts[tuple(out[cells[0]:cells[1]])] += 1
    return counts, ends


# ------------------------------------------------------------------------------------------------ pure functions


def test_ancestors_and_the_target_mask_of_a_small_tree():
    """Nodes 0 and 1 are children of the root, 2 and 3 of node 0, 4 of node 3 (depths 1, 1, 2, 2, 3)."""
    tree = DraftTree(torch.tensor([-1, -1, 0, 0, 3]), torch.tensor([1, 1, 2, 2, 3]), torch.ones(5), 3)
    anc = ancestors(tree.parents, tree.max_depth)
    want = torch.tensor([[1, 0, 0, 0, 0], [0, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 0, 0, 1, 0], [1, 0, 0, 1, 1]])
    assert torch.equal(anc, want.bool())
    mask, pos = tree_attention(tree, past=4, unseen=2, dtype=torch.bfloat16)
    assert mask.shape == (1, 1, 7, 11) and mask.dtype == torch.bfloat16  # kv = cached + fed, exactly
    allowed = mask[0, 0] == 0
    assert (mask[0, 0][~allowed] == torch.finfo(torch.bfloat16).min).all()
    assert allowed[:, :4].all()  # everybody sees the cache
    assert allowed[0, 4] and not allowed[0, 5] and allowed[1, 4:6].all()  # the fixed tokens are causal
    assert allowed[2:, 4:6].all() and torch.equal(allowed[2:, 6:], want.bool())
    assert pos.tolist() == [[4, 5, 6, 6, 7, 7, 8]]  # a node sits where it would sit in a chain


def test_the_walk_descends_while_the_target_draws_a_child_and_labels_the_end():
    tree = DraftTree(torch.tensor([-1, -1, 0, 0, 3]), torch.tensor([1, 1, 2, 2, 3]), torch.ones(5), 3)
    tokens = torch.tensor([10, 11, 12, 13, 14])
    V = 16

    def rows(*ids):
        return torch.nn.functional.one_hot(torch.tensor(ids), V).float()

    # root draws 10 (node 0), node 0 draws 13 (node 3), node 3 draws 14 (node 4, a leaf): bonus from node 4's row
    v = walk(tokens, tree, rows(10, 13, 0, 0, 14, 7), None, greedy=True)
    assert v.on_path.tolist() == [True, False, False, True, True] and int(v.n_accepted) == 3
    assert int(v.end_row) == 5 and int(v.next_token) == 7 and bool(v.end_is_leaf)
    # root draws 11 (node 1, a leaf): bonus; a draw at a row the walk never visits changes nothing
    v = walk(tokens, tree, rows(11, 12, 5, 0, 0, 0), None, greedy=True)
    assert v.on_path.tolist() == [False, True, False, False, False] and int(v.next_token) == 5 and bool(v.end_is_leaf)
    # node 0 draws 9, which it does not have: the target's correction, not a bonus
    v = walk(tokens, tree, rows(10, 9, 0, 0, 0, 0), None, greedy=True)
    assert int(v.n_accepted) == 1 and int(v.next_token) == 9 and not bool(v.end_is_leaf)
    # the root draws 3: the round ends at once
    v = walk(tokens, tree, rows(3, 0, 0, 0, 0, 0), None, greedy=True)
    assert int(v.n_accepted) == 0 and int(v.next_token) == 3 and not bool(v.end_is_leaf)


def test_the_walk_emits_exactly_p_at_each_depth(one_thread):
    """Fixed tree, fixed p rows: the first token follows p at the root, and the second follows p at the node it
    descended to (or the next row's p after a correction, here the root's p again: the test compares joint counts
    with the product the walk must produce)."""
    gen = torch.Generator().manual_seed(0)
    V = 6
    p_root = torch.tensor([0.3, 0.25, 0.2, 0.15, 0.1, 0.0])
    p_a = torch.tensor([0.1, 0.1, 0.5, 0.1, 0.1, 0.1])
    tree = DraftTree(torch.tensor([-1, -1, 0]), torch.tensor([1, 1, 2]), torch.ones(3), 2)
    tokens = torch.tensor([0, 1, 2])  # root children 0 and 1; node 0 has child 2
    p = torch.stack([p_root, p_a, torch.full((V,), 1 / V), torch.full((V,), 1 / V)])
    n, counts = 6000, Counter()
    for _ in range(n):
        v = walk(tokens, tree, p, gen)
        path = [int(t) for t, o in zip(tokens, v.on_path) if o]
        counts[tuple((path + [int(v.next_token)])[:2])] += 1
    exact = {}
    for x1 in range(V):  # one round: x1 from the root; x2 only if x1 is a node (its row) else the round ended
        if p_root[x1] == 0:
            continue
        if x1 in (0, 1):
            nxt = p_a if x1 == 0 else torch.full((V,), 1 / V)
            for x2 in range(V):
                if nxt[x2] > 0:
                    exact[(x1, x2)] = float(p_root[x1] * nxt[x2])
        else:
            exact[(x1,)] = float(p_root[x1])
    assert chi2_pvalue(counts, exact, n) > PASS_P


def test_grow_keeps_distinct_children_and_every_parent_and_reads_no_target():
    """The rerank never keeps a node without its parent, even where probabilities tie exactly (a child with head
    probability 1 scores as much as its parent); children of one node are distinct; growing twice gives the same
    tree (nothing random)."""
    V = 12
    torch.manual_seed(0)
    calls = []

    def expand(parent_slots, draft_ids, visible, d):
        calls.append((d, visible.shape))
        logits = torch.randn(draft_ids.shape[0], V)
        logits[0] = torch.full((V,), -1e4)
        logits[0, 5] = 1e4  # slot 0's child is certain: its score ties with its parent's
        return logits

    for topk, depth, budget in [(2, 4, 8), (3, 5, 20), (4, 3, 5), (1, 6, 6), (2, 3, 1)]:
        torch.manual_seed(1)
        root = torch.randn(V)
        calls.clear()
        g1 = grow(root, expand, topk, depth, budget)
        first_calls = list(calls)
        torch.manual_seed(1)
        g2 = grow(torch.randn(V), expand, topk, depth, budget)
        assert torch.equal(g1.draft_ids, g2.draft_ids) and torch.equal(g1.tree.parents, g2.tree.parents)
        parents, depths = g1.tree.parents.tolist(), g1.tree.depths.tolist()
        assert len(parents) == min(budget, topk + (depth - 1) * topk * topk)
        assert all(-1 <= a < i for i, a in enumerate(parents))  # every parent kept, and before its child
        assert all(depths[i] == (1 if a < 0 else depths[a] + 1) for i, a in enumerate(parents))
        for a in set(parents):
            kids = [int(g1.draft_ids[i]) for i, b in enumerate(parents) if b == a]
            assert len(kids) == len(set(kids))
        assert [c[0] for c in first_calls] == list(range(1, depth))  # one head call per depth below the first
        assert all(shape == (topk, d * topk) for d, shape in first_calls)


def test_grow_prunes_below_its_threshold_keeps_parents_and_stops_expanding():
    """prune_below: every kept node but the root's likeliest child reaches the threshold by cumulative head
    probability, every kept node's parent is kept, and no head call is made for a frontier that cannot reach it
    (a child's probability is never above its parent's); a threshold above every node leaves the best child alone,
    and no pruning is the plain tree."""
    V = 10
    calls = []

    def expand(parent_slots, draft_ids, visible, d):
        calls.append(d)
        return torch.log(torch.tensor([[0.6, 0.3, 0.1] + [0.0] * (V - 3)])).expand(draft_ids.shape[0], -1)

    root = torch.log(torch.tensor([0.5, 0.3, 0.2] + [0.0] * (V - 3)))
    plain = grow(root, expand, 2, 4, 8)
    for prune, depth_reached in ((0.0, 4), (0.1, 4), (0.2, 3), (0.4, 2), (0.6, 1)):
        calls.clear()
        g = grow(root, expand, 2, 4, 8, prune)
        parents = g.tree.parents.tolist()
        cum = []
        for i, a in enumerate(parents):
            cum.append(float(g.tree.head_p[i]) * (cum[a] if a >= 0 else 1.0))
        assert all(-1 <= a < i for i, a in enumerate(parents))
        assert cum[0] == max(cum) and all(c >= prune - 1e-6 for c in cum[1:]), (prune, cum)
        assert calls == list(range(1, depth_reached)) and g.tree.max_depth == depth_reached, (prune, calls)
        if prune == 0.0:
            assert torch.equal(g.draft_ids, plain.draft_ids) and torch.equal(g.tree.parents, plain.tree.parents)
    assert len(grow(root, expand, 2, 4, 8, 0.9).draft_ids) == 1  # nothing reaches 0.9: the best child alone


def test_grow_chooses_by_its_scorer_and_shows_the_heads_own_probabilities():
    """With log_q (TreeDrafter.warped_scores passes the head's q warped by the run's T, top-k and top-p), the
    children and the rerank follow log_q, and head_p stays the head's own softmax; without it, the head's."""
    V = 8
    torch.manual_seed(3)
    root = torch.randn(V)
    child = torch.randn(V)

    def expand(parent_slots, draft_ids, visible, d):
        return child.expand(draft_ids.shape[0], -1)

    def reversed_q(logits):  # a scorer that prefers what the head finds least likely
        return (-logits).log_softmax(-1)

    own, rev = grow(root, expand, 2, 2, 6), grow(root, expand, 2, 2, 6, log_q=reversed_q)
    first = rev.tree.depths == 1
    assert rev.draft_ids[first].tolist() == root.argsort()[:2].tolist()  # the head's two least likely
    assert own.draft_ids[own.tree.depths == 1].tolist() == root.argsort(descending=True)[:2].tolist()
    for g in (own, rev):
        want = [float((root if a < 0 else child).softmax(-1)[int(t)]) for t, a in zip(g.draft_ids, g.tree.parents)]
        assert torch.allclose(g.tree.head_p, torch.tensor(want), rtol=1e-5)
    second = rev.draft_ids[rev.tree.depths == 2]
    assert set(second.tolist()) <= set(child.argsort()[:2].tolist())


def test_graft_follows_the_tree_then_branches_off_with_the_copy():
    """tree.graft walks the tree along the copied tokens while a child has the next one, then appends the rest as a
    chain from there (head probability 0), within `room` new nodes: children stay distinct, every parent comes
    before its children, depths follow parents; a copy the tree already spells adds nothing."""
    tokens, parents, depths, head_p = [5, 6, 7, 8], [-1, -1, 0, 0], [1, 1, 2, 2], [0.6, 0.3, 0.5, 0.4]
    assert graft(tokens, parents, depths, head_p, [5, 8, 9, 4], room=8) == 2
    assert (tokens, parents, depths, head_p) == ([5, 6, 7, 8, 9, 4], [-1, -1, 0, 0, 3, 4], [1, 1, 2, 2, 3, 4],
                                                 [0.6, 0.3, 0.5, 0.4, 0.0, 0.0])
    assert graft(tokens, parents, depths, head_p, [5, 8, 9], room=8) == 0 and len(tokens) == 6
    assert graft(tokens, parents, depths, head_p, [3, 5, 7, 7], room=2) == 2  # from the root; room stops it
    assert tokens[6:] == [3, 5] and parents[6:] == [-1, 6] and depths[6:] == [1, 2]
    for node in [-1, *range(len(tokens))]:
        kids = [tokens[i] for i, a in enumerate(parents) if a == node]
        assert len(kids) == len(set(kids))
    assert all(a < i and depths[i] == (depths[a] + 1 if a >= 0 else 1) for i, a in enumerate(parents))


def test_grow_sampled_prunes_only_expansions_and_keeps_every_drawn_child():
    """With prune_below, a sampled tree expands only nodes whose cumulative q reaches it and stops where none does;
    each expanded node keeps all its drawn children (a row's children must be all its draws, in order)."""
    V = 8
    calls = []
    q_row = torch.tensor([[0.5, 0.25, 0.15, 0.1] + [0.0] * (V - 4)])

    def expand(parent_slots, draft_ids, visible, d):
        calls.append((d, draft_ids.shape[0]))
        return q_row.log().expand(draft_ids.shape[0], -1)

    for prune in (0.0, 0.05, 0.3, 0.95):
        for seed in range(20):
            calls.clear()
            gen = torch.Generator().manual_seed(seed)
            g = grow_sampled(q_row.log()[0], expand, sampled_plan(2, 4, 8), lambda x: x.softmax(-1), gen,
                             torch.arange(V), prune)
            parents, n = g.tree.parents.tolist(), len(g.draft_ids)
            q = g.tree.drawn.q
            cum = []
            for i, a in enumerate(parents):
                cum.append(float(q_row[0, g.draft_ids[i]]) * (cum[a] if a >= 0 else 1.0))
            expanded = sorted(set(a for a in parents if a >= 0))
            assert all(cum[a] >= prune for a in expanded), (prune, cum, parents)
            kids, plan, depths = Counter(parents), sampled_plan(2, 4, 8), g.tree.depths.tolist()
            assert kids[-1] == plan[0][1] and all(kids[a] == plan[depths[a]][1] for a in expanded)  # all draws kept
            assert q.shape[0] == 1 + len(expanded) and n == sum(kids.values())
            if prune == 0.95:
                assert calls == [] and n == 2  # the root's two drawn children, no deeper call
            if prune == 0.0:
                assert len(calls) == 3


# ------------------------------------------------------------------------------------------------ toy pair


@pytest.mark.parametrize("cfg,shape,warped", [(SamplingConfig(1.0), (2, 2, 4), False),
                                              (SamplingConfig(1.0), (3, 2, 6), False),
                                              (SamplingConfig(0.7, top_k=4, top_p=0.9), (2, 2, 4), False),
                                              (SamplingConfig(0.7, top_k=4, top_p=0.9), (3, 2, 6), True),
                                              (SamplingConfig(1.0), (1, 2, 2), False)],
                         ids=["T1-2x2-4", "T1-3x2-6", "T0.7-k4-p0.9-2x2-4", "T0.7-k4-p0.9-3x2-6-warped-scores",
                              "T1-chain-1x2-2"])
def test_the_tree_is_exact_on_the_toy_pair(toy_pair, cfg, shape, warped, one_thread):
    """The joint of the first three tokens (the first from the prefill round, the next from the first tree round)
    follows the target, with a random head (exactness must not depend on what the head learnt); the first tree
    round ends at the root, inside the tree and at leaves. warped: the children are chosen by the head's q warped
    with the run's T, top-k and top-p (TreeDrafter.warped_scores), where top-p can leave a node fewer likely
    tokens than children: still a tree fixed before the target is read."""
    prompt = [0, 1]
    head = random_head(toy_pair, torch.arange(toy_pair.vocab_size), scale=0.5)
    n = 1000
    counts, ends = tree_samples(toy_pair, prompt, cfg, shape, n, tree_drafter(toy_pair, head, cfg, shape,
                                                                              warped_scores=warped))
    assert {kind for kind, _ in ends} == {"root", "inner", "leaf"}, ends
    assert ends[("leaf", 2)] > 0.02 * n, ends  # walks that reached a leaf at depth 2 and took a bonus there
    assert chi2_pvalue(counts, exact_joint3(toy_pair, prompt, cfg), n) > PASS_P


def lossy_walk(tokens, tree, p_target, generator, greedy=False, q_head=None):
    """PLANTED BUG: treat the head's top-k children as if they had been sampled from its softmax q and run the
    ratio test min(1, p/q) on them, child by child, with a residual draw at the end. The children were chosen, not
    drawn, so this is lossy."""
    n = tokens.shape[0]
    path, node = [], -1
    while True:
        kids = [i for i in range(n) if int(tree.parents[i]) == node]
        row = p_target[node + 1]
        moved = False
        for i in kids:
            x = int(tokens[i])
            q = float(tree.head_p[i])
            if float(torch.rand(1, generator=generator)) < min(1.0, float(row[x]) / q):
                path.append(i)
                node, moved = i, True
                break
        if not moved:
            break
    row = p_target[node + 1]
    kids = [i for i in range(n) if int(tree.parents[i]) == node]
    q_row = torch.zeros_like(row)
    for i in kids:
        q_row[int(tokens[i])] = float(tree.head_p[i])
    nxt = sample(residual(row.view(1, -1), q_row.view(1, -1)) if kids else row.view(1, -1), generator)[0]
    on_path = torch.zeros(n, dtype=torch.bool)
    on_path[path] = True
    end_row = torch.tensor(node + 1)
    parent_row = tree.parents + 1
    p_of_node = p_target[parent_row].gather(1, tokens.view(-1, 1)).squeeze(1)
    return TreeVerdict(on_path, on_path.long().sum(), end_row, nxt, torch.tensor(not kids), p_of_node,
                       torch.zeros(n + 1), torch.zeros(n + 1, dtype=torch.long), torch.ones(n), p_of_node)


@pytest.mark.parametrize("children,prune,by_draws,stop,scale", [
    ("top", 0.05, False, False, 0.1), ("sampled", 0.15, False, False, 0.1), ("sampled", 0.1, True, False, 0.2),
    ("sampled", 0.0, False, True, 0.2)], ids=["top", "sampled", "sampled-children-pruned", "sampled-stop"])
def test_a_pruned_tree_is_exact_on_the_toy_pair(toy_pair, children, prune, by_draws, stop, scale, one_thread):
    """prune_below makes the tree's size depend on the head's probabilities (and, for sampled children, on its
    draws), never on the target: the joint of the first three tokens still follows the target. The first tree
    rounds are pruned (a milder random head than the other tests', whose near-one-hot q leaves one path at any
    threshold); with sampled children some are pruned and some whole, by the head's draws. by_draws: sampled
    children are also cut by their expected cumulative q (TreeDrafter.prune_children), so that rows keep their
    first one, two or all three draws (a slightly peakier head, where those expectations straddle 0.1). stop: the
    chain's confidence stop on sampled trees (TreeDrafter.sampled_stop): the depth-1 node that would be expanded
    gets no children where the head's q there has its top below the head's stop_below, set here to the median top
    that a first pass without the stop saw (this head's tops lie within 0.01 of each other, so no fixed number
    would keep both sides)."""
    cfg, shape, prompt = SamplingConfig(1.0), (3, 2, 6), [0, 1]
    head = random_head(toy_pair, torch.arange(toy_pair.vocab_size), scale=scale)
    head.cfg = dataclasses.replace(head.cfg, stop_below=0.0)
    sizes: Counter = Counter()
    kept_draws: Counter = Counter()  # how many children the first tree rounds' rows kept
    tops: list[float] = []  # the top of the expanded depth-1 node's q in each first tree round (drawn.q's row 1)

    def make():
        drafter = TreeDrafter(head, toy_pair.target, cfg, toy_pair.vocab_size, toy_pair.context_window + 1, shape,
                              children, prune)
        drafter.prune_children, drafter.sampled_stop = by_draws, stop
        propose = drafter.propose

        def counted(seq, k_max, gen):
            proposal = propose(seq, k_max, gen)
            if proposal.tree is not None and not drafter.counted:  # each run's first tree round
                sizes[proposal.k] += 1
                kept_draws.update(Counter(proposal.tree.parents.tolist()).values())
                drawn = proposal.tree.drawn
                if drawn is not None and drawn.q.shape[0] > 1:
                    tops.append(float(drawn.q[1].max()))
                drafter.counted = True
            return proposal

        drafter.propose, drafter.counted = counted, False
        return drafter

    if stop:  # the first pass: where this head's tops lie (stop_below 0 stops nothing)
        tree_samples(toy_pair, prompt, cfg, shape, 200, make, children=children)
        head.cfg = dataclasses.replace(head.cfg, stop_below=sorted(tops)[len(tops) // 2])
        sizes.clear()
    n = 1000
    counts, ends = tree_samples(toy_pair, prompt, cfg, shape, n, make, children=children)
    assert {kind for kind, _ in ends} == {"root", "inner", "leaf"}, ends
    if by_draws:
        assert set(kept_draws) == {1, 2, 3} and len(sizes) >= 3, (kept_draws, sizes)
    elif stop:
        assert set(sizes) == {3, 6}, sizes  # the root's three children, and sometimes three more below one
    else:
        assert 1 < min(sizes) < shape[2] and (children == "top" or max(sizes) == shape[2]), sizes
    assert chi2_pvalue(counts, exact_joint3(toy_pair, prompt, cfg), n) > PASS_P


def test_the_planted_ratio_test_on_top_k_children_is_caught(toy_pair, monkeypatch, one_thread):
    cfg = SamplingConfig(1.0)
    prompt = [0, 1]
    head = random_head(toy_pair, torch.arange(toy_pair.vocab_size), scale=0.5)
    shape = (2, 2, 4)
    monkeypatch.setattr(speculative, "walk", lossy_walk)
    n = 1000
    counts, _ = tree_samples(toy_pair, prompt, cfg, shape, n, tree_drafter(toy_pair, head, cfg, shape))
    assert chi2_pvalue(counts, exact_joint3(toy_pair, prompt, cfg), n) < BUG_P


def own_q_draws(q, kids, parent_score, floor, root=False):
    """PLANTED BUG: keep each sampled child by its OWN cumulative q, as a top-k tree keeps its children. Whether the
    s-th draw is tested then depends on what it turned out to be, so a tested child is no longer a draw from q."""
    ok = parent_score.double().view(-1, 1) + q.double().gather(1, kids).log() >= floor
    if root:
        ok[:, 0] = True
    return ok.long().cumprod(1).bool()


def decided_before_seen(first_draws) -> bool:
    """Whether `first_draws` keeps a prefix of each row's draws and decides on draw s from draws 1..s-1 alone:
    re-drawing draws s.. (any other distinct tokens) never changes which of draws 1..s are kept."""
    gen = torch.Generator().manual_seed(0)
    for trial in range(200):
        rows, vocab, c = 4, 12, 3
        q = (torch.randn(rows, vocab, generator=gen) * 2).softmax(-1)
        perm = torch.stack([torch.randperm(vocab, generator=gen) for _ in range(rows)])
        kids, score = perm[:, :c], torch.rand(rows, generator=gen).log()
        ok = first_draws(q, kids, score, math.log(0.05))
        if not torch.equal(ok, ok.long().cumprod(1).bool()):
            return False
        for s in range(c):
            other = torch.cat([kids[:, :s], perm[:, c + s:c + s + c - s]], dim=1)  # draws s.. replaced
            if not torch.equal(first_draws(q, other, score, math.log(0.05))[:, :s + 1], ok[:, :s + 1]):
                return False
    return True


def test_sampled_children_are_cut_before_they_are_seen():
    """TreeDrafter.prune_children's rule (sampled_tree.first_draws) keeps each row's first m draws with m decided
    draw by draw from the earlier draws alone, so every kept child is still a draw from q without replacement (the
    toy chi-square test above checks the joint). The planted rule that keeps a child by its own q fails the check."""
    assert decided_before_seen(first_draws)
    assert not decided_before_seen(own_q_draws)


# ------------------------------------------------------------------------------------------------ Shakespeare


@torch.inference_mode()
def next_rows(pair, prefixes: list[list[int]], cfg) -> torch.Tensor:
    """The warped target distribution after each prefix (all of one length), in one batched forward: [B, V]."""
    logits = pair.target(torch.tensor(prefixes)).logits[:, -1, : pair.vocab_size]
    return warp(logits, cfg)


@torch.inference_mode()
def exact_second_token(pair, prompt_ids, cfg) -> dict:
    """P(x2 | prompt) = sum over x1 of p(x1) p(x2 | x1): the token the first tree round emits first, whether the
    walk leaves the tree at the root or descends (every x1 in one batched forward)."""
    p1 = next_rows(pair, [prompt_ids], cfg)[0]
    x1s = [i for i in range(pair.vocab_size) if p1[i] > 0]
    marg = torch.zeros(pair.vocab_size, dtype=torch.float64)
    for start in range(0, len(x1s), 1024):
        chunk = x1s[start : start + 1024]
        marg += (p1[chunk].double().view(-1, 1) * next_rows(pair, [prompt_ids + [x] for x in chunk], cfg).double()).sum(0)
    return {(i,): float(v) for i, v in enumerate(marg.tolist()) if v > 0}


@torch.inference_mode()
def exact_three_tokens(pair, prompt_ids, cfg) -> dict:
    """P(x1, x2, x3 | prompt) by enumeration (a filtered cfg keeps the supports small)."""
    p1 = next_rows(pair, [prompt_ids], cfg)[0]
    x1s = [i for i in range(pair.vocab_size) if p1[i] > 0]
    p2 = next_rows(pair, [prompt_ids + [a] for a in x1s], cfg)
    pairs = [(a, b, float(p1[a] * p2[i, b])) for i, a in enumerate(x1s) for b in range(pair.vocab_size) if p2[i, b] > 0]
    p3 = next_rows(pair, [prompt_ids + [a, b] for a, b, _ in pairs], cfg)
    return {(a, b, c): w * float(p3[j, c]) for j, (a, b, w) in enumerate(pairs) for c in range(pair.vocab_size)
            if p3[j, c] > 0}


SHAKESPEARE_TREE = (2, 2, 4)  # two children of the root, the best two grandchildren: leaves at depths 1 and 2
# samples for the top-k tree's chi-square tests: the planted ratio test below gets p = 3e-203 at 300 over these seeds
# and underflows to 0 at 500 (measured 2026-11-25); 800 cost a minute more of CI a test on a CPU without bf16 units
SHAKESPEARE_N = 500


@pytest.mark.parametrize("cfg", [SamplingConfig(1.0), SamplingConfig(0.7, top_k=20, top_p=0.9)],
                         ids=["T1", "T0.7-k20-p0.9"])
def test_the_tree_is_exact_on_the_shakespeare_pair(pair32, cfg, one_thread):
    """With the shipped Shakespeare head (float32, so that the enumerated p and the tree forward's p agree to
    rounding): at T = 1 the first token of the first tree round follows the target's marginal (every x1
    enumerated); at T = 0.7 with top-k 20 and top-p 0.9 the joint of the first three tokens does, through walks
    that end at the root, at depth 1 and at leaves."""
    prompt_ids = pair32.encode("ROMEO:\n")
    n = SHAKESPEARE_N
    cells = (1, 2) if cfg.temperature == 1.0 else (0, 3)
    counts, ends = tree_samples(pair32, prompt_ids, cfg, SHAKESPEARE_TREE, n, cells=cells)
    assert {kind for kind, _ in ends} == {"root", "inner", "leaf"}, ends
    assert any(kind == "leaf" and depth >= 1 for kind, depth in ends), ends
    exact = exact_second_token(pair32, prompt_ids, cfg) if cells == (1, 2) else exact_three_tokens(pair32, prompt_ids,
                                                                                                       cfg)
    assert chi2_pvalue(counts, exact, n) > PASS_P


def test_the_planted_ratio_test_is_caught_on_the_shakespeare_pair(pair32, monkeypatch, one_thread):
    """The same lossy rule as on the toy pair, planted under the shipped Shakespeare head, is caught by the
    Shakespeare test's own joint of three tokens (T = 0.7, top-k 20, top-p 0.9, the same tree and seeds)."""
    cfg = SamplingConfig(0.7, top_k=20, top_p=0.9)
    prompt_ids = pair32.encode("ROMEO:\n")
    monkeypatch.setattr(speculative, "walk", lossy_walk)
    n = SHAKESPEARE_N
    counts, _ = tree_samples(pair32, prompt_ids, cfg, SHAKESPEARE_TREE, n)
    assert chi2_pvalue(counts, exact_three_tokens(pair32, prompt_ids, cfg), n) < BUG_P


# ------------------------------------------------------------------------------------------------ sampled children


def test_children_are_drawn_without_replacement_in_draw_order():
    """sampled_tree.draw_children against the exact law of successive draws without replacement: P(a, b, c) =
    q_a x q_b / (1 - q_a) x q_c / (1 - q_a - q_b), by χ² over 20,000 rows at once; a q with a token of mass 0 never
    gives it while mass is left; and where the support runs out (two tokens, three draws) the third is a token not
    drawn yet, so a row's children stay distinct."""
    q = torch.tensor([0.5, 0.25, 0.15, 0.1, 0.0])
    n = 20_000
    gen = torch.Generator().manual_seed(11)
    kids = draw_children(q.expand(n, -1), torch.rand(n, 3, generator=gen, dtype=torch.float64))
    seen = Counter(tuple(r) for r in kids.tolist())
    exact = {}
    for a in range(4):
        for b in range(4):
            for c in range(4):
                if len({a, b, c}) == 3:
                    exact[a, b, c] = float(q[a] * q[b] / (1 - q[a]) * q[c] / (1 - q[a] - q[b]))
    assert set(seen) <= set(exact) and chi2_pvalue(seen, exact, n) > PASS_P
    wrong = {k: float(q[k[0]] * q[k[1]] * q[k[2]]) for k in exact}  # draws with replacement, renormalised
    total = sum(wrong.values())
    assert chi2_pvalue(seen, {k: v / total for k, v in wrong.items()}, n) < BUG_P
    two = draw_children(torch.tensor([[0.0, 0.7, 0.3, 0.0]]).expand(200, -1),
                        torch.rand(200, 3, generator=gen, dtype=torch.float64))
    assert all(sorted(r[:2]) == [1, 2] and r[2] in (0, 3) for r in two.tolist())


def test_the_sampled_plan_reaches_its_depth_within_the_budget():
    for topk in range(1, 6):
        for depth in range(1, 7):
            for budget in range(1, 40):
                plan = sampled_plan(topk, depth, budget)
                frontier = 1
                for expanded, children in plan:
                    assert 1 <= expanded <= min(topk, frontier) and 1 <= children <= topk
                    frontier = expanded * children
                assert len(plan) == min(depth, budget) and sum(m * c for m, c in plan) <= budget
    assert sampled_plan(2, 4, 8) == [(1, 2), (2, 2), (1, 1), (1, 1)]
    assert sampled_plan(2, 4, 5) == [(1, 2), (1, 1), (1, 1), (1, 1)]  # SmolLM2's on a bf16 CPU: the chain + a spare
    assert sampled_plan(1, 4, 4) == [(1, 1)] * 4  # top-k 1: a sampled chain
    # the widest head call after the root's, which bench times in isolation
    from specdemo.bench.timing import frontier_width

    assert (frontier_width((2, 4, 5), "sampled"), frontier_width((2, 4, 8), "sampled")) == (1, 2)
    assert frontier_width((3, 5, 15), "top") == 3


def test_the_sampled_walk_emits_exactly_p_at_each_depth(one_thread):
    """Rows with three children drawn without replacement from a q whose support has only two tokens (so the third
    child lies outside it and is never tested), a row with one child, and leaves: the first emitted token follows
    p at the root and the second follows p at the node the walk went through, whatever the head's q is."""
    gen = torch.Generator().manual_seed(3)
    v = 6
    p = torch.softmax(torch.randn(5, v, generator=gen), -1)
    p[0, 5] = 0.0  # a token the target never emits, as a top-k or top-p warp leaves them
    p[0] /= p[0].sum()
    q_root = torch.tensor([0.0, 0.7, 0.3, 0.0, 0.0, 0.0])  # support {1, 2}: the third child is out of it
    q_node = torch.softmax(torch.randn(v, generator=gen), -1)
    n, hits, seconds = 6000, Counter(), Counter()
    for _ in range(n):
        kids = draw_children(q_root.view(1, -1), torch.rand(1, 3, generator=gen, dtype=torch.float64))[0]
        kid0 = draw_children(q_node.view(1, -1), torch.rand(1, 1, generator=gen, dtype=torch.float64))[0]
        tokens = torch.cat([kids, kid0])  # nodes 0..2: the root's children; node 3: the child of node 0
        drawn = Drawn(torch.stack([q_root, q_node]), torch.tensor([0, 1]), tokens, torch.arange(v), 3)
        tree = DraftTree(torch.tensor([-1, -1, -1, 0]), torch.tensor([1, 1, 1, 2]), torch.ones(4), 2, drawn)
        verdict = walk_sampled(tokens, tree, p, gen)
        path = [int(t) for t, o in zip(tokens, verdict.on_path) if o]
        out = (path + [int(verdict.next_token)])[:2]
        assert not bool(verdict.on_path[2])  # the child outside the head's support is never accepted
        hits[out[0],] += 1
        if bool(verdict.on_path[0]):  # the walk went on through node 0: the next token follows p there
            seconds[out[1],] += 1
    assert chi2_pvalue(hits, {(i,): float(p[0, i]) for i in range(v) if p[0, i] > 0}, n) > PASS_P
    m = sum(seconds.values())
    assert m > 500
    assert chi2_pvalue(seconds, {(i,): float(p[1, i]) for i in range(v)}, m) > PASS_P


def test_the_sampled_walk_reports_each_childs_chance_given_the_ones_before_it_were_refused():
    """The numbers the page shows for a sampled row (accept_of_node, q_of_node, p_continue), worked out by hand: the
    second child is tested only once the first is refused, against r_2 = norm(max(0, p - q)) with q renormalised
    without the first child, whichever child this round's draws accepted. (Until 2026-11-26 a row that accepted its
    first child scored the second against p itself: p_continue 0.733 here instead of 2/3.)"""
    p = torch.tensor([[0.1, 0.2, 0.3, 0.4, 0.0], [0.2, 0.2, 0.2, 0.2, 0.2], [0.2, 0.2, 0.2, 0.2, 0.2],
                      [0.2, 0.2, 0.2, 0.2, 0.2]])
    q_root = torch.tensor([0.5, 0.3, 0.1, 0.1, 0.0])
    tokens = torch.tensor([1, 0, 3])  # the root's children 1 then 0 (in draw order), and a child of node 0
    drawn = Drawn(torch.stack([q_root, torch.full((5,), 0.2)]), torch.tensor([0, 1]), tokens, torch.arange(5), 2)
    tree = DraftTree(torch.tensor([-1, -1, 0]), torch.tensor([1, 1, 2]), torch.ones(3), 2, drawn)
    a1 = 0.2 / 0.3  # min(1, p/q) for token 1
    r2 = (p[0] - q_root).clamp(min=0) / (p[0] - q_root).clamp(min=0).sum()  # [0, 0, 0.4, 0.6, 0]
    q2_of_0 = 0.5 / 0.7
    a2 = min(1.0, float(r2[0]) / q2_of_0)  # 0: token 0 has no residual mass left
    a3 = 1.0  # node 0's child: q = p there
    seen = set()
    for seed in range(40):
        v = walk_sampled(tokens, tree, p, torch.Generator().manual_seed(seed))
        seen.add(int(v.on_path[0]))
        assert v.accept_of_node.tolist() == pytest.approx([a1, a2, a3], abs=1e-6)
        assert v.q_of_node.tolist() == pytest.approx([0.3, q2_of_0, 0.2], abs=1e-6)
        assert v.p_continue.tolist() == pytest.approx([1 - (1 - a1) * (1 - a2), 1.0, 0.0, 0.0], abs=1e-6)
        assert not bool(v.on_path[1])  # a child with no residual mass is never accepted
    assert seen == {0, 1}  # rounds that accepted the first child and rounds that refused both


def test_a_sibling_drawn_after_a_near_certain_first_child_is_tested_with_the_q_it_was_drawn_from():
    """A head that puts all but 1e-30 of its q on one token: once that first child is set aside, the second was
    drawn from what is left, q = 1 on it. The walk sums what is left rather than taking 1 minus the first child's
    q, which cancels to 0 here (a rewrite that did so overflowed to q = inf and never accepted such a child, and
    the toy pair's chi-square test caught it). Once the first child is refused (p 0.1 against q 1), the residual
    is p without it, [0, 0.5, 0.4, 0] renormalised, so the second is accepted with chance (0.5 / 0.9) / 1 = 5/9."""
    p = torch.tensor([[0.1, 0.5, 0.4, 0.0], [0.25, 0.25, 0.25, 0.25], [0.25, 0.25, 0.25, 0.25]])
    q_root = torch.tensor([1.0, 1e-30, 0.0, 0.0])
    tokens = torch.tensor([0, 1])  # the root's children, in draw order
    drawn = Drawn(q_root.view(1, -1), torch.tensor([0]), tokens, torch.arange(4), 2)
    tree = DraftTree(torch.tensor([-1, -1]), torch.tensor([1, 1]), torch.ones(2), 1, drawn)
    r2 = (p[0] - q_root).clamp(min=0)  # [0, 0.5, 0.4, 0]: the residual once the first child is refused
    a2 = min(1.0, float(r2[1] / r2.sum()) / 1.0)
    seen = Counter()
    for seed in range(200):
        v = walk_sampled(tokens, tree, p, torch.Generator().manual_seed(seed))
        assert v.q_of_node.tolist() == pytest.approx([1.0, 1.0], abs=1e-6)
        assert v.accept_of_node.tolist() == pytest.approx([0.1, a2], abs=1e-6)
        seen[tuple(v.on_path.tolist())] += 1
    assert a2 == pytest.approx(5 / 9) and set(seen) == {(True, False), (False, True), (False, False)}, seen


SAMPLED_TOY_SHAPES = [(SamplingConfig(1.0), (2, 2, 4)), (SamplingConfig(1.0), (3, 3, 7)),
                      (SamplingConfig(0.7, top_k=4, top_p=0.9), (3, 2, 6)), (SamplingConfig(1.0), (1, 2, 2)),
                      (SamplingConfig(0.7), (2, 4, 5))]  # the last: SmolLM2's sampled tree on a bf16 CPU


@pytest.mark.parametrize("cfg,shape", SAMPLED_TOY_SHAPES, ids=["T1-2x2-4", "T1-3x3-7", "T0.7-k4-p0.9-3x2-6",
                                                               "T1-chain-1x2-2", "T0.7-2x4-5"])
def test_the_sampled_tree_is_exact_on_the_toy_pair(toy_pair, cfg, shape, one_thread):
    """Children drawn from a random head without replacement, verified by recursive rejection sampling: the joint
    of the first three tokens follows the target, through rounds that end at the root, inside and at leaves (with
    top-k 4 and top-p 0.9 a row's head support can be smaller than its three children)."""
    prompt = [0, 1]
    head = random_head(toy_pair, torch.arange(toy_pair.vocab_size), scale=0.5)
    n = 1000
    counts, ends = tree_samples(toy_pair, prompt, cfg, shape, n, tree_drafter(toy_pair, head, cfg, shape, "sampled"),
                                children="sampled")
    assert {kind for kind, _ in ends} == {"root", "inner", "leaf"}, ends
    assert chi2_pvalue(counts, exact_joint3(toy_pair, prompt, cfg), n) > PASS_P


def test_a_sampled_walk_without_the_residual_is_caught(toy_pair, monkeypatch, one_thread):
    """PLANTED BUG: test every sampled sibling against p itself and draw the round's end from p, not from the
    residual norm(max(0, r - q)) (the mistake of forgetting that a refused child changes what is left). The same
    chi-square test catches it."""
    import specdemo.engine.walk as walk_module

    cfg = SamplingConfig(1.0)
    prompt = [0, 1]
    head = random_head(toy_pair, torch.arange(toy_pair.vocab_size), scale=0.5)
    shape = (2, 2, 4)
    monkeypatch.setattr(walk_module, "refused", lambda r, q: r)
    n = 1000
    counts, _ = tree_samples(toy_pair, prompt, cfg, shape, n, tree_drafter(toy_pair, head, cfg, shape, "sampled"),
                             children="sampled")
    assert chi2_pvalue(counts, exact_joint3(toy_pair, prompt, cfg), n) < BUG_P


@pytest.mark.parametrize("cfg", [SamplingConfig(1.0), SamplingConfig(0.7, top_k=20, top_p=0.9)],
                         ids=["T1", "T0.7-k20-p0.9"])
def test_the_sampled_tree_is_exact_on_the_shakespeare_pair(pair32, cfg, one_thread):
    """As for the top-k tree, with the shipped head's children sampled: the first tree round's first token at
    T = 1, and the joint of three tokens at T = 0.7 with top-k 20 and top-p 0.9. (With this pair a refused child
    hardly changes what is drawn: the no-residual bug planted above gets only p = 0.016 here at 800 samples, and
    p > 0.05 at 500 with two other prompts or with trees (3, 2, 6) and (4, 3, 12), 2026-11-25. The toy pair's random
    head is what catches it, so these runs are sized as the top-k tree's.)"""
    prompt_ids = pair32.encode("ROMEO:\n")
    n = SHAKESPEARE_N
    cells = (1, 2) if cfg.temperature == 1.0 else (0, 3)
    counts, ends = tree_samples(pair32, prompt_ids, cfg, SHAKESPEARE_TREE, n, cells=cells, children="sampled")
    assert {kind for kind, _ in ends} >= {"inner", "leaf"}, ends
    exact = exact_second_token(pair32, prompt_ids, cfg) if cells == (1, 2) else exact_three_tokens(pair32, prompt_ids,
                                                                                                       cfg)
    assert chi2_pvalue(counts, exact, n) > PASS_P


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_tree_of_top_k_1_is_the_chain(pair32, temperature):
    """A tree with one child a node is drafted by the chain's own loop and walked by the chain's own test (at T > 0
    walk.chain_walk, sampling.verify), so with the same seed it keeps exactly the tokens of `eagle` with K = depth,
    round for round (the Shakespeare head has no confidence stop)."""
    assert pair32.head.cfg.stop_below == 0
    cfg = SamplingConfig(temperature)
    for seed, prompt in enumerate(("ROMEO:\n", "JULIET:\n")):
        chain = speculative_generate(pair32, prompt, cfg, SpecConfig(k=4, max_new_tokens=48, seed=seed,
                                                                     strategy="eagle", top_candidates=0))
        tree = speculative_generate(pair32, prompt, cfg, SpecConfig(max_new_tokens=48, seed=seed, strategy="tree",
                                                                    tree_topk=1, tree_depth=4, top_candidates=0))
        assert tree.output_ids == chain.output_ids
        assert [r.n_accepted for r in tree.rounds] == [r.n_accepted for r in chain.rounds]
        drafted = [r for r in tree.rounds if r.k]  # (the prefill round, and one at the token budget, draft nothing)
        assert len(drafted) >= 5 and all([nd.parent for nd in r.tree] == list(range(-1, r.k - 1)) for r in drafted)
        assert all((nd.q is not None) == (temperature > 0) for r in drafted for nd in r.tree)


def test_sampled_children_at_t0_are_the_top_k_walk(pair32):
    """At T = 0 "sampled" is the top-k tree (a one-hot head has one child to draw): the target's greedy output."""
    for prompt in ("ROMEO:\n", "First Citizen:\nBefore we proceed"):
        want = baseline_generate(pair32, prompt, GREEDY, max_new_tokens=24).output_ids
        spec = SpecConfig(max_new_tokens=24, top_candidates=0, strategy="tree", tree_topk=2, tree_depth=4,
                          tree_budget=8, tree_children="sampled")
        got = speculative_generate(pair32, prompt, GREEDY, spec)
        assert got.output_ids == want
        assert any(len([nd for nd in r.tree if nd.parent == -1]) == 2 for r in got.rounds if r.tree)


# ------------------------------------------------------------------------------------------------ greedy identity

GREEDY_SHAPES = [(1, 4, 4, 0.0), (2, 4, 8, 0.0), (4, 5, 16, 0.0), (3, 3, 1, 0.0),  # a chain, two bushy trees, one node
                 (4, 5, 16, 0.05), (4, 5, 16, 0.005)]  # and trees pruned below a cumulative head probability


def test_greedy_identity_on_the_shakespeare_pair(pair32):
    """At T = 0 the walk is the argmax walk: the output equals the target's own greedy output on 20 prompts for a
    chain (top-k 1), two bushy trees, a budget of 1 and a pruned tree, in float32 (where a tree forward and a
    one-token step round alike). The trees are really used: some rounds keep a path that is not the head's first
    choice, and the pruned trees' sizes vary from round to round. The pruning comes from the run's own setting
    (SpecConfig.tree_prune, the CLI's --tree-prune), which the trace's settings report."""
    from conftest import PROMPTS

    off_first_choice, pruned_sizes = 0, set()
    for prompt in PROMPTS:
        want = baseline_generate(pair32, prompt, GREEDY, max_new_tokens=32).output_ids
        for topk, depth, budget, prune in GREEDY_SHAPES:
            spec = SpecConfig(max_new_tokens=32, top_candidates=0, strategy="tree", tree_topk=topk, tree_depth=depth,
                              tree_budget=budget, tree_prune=prune)
            got = speculative_generate(pair32, prompt, GREEDY, spec)
            assert got.output_ids == want, (prompt, topk, depth, budget, prune)
            assert got.settings["tree_prune_below"] == prune
            if prune:
                pruned_sizes |= {r.k for r in got.rounds if r.tree}
            trees = [r for r in got.rounds if r.tree]  # (a round at the token budget drafts nothing)
            assert trees and all(r.k <= budget for r in trees)
            for r in trees:
                path = [nd for nd in r.tree if nd.on_path]
                assert [nd.depth for nd in path] == list(range(1, len(path) + 1))
                off_first_choice += any(nd.head_p < max(s.head_p for s in r.tree if s.parent == nd.parent)
                                        for nd in path)
    assert off_first_choice > 0  # a sibling that was not the head's favourite was kept at least once
    assert len(pruned_sizes) > 3, pruned_sizes


def test_greedy_identity_with_a_lookup_branch_on_the_shakespeare_pair(pair32):
    """A top-k tree with a prompt-lookup branch grafted on (SpecConfig.tree_lookup) is still the argmax walk: the
    output equals the target's greedy output on 20 prompts, and the copied nodes are really used (some kept paths
    run through them), in float32."""
    from conftest import PROMPTS

    through_copy = 0
    for prompt in PROMPTS:
        want = baseline_generate(pair32, prompt, GREEDY, max_new_tokens=32).output_ids
        spec = SpecConfig(max_new_tokens=32, top_candidates=0, strategy="tree", tree_topk=2, tree_depth=4,
                          tree_budget=8, tree_lookup=8)
        got = speculative_generate(pair32, prompt, GREEDY, spec)
        assert got.output_ids == want, prompt
        assert got.settings["tree_lookup"] == 8
        through_copy += sum(any(nd.on_path and nd.copied for nd in r.tree) for r in got.rounds if r.tree)
        for r in got.rounds:  # the copied nodes come last, say so in the JSON trace, and carry head p 0
            if r.tree and any(nd.copied for nd in r.tree):
                first = min(nd.id for nd in r.tree if nd.copied)
                assert all(nd.copied == (nd.id >= first) and (nd.head_p == 0) == nd.copied for nd in r.tree)
                assert [n.get("copied", False) for n in r.to_dict()["tree"]] == [nd.copied for nd in r.tree]
                copied = sum(nd.copied for nd in r.tree)  # the caption and the drawing say so, in both languages
                assert f"; prompt lookup copied {copied} of its tokens, which the head did not draft" in r.caption
                assert f"树中有 {copied} 个 token 是由提示查找复制来的" in captions.tree_caption(r, "zh-CN")
                drawn = tree_view.tree_html(r, "en")
                assert drawn.count("copied by prompt lookup (the head did not propose it)") == copied
                assert tree_view.tree_html(r, "zh-CN").count("由提示查找复制而来") == copied
            elif r.tree:
                assert "prompt lookup" not in r.caption
    assert through_copy > 0


def test_a_tree_with_a_lookup_branch_is_exact_on_the_toy_pair(toy_pair, one_thread):
    """The joint of the first three tokens follows the target with a copied branch grafted onto a random head's
    top-k tree: the prompt repeats a token, so prompt lookup always finds something to copy."""
    cfg, shape, prompt = SamplingConfig(1.0), (2, 2, 4), [0, 1, 0]
    head = random_head(toy_pair, torch.arange(toy_pair.vocab_size), scale=0.5)
    grafted: Counter = Counter()

    def make():
        drafter = TreeDrafter(head, toy_pair.target, cfg, toy_pair.vocab_size, toy_pair.context_window + 1, shape,
                              "top", lookup=3)
        propose = drafter.propose

        def counted(seq, k_max, gen):
            proposal = propose(seq, k_max, gen)
            if proposal.tree is not None:
                grafted[int((proposal.tree.head_p == 0).sum())] += 1
            return proposal

        drafter.propose = counted
        return drafter

    n = 1000
    counts, ends = tree_samples(toy_pair, prompt, cfg, shape, n, make)
    assert {kind for kind, _ in ends} == {"root", "inner", "leaf"}, ends
    assert sum(v for k, v in grafted.items() if k > 0) > 0.3 * n, grafted  # most first rounds had a copied branch
    assert chi2_pvalue(counts, exact_joint3(toy_pair, prompt, cfg), n) > PASS_P


# ------------------------------------------------------------------------------------------------ caches


@pytest.mark.parametrize("temperature,children,lookup", [(0.0, "top", 0), (1.0, "top", 0), (1.0, "sampled", 0),
                                                         (0.0, "top", 8)])
def test_caches_after_tree_rounds_equal_fresh_passes(pair32, temperature, children, lookup):
    """After every tree round: the target's cache holds exactly the kept sequence but its newest token (the path's
    entries moved up on every layer), so its next logits equal a fresh forward over the kept sequence; the head's
    cache holds only positions with the target's TRUE features, its keys equal a fresh head pass over them, and
    the features waiting to be read equal a fresh target forward."""
    pair = pair32
    cfg = SamplingConfig(temperature)
    spec = SpecConfig(max_new_tokens=32, seed=5, top_candidates=0, strategy="tree", tree_topk=3, tree_depth=4,
                      tree_budget=10, tree_children=children, tree_lookup=lookup)
    drafter = make_drafter(spec, cfg, pair)
    target = CachedLM(pair.target, pair.vocab_size)
    prompt_ids = pair.encode("KING RICHARD III:\nNow is the winter")
    seq, checked, moved, grafted = list(prompt_ids), 0, 0, 0
    for rnd in speculative_rounds(pair, prompt_ids, cfg, spec, target_lm=target, drafter=drafter):
        seq += [t.token_id for t in rnd.output]
        if rnd.stop_reason:
            break
        moved += bool(rnd.tree) and any(nd.on_path and nd.id != nd.depth - 1 for nd in rnd.tree)
        grafted += bool(rnd.tree) and any(nd.on_path and nd.copied for nd in rnd.tree)
        assert target.length == len(seq) - 1
        with torch.inference_mode():
            ids = torch.tensor([seq])
            fresh = pair.target(ids).logits[0, -1, : pair.vocab_size].float()
            torch.testing.assert_close(target.feed(torch.tensor(seq[-1:]))[0], fresh, atol=2e-4, rtol=1e-4)
            target.crop(len(seq) - 1)
            feats = pair.target.base_model(input_ids=ids).last_hidden_state[0]
            emb = pair.target.get_input_embeddings()(ids[0])
        n_cached = drafter.cache.length
        pending = torch.cat(drafter.pending) if drafter.pending else torch.empty(0, pair.head.cfg.hidden_size)
        assert n_cached + pending.shape[0] == len(seq) - 1
        torch.testing.assert_close(pending, feats[n_cached : len(seq) - 1], atol=2e-4, rtol=1e-4)
        if n_cached:
            with torch.inference_mode():
                _, _, k, _ = drafter.head.project(feats[None, :n_cached], emb[None, 1 : n_cached + 1],
                                                  torch.arange(n_cached))
            torch.testing.assert_close(drafter.cache.k[:, :n_cached], k[0], atol=2e-4, rtol=1e-4)
            checked += 1
    assert checked >= 5 and moved >= 1  # some kept paths were not the first nodes: their entries had to move
    assert grafted >= 1 if lookup else grafted == 0  # with lookup, some kept paths ran through copied nodes


# ------------------------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize("field,value", [("tree_topk", 17), ("tree_depth", 0 - 1), ("tree_depth", 17),
                                         ("tree_budget", -1), ("tree_topk", 2.5), ("tree_prune", 1.0),
                                         ("tree_prune", -0.01), ("tree_prune", float("nan")), ("tree_prune", True),
                                         ("tree_prune", "0.1"), ("tree_lookup", -1), ("tree_lookup", 17),
                                         ("tree_lookup", 2.0)])
def test_tree_sizes_out_of_range_are_refused_in_one_sentence(field, value):
    with pytest.raises(ConfigError) as err:
        SpecConfig(strategy="tree", **{field: value})
    assert field in str(err.value) and "\n" not in str(err.value)


def test_the_budget_is_capped_by_the_tree_and_by_the_server(pair32, monkeypatch):
    spec = SpecConfig(strategy="tree", tree_topk=2, tree_depth=3, tree_budget=100)
    assert tree_shape(spec, pair32.head) == (2, 3, 2 + 2 * 4)  # what a 2-wide, 3-deep tree can hold
    monkeypatch.setenv("SPECDEMO_MAX_TREE", "5")
    assert tree_shape(spec, pair32.head) == (2, 3, 5)


@pytest.fixture(scope="module")
def own_static_pair():
    """A private float32 Shakespeare pair with static caches (the LRU's pairs are shared with other tests)."""
    from specdemo.models.loading import load_pair_uncached
    from specdemo.models.static import prepare

    pair = load_pair_uncached("shakespeare", device="cpu", dtype="float32")
    prepare(pair, "static")
    return pair


def test_no_tree_outgrows_the_rows_a_static_cache_keeps_after_its_window(own_static_pair, monkeypatch):
    """A static cache keeps MAX_TREE_NODES + 1 rows after its window, whatever widths it captures; a larger
    SPECDEMO_MAX_TREE counts as MAX_TREE_NODES. It used not to: with 128, a tree round near the window's end asked
    for more slots than the cache held (an AssertionError, a traceback in the app)."""
    from specdemo.limits import Limits
    from specdemo.models.devices import MAX_TREE_NODES

    monkeypatch.setenv("SPECDEMO_MAX_TREE", "128")
    assert Limits.from_env().max_tree == MAX_TREE_NODES
    spec = SpecConfig(strategy="tree", tree_topk=8, tree_depth=4, tree_budget=128, max_new_tokens=20)
    assert tree_shape(spec, own_static_pair.head)[2] == MAX_TREE_NODES
    slot = own_static_pair.static_slots["target"]
    assert slot.max_len == own_static_pair.context_window + MAX_TREE_NODES + 1, "room for the tree's rows and one"
    line = own_static_pair.encode("ROMEO:\nWhat light through yonder window breaks?\n")
    prompt_ids = (line * own_static_pair.context_window)[: own_static_pair.context_window - 20]  # ends at its end
    rounds = list(speculative_rounds(own_static_pair, prompt_ids, GREEDY, spec))
    assert sum(t.label != "rejected" for r in rounds for t in r.tokens) == 20 and rounds[-1].stop_reason
    assert max(r.k for r in rounds) > 32, "trees wider than the widest captured forward but one"


def test_a_pair_without_a_head_refuses_tree_as_it_refuses_eagle(toy_pair):
    assert toy_pair.head is None
    for strategy in ("eagle", "tree"):
        with pytest.raises(StrategyUnavailable) as err:
            speculative_generate(toy_pair, "ab", GREEDY, SpecConfig(strategy=strategy, max_new_tokens=4))
        assert "\n" not in str(err.value)


def test_auto_children_and_sizes_follow_the_rules_each_head_records(pair32):
    """`auto` at T > 0. Where the target runs in bf16 on a CPU, SmolLM2's head records the temperature up to which
    top-k children were the faster choice (0.3) and the smaller tree that sampled children were faster in above it
    ((2, 4, 5)), by the rules in docs/decisions.md ("a small sampled tree above T = 0.3 on a bf16 CPU"; Zen 4): top-k (3, 5, 15) at
    T 0.3, sampled (2, 4, 5) above it, and sampled (3, 5, 15) wherever the target runs in float32. The Shakespeare
    head records neither. T = 0 is top everywhere, an explicit choice or size is kept, and a run's settings and its
    rounds say what it drafted with."""
    from specdemo.bench.strategies import tree_methods
    from specdemo.engine.speculative import run_settings
    from specdemo.engine.tree_drafter import run_tree_shape, tree_children
    from specdemo.models import load_pair_uncached

    smol16 = load_pair_uncached("smollm2-135m", target_dtype="bfloat16")
    smol32 = load_pair_uncached("smollm2-135m", target_dtype="float32", draft_dtype="float32")
    assert smol16.head.cfg.tree["auto_top_to_t_bf16_cpu"] == 0.3 and smol16.device.type == "cpu"
    auto, top, sampled = (SpecConfig(strategy="tree", tree_children=c) for c in ("auto", "top", "sampled"))
    big, small = (3, 5, 15), (2, 4, 5)
    for t, want16 in ((0.0, "top"), (0.3, "top"), (0.31, "sampled"), (0.7, "sampled"), (1.0, "sampled")):
        cfg = SamplingConfig(t)
        assert tree_children(auto, cfg, smol16) == want16, t
        assert run_tree_shape(auto, cfg, smol16) == (big if want16 == "top" else small), t
        assert tree_children(auto, cfg, smol32) == ("top" if t == 0 else "sampled"), t
        assert run_tree_shape(auto, cfg, smol32) == run_tree_shape(top, cfg, smol16) == big, t
        assert tree_children(auto, cfg, pair32) == ("top" if t == 0 else "sampled"), t
        assert tree_children(top, cfg, smol32) == "top" and tree_children(sampled, cfg, smol16) == (
            "top" if t == 0 else "sampled")
        assert run_tree_shape(sampled, cfg, smol16) == (big if t == 0 else small), t
    # a size given by hand replaces that size only: the others stay those of the run's children and machine
    assert run_tree_shape(SpecConfig(strategy="tree", tree_budget=9), SamplingConfig(0.7), smol16) == (2, 4, 9)
    assert run_tree_shape(SpecConfig(strategy="tree", tree_topk=3), SamplingConfig(0.7), smol16) == (3, 4, 5)
    assert run_tree_shape(SpecConfig(strategy="tree", tree_topk=3), SamplingConfig(0.7), smol32) == (3, 5, 15)
    # bench --strategies races the trees a run would draft; their prune_below is left to each run (run_tree_prune),
    # and the rows are named by what this pair's runs prune at
    assert tree_methods(smol16, SamplingConfig(0.7)) == {
        "tree 3x5 N=15 prune 0.02": {"tree_topk": 3, "tree_depth": 5, "tree_budget": 15, "tree_children": "top",
                                     "tree_prune": None},
        "tree 2x4 N=5 prune 0.02 sampled": {"tree_topk": 2, "tree_depth": 4, "tree_budget": 5,
                                            "tree_children": "sampled", "tree_prune": None}}
    assert list(tree_methods(smol16, SamplingConfig(0.0))) == ["tree 3x5 N=15 prune 0.02"]
    trace = speculative_generate(smol16, "Hi", SamplingConfig(0.3), SpecConfig(strategy="tree", max_new_tokens=6))
    assert trace.settings["tree_children"] == run_settings(smol16, SamplingConfig(0.3), auto)["tree_children"] == "top"
    assert all(nd.q is None for r in trace.rounds for nd in (r.tree or []))  # no node was drawn from q
    trace = speculative_generate(smol16, "Name three rivers.", SamplingConfig(0.7),
                                 SpecConfig(strategy="tree", max_new_tokens=24))
    s = trace.settings
    assert (s["tree_children"], s["tree_topk"], s["tree_depth"], s["tree_budget"]) == ("sampled", *small)
    trees = [r.tree for r in trace.rounds if r.tree]
    assert trees and all(len(t) <= 5 and max(nd.depth for nd in t) <= 4 and all(nd.q is not None for nd in t)
                         for t in trees)
