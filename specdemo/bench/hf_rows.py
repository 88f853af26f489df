"""transformers' own `generate` in the bench: the rows that no specdemo code runs.

Assisted generation (`assisted_generate`: the pair's draft at a constant K, transformers' default settings, or
prompt lookup) and target-only generate (`hf_generate`), plain or with a static cache under torch.compile
(`CompiledGenerate`), each timed between two synchronisations of the pair's device (`timed_generate`). The main
benchmark (methods.py) and the strategies benchmark (strategies.py) run them beside specdemo's own rows. No UI.
"""

from __future__ import annotations

import copy
import time

import torch

from specdemo.config import SamplingConfig, SpecConfig
from specdemo.engine.speculative import device_sync, encode_prompt
from specdemo.models import ModelPair, PackedLinear

ASSISTANT_SETTINGS = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")


@torch.inference_mode()
def assisted_generate(pair: ModelPair, prompt: str, sampling: SamplingConfig, spec: SpecConfig,
                      mode: str = "constant") -> tuple[int, float]:
    """transformers' own speculative decoding; -> (tokens, seconds).

    mode "constant": `generate(assistant_model=draft)` with a constant K and no confidence stop. "default": what a
    user gets with no settings (transformers 5: num_assistant_tokens=20, a constant schedule, and a stop when the
    draft's probability of its token falls below assistant_confidence_threshold=0.4). "lookup": no draft model,
    `generate(prompt_lookup_num_tokens=spec.k)` (n-grams up to transformers' default max_matching_ngram_size=2).
    """
    ids = torch.tensor([encode_prompt(pair, prompt, spec.max_new_tokens)], device=pair.device)
    config = pair.draft.generation_config
    saved = getattr(config, "_specdemo_saved", None)
    if saved is None:  # the checkpoint's own settings (None: transformers' global defaults apply)
        saved = config._specdemo_saved = {a: getattr(config, a, None) for a in ASSISTANT_SETTINGS}
    for attr, value in saved.items():
        setattr(config, attr, value)
    extra = {}
    if mode == "constant":
        config.num_assistant_tokens = spec.k
        config.num_assistant_tokens_schedule = "constant"
        config.assistant_confidence_threshold = 0.0
        extra["assistant_model"] = pair.draft
    elif mode == "default":
        extra["assistant_model"] = pair.draft
    elif mode == "lookup":
        extra["prompt_lookup_num_tokens"] = spec.k
    else:
        raise ValueError(mode)
    return timed_generate(pair, pair.target, ids, sampling, spec.max_new_tokens, spec.seed, **extra)


def timed_generate(pair: ModelPair, model, ids: torch.Tensor, sampling: SamplingConfig, max_new_tokens: int,
                   seed: int, **extra) -> tuple[int, float]:
    """One `model.generate` from prompt ids [1, n] with the run's sampling settings, timed between two device
    synchronisations; -> (new tokens, seconds). `extra`: generate's own arguments (an assistant, a cache)."""
    kwargs = dict(do_sample=False)
    if not sampling.greedy:
        kwargs = dict(do_sample=True, temperature=sampling.temperature, top_k=sampling.top_k or None,
                      top_p=sampling.top_p)
    torch.manual_seed(seed)
    mask = torch.ones_like(ids)
    device_sync(pair.device)  # the copies above are done before the clock starts, on the pair's own device
    t0 = time.perf_counter()
    out = model.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, pad_token_id=pair.eos_token_id,
                         **extra, **kwargs)
    device_sync(pair.device)
    return out.shape[1] - ids.shape[1], time.perf_counter() - t0


@torch.inference_mode()
def hf_generate(pair: ModelPair, prompt: str, sampling: SamplingConfig, max_new_tokens: int, seed: int,
                compiled: CompiledGenerate | None = None) -> tuple[int, float]:
    """transformers' own target-only decoding, `target.generate` (its dynamic cache, eager forwards), or with
    `compiled` its static cache under torch.compile (CompiledGenerate); -> (tokens, seconds)."""
    ids = torch.tensor([encode_prompt(pair, prompt, max_new_tokens)], device=pair.device)
    if compiled is None:
        return timed_generate(pair, pair.target, ids, sampling, max_new_tokens, seed)
    return timed_generate(pair, compiled.model, ids, sampling, max_new_tokens, seed, **compiled.kwargs)


class CompiledGenerate:
    """transformers' `generate(cache_implementation="static")` with its one-token decode step compiled by
    torch.compile, as transformers does it itself (`compile_config`, GenerationMixin._valid_auto_compile_criteria,
    PreTrainedModel.get_compiled_call): CompileConfig(fullgraph=True, mode="reduce-overhead") on CUDA, which
    replays the step as CUDA graphs; on a CPU mode "default" (there are no graphs to replay), where transformers
    compiles only when asked to (`_compile_all_devices`). The prefill runs eagerly, as in transformers.

    On a CPU whose bf16 linears specdemo packed for oneDNN (models.PackedLinear) inductor cannot lower the packed
    weights, so the compiled model is a plain copy of the target (its own nn.Linear layers, the same weights).

    `warm_up` compiles it: `calls` generate calls on the longest prompt of the run (transformers keeps the largest
    static cache it has made, so the longest request first means one cache size and one compile), timed one by one;
    the first holds the compile. It is not part of any row's time."""

    def __init__(self, pair: ModelPair):
        self.cuda = pair.device.type == "cuda"
        self.configure(fullgraph=True)
        self.model, self.copied = None, False  # warm_up makes it
        self.warmup_s: list[float] = []
        self.error: str | None = None

    def configure(self, fullgraph: bool) -> None:
        """A fresh CompileConfig (transformers recompiles when the config it is handed is a different one)."""
        from transformers import CompileConfig

        self.config = CompileConfig(fullgraph=fullgraph, mode="reduce-overhead" if self.cuda else "default")
        if not self.cuda:
            self.config._compile_all_devices = True  # transformers compiles on CUDA (and a few others) by itself
        self.kwargs = {"cache_implementation": "static", "compile_config": self.config}

    def describe(self) -> dict:
        return {"compile_config": {"fullgraph": self.config.fullgraph, "mode": self.config.mode,
                                   "backend": self.config.backend, "dynamic": self.config.dynamic},
                "plain_copy": self.copied,
                "warmup_s": self.warmup_s, "compile_s": self.warmup_s[0] if self.warmup_s else None,
                "error": self.error}

    def warm_up(self, pair: ModelPair, prompts: list[str], sampling: SamplingConfig, max_new_tokens: int,
                seed: int = 0, calls: int = 3, log=print) -> bool:
        """Compile and warm up, with fullgraph=True and, where that fails, once more with transformers' default
        fullgraph=False; False (with `error` set) where both fail, so that the bench goes on without the row."""
        longest = max(prompts, key=lambda p: len(encode_prompt(pair, p, max_new_tokens)))
        for fullgraph in (True, False):
            self.configure(fullgraph)
            self.warmup_s, self.error = [], None
            try:
                if self.model is None:
                    self.model = plain_copy(pair.target)
                    self.copied = self.model is not pair.target
                for _ in range(calls):
                    self.warmup_s.append(hf_generate(pair, longest, sampling, max_new_tokens, seed, self)[1])
            except Exception as err:  # noqa: BLE001 - a compile that fails drops the row, and says why
                text = str(err).strip()
                self.error = f"{type(err).__name__}: {text.splitlines()[0][:200] if text else ''}"
                log(f"hf generate static compiled: compiling with fullgraph={fullgraph} failed ({self.error})"
                    + ("; trying fullgraph=False" if fullgraph else "; the row is left out"))
                torch._dynamo.reset()
                continue
            log(f"hf generate static compiled: CompileConfig(fullgraph={fullgraph}, mode={self.config.mode!r}); "
                "warm-up calls " + ", ".join(f"{s:.1f} s" for s in self.warmup_s) + " (the first holds the compile)")
            return True
        return False


def plain_copy(model):
    """`model` itself, or where specdemo packed its bf16 linears (PackedLinear) a copy with plain nn.Linear layers
    and the same weights, which torch.compile's inductor can lower."""
    packed = {m: m.packed for m in model.modules() if isinstance(m, PackedLinear)}
    if not packed:
        return model
    try:
        for m in packed:
            m.__class__ = torch.nn.Linear
            del m.packed
        return copy.deepcopy(model)
    finally:
        for m, p in packed.items():
            m.__class__ = PackedLinear
            m.packed = p
