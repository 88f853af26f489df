"""The benchmark: naive target-only decoding vs speculative sampling vs transformers' assisted generation.

Owns the measurement protocol: one process, one pair, the same prompts and settings for every method, a warm-up
run of each method that is not counted, and the methods interleaved prompt by prompt so that a slow moment of a
shared machine hits all of them alike. It reports tokens/s, speedups, alpha, the cost ratio c and the verify cost
measured in the same run, and the theoretical ceiling those imply. strategies.py (bench --strategies) does
the same for every drafting strategy, target-only decoding in each dtype, and transformers' equivalents. No UI.

What it builds on lives beside it: decodings.py (the pairs' caches run eagerly, over a static cache, or as captured
CUDA graphs, sized to the longest request of the prompt set), hf_rows.py (transformers' own `generate`, assisted or
target-only, plain or compiled: the rows that no specdemo code runs) and timing.py (the isolated costs: a draft
step, a target step, a verify).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from specdemo.config import SamplingConfig, SpecConfig
from specdemo.engine.autoregressive import baseline_generate
from specdemo.engine.events import acceptance
from specdemo.engine.speculative import speculative_generate
from specdemo.engine.theory import expected_tokens_per_round, measure, predicted_speedup
from specdemo.engine.tree_drafter import run_tree_prune, run_tree_shape, tree_children
from specdemo.models import ModelPair
from specdemo.models.devices import dtype_name

from .decodings import decoded_views, decoding_info, longest_request, target_variants
from .hf_rows import assisted_generate
from .prompts import HELD_OUT
from .timing import forward_ms, frontier_width, isolated_draft_ms, tree_verify_ms

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

# prompts on which copying pays: repeat, edit or answer from a quoted passage (prompt lookup's home ground)
COPY_PROMPTS = {
    "shakespeare": [
        "ROMEO:\nBut, soft! what light through yonder window breaks?\nIt is the east, and Juliet is the sun.\n"
        "Arise, fair sun, and kill the envious moon,\nWho is already sick and pale with grief,\n"
        "JULIET:\nSay it again, Romeo, every word:\nROMEO:\nBut, soft! what light through yonder window breaks?\n",
        "HAMLET:\nTo be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n"
        "The slings and arrows of outrageous fortune,\nOr to take arms against a sea of troubles,\n"
        "HORATIO:\nMy lord, repeat it, that I may learn it:\nHAMLET:\nTo be, or not to be, that is the question:\n",
        "PORTIA:\nThe quality of mercy is not strain'd,\nIt droppeth as the gentle rain from heaven\n"
        "Upon the place beneath: it is twice blest;\nNERISSA:\nMadam, you said: The quality of mercy is not strain'd,\n",
        "First Citizen:\nWe are accounted poor citizens, the patricians good.\nWhat authority surfeits on would "
        "relieve us.\nSecond Citizen:\nYou said, We are accounted poor citizens, the patricians good.\n",
    ],
    "smollm2-135m": [
        "Repeat this sentence exactly: \"The quick brown fox jumps over the lazy dog while the farmer sleeps under "
        "the old oak tree.\"",
        "Rewrite this paragraph with the word \"car\" replaced by \"bicycle\": \"My car is red. I drive my car to "
        "work every day, and on weekends my car takes me to the lake.\"",
        "Fix the spelling in this text and return it: \"The weathr today is sunny and warm, so we will go to the "
        "beech and swim in the see.\"",
        "Read the text and answer the question. Text: \"The Eiffel Tower was completed in 1889 for the World's "
        "Fair in Paris. It is 330 metres tall and was the tallest man-made structure in the world for 41 years.\" "
        "Question: When was the Eiffel Tower completed, and how tall is it?",
    ],
}


def bench_prompts(pair: ModelPair) -> list[str]:
    """The bench's prompts for a pair: the Shakespeare prompts, or a chat preset's held-out messages. Messages stay
    plain text: encode_prompt wraps them in the chat template once, as for every other run of a chat pair."""
    if pair.name == "smollm2-135m":
        return list(HELD_OUT)
    return list(BENCH_PROMPTS)


def run_bench(
    pair: ModelPair,
    sampling: SamplingConfig,
    spec: SpecConfig,
    prompts: list[str] | None = None,
    include_hf: bool = True,
    log=print,
    decoding: str | None = None,
) -> dict:
    """spec.strategy against target-only decoding in each dtype (and transformers' assisted generation with the
    pair's draft model), interleaved prompt by prompt. decoding: how the pairs' caches run (static.prepare, sized to
    the longest request); None keeps the pair's own (SPECDEMO_DECODING at load)."""
    prompts = prompts or BENCH_PROMPTS
    own = dtype_name(pair.dtype)
    views = decoded_views(target_variants(pair), [decoding] if decoding else None,
                          longest_request(pair, prompts, spec.max_new_tokens), log)
    (mode, variants), = views.items()
    naive = {("naive" if d == own else f"naive {d}"): p for d, p in variants.items()}
    methods = [*naive, "speculative"] + (["hf_assisted"] if include_hf else [])
    totals, rounds, steps = interleaved_runs(pair, naive, methods, prompts, sampling, spec, log)
    res = summarize(pair, sampling, spec, len(prompts), naive, totals, rounds, steps)
    res["settings"] |= {"decoding": mode, "decoding_info": decoding_info(variants)}
    return res


def interleaved_runs(pair: ModelPair, naive: dict, methods: list[str], prompts: list[str], sampling: SamplingConfig,
                     spec: SpecConfig, log) -> tuple[dict, list, list]:
    """Every method on every prompt, prompt by prompt (so that a machine's slow minute hurts all methods alike),
    after one warm-up call each: -> (tokens and seconds per method, the speculative rounds, the naive steps)."""
    totals = {m: {"tokens": 0, "seconds": 0.0} for m in methods}
    rounds, steps = [], []

    def run(method: str, prompt: str, seed: int):
        if method in naive:
            tr = baseline_generate(naive[method], prompt, sampling, spec.max_new_tokens, seed)
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
    return totals, rounds, steps


def summarize(pair: ModelPair, sampling: SamplingConfig, spec: SpecConfig, n_prompts: int, naive: dict,
              totals: dict, rounds: list, steps: list) -> dict:
    """The bench's figures: rates, speedups, the paper's quantities (alpha, c, the verify's cost) and ceilings."""
    methods, include_hf = list(totals), "hf_assisted" in totals
    tps = {m: totals[m]["tokens"] / totals[m]["seconds"] for m in methods}
    fastest = max((m for m in naive), key=tps.get)
    tree = run_tree_shape(spec, sampling, pair) if spec.strategy == "tree" else None
    k_full = tree[2] if tree else spec.k if spec.strategy != "adaptive" else None
    m = measure(rounds, steps, k_full)  # t_target from the naive runs, t_draft and t_verify from the speculative
    alpha, c, verify_cost = m["alpha_empirical"], m["c"], m["verify_cost"]
    emitted = sum(len(r.output) for r in rounds)
    ceiling_paper = predicted_speedup(alpha, spec.k, c)  # Leviathan et al.: verify costs one target step
    ceiling_measured = predicted_speedup(alpha, spec.k, c, verify_cost)
    speedup = tps["speculative"] / tps["naive"]
    iso_draft = isolated_draft_ms(pair, spec.strategy, frontier_width(tree, tree_children(spec, sampling, pair))
                                  if tree else 0)
    iso_target = forward_ms(pair.target, pair.vocab_size, 1)
    own_logits = forward_ms(pair.target, pair.vocab_size, 1, float32_logits=False)
    result = {
        "pair": pair.describe(),
        "settings": {"k": spec.k, "strategy": spec.strategy, "max_new_tokens": spec.max_new_tokens,
                     "temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p,
                     "prompts": n_prompts, "threads": torch.get_num_threads()},
        "tokens_per_s": tps,
        "speedup_vs_naive": speedup,
        "fastest_naive": fastest,
        "speedup_vs_fastest_naive": tps["speculative"] / tps[fastest],
        "speedup_vs_hf_assisted": tps["speculative"] / tps["hf_assisted"] if include_hf else None,
        "hf_assisted_speedup_vs_naive": tps["hf_assisted"] / tps["naive"] if include_hf else None,
        **m,
        "c_isolated": iso_draft / iso_target if iso_draft is not None else None,
        "t_draft_isolated_ms": iso_draft, "t_target_isolated_ms": iso_target,
        "t_target_own_logits_ms": own_logits,  # the same step with the logits in the model's dtype
        "acceptance_rate": acceptance(rounds)["acceptance_rate"],
        "mean_accepted_length": emitted / len(rounds),
        "drafts_per_round": sum(r.k for r in rounds) / len(rounds),
        "expected_tokens_per_round": expected_tokens_per_round(alpha, spec.k),
        "ceiling_paper": ceiling_paper,
        "ceiling_measured_verify": ceiling_measured,
        "fraction_of_ceiling_paper": speedup / ceiling_paper,
        "fraction_of_ceiling_measured_verify": speedup / ceiling_measured,
        "overhead_ms_per_round": sum(r.overhead_ms for r in rounds) / len(rounds),
        "target_calls": len(rounds),
    }
    if tree:  # the chain's theory lines do not apply; the tree's own costs, in target steps
        full = [r for r in rounds if r.tree and r.k == tree[2]] or [r for r in rounds if r.tree]
        depth_of = [max(nd.depth for nd in r.tree) for r in full]
        result |= {
            "tree_shape": {"topk": tree[0], "depth": tree[1], "budget": tree[2],
                           "prune_below": run_tree_prune(spec, sampling, pair), "lookup": spec.tree_lookup},
            "tree_verify_ms_isolated": tree_verify_ms(pair, tree[2]),
            "head_ms_per_depth": sum(r.draft_ms for r in full) / max(1, sum(depth_of)),
            "head_ms_per_depth_isolated": iso_draft,
        }
    return result


def format_bench(res: dict) -> str:
    s = res["settings"]
    tps = res["tokens_per_s"]
    lines = [
        f"pair {res['pair']['name']} on {res['pair']['device']} ({s['threads']} threads), {s['strategy']}, K={s['k']}, "
        f"T={s['temperature']}, top-k={s['top_k']}, top-p={s['top_p']}, {s['max_new_tokens']} new tokens x "
        f"{s['prompts']} prompts" + (f", decoding {s['decoding']}" if s.get("decoding") else ""),
        "",
        "| method | tokens/s | speedup vs naive |",
        "|---|---:|---:|",
        f"| naive target-only (KV cache), {res['pair']['target_dtype']} | {tps['naive']:.1f} | 1.00x |",
    ]
    lines += [f"| naive target-only (KV cache), {m.split()[1]} | {tps[m]:.1f} | {tps[m] / tps['naive']:.2f}x |"
              for m in tps if m.startswith("naive ")]
    lines += [f"| specdemo speculative ({s['strategy']}) | {tps['speculative']:.1f} | {res['speedup_vs_naive']:.2f}x |",
              "", f"speedup vs the fastest target-only ({res['fastest_naive']}): "
              f"{res['speedup_vs_fastest_naive']:.2f}x"]
    if res.get("speedup_vs_hf_assisted"):
        lines.append(f"| transformers assisted generation | {tps['hf_assisted']:.1f} | "
                     f"{res['hf_assisted_speedup_vs_naive']:.2f}x |")
        lines.append("")
        lines.append(f"specdemo vs transformers assisted: {res['speedup_vs_hf_assisted']:.2f}x")
    if "tree_shape" in res:
        t, step = res["tree_shape"], res["t_target_isolated_ms"]
        lines += [
            f"tree top-k {t['topk']}, depth {t['depth']}, budget {t['budget']}"
            + (f", pruned below {t['prune_below']:g}" if t.get("prune_below") else "")
            + (f", a lookup branch of up to {t['lookup']}" if t.get("lookup") else "")
            + f": {res['mean_accepted_length']:.2f} tokens per target call ({res['target_calls']} calls), "
            f"{res['drafts_per_round']:.1f} nodes a round",
            f"verify of the tree ({res['drafts_per_round']:.1f} nodes on average + the last fixed token): "
            f"{res['t_verify_ms']:.2f} ms in the loop = {res['verify_cost']:.2f} target steps; a full tree of "
            f"{t['budget']} nodes in isolation {res['tree_verify_ms_isolated']:.2f} ms = "
            f"{res['tree_verify_ms_isolated'] / step:.2f} steps",
            f"the head per depth: {res['head_ms_per_depth']:.2f} ms in the loop (the root's read included) = "
            f"{res['head_ms_per_depth'] / step:.3f} target steps; one depth in isolation "
            f"{res['head_ms_per_depth_isolated']:.2f} ms = {res['head_ms_per_depth_isolated'] / step:.3f} steps",
            f"loop overhead {res['overhead_ms_per_round']:.2f} ms per round",
        ]
        return "\n".join(lines)
    lines += [
        f"alpha (empirical) {res['alpha_empirical']:.3f}, alpha (mean sum min(p,q)) {res['alpha_overlap']:.3f}, "
        f"acceptance rate {res['acceptance_rate']:.3f}",
        f"mean tokens per round {res['mean_accepted_length']:.2f} (theory for K drafts a round "
        f"{res['expected_tokens_per_round']:.2f}), mean drafts per round {res['drafts_per_round']:.2f}",
        f"t_target {res['t_target_ms']:.2f} ms, t_draft {res['t_draft_ms']:.2f} ms, c = {res['c']:.3f} in the loop"
        + (f", {res['c_isolated']:.3f} in isolation ({res['t_draft_isolated_ms']:.2f} / "
           f"{res['t_target_isolated_ms']:.2f} ms)" if res["c_isolated"] is not None else "") + "; "
        f"(K+1)-token verify {res['t_verify_ms']:.2f} ms = {res['verify_cost']:.2f} target steps",
        f"ceiling E/(cK+1) = {res['ceiling_paper']:.2f}x -> reached {100 * res['fraction_of_ceiling_paper']:.0f}%; "
        f"with the measured verify cost E/(cK+v) = {res['ceiling_measured_verify']:.2f}x -> reached "
        f"{100 * res['fraction_of_ceiling_measured_verify']:.0f}%",
        f"loop overhead {res['overhead_ms_per_round']:.2f} ms per round",
        f"float32 logits: a target step takes {res['t_target_isolated_ms']:.2f} ms, against "
        f"{res['t_target_own_logits_ms']:.2f} ms with the logits in {res['pair']['target_dtype']}",
    ]
    return "\n".join(lines)
