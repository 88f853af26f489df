"""Request validation: turning a page's or an API call's raw inputs into an engine request, or one sentence why not.

Owns the checks on every input (numbers parsed exactly, prompts, strategies, custom model ids and their size cap),
the `Request` they produce, and the pair loading that turns a load failure into a `UserError` in the visitor's
language. It imports no gradio: the CLI, the API and the UI share it, and handlers.py turns its errors into
`gr.Error`.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from decimal import Decimal

import torch

from specdemo import i18n
from specdemo.config import (
    NGRAM_RANGE,
    PRESETS,
    SEED_MAX,
    STRATEGIES,
    TREE_DEPTH_RANGE,
    TREE_LOOKUP_MAX,
    TREE_TOPK_RANGE,
    ConfigError,
    SamplingConfig,
    SpecConfig,
)
from specdemo.engine.strategy import HEAD_STRATEGIES, check_head, has_head  # noqa: F401 (one rule; handlers and views ask here)
from specdemo.i18n import Msg, Translatable, tr
from specdemo.limits import Limits
from specdemo.models import (
    ModelLoadError,
    ModelPair,
    StrategyUnavailable,
    hub_cache,
    load_config,
    load_pair,
    loaded_pair,
)
from specdemo.models.devices import zerogpu_space
from specdemo.models.lm import release_cuda_cache
from specdemo.models.sizing import BUILD_LAYERS_MAX, count_parameters
from specdemo.models.weights import load_error, role_name

CUSTOM = "custom"  # the pair selector's value for a custom draft/target pair
SPACES_GUARD = "torch._C._cuda_init"  # named by the error spaces raises where CUDA starts outside a GPU call


class UserError(Translatable, Exception):
    """Bad input or an unavailable model: shown to the person, in their language. Raise it with a catalogue key and
    its params (`UserError("err.range", name=Msg("field.k"), ...)`); a plain sentence is shown as it is."""


def as_number(name: Msg, value, kind=float, lo=None, hi=None):
    """`value` as a number of `kind` within [lo, hi]; `name` is the field's catalogue entry (Msg("field.k")).

    Parsed as a Decimal, never through float, so that whole numbers keep every digit: a seed of 2**63 - 1 is
    accepted as it is, and 2**63 is refused rather than rounded."""
    if value is None or (isinstance(value, str) and not value.strip()):
        raise UserError("err.missing", name=name)
    try:
        number = Decimal(int(value) if isinstance(value, bool) else str(value).strip())
    except (TypeError, ValueError, ArithmeticError):
        raise UserError("err.not_number", name=name, value=repr(str(value)[:40])) from None
    if not number.is_finite():
        raise UserError("err.not_finite", name=name)
    if (lo is not None and number < lo) or (hi is not None and number > hi):
        raise UserError("err.range", name=name, lo=lo, hi=hi, value=value)
    if kind is int:
        if number != number.to_integral_value():
            raise UserError("err.not_whole", name=name, value=value)
        return int(number)
    return float(number)


NOT_A_REPO_ID = i18n.EN["err.not_a_repo_id"]  # the one refusal of anything that is not a hub repo id (in English)


def is_repo_id(model_id: str) -> bool:
    """owner/name as huggingface_hub's own validator accepts it. Looks only at the string, never at the disk."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if model_id.count("/") != 1:
        return False
    try:
        validate_repo_id(model_id)
    except HFValidationError:
        return False
    return True


def check_custom_ids(draft_id: str, target_id: str, limits: Limits, head_id: str = "") -> None:
    """The app's one rule for custom model ids, applied before anything is read or downloaded.

    1. Custom ids can be switched off (SPECDEMO_ALLOW_CUSTOM=0).
    2. Unless SPECDEMO_ALLOW_LOCAL=1, both ids (and a head's) must be hub repo ids (`is_repo_id`). Everything else
       (an absolute or relative path, ~, a Windows path, a typo) gets the same message, NOT_A_REPO_ID, decided from
       the string alone, so the answer says nothing about the server's disk. A repo id that also names a folder
       under the server's working directory (transformers would read that folder) is answered as a hub miss, as
       if the folder were not there; a head's is looked for on the hub only (eagle3_files.head_folder). The CLI
       and the Python API do not pass through here: they load paths.
    3. Models over the size cap (SPECDEMO_MAX_PARAMS_M), or that no build can count (sizing.count_parameters), are
       refused from their config, before any weights load.
    4. Before any config is read, the ids (and the head's, if given) are claimed: a repository that this read or
       the load brings into the hub cache is the visitors', deleted again past a budget (models/hub_cache.py).
    """
    if not limits.allow_custom:
        raise UserError("err.custom_off")
    hub_only = not limits.allow_local
    if hub_only and not (is_repo_id(draft_id) and is_repo_id(target_id)):
        raise UserError("err.not_a_repo_id")
    if head_id and hub_only and not is_repo_id(head_id):
        raise UserError("err.not_a_repo_id")
    hub_cache.claim_quietly([draft_id, target_id] + ([head_id] if is_repo_id(head_id) else []))
    for role, model_id in (("draft", draft_id), ("target", target_id)):
        if hub_only and os.path.lexists(model_id):  # answered word for word as transformers' hub miss is
            raise user_error(load_error(model_id, role, OSError(), local=False))
        try:
            config = load_config(model_id, role, local=False if hub_only else None)
        except ModelLoadError as err:
            raise user_error(err) from None
        n = count_parameters(config)
        if n is None:  # no build counted it: nothing bounds what it would load
            raise UserError("err.uncountable", role=role_name(role), model=repr(model_id), layers=BUILD_LAYERS_MAX)
        if n > limits.max_params_m * 1_000_000:
            raise UserError("err.too_big", role=role_name(role), model=repr(model_id), billions=f"{n / 1e9:.1f}",
                            cap=limits.max_params_m)


@dataclass(frozen=True)
class Request:
    pair: str | tuple[str, str]
    prompt: str
    sampling: SamplingConfig
    spec: SpecConfig
    run_baseline: bool
    chat: bool | None = None  # wrap the prompt with the chat template; None: the pair's default
    # on ZeroGPU, when it was made (time.monotonic()): its time limit counts from here, so that a run whose worker
    # loads the pair first pays for the load out of the GPU time it asked for; elsewhere None, from the first round
    received: float | None = field(default=None, compare=False, repr=False)


def pair_key(pair_name: str, draft_id: str | None, target_id: str | None, limits: Limits, head_id: str | None = None
             ) -> str | tuple[str, ...]:
    """A preset's name, or a custom pair's (draft, target), with its EAGLE-3 head's id as a third item if given
    (a Hub id, or a folder where SPECDEMO_ALLOW_LOCAL=1, as for the models; checked against the target at load)."""
    if pair_name == CUSTOM:
        if not all(isinstance(i, str) or i is None for i in (draft_id, target_id)):
            raise UserError("err.both_ids")
        draft_id, target_id = (draft_id or "").strip(), (target_id or "").strip()
        if not draft_id or not target_id:
            raise UserError("err.both_ids")
        head_id = (head_id or "").strip() if isinstance(head_id, str) else ""
        check_custom_ids(draft_id, target_id, limits, head_id)
        return (draft_id, target_id, head_id) if head_id else (draft_id, target_id)
    if pair_name not in PRESETS:
        raise UserError("err.unknown_pair", name=repr(str(pair_name)[:60]), presets=", ".join(PRESETS))
    return pair_name


def as_strategy(strategy) -> str:
    name = strategy.strip().lower() if isinstance(strategy, str) else strategy
    if name not in STRATEGIES:
        raise UserError("err.strategy", choices=", ".join(STRATEGIES), value=repr(str(strategy)[:40]))
    return name


def own_strategy(pair_name) -> str:
    """The strategy a pair opens with: its preset's (tree for smollm2-135m), fixed for a custom pair."""
    return PRESETS[pair_name].strategy if pair_name in PRESETS else "fixed"


TREE_FIELD_KEY = {"tree_topk": "field.tree_topk", "tree_depth": "field.tree_depth", "tree_budget": "field.tree_budget"}


def tree_size(name: str, value, hi: int, limits: Limits) -> int:
    """One of a tree's sizes (TREE_FIELD_KEY): 0 (the head's own) or 1..hi. The budget's hi is the server's
    SPECDEMO_MAX_TREE, and a budget above it is refused saying so."""
    field = Msg(TREE_FIELD_KEY[name])
    number = as_number(field, value, int)
    if name == "tree_budget" and number > limits.max_tree:
        raise UserError("err.tree_cap", name=field, max=limits.max_tree, value=value)
    if not 0 <= number <= hi:
        raise UserError("err.tree_range", name=field, lo=1, hi=hi, value=value)
    return number


def tree_prune_of(value) -> float | None:
    """The tree's pruning threshold as /generate takes it: None or a negative number (its default, -1) takes the
    head's own; otherwise a cumulative head probability below 1 (0: no pruning)."""
    if value is None:
        return None
    number = as_number(Msg("field.tree_prune"), value, float)
    if number >= 1:
        raise UserError("err.tree_prune", name=Msg("field.tree_prune"), value=value)
    return None if number < 0 else number


def validate(pair_name, draft_id, target_id, prompt, k, temperature, top_k, top_p, max_new_tokens, seed,
             run_baseline, lenience, limits: Limits | None = None, chat=None, strategy="fixed", ngram=3,
             tree_topk=0, tree_depth=0, tree_budget=0, tree_prune=None, tree_lookup=0, head_id=None) -> Request:
    """A request from raw inputs, or one sentence (UserError) on the first bad one. strategy "" or None: the
    pair's own (own_strategy), as /generate's default. The tree's sizes (0: the head's own) and its pruning
    (tree_prune_of) are checked whatever the strategy, as the n-gram size is."""
    limits = limits or Limits.from_env()
    if not isinstance(pair_name, str):  # /generate passes JSON as it comes: a list here is no preset's name
        raise UserError("err.unknown_pair", name=repr(str(pair_name)[:60]), presets=", ".join(PRESETS))
    strategy = own_strategy(pair_name) if strategy in ("", None) else as_strategy(strategy)
    try:
        if not (pair_name == CUSTOM and isinstance(head_id, str) and head_id.strip()):  # a custom head: at load
            check_head(strategy, pair_name)  # the head's strategies, refused by name before anything loads
    except StrategyUnavailable as err:
        raise user_error(err) from None
    ngram = as_number(Msg("field.ngram"), ngram, int, *NGRAM_RANGE)
    tree_topk = tree_size("tree_topk", tree_topk, TREE_TOPK_RANGE[1], limits)
    tree_depth = tree_size("tree_depth", tree_depth, TREE_DEPTH_RANGE[1], limits)
    tree_budget = tree_size("tree_budget", tree_budget, limits.max_tree, limits)
    tree_prune = tree_prune_of(tree_prune)
    tree_lookup = as_number(Msg("field.tree_lookup"), tree_lookup, int, 0, TREE_LOOKUP_MAX)
    if not isinstance(prompt, str):
        raise UserError("err.prompt_text", value=repr(str(prompt)[:20]))
    if not prompt.strip():
        raise UserError("err.prompt_empty")
    if len(prompt) > limits.max_prompt_chars:
        raise UserError("err.prompt_chars", n=len(prompt), max=limits.max_prompt_chars)
    try:  # a lone surrogate (half of a UTF-16 pair), which a script or a raw HTTP call can send, is no text
        prompt.encode("utf-8")
    except UnicodeEncodeError as err:
        raise UserError("err.prompt_unicode", at=err.start + 1) from None
    k = as_number(Msg("field.k"), k, int, 1, limits.max_k)
    temperature = as_number(Msg("field.temperature"), temperature, float, 0.0, 2.0)
    top_k = as_number(Msg("field.top_k"), top_k, int, 0, 1_000_000)
    top_p = as_number(Msg("field.top_p"), top_p, float, 0.0, 1.0)
    if top_p <= 0.0:
        raise UserError("err.top_p_zero")
    max_new_tokens = as_number(Msg("field.max_new"), max_new_tokens, int, 1, limits.max_new_tokens)
    seed = as_number(Msg("field.seed"), seed, int, 0, SEED_MAX)
    lenience = as_number(Msg("field.lenience"), lenience, float, 0.0, 1.0)
    if lenience <= 0.0:
        raise UserError("err.lenience_zero")
    if strategy == "tree" and lenience < 1.0:
        raise UserError("err.lenience_tree")
    try:
        sampling = SamplingConfig(temperature, top_k, top_p)
        spec = SpecConfig(k=k, max_new_tokens=max_new_tokens, seed=seed, lenience=lenience, strategy=strategy,
                          ngram=ngram, tree_topk=tree_topk, tree_depth=tree_depth, tree_budget=tree_budget,
                          tree_prune=tree_prune, tree_lookup=tree_lookup)
    except ConfigError as err:
        raise UserError(str(err)) from None
    if chat is not None and not isinstance(chat, bool):
        raise UserError("err.chat_value", value=repr(str(chat)[:20]))
    if run_baseline is not None and not isinstance(run_baseline, bool):  # the string "false" would be true
        raise UserError("err.baseline_value", value=repr(str(run_baseline)[:20]))
    return Request(pair_key(pair_name, draft_id, target_id, limits, head_id), prompt, sampling, spec,
                   run_baseline is not False, chat, time.monotonic() if zerogpu_space() else None)


def user_error(err: ModelLoadError | StrategyUnavailable) -> UserError:
    """A load failure or a refused strategy as a UserError that keeps its catalogue entry, so that it reaches the
    page translated."""
    return UserError(err.key, **err.params) if err.key else UserError(str(err))


def get_pair(key, strategy: str | None = None) -> ModelPair:
    """Load the pair (a failure as one sentence); with a strategy, also refuse one the loaded pair cannot use. After
    a custom pair's load (failed or not: a failed download leaves files too), the hub cache makes room
    (hub_cache.tidy): what visitors downloaded goes once past its budget."""
    custom_load = isinstance(key, tuple) and loaded_pair(key) is None
    try:
        pair = _load(key)
    finally:
        if custom_load:
            hub_cache.tidy()
    if strategy is not None:
        try:
            check_head(strategy, pair.name, pair)
        except StrategyUnavailable as err:
            raise user_error(err) from None
    return pair


def _load(key) -> ModelPair:
    """load_pair(key), its expected failures as one sentence each."""
    try:
        return load_pair(key)
    except ModelLoadError as err:
        raise user_error(err) from None
    except torch.cuda.OutOfMemoryError:  # said as a run's is (handlers.user_errors), the cache given back too
        release_cuda_cache()
        raise UserError("err.oom") from None
    except RuntimeError as err:
        # On ZeroGPU a load in one of gradio's threads, outside a GPU call, reaches spaces' guard on CUDA's start
        # (spaces 0.51.3 lends CUDA to the importing thread and to its GPU calls only; its message names
        # torch._C._cuda_init): say so in one sentence, so that the selector goes back to the loaded pair
        # (handlers.change_pair). A pair change loads inside a GPU call there (zerogpu.pair_summary), so this is
        # the fallback for a load that still meets the guard.
        if not (zerogpu_space() and SPACES_GUARD in str(err)):
            raise
        raise UserError("err.zerogpu_load") from None


def error_text(err: Exception, lang: str | None = None) -> str:
    """An expected error as one sentence in `lang` (catalogue errors are translated; others keep their text)."""
    if isinstance(err, torch.cuda.OutOfMemoryError):
        return tr("err.oom", lang)
    return err.text(lang) if isinstance(err, Translatable) else str(err)
