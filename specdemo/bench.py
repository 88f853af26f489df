"""The benchmark: naive target-only decoding vs speculative sampling vs transformers' assisted generation.

Owns the measurement protocol: one process, one pair, the same prompts and settings for every method, a warm-up
run of each method that is not counted, and the methods interleaved prompt by prompt so that a slow moment of a
shared machine hits all of them alike. It reports tokens/s, speedups, alpha, the cost ratio c and the verify cost
measured in the same run, and the theoretical ceiling those imply. No UI.
"""

from __future__ import annotations

import time
from dataclasses import replace

import torch

from .autoregressive import baseline_generate
from .config import SamplingConfig, SpecConfig
from .models import ModelPair
from .speculative import encode_prompt, speculative_generate
from .theory import expected_tokens_per_round, measure, predicted_speedup

BENCH_PROMPTS = [
    "ROMEO:\n",
    "HAMLET:\nTo be, or not to be, that is the question:\n",
    "KING HENRY V:\nOnce more unto the breach, dear friends, once more;\n",
    "VIOLA:\nI left no ring with her: what means this lady?\n",
    "MACBETH:\n",
    "First Citizen:\nWe are accounted poor citizens, the patricians good.\n",
    "PORTIA:\nThe quality of mercy is not strain'd,\n",
    "JULIET:\nO, swear not by the moon,",
    "LEAR:\n",
    "FALSTAFF:\nWhat, is the old king dead?\n",
]


@torch.inference_mode()
def assisted_generate(pair: ModelPair, prompt: str, sampling: SamplingConfig, spec: SpecConfig) -> tuple[int, float]:
    """transformers' own speculative decoding (`generate(assistant_model=draft)`) with a constant K; -> (tokens, s)."""
    ids = torch.tensor([encode_prompt(pair, prompt, spec.max_new_tokens)], device=pair.device)
    pair.draft.generation_config.num_assistant_tokens = spec.k
    pair.draft.generation_config.num_assistant_tokens_schedule = "constant"
    pair.draft.generation_config.assistant_confidence_threshold = 0.0
    kwargs = dict(do_sample=False)
    if not sampling.greedy:
        kwargs = dict(do_sample=True, temperature=sampling.temperature, top_k=sampling.top_k or None,
                      top_p=sampling.top_p)
    torch.manual_seed(spec.seed)
    t0 = time.perf_counter()
    out = pair.target.generate(
        ids, attention_mask=torch.ones_like(ids), assistant_model=pair.draft, max_new_tokens=spec.max_new_tokens,
        pad_token_id=pair.eos_token_id, **kwargs,
    )
    if pair.device.type == "cuda":
        torch.cuda.synchronize()
    return out.shape[1] - ids.shape[1], time.perf_counter() - t0


def run_bench(
    pair: ModelPair,
    sampling: SamplingConfig,
    spec: SpecConfig,
    prompts: list[str] | None = None,
    include_hf: bool = True,
    log=print,
) -> dict:
    prompts = prompts or BENCH_PROMPTS
    methods = ["naive", "speculative"] + (["hf_assisted"] if include_hf else [])
    totals = {m: {"tokens": 0, "seconds": 0.0} for m in methods}
    rounds, steps = [], []

    def run(method: str, prompt: str, seed: int):
        if method == "naive":
            tr = baseline_generate(pair, prompt, sampling, spec.max_new_tokens, seed)
            return len(tr.output_ids), tr.wall_s, tr
        if method == "speculative":
            tr = speculative_generate(pair, prompt, sampling, replace(spec, seed=seed))
            return len(tr.output_ids), tr.wall_s, tr
        n, s = assisted_generate(pair, prompt, sampling, replace(spec, seed=seed))
        return n, s, None

    for m in methods:  # warm-up: first calls pay for allocation, kernels, lazily built tables
        run(m, prompts[0], spec.seed)
    for i, prompt in enumerate(prompts):
        for m in methods:
            n, s, tr = run(m, prompt, spec.seed + i)
            totals[m]["tokens"] += n
            totals[m]["seconds"] += s
            if m == "speculative":
                rounds += tr.rounds
            elif m == "naive":
                steps += tr.steps
        log(f"  prompt {i + 1}/{len(prompts)}: " + ", ".join(
            f"{m} {totals[m]['tokens'] / totals[m]['seconds']:.1f} tok/s" for m in methods))

    tps = {m: totals[m]["tokens"] / totals[m]["seconds"] for m in methods}
    m = measure(rounds, steps, spec.k)  # t_target from the naive runs, t_draft and t_verify from the speculative
    alpha, c, verify_cost = m["alpha_empirical"], m["c"], m["verify_cost"]
    drafted = sum(r.k for r in rounds)
    emitted = sum(len(r.output) for r in rounds)
    ceiling_paper = predicted_speedup(alpha, spec.k, c)  # Leviathan et al.: verify costs one target step
    ceiling_measured = predicted_speedup(alpha, spec.k, c, verify_cost)
    speedup = tps["speculative"] / tps["naive"]
    result = {
        "pair": pair.describe(),
        "settings": {"k": spec.k, "max_new_tokens": spec.max_new_tokens, "temperature": sampling.temperature,
                     "top_k": sampling.top_k, "top_p": sampling.top_p, "prompts": len(prompts),
                     "threads": torch.get_num_threads()},
        "tokens_per_s": tps,
        "speedup_vs_naive": speedup,
        "speedup_vs_hf_assisted": tps["speculative"] / tps["hf_assisted"] if include_hf else None,
        "hf_assisted_speedup_vs_naive": tps["hf_assisted"] / tps["naive"] if include_hf else None,
        **m,
        "acceptance_rate": sum(r.n_accepted for r in rounds) / drafted,
        "mean_accepted_length": emitted / len(rounds),
        "expected_tokens_per_round": expected_tokens_per_round(alpha, spec.k),
        "ceiling_paper": ceiling_paper,
        "ceiling_measured_verify": ceiling_measured,
        "fraction_of_ceiling_paper": speedup / ceiling_paper,
        "fraction_of_ceiling_measured_verify": speedup / ceiling_measured,
        "overhead_ms_per_round": sum(r.overhead_ms for r in rounds) / len(rounds),
    }
    return result


def format_bench(res: dict) -> str:
    s = res["settings"]
    tps = res["tokens_per_s"]
    lines = [
        f"pair {res['pair']['name']} on {res['pair']['device']} ({s['threads']} threads), K={s['k']}, "
        f"T={s['temperature']}, top-k={s['top_k']}, top-p={s['top_p']}, {s['max_new_tokens']} new tokens x "
        f"{s['prompts']} prompts",
        "",
        "| method | tokens/s | speedup vs naive |",
        "|---|---:|---:|",
        f"| naive target-only (KV cache) | {tps['naive']:.1f} | 1.00x |",
        f"| specdemo speculative | {tps['speculative']:.1f} | {res['speedup_vs_naive']:.2f}x |",
    ]
    if res.get("speedup_vs_hf_assisted"):
        lines.append(f"| transformers assisted generation | {tps['hf_assisted']:.1f} | "
                     f"{res['hf_assisted_speedup_vs_naive']:.2f}x |")
        lines.append("")
        lines.append(f"specdemo vs transformers assisted: {res['speedup_vs_hf_assisted']:.2f}x")
    lines += [
        f"alpha (empirical) {res['alpha_empirical']:.3f}, alpha (mean sum min(p,q)) {res['alpha_overlap']:.3f}, "
        f"acceptance rate {res['acceptance_rate']:.3f}",
        f"mean tokens per round {res['mean_accepted_length']:.2f} (theory {res['expected_tokens_per_round']:.2f})",
        f"t_target {res['t_target_ms']:.2f} ms, t_draft {res['t_draft_ms']:.2f} ms, c = {res['c']:.3f}; "
        f"(K+1)-token verify {res['t_verify_ms']:.2f} ms = {res['verify_cost']:.2f} target steps",
        f"ceiling E/(cK+1) = {res['ceiling_paper']:.2f}x -> reached {100 * res['fraction_of_ceiling_paper']:.0f}%; "
        f"with the measured verify cost E/(cK+v) = {res['ceiling_measured_verify']:.2f}x -> reached "
        f"{100 * res['fraction_of_ceiling_measured_verify']:.0f}%",
        f"loop overhead {res['overhead_ms_per_round']:.2f} ms per round",
    ]
    return "\n".join(lines)
