"""Greedy identity (`bench --identity`): at T = 0 every drafting strategy must give the tokens of the project's own
target-only decoding, prompt by prompt, under the pair's decoding (eager, static or captured CUDA graphs).

Owns the check and its report: per strategy, on how many prompts the two outputs are the same tokens, and for each
prompt where they part, where and whether the target's two candidates there are a near-tie within bf16 rounding
(ties.explain_divergence: such a tie may break either way in two summation orders, which is no bug). Where the pair
does not decode eagerly, its target-only is also set against an eager copy of itself: the captured path's own
identity. No timing.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from functools import partial

from specdemo.config import SamplingConfig, SpecConfig
from specdemo.engine.autoregressive import baseline_generate
from specdemo.engine.speculative import speculative_generate
from specdemo.engine.ties import explain_divergence
from specdemo.models import ModelPair, static


def identity_specs(pair: ModelPair, k: int = 4, lookup_k: int = 8) -> dict[str, SpecConfig]:
    """The strategies the pair offers, by row name: fixed, adaptive and lookup always, eagle and tree (the head's
    own shape) where the pair has an EAGLE head."""
    specs = {f"fixed K={k}": SpecConfig(k=k, strategy="fixed"), "adaptive": SpecConfig(k=k, strategy="adaptive"),
             f"lookup K={lookup_k}": SpecConfig(k=lookup_k, strategy="lookup")}
    if pair.head is not None:
        specs |= {f"eagle K={k}": SpecConfig(k=k, strategy="eagle"), "tree": SpecConfig(strategy="tree")}
    return specs


def check_identity(pair: ModelPair, prompts: list[str], max_new_tokens: int, k: int = 4, lookup_k: int = 8,
                   seed: int = 0, log=print) -> dict:
    """Every strategy against the pair's own target-only at T = 0 on each prompt: {"rows": {name: {"same": n,
    "prompts": n, "parted": [...]}}, ...}. A parting is {"prompt": i, "position": token index, "near_tie": bool,
    ...}; near_tie False is a bug."""
    greedy = SamplingConfig(0.0)
    specs = identity_specs(pair, k, lookup_k)
    rows = {name: {"same": 0, "prompts": 0, "parted": []} for name in specs}
    eager = None
    if pair.decoding != "eager":  # the decoding's own target-only against the eager path's
        eager = copy.copy(pair)
        static.prepare(eager, "eager")
        rows[f"target-only {pair.decoding} vs eager"] = {"same": 0, "prompts": 0, "parted": []}
    for i, prompt in enumerate(prompts):
        base = baseline_generate(pair, prompt, greedy, max_new_tokens, seed)
        runs = {name: speculative_generate(pair, prompt, greedy, replace(spec, max_new_tokens=max_new_tokens,
                                                                          seed=seed, top_candidates=0))
                for name, spec in specs.items()}
        for name, tr in runs.items():
            record(rows[name], i, tr.output_ids, base.output_ids,
                   partial(explain_divergence, pair, tr.prompt_ids, tr.rounds, base.output_ids))
        if eager is not None:
            ref = baseline_generate(eager, prompt, greedy, max_new_tokens, seed)
            record(rows[f"target-only {pair.decoding} vs eager"], i, base.output_ids, ref.output_ids, None)
        log(f"  prompt {i + 1}/{len(prompts)}: " + ", ".join(
            f"{name} {'=' if not r['parted'] or r['parted'][-1]['prompt'] != i else 'PARTS'}"
            for name, r in rows.items()))
    return {"pair": pair.describe(), "settings": {"prompts": len(prompts), "max_new_tokens": max_new_tokens,
                                                  "k": k, "lookup_k": lookup_k, "seed": seed,
                                                  "decoding": pair.decoding,
                                                  "decoding_note": pair.decoding_note},
            "rows": rows, "bugs": sum(1 for r in rows.values() for p in r["parted"] if p["near_tie"] is False)}


def record(row: dict, prompt: int, ids: list[int], ref: list[int], explain) -> None:
    """Count one prompt in `row`: the same tokens, or where they part (explained by `explain()` where given)."""
    row["prompts"] += 1
    if ids == ref:
        row["same"] += 1
        return
    at = next((j for j, (a, b) in enumerate(zip(ids, ref)) if a != b), min(len(ids), len(ref)))
    d = explain() if explain is not None else None
    row["parted"].append({"prompt": prompt, "position": at, "near_tie": d.near_tie if d is not None else None,
                          "divergence": d.to_dict() if d is not None else None})


def format_identity(res: dict) -> str:
    s = res["settings"]
    lines = [(f"greedy identity: pair {res['pair']['name']} on {res['pair']['device']}, target "
              f"{res['pair']['target_dtype']}, decoding {s['decoding']} ({s['decoding_note']}), {s['prompts']} "
              f"prompts x {s['max_new_tokens']} tokens, T = 0; each strategy against the project's own target-only")]
    for name, r in res["rows"].items():
        parts = "; ".join(
            f"prompt {p['prompt'] + 1} parts at token {p['position']}"
            + ("" if p["near_tie"] is None else ": a near-tie" if p["near_tie"] else ": NOT a near-tie (a bug)")
            for p in r["parted"])
        lines.append(f"{name}: identity {r['same']}/{r['prompts']}" + (f" ({parts})" if parts else ""))
    return "\n".join(lines)

