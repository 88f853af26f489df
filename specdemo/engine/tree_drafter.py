"""The tree drafter: the EAGLE head drafts a tree of tokens a round (strategy "tree"), and how big that tree is.

Owns `TreeDrafter` and the sizing of a tree run: its shape (`tree_shape`, `run_tree_shape`, with the head's own
defaults from its config, `head_tree`), how its children are chosen (`tree_children`: the head's top-k or draws
from it) and where it prunes (`tree_prune`, `run_tree_prune`). It does not own the tree's structure and growth
(tree.py), the walk that verifies it (walk.py), the chain drafter it extends (drafters.EagleDrafter) or which
drafter a run's strategy names (strategy.make_drafter).
"""

from __future__ import annotations

import torch

from specdemo.config import SamplingConfig, SpecConfig
from specdemo.limits import Limits
from specdemo.models import ModelPair
from specdemo.models.eagle import SAMPLED_BF16_CPU

from .drafters import EagleDrafter, LookupDrafter, Proposal, RoundOutcome
from .sampling import warp
from .sampled_graph import sampled_tree_graphs
from .sampled_tree import grow_sampled, sampled_plan
from .tree import DraftTree, Drawn, graft, grow
from .tree_graph import tree_graphs

DEFAULT_TREE = {"topk": 2, "depth": 4, "budget": 8}  # a head whose config names no tree shape drafts this one
# the default shape on CUDA, where a verify's rows cost little: chosen by rules from the H200's costs (issue 45;
# docs/decisions.md, "the default tree on CUDA" and "the CUDA tree fills the width its verify replays"): 15 nodes
# and the root, 16 rows, fill the 16-row verify graph that (2, 4, 8), the default before, replayed with 7 rows empty
CUDA_TREE = {"topk": 4, "depth": 4, "budget": 15}


def head_tree(head) -> dict:
    """What a head's config says of its trees (its "tree": sizes, prune_below, auto_top_to_t_bf16_cpu,
    sampled_bf16_cpu); {} without a head."""
    return head.cfg.tree if head is not None else {}


def bf16_cpu(pair: ModelPair | None) -> bool:
    """Whether the pair's target runs in bf16 on a CPU, where a head's config may record other tree defaults. It
    reads the target's dtype, not the CPU, so a run asked in float32 on a CPU with bf16 units chooses as a CPU
    without them would."""
    return pair is not None and pair.device.type == "cpu" and pair.dtype == torch.bfloat16


def tree_shape(spec: SpecConfig, head, limits: Limits | None = None, sampled_bf16_cpu: bool = False,
               cuda: bool = False) -> tuple[int, int, int]:
    """(topk, depth, budget) for a tree run: spec's sizes, 0 taking the head's default (its config's "tree"; on
    `cuda`, CUDA_TREE), the budget never above what the tree can hold nor the server's SPECDEMO_MAX_TREE.
    sampled_bf16_cpu: the run's children are sampled and its target runs in bf16 on a CPU, where the head's config
    may name other defaults (tree["sampled_bf16_cpu"]); run_tree_shape says when."""
    own = DEFAULT_TREE | head_tree(head) | (CUDA_TREE if cuda else {})
    if sampled_bf16_cpu:
        own |= own.get(SAMPLED_BF16_CPU, {})
    topk = spec.tree_topk or own["topk"]
    depth = spec.tree_depth or own["depth"]
    budget = spec.tree_budget or own["budget"]
    cap = (limits or Limits.from_env()).max_tree
    return topk, depth, max(1, min(budget, topk + (depth - 1) * topk * topk, cap))


def run_tree_shape(spec: SpecConfig, sampling: SamplingConfig, pair: ModelPair, limits: Limits | None = None
                   ) -> tuple[int, int, int]:
    """The sizes a tree run drafts with (tree_shape): those for its children, on its target's device and dtype."""
    sampled = tree_children(spec, sampling, pair) == "sampled"
    return tree_shape(spec, pair.head, limits, sampled and bf16_cpu(pair), pair.device.type == "cuda")


def tree_prune(head, spec: SpecConfig | None = None) -> float:
    """The cumulative head probability below which a tree leaves a node out (tree.grow's prune_below): the run's
    spec.tree_prune where it names one, else the head's config's "prune_below", 0 (no pruning) for a head that
    names none."""
    if spec is not None and spec.tree_prune is not None:
        return float(spec.tree_prune)
    return float(head_tree(head).get("prune_below", 0.0))


def run_tree_prune(spec: SpecConfig, sampling: SamplingConfig, pair: ModelPair) -> float:
    """The prune_below a tree run drafts with (tree_prune), but 0 at T = 0 where the run names none and its tree
    grows in one replay (the pair's head slot, TreeDrafter.propose): a captured tree holds `budget` nodes whatever
    pruning drops, and the verify's graph takes them all, so pruning would only throw verified nodes away; at T = 0
    the unpruned tree holds every path of the pruned one (docs/decisions.md, "the captured tree keeps its low
    nodes"). At T > 0, where the measurements disagreed, and for a top-k tree with a lookup branch (grown step by
    step), the head's holds."""
    if spec.tree_prune is None and sampling.greedy and not spec.tree_lookup and "head" in (
            getattr(pair, "static_slots", None) or {}):
        return 0.0
    return tree_prune(pair.head, spec)


# What tree_children="auto" means at T > 0. Chosen by rules written before measuring: by tokens per target call
# (select_tree.py --children sampled), then by speed on SELECTION at T = 0.3, 0.7 and 1 for the pruned tree
# (tree_vs_chain.py --selection; top-k children lost at 0.3 on a CPU without bf16 units, in float32). Where the
# target runs in bf16 on a CPU, a head's config may record the temperature up to which top-k children were faster
# there (tree["auto_top_to_t_bf16_cpu"]) and the smaller tree that sampled children are faster in above it
# (tree["sampled_bf16_cpu"]): for SmolLM2 on a Zen 4 CPU, top-k (3, 5, 15) up to T = 0.3, sampled (2, 4, 5) above.
# docs/decisions.md, "pruned trees, (3, 5, 15) below 0.02" and "a small sampled tree above T = 0.3 on a bf16 CPU".
AUTO_TREE_CHILDREN = "sampled"


def tree_children(spec: SpecConfig, sampling: SamplingConfig, pair: ModelPair | None = None) -> str:
    """"top" or "sampled": how a tree run's children are chosen. At T = 0 always "top" (sampling from a one-hot
    head has one child; the argmax walk is the T -> 0 limit of both). "auto" at T > 0 is AUTO_TREE_CHILDREN,
    except where the pair's target runs in bf16 on a CPU and its head's config names a temperature up to which
    top-k children were measured faster there (tree["auto_top_to_t_bf16_cpu"])."""
    if sampling.greedy:
        return "top"
    if spec.tree_children != "auto":
        return spec.tree_children
    top_to = head_tree(pair.head if pair is not None else None).get("auto_top_to_t_bf16_cpu")
    if top_to is not None and bf16_cpu(pair) and sampling.temperature <= top_to:
        return "top"
    return AUTO_TREE_CHILDREN


class TreeDrafter(EagleDrafter):
    """The EAGLE head drafts a tree (EAGLE-2; tree.grow): per depth, one head call over the frontier's topk nodes
    with a tree mask in the head's own cache; then the best `budget` nodes by cumulative head probability. The
    children are the head's top-k, not samples, so the loop verifies the tree with the exact walk (walk.walk) at
    every temperature. With sampled children (T > 0), the same head calls draw each expanded node's children
    from the head's warped q without replacement (sampled_tree.grow_sampled), and the loop verifies them by recursive
    rejection sampling (walk.walk_sampled). The drafted positions are cropped from the head's cache after the
    round, and the kept path is re-read from the target's true features, as for the chain."""

    name = "tree"
    prune_children = False  # sampled children: also stop a row's draws by prune_below (sampled_tree.grow_sampled)
    sampled_stop = False  # sampled children: no children below a node whose q's top is below the head's stop_below
    warped_scores = False  # top-k children at T > 0: choose and score them by the head's warped q (tree.grow)

    def __init__(self, head, target, sampling: SamplingConfig, vocab_size: int, capacity: int,
                 shape: tuple[int, int, int], children: str = "top", prune_below: float = 0.0, lookup: int = 0,
                 max_nodes: int | None = None, slot=None):
        self.topk, self.depth, self.budget = shape
        super().__init__(head, target, sampling, vocab_size, capacity + (self.depth - 1) * self.topk, slot)
        self.stop_below = 0.0  # a tree hedges instead of stopping
        self.prune_below = prune_below  # nodes below this cumulative head probability are left out (tree.grow)
        self.sampled = children == "sampled" and not sampling.greedy
        # lookup > 0 (top-k children only): graft up to that many copied tokens onto each tree (tree.graft), found
        # by prompt lookup over the fixed tokens, which it keeps on the host as LookupDrafter does
        self.lookup = LookupDrafter(vocab_size, 3) if lookup and not self.sampled else None
        self.lookup_k, self.max_nodes = lookup, max_nodes or self.budget + lookup

    @torch.inference_mode()
    def propose(self, seq: torch.Tensor, k_max: int, gen: torch.Generator) -> Proposal:
        empty = torch.empty(0, self.vocab_size, device=seq.device)
        if self.lookup is not None:
            self.lookup.sync(seq)
        if not self.pending and self.cache.length == 0:  # round one: the target has not read the prompt yet
            return Proposal(seq.new_empty(0), empty, "prefill")
        if k_max <= 0:
            return Proposal(seq.new_empty(0), empty, "tree")
        if self.slot:  # the shared head cache holds this run's positions from here to the round's end
            self.slot.take(self.cache)
        # 1. read the true features of the newly fixed positions, as the chain does
        g_root = self.read_pending(seq)
        depth, topk = min(self.depth, k_max), self.topk
        dev, true_len = seq.device, self.true_len
        if topk == 1:  # a tree of one child per node is a chain: drafted by the chain's own loop, no tree mask
            chain = self.draft_chain(g_root, depth, gen, not self.sampled, head_p=True)
            k = chain.tokens.shape[0]
            drawn = None if chain.q is None else Drawn(chain.q, torch.arange(k, device=dev), chain.picks,
                                                       self.head.d2t, 1)
            return Proposal(chain.tokens, empty, "tree", tree=DraftTree.chain(k, dev, chain.head_p, drawn))
        outputs = {"g": g_root}  # the predicted features of the nodes the head read last (the root's at first)

        def expand(parent_slots, draft_ids, visible, d):
            # the frontier's nodes at depth d, each read as (its parent's predicted feature, its token), in one call
            m = draft_ids.shape[0]
            feat = outputs["g"].expand(m, -1) if parent_slots is None else outputs["g"][parent_slots]
            positions = torch.full((m,), true_len + d - 1, device=dev)  # where a chain's node would sit
            prefix_seen = torch.ones(m, true_len, dtype=torch.bool, device=dev)
            g = self.step_at(feat, self.head.d2t[draft_ids], positions, torch.cat([prefix_seen, visible], dim=1))
            outputs["g"] = g
            return self.head.logits(g)

        # 2. grow the tree from the root's logits: the head's top-k children, reranked to the best `budget` nodes;
        #    or children drawn from the head, in the shape sampled_plan fixes
        if self.slot and not self.sampled and not self.warped_scores and self.lookup is None:
            # the whole growth as one replay (tree_graph.py), its tree padded to the budget
            grown = tree_graphs(self.slot, (topk, depth, self.budget), self.prune_below).grow(self.cache, g_root)
            if grown is not None:
                return Proposal(grown[0], empty, "tree", tree=grown[1])
        if self.slot and self.sampled and not self.prune_children and not self.sampled_stop:
            # the same, for children drawn from the head (sampled_graph.py), its plan padded
            grown = sampled_tree_graphs(self.slot, (topk, depth, self.budget), self.prune_below,
                                        self.sampling).grow(self.cache, g_root, gen)
            if grown is not None:
                return Proposal(grown[0], empty, "tree", tree=grown[1])
        root = self.head.logits(g_root)[0]
        if not self.sampled:
            warped = self.warped_scores and not self.sampling.greedy
            log_q = (lambda logits: warp(logits, self.sampling).log()) if warped else None
            grown = grow(root, expand, topk, depth, self.budget, self.prune_below, log_q)
            tokens, tree = self.head.d2t[grown.draft_ids], grown.tree
            if self.lookup is not None:
                tokens, tree = self.graft_lookup(tokens, tree, k_max)
            return Proposal(tokens, empty, "tree", tree=tree)
        grown = grow_sampled(root, expand, sampled_plan(topk, depth, self.budget),
                             lambda logits: warp(logits, self.sampling), gen, self.head.d2t, self.prune_below,
                             self.prune_children, self.head.cfg.stop_below if self.sampled_stop else 0.0)
        return Proposal(self.head.d2t[grown.draft_ids], empty, "tree", tree=grown.tree)

    def step_at(self, feat, tokens, positions, mask) -> torch.Tensor:
        return self.head.step(feat.to(self.dtype), self.embed(tokens).to(self.dtype), self.cache, positions, mask)

    def graft_lookup(self, tokens: torch.Tensor, tree: DraftTree, k_max: int) -> tuple[torch.Tensor, DraftTree]:
        """The tree with what followed the latest earlier occurrence of the last (up to 3) fixed tokens grafted on
        (tree.graft): at most lookup_k tokens deep and k_max deep, within max_nodes nodes. Reads the tree's tokens,
        parents, depths and head p on the host and copies the grafted tree back: four reads and four uploads a round
        where it grafts (free on a CPU; a tree with a lookup branch is grown step by step)."""
        found = self.lookup.find(self.lookup.host)
        if found is None:
            return tokens, tree
        copy = self.lookup.host[found[0]: found[0] + min(self.lookup_k, k_max)]
        ids, parents, depths, head_p = (x.tolist() for x in (tokens, tree.parents, tree.depths, tree.head_p))
        if not graft(ids, parents, depths, head_p, copy, max(0, self.max_nodes - len(ids))):
            return tokens, tree
        dev = tokens.device
        return torch.tensor(ids, device=dev), DraftTree(
            torch.tensor(parents, device=dev), torch.tensor(depths, device=dev),
            torch.tensor(head_p, device=dev, dtype=tree.head_p.dtype), max(tree.max_depth, max(depths)),
            copied_from=tokens.shape[0])

    def observe(self, outcome: RoundOutcome) -> None:
        super().observe(outcome)
        if self.lookup is not None:
            self.lookup.observe(outcome)
