"""A draft tree of SAMPLED children grown and judged in one replay each (engine/sampled_graph.py, and
judge_graph.TreeJudge with walk.walk_sampled), on the graphs' stand-in: from the same generator, the trees, draws
and verdicts of the growth and walk step by step, padded where prune_below leaves rows out; a round of at most 40
operators and one host read; and the output still the warped target's."""

from __future__ import annotations

import pytest
from test_eagle import exact_joint3
from test_exactness import PASS_P, chi2_pvalue, drop_k, speculative_samples
from test_static import (GREEDY, cuda_pair, decode_as, interleaved, own_pair, rounds_and_syncs,  # noqa: F401 - fixtures
                         tokens_of)
from test_tree_graph import assert_round_floor, nodes_of, tree_rounds

from specdemo.config import SamplingConfig, SpecConfig
from specdemo.engine.sampled_tree import sampled_plan
from specdemo.engine.speculative import speculative_rounds
from specdemo.engine.tree_drafter import TreeDrafter
from specdemo.models.static import prepare


def sampled_spec(shape, prune, **more) -> SpecConfig:
    topk, depth, budget = shape
    return SpecConfig(k=4, strategy="tree", tree_topk=topk, tree_depth=depth, tree_budget=budget, tree_prune=prune,
                      tree_children="sampled", **({"max_new_tokens": 40, "top_candidates": 3, "seed": 5} | more))


@pytest.mark.parametrize("shape,prune,cfg", [
    ((2, 4, 8), 0.0, SamplingConfig(0.7)),
    ((3, 5, 15), 0.02, SamplingConfig(1.0)),
    ((2, 4, 5), 0.05, SamplingConfig(0.7, top_k=20, top_p=0.9)),
], ids=["2x4-8", "3x5-15-pruned-T1", "2x4-5-pruned-top-k-top-p"])
def test_a_sampled_tree_grown_and_judged_in_replays_is_the_one_grown_and_walked_step_by_step(own_pair, shape, prune,
                                                                                              cfg):
    """Round for round, from the same seed: the same nodes (tokens, parents, depths, the path), the same kept
    tokens and labels, and the page's numbers (head p, p, q, the chance when tested, the chance to go on) within
    float32 rounding. With prune_below, trees hold fewer nodes than the plan (the replay's padding stays out)."""
    pair = own_pair
    decode_as(pair, "replayed")
    spec = sampled_spec(shape, prune)
    slot, target = pair.static_slots["head"], pair.static_slots["target"]
    before = set(getattr(slot, "tree_shapes", {}))
    replayed, stepped = tree_rounds(pair, spec, cfg, True), tree_rounds(pair, spec, cfg, False)
    assert any("sampled" in key for key in set(slot.tree_shapes) - before), "grown in a captured graph"
    assert any(len(key) == 3 for j in target.tree_judges.values() for key in j.graphs), "judged in one too"
    assert len(replayed) == len(stepped) > 5
    sizes = []
    for a, b in zip(replayed, stepped, strict=True):
        assert nodes_of(a) == nodes_of(b), a.index
        assert [(t.token_id, t.label) for t in a.tokens] == [(t.token_id, t.label) for t in b.tokens]
        for x, y in zip(a.tree or [], b.tree or []):
            assert (x.head_p, x.p, x.q, x.accept_prob) == pytest.approx((y.head_p, y.p, y.q, y.accept_prob),
                                                                         rel=1e-4, abs=1e-6)
        for x, y in zip(a.drafts, b.drafts):
            assert x.overlap == pytest.approx(y.overlap, rel=1e-4, abs=1e-6)
        sizes.append(len(a.tree or []))
    full = sum(m * c for m, c in sampled_plan(*shape))
    trees = [n for n in sizes if n]
    assert len(trees) > 5 and max(trees) <= full
    if prune:
        assert min(trees) < full, "some tree was pruned below its plan: the padding stayed out of the walk"


def test_sampled_children_captured_keep_the_targets_joint(own_pair):
    """The joint of the first three tokens through replayed sampled trees (round two grows and walks one) is the
    warped target's (χ², enumerated over the top-3 support), as for top-k children in test_tree_graph.py."""
    pair = own_pair
    decode_as(pair, "replayed")
    cfg = SamplingConfig(temperature=1.0, top_k=3)
    prompt_ids = pair.encode("ROMEO:\nI")
    slot = pair.static_slots["head"]
    exact = exact_joint3(pair, prompt_ids, cfg)
    n = 500

    def drafter():
        return TreeDrafter(pair.head, pair.target, cfg, pair.vocab_size, pair.context_window + 1, (2, 3, 6),
                           "sampled", 0.05, slot=slot)

    counts = speculative_samples(pair, prompt_ids, cfg, k=3, n=n, n_tokens=3, strategy="tree",
                                 make_drafter=drafter)
    counts.pop("rejections")
    assert any("sampled" in key for key in slot.tree_shapes)
    assert chi2_pvalue(drop_k(counts), exact, n) > PASS_P


@pytest.mark.parametrize("cfg", [SamplingConfig(0.7), SamplingConfig(1.0, top_k=20, top_p=0.9)], ids=["T0.7", "T1"])
def test_a_sampled_tree_round_dispatches_at_most_40_operators_and_reads_once(own_pair, cfg):
    """Issue 45's floor for the tree a run drafts at T > 0 (bench/round_ops.py counts, on the graphs' stand-in):
    after the prompt's round, the head's read, the growth, the verify and the verdict with the cache's roll-back
    are replays, and a round dispatches at most 40 operators outside them and reads the device once; step by step,
    with prune_below, the growth read a number a depth and the round dispatched hundreds."""
    assert_round_floor(own_pair, cfg, sampled_spec((2, 4, 8), 0.02, max_new_tokens=32, top_candidates=0, seed=2))


def test_runs_of_one_sampled_plan_taking_turns_each_give_what_they_give_alone(own_pair):
    """Two visitors' runs with the same plan and settings share one SampledTreeGraphs (its uniforms, packed tree,
    q and rows are the same buffers), and a third grows top-k trees on the same head slot; alternating round by
    round, as the device lock makes them, each gives exactly the tokens it gives alone."""
    pair = own_pair
    decode_as(pair, "replayed")
    cfg = SamplingConfig(0.7)
    runs = [("ROMEO:\n", sampled_spec((2, 4, 8), 0.02, seed=1), cfg),
            ("JULIET:\nO", sampled_spec((2, 4, 8), 0.02, seed=2), cfg),
            ("HAMLET:\n", SpecConfig(k=4, max_new_tokens=40, strategy="tree", tree_topk=3, tree_depth=3,
                                     tree_budget=6, tree_children="top", seed=3), GREEDY)]
    alone = [tokens_of(speculative_rounds(pair, pair.encode(p), sampling, spec)) for p, spec, sampling in runs]
    head_swaps = pair.static_slots["head"].swaps
    assert interleaved(pair, runs) == alone
    assert len({tuple(a) for a in alone}) == 3, "three different runs"
    assert pair.static_slots["head"].swaps - head_swaps > 5, "the runs took turns in the head's cache"


def test_a_sampled_plan_let_go_takes_its_verdict_graphs_with_it(own_pair):
    """A public page's visitors pick many plans (prune_below, T, top-k, top-p each make one): the head slot keeps
    the SHAPES_KEPT most recent, and the verdict graphs that read a plan's buffers go when the plan goes, so neither
    holds the device's memory for plans no run uses."""
    import gc

    from specdemo.engine.sampled_graph import SampledTreeGraphs
    from specdemo.engine.tree_graph import SHAPES_KEPT

    pair = own_pair
    decode_as(pair, "replayed")
    ids = pair.encode("ROMEO:\nWhat light")
    for i in range(SHAPES_KEPT + 3):  # more plans than the slot keeps
        spec = sampled_spec((2, 3, 6), 0.001 * (i + 1), max_new_tokens=8, top_candidates=0, seed=i)
        list(speculative_rounds(pair, ids, SamplingConfig(0.8), spec))
    gc.collect()
    shapes = pair.static_slots["head"].tree_shapes
    assert len(shapes) <= SHAPES_KEPT
    live = {id(s.pack) for s in shapes.values() if isinstance(s, SampledTreeGraphs)}
    judge = next(j for key, j in pair.static_slots["target"].tree_judges.items() if key[0] == 0.8)
    sampled = {key[2] for key in judge.graphs if len(key) == 3}
    assert sampled and sampled <= live, (len(sampled), len(live))


@pytest.mark.cuda
def test_on_cuda_a_sampled_tree_round_syncs_once(cuda_pair):
    """As test_tree_graph.py's top-k test, for the tree a run drafts at T > 0: after the prompt's rounds, a round of
    sampled children (its read, growth, verify and verdict with the roll-back each one replay) synchronises once,
    for the verdict's copy. A failure names the lines that synchronised."""
    pair = cuda_pair
    prepare(pair, "graphs")
    ids = pair.encode("ROMEO:\nWhat light")
    rounds, syncs = rounds_and_syncs(pair, ids, SamplingConfig(0.7), sampled_spec((2, 4, 8), 0.02, max_new_tokens=48))
    assert len(rounds) > 5 and all(len(s) == 1 for s in syncs[2:]), syncs
