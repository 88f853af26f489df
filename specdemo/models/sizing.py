"""What a model weighs before it loads: its parameter count from its config alone, for the size cap on visitors'
models (app/validation.py) and the memory budget of a load (loading.load_bytes)."""

from __future__ import annotations

import warnings

import torch

BUILD_LAYERS_MAX = 1024  # a config with more layers is counted by formula: building it, even on meta, could take long


def estimate_parameters(config) -> int:
    """A model's parameter count from its config alone, for the size cap and the memory budget: counted exactly on a
    model built on the meta device (no memory, no weights; tied weights once; a composite config's vision tower and
    an MoE's experts included), else, where transformers cannot build it, or it names over BUILD_LAYERS_MAX layers,
    by `parameter_formula` over its text config. The formula alone read 0 for a composite config (Gemma 3's)
    and left out an MoE's experts (docs/decisions.md, "the size cap counts what loads")."""
    from transformers import AutoModelForCausalLM

    rough = parameter_formula(config)
    if text_layers(config) > BUILD_LAYERS_MAX:
        return rough
    try:
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    except Exception:  # noqa: BLE001 - an architecture transformers cannot build here: the formula's estimate
        return rough
    return int(sum(p.numel() for p in model.parameters()))


def text_layers(config) -> int:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(getattr(text, "num_hidden_layers", None) or getattr(text, "n_layer", None) or 0)


def parameter_formula(config) -> int:
    """A decoder's parameters from its (text) config: embeddings + attention + MLP, the MLP once per expert."""
    c = config.get_text_config() if hasattr(config, "get_text_config") else config
    d = getattr(c, "hidden_size", None) or getattr(c, "n_embd", None) or getattr(c, "d_model", 0) or 0
    vocab = getattr(c, "vocab_size", 0) or 0
    inner = getattr(c, "intermediate_size", None) or getattr(c, "n_inner", None) or 4 * d
    experts = next((int(n) for n in (getattr(c, k, None) for k in ("num_experts", "num_local_experts",
                                                                   "n_routed_experts")) if n), 0)
    if experts:
        inner = (getattr(c, "moe_intermediate_size", None) or inner) * experts
    mlp = (3 if getattr(c, "intermediate_size", None) else 2) * d * inner
    return int(vocab * d + text_layers(c) * (4 * d * d + mlp))
