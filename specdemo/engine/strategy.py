"""From a run's strategy to its drafter: `make_drafter`, the most tokens a round may propose (`max_drafts`) and the
one rule for the strategies that draft with an EAGLE head (`check_head`).

Owns the choice, not the drafters: the chain drafters are in drafters.py, the tree drafter in tree_drafter.py, and
the loop that runs them in speculative.py.
"""

from __future__ import annotations

from specdemo.config import PRESETS, TREE_DEPTH_RANGE, SamplingConfig, SpecConfig
from specdemo.i18n import Msg
from specdemo.limits import Limits
from specdemo.models import CachedLM, ModelPair, StrategyUnavailable

from .drafters import ADAPTIVE_MAX_K, AdaptiveDrafter, Drafter, EagleDrafter, LookupDrafter, ModelDrafter
from .tree_drafter import TreeDrafter, run_tree_prune, run_tree_shape, tree_children

HEAD_STRATEGIES = ("eagle", "tree")  # the strategies that draft with the pair's EAGLE head


def has_head(pair_name) -> bool:
    """Whether a pair offers HEAD_STRATEGIES: only presets that ship an EAGLE head, or name a published EAGLE-3 head,
    do (a custom pair given a head has one once loaded: the page and the CLI ask the loaded pair)."""
    return pair_name in PRESETS and bool(PRESETS[pair_name].eagle_head or PRESETS[pair_name].eagle3_head)


def check_head(strategy: str, pair_name, pair: ModelPair | None = None) -> None:
    """The one rule for the strategies that draft with an EAGLE head (the page, the API, the CLI and make_drafter
    all ask here): refuse one, in one sentence (StrategyUnavailable), for a pair without a head. Before anything
    loads (pair None) by the pair's name: a custom or hub pair, or a preset that ships none. Once loaded, by the
    pair itself: its head is there, or it says why not (missing, damaged, made for another target)."""
    if strategy not in HEAD_STRATEGIES:
        return
    if pair is not None:
        if pair.head is None:
            raise StrategyUnavailable("err.no_head", name=repr(pair.name), why=pair.head_error or Msg("head.none"))
        return
    if pair_name not in PRESETS:
        raise StrategyUnavailable("err.no_head_custom")
    if not has_head(pair_name):
        raise StrategyUnavailable("err.no_head", name=repr(pair_name), why=Msg("head.none"))


def make_drafter(spec: SpecConfig, sampling: SamplingConfig, pair: ModelPair, draft_lm: CachedLM | None = None
                 ) -> Drafter:
    """The drafter for spec.strategy, made from the pair (its draft model, or its EAGLE head)."""
    if spec.strategy == "lookup":
        return LookupDrafter(pair.vocab_size, spec.ngram)
    check_head(spec.strategy, pair.name, pair)
    if spec.strategy == "eagle":
        return EagleDrafter(pair.head, pair.target, sampling, pair.vocab_size, pair.context_window + 1,
                            pair.static_slots.get("head"))
    if spec.strategy == "tree":
        return TreeDrafter(pair.head, pair.target, sampling, pair.vocab_size, pair.context_window + 1,
                           run_tree_shape(spec, sampling, pair), tree_children(spec, sampling, pair),
                           run_tree_prune(spec, sampling, pair), spec.tree_lookup, Limits.from_env().max_tree,
                           pair.static_slots.get("head"))
    draft_lm = draft_lm or pair.new_lm("draft")
    if spec.strategy == "adaptive":
        return AdaptiveDrafter(draft_lm, sampling)
    return ModelDrafter(draft_lm, sampling)


def max_drafts(spec: SpecConfig, limits: Limits | None = None) -> int:
    """The most tokens a round may propose under spec: K, except for adaptive, which picks K itself, up to
    ADAPTIVE_MAX_K and never above the server's K limit (SPECDEMO_MAX_K), and a tree, whose bound is the deepest a
    round may draft (TREE_DEPTH_RANGE[1]), not its number of nodes."""
    if spec.strategy == "tree":  # the tree's depth bounds a round; TreeDrafter takes the smaller of the two
        return TREE_DEPTH_RANGE[1]
    if spec.strategy != "adaptive":
        return spec.k
    return max(1, min(ADAPTIVE_MAX_K, (limits or Limits.from_env()).max_k))
