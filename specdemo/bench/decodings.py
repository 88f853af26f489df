"""The bench's decodings (static.prepare): the pair with its target in every dtype worth timing
(`target_variants`), its caches run eagerly, over a static cache, or as captured CUDA graphs (`decoded_views`), each
sized to the longest request of its prompt set (`longest_request`), and what each decoding records and the line that
says which one runs and why (`decoding_info`, `decoding_line`). The strategies bench can race several side by side.
"""

from __future__ import annotations

import copy

import torch

from specdemo.engine.speculative import encode_prompt
from specdemo.models import ModelPair, load_pair_uncached, static
from specdemo.models.devices import cpu_has_bf16, dtype_name


def target_variants(pair: ModelPair) -> dict[str, ModelPair]:
    """The pair with its target in every dtype worth timing: its own, float32, and bf16 where the device has it.
    Target-only decoding is timed in each, and speedups are also given against the fastest."""
    targets = {dtype_name(pair.dtype): pair}
    for dt in (torch.float32, torch.bfloat16):
        if dtype_name(dt) not in targets and (dt == torch.float32 or pair.device.type != "cpu" or cpu_has_bf16()):
            targets[dtype_name(dt)] = load_pair_uncached((pair.draft_id, pair.target_id), str(pair.device),
                                                         draft_dtype=pair.draft_dtype, target_dtype=dt)
    return targets


def longest_request(pair: ModelPair, prompts: list[str], max_new_tokens: int) -> int:
    """The longest sequence a run of the bench makes: its longest prompt in tokens (chat template included, as the
    runs encode it) plus the new tokens. The static caches are sized to it, as a per-run cache would be."""
    return max(len(encode_prompt(pair, p, max_new_tokens)) for p in prompts) + max_new_tokens


def decoded_views(pairs: dict[str, ModelPair], decodings: list[str] | None, max_request: int,
                  log=print) -> dict[str, dict[str, ModelPair]]:
    """The pairs (target_variants: one per target dtype) under each decoding asked, keyed by the decoding that runs
    (a CPU runs "graphs" as "static", and "auto" as static.choose_mode says): {decoding: {dtype: pair}}.

    Each is static.prepare'd with its caches sized to `max_request`. The first decoding asked is prepared on the
    pairs themselves; each later one on shallow copies that share their models, tokenizer and head and hold static
    caches (and CUDA graphs) of their own, so that the decodings can alternate prompt by prompt without preparing
    again. A decoding that runs as one already prepared is left out, with a line that says so. No decodings: the
    pairs as they loaded (SPECDEMO_DECODING)."""
    if not decodings:
        return {next(iter(pairs.values())).decoding: pairs}
    out: dict[str, dict[str, ModelPair]] = {}
    for i, asked in enumerate(decodings):
        views = {name: p if i == 0 else copy.copy(p) for name, p in pairs.items()}
        for view in views.values():
            static.prepare(view, asked, max_request=max_request)
        mode = next(iter(views.values())).decoding
        if mode in out:
            log(f"decoding {asked}: runs as {mode} here, which is measured already; left out")
            continue
        out[mode] = views
        log(decoding_line(views, asked))
    return out


def decoding_info(views: dict[str, ModelPair]) -> dict:
    """What a decoding's pairs record: the decoding, the one-line reason, the static caches' size in tokens and the
    seconds each pair's capture took (CUDA graphs; 0 where nothing was captured), by target dtype."""
    first = next(iter(views.values()))
    slots = first.static_slots
    return {"decoding": first.decoding, "note": first.decoding_note,
            # the target's slots (a head's cache keeps room for a tree besides: the H200's log of 2026-11-28 said
            # "static caches of 471 tokens" for a target of 295)
            "cache_tokens": slots["target"].max_len if "target" in slots else None,
            "capture_s": {name: sum(s.capture_s for s in p.static_slots.values()) for name, p in views.items()}}


def decoding_line(views: dict[str, ModelPair] | dict, asked: str | None = None) -> str:
    """One line: the decoding that runs, why, the static caches' size and the capture seconds of each pair load.
    views: the decoding's pairs, or their decoding_info."""
    info = views if "capture_s" in views else decoding_info(views)
    size = f"; static caches of {info['cache_tokens']} tokens" if info["cache_tokens"] else ""
    capture = ", ".join(f"{s:.2f} s ({name} pair)" for name, s in info["capture_s"].items())
    asked = f" (asked: {asked})" if asked and asked != info["decoding"] else ""
    return f"decoding {info['decoding']}{asked}: {info['note'] or 'as loaded'}{size}; capture {capture}"
