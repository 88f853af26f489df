"""A draft tree grown in one replay (engine/tree_graph.py), on the graphs' stand-in: the same trees as the growth
step by step, padded to the budget where pruning keeps fewer nodes, the walk and the page's story blind to the
padding, and the output still the warped target's."""

from __future__ import annotations

import pytest
import torch
from test_eagle import exact_joint3
from test_exactness import PASS_P, chi2_pvalue, drop_k, speculative_samples
from test_static import GREEDY, cuda_pair, decode_as, own_pair, rounds_and_syncs  # noqa: F401 - own_pair, cuda_pair: fixtures

from specdemo.config import SamplingConfig, SpecConfig
from specdemo.engine.speculative import speculative_rounds
from specdemo.engine.tree_drafter import TreeDrafter
from specdemo.models.static import prepare


def tree_rounds(pair, spec: SpecConfig, sampling: SamplingConfig, head: bool) -> list:
    """A run's rounds with the pair's head slot (its trees grown in one replay), or without (step by step)."""
    slot = pair.static_slots.pop("head") if not head else None
    try:
        return list(speculative_rounds(pair, pair.encode("ROMEO:\nWhat light"), sampling, spec))
    finally:
        if slot is not None:
            pair.static_slots["head"] = slot


def nodes_of(rnd) -> list[tuple]:
    return [(n.token_id, n.parent, n.depth, n.on_path) for n in rnd.tree or []]


@pytest.mark.parametrize("shape,prune", [((2, 4, 8), 0.0), ((3, 5, 15), 0.02), ((4, 4, 20), 0.2)],
                         ids=["2x4-8", "3x5-15-pruned", "4x4-20-pruned-hard"])
def test_a_tree_grown_in_one_replay_is_the_tree_grown_step_by_step(own_pair, shape, prune):
    """At T = 0, round for round: the same nodes (tokens, parents, depths, the path), head probabilities within
    float32 rounding, the same tokens kept. Where pruning keeps fewer nodes than the budget, the replay's tree is
    padded, and the page's tree holds the real nodes only."""
    pair = own_pair
    decode_as(pair, "replayed")
    topk, depth, budget = shape
    spec = SpecConfig(k=4, max_new_tokens=40, strategy="tree", tree_topk=topk, tree_depth=depth, tree_budget=budget,
                      tree_prune=prune, top_candidates=3)
    slot = pair.static_slots["head"]
    before = dict(getattr(slot, "trees", {}))
    replayed, stepped = tree_rounds(pair, spec, GREEDY, True), tree_rounds(pair, spec, GREEDY, False)
    assert set(getattr(slot, "trees", {})) - set(before), "the replayed run grew its trees in a captured graph"
    assert [t.token_id for r in replayed for t in r.output] == [t.token_id for r in stepped for t in r.output]
    sizes = []
    for a, b in zip(replayed, stepped, strict=True):
        assert nodes_of(a) == nodes_of(b), a.index
        assert a.k == b.k == len(a.tree or [])
        for x, y in zip(a.tree or [], b.tree or []):
            assert x.head_p == pytest.approx(y.head_p, rel=1e-4, abs=1e-6)
            assert x.p == pytest.approx(y.p, rel=1e-4, abs=1e-6)
        sizes.append(len(a.tree or []))
    trees = [n for n in sizes if n]
    assert len(trees) > 5
    if prune:
        assert min(trees) < budget, "pruning left some tree smaller than its budget: the padding was walked past"
    else:  # (the last rounds draft shallower trees, which hold fewer candidates)
        assert max(trees) == budget


def test_a_captured_tree_at_t0_keeps_its_low_nodes(own_pair, monkeypatch):
    """docs/decisions.md, "the captured tree keeps its low nodes": the captured growth holds `budget` nodes whatever
    pruning drops and the verify's graph takes them all, so at T = 0 a tree run that names no prune_below drafts
    unpruned there; step by step, at T > 0, or where the run names one, the head's or the run's holds. The
    unpruned tree holds every path of the pruned one: the same greedy tokens, from fuller trees."""
    from dataclasses import replace

    from specdemo.engine.tree_drafter import run_tree_prune

    pair = own_pair
    decode_as(pair, "replayed")
    monkeypatch.setattr(pair.head, "cfg", replace(pair.head.cfg, tree=pair.head.cfg.tree | {"prune_below": 0.2}))
    spec = SpecConfig(k=4, max_new_tokens=40, strategy="tree", tree_topk=2, tree_depth=4, tree_budget=14,
                      top_candidates=0)
    assert run_tree_prune(spec, GREEDY, pair) == 0.0
    assert run_tree_prune(replace(spec, tree_children="sampled"), SamplingConfig(0.7), pair) == 0.2
    assert run_tree_prune(replace(spec, tree_children="top"), SamplingConfig(0.7), pair) == 0.2
    assert run_tree_prune(replace(spec, tree_lookup=4), GREEDY, pair) == 0.2  # a lookup branch: grown step by step
    assert run_tree_prune(replace(spec, tree_prune=0.1), GREEDY, pair) == 0.1
    captured, stepped = tree_rounds(pair, spec, GREEDY, True), tree_rounds(pair, spec, GREEDY, False)
    assert [t.token_id for r in captured for t in r.output] == [t.token_id for r in stepped for t in r.output]
    full, pruned = [len(r.tree or []) for r in captured], [len(r.tree or []) for r in stepped]
    assert max(full) == 14 and max(pruned) < 14, (full, pruned)  # the head prunes hard where the run is stepped
    assert sum(full) / len(full) > sum(pruned) / len(pruned)


def test_top_k_children_at_t_07_keep_the_tree_and_the_targets_joint(own_pair):
    """At T > 0 with top-k children the replay grows the trees the steps grow (round two's, before the walks'
    draws part the runs: a padded tree draws at more rows), and the joint of the first three tokens is the warped
    target's (χ², enumerated over the top-3 support; round two walks a replayed tree)."""
    pair = own_pair
    decode_as(pair, "replayed")
    cfg = SamplingConfig(temperature=1.0, top_k=3)
    spec = SpecConfig(k=4, max_new_tokens=12, strategy="tree", tree_topk=2, tree_depth=3, tree_budget=6,
                      tree_prune=0.05, tree_children="top", seed=4)
    replayed, stepped = tree_rounds(pair, spec, cfg, True), tree_rounds(pair, spec, cfg, False)
    assert nodes_of(replayed[1]) == nodes_of(stepped[1]) and replayed[1].tree

    prompt_ids = pair.encode("ROMEO:\nI")
    slot = pair.static_slots["head"]
    exact = exact_joint3(pair, prompt_ids, cfg)
    n = 500  # as the chain's joint test in test_static.py

    def drafter():
        return TreeDrafter(pair.head, pair.target, cfg, pair.vocab_size, pair.context_window + 1, (2, 3, 6), "top",
                           0.05, slot=slot)

    counts = speculative_samples(pair, prompt_ids, cfg, k=3, n=n, n_tokens=3, strategy="tree",
                                 make_drafter=drafter)
    counts.pop("rejections")
    assert chi2_pvalue(drop_k(counts), exact, n) > PASS_P


@pytest.mark.parametrize("cfg", [GREEDY, SamplingConfig(0.7)], ids=["T0", "T0.7"])
def test_a_top_k_tree_round_dispatches_at_most_40_operators_and_reads_once(own_pair, cfg):
    """Issue 45's floor for a tree of top-k children on the graphs' stand-in (bench/round_ops.py counts): after the
    prompt's round, the head's read, the growth, the target's verify (its tree mask made in the graph) and the
    verdict with the cache's roll-back are replays, and a round dispatches at most 40 operators outside them and
    reads the device once; step by step the growth alone read a number a depth and dispatched hundreds."""
    spec = SpecConfig(k=4, max_new_tokens=32, strategy="tree", tree_topk=2, tree_depth=4, tree_budget=8,
                      tree_prune=0.02, tree_children="top", top_candidates=0, seed=2)
    assert_round_floor(own_pair, cfg, spec)


def assert_round_floor(pair, cfg: SamplingConfig, spec: SpecConfig) -> None:
    """Issue 45's floor, asserted on the stand-in: after the prompt's rounds (every graph captured by a first run),
    each round dispatches at most 40 operators outside the replays and reads the device once; the same run step by
    step (no head slot) reads more than once a round somewhere and dispatches over a hundred operators a round."""
    from specdemo.bench.round_ops import round_counts

    decode_as(pair, "replayed")
    ids = pair.encode("ROMEO:\nWhat light")
    list(speculative_rounds(pair, ids, cfg, spec))
    counts = round_counts(speculative_rounds(pair, ids, cfg, spec), skip=2)
    assert len(counts) > 3 and all(reads == 1 for _, reads, _, _ in counts), counts
    assert max(ops for ops, *_ in counts) <= 40, counts
    slot = pair.static_slots.pop("head")
    try:
        stepped = round_counts(speculative_rounds(pair, ids, cfg, spec), skip=2)
    finally:
        pair.static_slots["head"] = slot
    assert max(reads for _, reads, _, _ in stepped) > 1, "the step-by-step growth reads a number a depth"
    assert min(ops for ops, *_ in stepped) > 100, stepped


@pytest.mark.parametrize("m", [1, 3])
def test_a_tree_rounds_roll_back_in_one_replay_moves_the_kept_rows_and_nothing_else(own_pair, m):
    """StaticLM.keep_rows on captured forwards (models/row_moves.py): the kept rows' keys and values land right
    after the fixed tokens, in every layer, and every other slot keeps what it held, the first replay (its
    capture) included."""
    pair = own_pair
    decode_as(pair, "replayed")
    slot = pair.static_slots["target"]
    slot.moves.graphs.pop(m, None)  # captured by this call
    lm = pair.new_lm("target")
    lm.feed(torch.tensor(pair.encode("ROMEO:\nWhat light through yonder window breaks")), keep_logits=1)
    start = lm.length - 8
    rows = list(range(2)) + list(range(8 - m, 8))  # the first 2 stay; the last m move up behind them
    before = [(k.clone(), v.clone()) for k, v in slot.kv]
    lm.keep_rows(start, rows)
    assert m in slot.moves.graphs and lm.length == start + 2 + m
    for (k0, v0), (k, v) in zip(before, slot.kv, strict=True):
        for old, new in ((k0, k), (v0, v)):
            want = old.clone()
            want[:, :, start + 2 : start + 2 + m] = old[:, :, start + 8 - m : start + 8]
            assert torch.equal(new, want)


@pytest.mark.parametrize("cfg", [GREEDY, SamplingConfig(0.7, top_k=20, top_p=0.9), SamplingConfig(1.0)],
                         ids=["greedy", "top-k-top-p", "T1"])
def test_a_trees_captured_verdict_decides_what_the_eager_walk_decides(own_pair, monkeypatch, cfg):
    """judge_graph.TreeJudge against walk.walk on the same padded trees and the same generator: the same rounds,
    token for token and label for label, with the same numbers on the page (p, head p, the chance to go on, the
    inspector's candidates) within float32 rounding."""
    from specdemo.engine import speculative

    pair = own_pair
    decode_as(pair, "replayed")
    spec = SpecConfig(k=4, max_new_tokens=40, strategy="tree", tree_topk=3, tree_depth=4, tree_budget=10,
                      tree_prune=0.05, tree_children="top", top_candidates=3, seed=7)
    replayed = tree_rounds(pair, spec, cfg, True)
    judges = pair.static_slots["target"].tree_judges
    assert any(j.graphs for j in judges.values())
    monkeypatch.setattr(speculative, "tree_judge", lambda *a: None)
    eager = tree_rounds(pair, spec, cfg, True)
    assert len(replayed) == len(eager) > 5
    for a, b in zip(replayed, eager, strict=True):
        assert [(t.token_id, t.label) for t in a.tokens] == [(t.token_id, t.label) for t in b.tokens]
        assert nodes_of(a) == nodes_of(b)
        for x, y in zip(a.tokens, b.tokens):
            assert x.p == pytest.approx(y.p, rel=1e-5, abs=1e-7)
        for x, y in zip(a.drafts, b.drafts):
            assert (x.overlap, x.accept_prob) == pytest.approx((y.overlap, y.accept_prob), rel=1e-5, abs=1e-7)
            assert [c.token_id for c in x.top] == [c.token_id for c in y.top]


@pytest.mark.cuda
def test_on_cuda_a_top_k_tree_round_syncs_once(cuda_pair):
    """Issue 45 on a GPU, as test_static.py's eagle test: after the prompt's rounds, a round of a top-k tree (the
    head's read, the growth, the verify and the verdict with the roll-back, each one replay) synchronises once, for
    the verdict's copy, as torch's sync debug mode sees it. A failure names the lines that synchronised."""
    pair = cuda_pair
    prepare(pair, "graphs")
    ids = pair.encode("ROMEO:\nWhat light")
    spec = SpecConfig(k=4, max_new_tokens=48, strategy="tree", tree_topk=2, tree_depth=4, tree_budget=8,
                      tree_prune=0.02, tree_children="top")
    for cfg in (GREEDY, SamplingConfig(0.7)):
        rounds, syncs = rounds_and_syncs(pair, ids, cfg, spec)
        assert len(rounds) > 5 and all(len(s) == 1 for s in syncs[2:]), syncs
