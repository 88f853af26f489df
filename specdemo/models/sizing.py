"""What a model weighs before it loads: its parameter count from its config alone, for the size cap on visitors'
models (app/validation.py) and the memory budget of a load (loading.load_bytes)."""

from __future__ import annotations

import copy
import threading
import warnings
from collections import OrderedDict

import torch

BUILD_LAYERS_MAX = 512  # layers over a config and its sub-configs (a vision tower's too) that it may build to count
BUILD_EXPERTS_MAX = 1024  # experts a layer may name (DeepSeek-V3: 256); past either, count_parameters builds nothing
COUNTS_KEPT = 32  # configs whose count is kept: a custom pair is counted by the cap, then by its load's budget
_COUNTS: OrderedDict[tuple[str, str], int | None] = OrderedDict()
_COUNTS_GUARD = threading.Lock()
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "depth", "encoder_layers", "decoder_layers")
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


def count_parameters(config) -> int | None:
    """A model's size from its config alone, for the size cap on visitors' models: its parameters and the elements
    of its buffers (gpt_bigcode keeps a causal mask of n_positions² elements, which a 300 KB repository can make
    gigabytes), counted exactly on a model built from a copy of the config on the meta device (no tensor memory,
    no weights; tied weights once; a composite config's vision tower and an MoE's experts included). None where
    transformers cannot build it here, or where it names more layers or experts than BUILD_LAYERS_MAX and
    BUILD_EXPERTS_MAX (a config can ask for a build that takes minutes): then nothing counts it. The last
    COUNTS_KEPT configs' counts are kept, by their JSON: a custom pair's models are counted by the size cap, then
    again by its load's memory budget (loading.load_bytes).
    The formula that came before read 0 for a composite config (Gemma 3's) and left out an MoE's experts
    (docs/decisions.md, "the size cap counts what loads")."""
    key = (type(config).__name__, config.to_json_string())
    with _COUNTS_GUARD:
        if key in _COUNTS:
            return _COUNTS[key]
    n = built_count(config)
    with _COUNTS_GUARD:
        _COUNTS[key] = n
        while len(_COUNTS) > COUNTS_KEPT:
            _COUNTS.popitem(last=False)
    return n


def built_count(config) -> int | None:
    """count_parameters without its memory of the configs it has counted."""
    from transformers import AutoModelForCausalLM

    layers, experts = build_size(config)
    if layers > BUILD_LAYERS_MAX or experts > BUILD_EXPERTS_MAX:
        return None
    try:
        # dtype=None: from_config would otherwise set torch's default dtype to the config's for the whole process
        # while it builds, and a run in another thread would then draw its uniforms in bf16
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = AutoModelForCausalLM.from_config(copy.deepcopy(config), dtype=None, trust_remote_code=False)
    except Exception:  # noqa: BLE001 - an architecture transformers cannot build here
        return None
    return int(sum(p.numel() for p in model.parameters()) + sum(b.numel() for b in model.buffers()))


def estimate_parameters(config) -> int:
    """count_parameters where it counts, else `parameter_formula`: for the memory a load will take
    (loading.load_bytes), where the load itself will say what it cannot do."""
    n = count_parameters(config)
    return parameter_formula(config) if n is None else n


def build_size(config) -> tuple[int, int]:
    """The layers a config names, summed over it and every sub-config, and the most experts any of them names."""
    layers = experts = 0

    def walk(fields: dict) -> None:
        nonlocal layers, experts
        for key, value in fields.items():
            if isinstance(value, dict):
                walk(value)
            elif isinstance(value, int) and not isinstance(value, bool) and value > 0:
                if key in LAYER_KEYS:
                    layers += value
                elif key in EXPERT_KEYS:
                    experts = max(experts, value)

    walk(config.to_dict())
    return layers, experts


def text_layers(config) -> int:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(getattr(text, "num_hidden_layers", None) or getattr(text, "n_layer", None) or 0)


def parameter_formula(config) -> int:
    """A decoder's parameters from its (text) config: embeddings (positions too, as if learned) + attention + MLP,
    the MLP once per expert. A rough figure: where nothing could build the model."""
    c = config.get_text_config() if hasattr(config, "get_text_config") else config
    d = getattr(c, "hidden_size", None) or getattr(c, "n_embd", None) or getattr(c, "d_model", 0) or 0
    vocab = getattr(c, "vocab_size", 0) or 0
    inner = getattr(c, "intermediate_size", None) or getattr(c, "n_inner", None) or 4 * d
    experts = next((int(n) for n in (getattr(c, k, None) for k in ("num_experts", "num_local_experts",
                                                                   "n_routed_experts")) if n), 0)
    if experts:
        inner = (getattr(c, "moe_intermediate_size", None) or inner) * experts
    mlp = (3 if getattr(c, "intermediate_size", None) else 2) * d * inner
    positions = getattr(c, "max_position_embeddings", None) or getattr(c, "n_positions", None) or 0  # if learned
    return int((vocab + positions) * d + text_layers(c) * (4 * d * d + mlp))
