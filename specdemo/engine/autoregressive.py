"""The honest baseline: target-only autoregressive decoding with a KV cache.

Owns the token-by-token loop as a generator of `Step` events. It uses the same `CachedLM`, the same `warp` and
`sample`, and a generator seeded the same way as the speculative loop, so that at T = 0 both produce the same
tokens and any speedup measured between them is the algorithm's, not a missing cache's.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch

from specdemo.config import SamplingConfig
from specdemo.models import CachedLM, ModelPair

from .events import Step, Token, Trace
from .sampling import sample, warp
from .speculative import device_sync, encode_prompt, finish, run_settings


@torch.inference_mode()
def baseline_steps(
    pair: ModelPair,
    prompt_ids: list[int],
    sampling: SamplingConfig,
    max_new_tokens: int,
    seed: int = 0,
    target_lm: CachedLM | None = None,
) -> Iterator[Step]:
    """Yield one Step per generated token until max_new_tokens or EOS."""
    dev = pair.device
    gen = torch.Generator(device=dev).manual_seed(seed)
    target = target_lm or pair.new_lm("target")
    target.reset()
    pending = torch.tensor(prompt_ids, dtype=torch.long, device=dev)
    eos = pair.eos_token_ids  # the generation config's EOS ids and the tokenizer's, as in the speculative loop
    stream = pair.text_stream()  # what each token adds to the output (a piece of a character adds "")
    busy = 0.0
    for i in range(max_new_tokens):
        t0 = time.perf_counter()
        p = warp(target.feed(pending), sampling)  # [1, V]
        x = sample(p, gen, greedy=sampling.greedy)  # [1]
        tok, p_x = torch.stack([x[0].float(), p[0, x[0]]]).tolist()  # one host sync per token
        tok_id = int(tok)
        device_sync(dev)
        t1 = time.perf_counter()
        busy += t1 - t0
        stop = "eos" if tok_id in eos else ("max_new_tokens" if i + 1 == max_new_tokens else None)
        token = Token(tok_id, stream.push(tok_id), "bonus", 1, p=p_x)
        yield Step(i, token, (t1 - t0) * 1e3, busy, stop)
        if stop:
            return
        pending = x


def baseline_generate(
    pair: ModelPair,
    prompt: str,
    sampling: SamplingConfig | None = None,
    max_new_tokens: int = 64,
    seed: int = 0,
    chat: bool | None = None,
) -> Trace:
    """Run the target alone to the end and return its Trace (chat: as in speculative_generate)."""
    sampling = sampling or SamplingConfig()
    chat = pair.chat if chat is None else chat
    prompt_ids = encode_prompt(pair, prompt, max_new_tokens, chat)
    settings = run_settings(pair, sampling) | {"max_new_tokens": max_new_tokens, "seed": seed, "chat": chat}
    trace = Trace("baseline", prompt, prompt_ids, settings=settings)
    t0 = time.perf_counter()
    with pair.lock:
        trace.steps.extend(baseline_steps(pair, prompt_ids, sampling, max_new_tokens, seed))
    trace.wall_s = time.perf_counter() - t0
    finish(pair, trace)
    return trace
