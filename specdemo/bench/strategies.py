"""The strategies benchmark (`bench --strategies`): every drafting strategy against target-only decoding in each
dtype the machine offers and transformers' assisted generation, on the same prompts, interleaved prompt by prompt.

Owns the comparison table of drafting strategies: tokens/s, speedups against the pair's own and the fastest
target-only decoding, target calls, acceptance, c in the loop against c in isolation, the verify cost, and the share
of the ceiling E / (cK + v) each run reached. The protocol it shares with the main benchmark lives in methods.py.
"""

from __future__ import annotations

import torch

from specdemo.config import SamplingConfig, SpecConfig
from specdemo.engine.autoregressive import baseline_generate
from specdemo.engine.events import acceptance
from specdemo.engine.speculative import speculative_generate
from specdemo.engine.tree_drafter import run_tree_shape, tree_prune
from specdemo.models import ModelPair
from specdemo.models.devices import dtype_name

from .methods import COPY_PROMPTS, assisted_generate, bench_prompts, forward_ms, head_step_ms, target_variants


class CallCounter:
    """Counts a model's forward calls (transformers' generate does not report how many target calls it made)."""

    def __init__(self, model):
        self.n = 0
        self.handle = model.register_forward_hook(self.hook)

    def hook(self, *_):
        self.n += 1


def run_strategies(pair: ModelPair, sampling: SamplingConfig, k: int, max_new_tokens: int, n_prompts: int = 10,
                   seed: int = 0, ngram: int = 3, lookup_k: int = 8, k_search: bool = True, include_hf: bool = True,
                   log=print, tree: tuple[int, int, int] = (0, 0, 0), tree_prune_below: float | None = None) -> dict:
    """Every drafting strategy against target-only decoding (in each dtype the machine offers) and transformers'
    assisted generation (constant K, its default schedule, prompt lookup), interleaved prompt by prompt. Where the
    pair has a head, its chain (eagle) and its tree, of the sizes `tree` (top-k, depth, budget; 0 = the head's own),
    pruned below `tree_prune_below` (None = the head's own).

    The general prompts and the copy-friendly ones are timed as two groups. Speedups are against target-only in
    the pair's target dtype and against the fastest target-only in any dtype.
    """
    general = bench_prompts(pair)[:n_prompts]
    copy = list(COPY_PROMPTS.get(pair.name, COPY_PROMPTS["shakespeare"]))
    targets = target_variants(pair)
    own = dtype_name(pair.dtype)
    ks = list(range(1, 9)) if k_search else [k]
    trees = tree_methods(pair, sampling, tree, tree_prune_below)
    methods = method_names(pair, targets, ks, k, lookup_k, include_hf, list(trees))
    counter = CallCounter(pair.target)
    run = method_runner(pair, targets, sampling, k, max_new_tokens, ngram, lookup_k, counter, trees)

    for m in methods:  # warm-up: first calls pay for allocation, kernels, lazily built tables
        run(m, general[0], seed)
    groups = {}
    for group, prompts in (("general", general), ("copy", copy)):
        tot = {m: {"tokens": 0, "seconds": 0.0, "calls": 0, "rounds": [], "steps": []} for m in methods}
        for i, prompt in enumerate(prompts):
            for m in methods:
                n, secs, calls, tr = run(m, prompt, seed + i)
                t = tot[m]
                t["tokens"] += n
                t["seconds"] += secs
                t["calls"] += calls
                if tr is not None:
                    t["rounds" if tr.mode == "speculative" else "steps"] += tr.rounds or tr.steps
            log(f"  {group} prompt {i + 1}/{len(prompts)} done")
        groups[group] = tot
    counter.handle.remove()
    # isolated costs, hot caches, same run: one draft step, one target step, one (k+1)-token verify
    iso = {"draft_ms": forward_ms(pair.draft, pair.vocab_size, 1),
           "head_ms": head_step_ms(pair) if pair.head is not None else None,
           "target_ms": {name: forward_ms(p.target, p.vocab_size, 1) for name, p in targets.items()},
           "verify_ms": {kk: forward_ms(pair.target, pair.vocab_size, kk + 1) for kk in sorted({*ks, k, lookup_k})}}
    return {"pair": pair.describe(), "settings": {
        "k": k, "lookup_k": lookup_k, "ngram": ngram, "max_new_tokens": max_new_tokens, "temperature":
        sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p, "general_prompts": len(general),
        "copy_prompts": len(copy), "threads": torch.get_num_threads(), "target_dtype": own,
        "draft_dtype": dtype_name(pair.draft_dtype)},
        "isolated": iso, "groups": {g: summarise(tot, own, iso) for g, tot in groups.items()}}


def method_names(pair: ModelPair, targets: dict, ks: list[int], k: int, lookup_k: int, include_hf: bool,
                 trees: list[str] = ()) -> list[str]:
    """The race's entrants: target-only in each dtype, fixed K for each K searched, adaptive, lookup, eagle and the
    head's `trees` (tree_methods; if the pair has a head), and transformers' three assisted modes."""
    methods = [f"target-only {name}" for name in targets]
    methods += [f"fixed K={kk}" for kk in ks] + ["adaptive", f"lookup K={lookup_k}"]
    if pair.head is not None:
        methods += [f"eagle K={k}", *trees]
    if include_hf:
        methods += [f"hf assisted K={k}", "hf assisted default", f"hf prompt lookup K={lookup_k}"]
    return methods


def tree_methods(pair: ModelPair, sampling: SamplingConfig, sizes: tuple[int, int, int] = (0, 0, 0),
                 prune_below: float | None = None) -> dict[str, dict]:
    """The head's trees in the race, by row name (tree_method): the SpecConfig fields each runs with. One with
    top-k children and, at T > 0, one with sampled children, each of the sizes `sizes` (0 = what a run with those
    children drafts with here, tree_drafter.run_tree_shape), pruned below `prune_below` (None = the head's own)."""
    if pair.head is None:
        return {}
    out = {}
    for children in ("top",) if sampling.greedy else ("top", "sampled"):
        spec = SpecConfig(strategy="tree", tree_topk=sizes[0], tree_depth=sizes[1], tree_budget=sizes[2],
                          tree_prune=prune_below, tree_children=children)
        shape, prune = run_tree_shape(spec, sampling, pair), tree_prune(pair.head, spec)
        out[tree_method(shape, children, prune)] = {"tree_topk": shape[0], "tree_depth": shape[1],
                                                    "tree_budget": shape[2], "tree_children": children,
                                                    "tree_prune": prune}
    return out


def tree_method(shape: tuple[int, int, int], children: str = "top", prune_below: float = 0.0) -> str:
    """A tree's row name: 'tree 2x4 N=8' (top-k, depth, budget) with top-k children, 'tree 2x4 N=8 sampled' with
    children drawn from the head; ' prune 0.02' where the head prunes (tree_drafter.tree_prune)."""
    return (f"tree {shape[0]}x{shape[1]} N={shape[2]}" + (f" prune {prune_below:g}" if prune_below else "")
            + (" sampled" if children == "sampled" else ""))


def method_runner(pair: ModelPair, targets: dict, sampling: SamplingConfig, k: int, max_new_tokens: int, ngram: int,
                  lookup_k: int, counter: CallCounter, trees: dict[str, dict] | None = None):
    """run(method, prompt, seed) -> (tokens, seconds, target calls, trace or None), for any of `method_names`."""

    def run(method: str, prompt: str, s: int):
        if method.startswith("target-only"):
            tr = baseline_generate(targets[method.split()[-1]], prompt, sampling, max_new_tokens, s)
            return len(tr.output_ids), tr.wall_s, len(tr.steps), tr
        if method.startswith("hf"):
            mode = "lookup" if "lookup" in method else "default" if "default" in method else "constant"
            spec = SpecConfig(k=lookup_k if mode == "lookup" else k, max_new_tokens=max_new_tokens, seed=s)
            before = counter.n
            n, secs = assisted_generate(pair, prompt, sampling, spec, mode)
            return n, secs, counter.n - before, None
        strategy = method.split()[0]
        kk = int(method.split("=")[1]) if "=" in method and strategy != "tree" else k
        sizes = trees[method] if strategy == "tree" else {}
        spec = SpecConfig(k=kk, max_new_tokens=max_new_tokens, seed=s, strategy=strategy, ngram=ngram,
                          top_candidates=0, **sizes)
        tr = speculative_generate(pair, prompt, sampling, spec)
        return len(tr.output_ids), tr.wall_s, len(tr.rounds), tr

    return run


def summarise(tot: dict, own: str, iso: dict) -> dict:
    """Per method: tokens/s, speedups, target calls, acceptance, tokens per round, c (loop vs isolated), v and the
    share of the ceiling E / (c K + v) that the run reached, all from this run's own measurements."""
    tps = {m: t["tokens"] / t["seconds"] for m, t in tot.items() if t["seconds"] > 0}
    base = {m.split()[-1]: v for m, v in tps.items() if m.startswith("target-only")}
    fastest = max(base.values())
    steps = tot[f"target-only {own}"]["steps"]
    t_target = sum(s.step_ms for s in steps) / len(steps)
    out = {}
    for m, t in tot.items():
        row = {"tokens_per_s": tps[m], "speedup_same_dtype": tps[m] / base[own], "speedup_vs_fastest":
               tps[m] / fastest, "target_calls": t["calls"], "tokens": t["tokens"]}
        rounds = t["rounds"]
        if rounds:
            a = acceptance(rounds)
            drafted = a["drafted"]
            emitted = sum(len(r.output) for r in rounds)
            k_mean = drafted / len(rounds)
            c_loop = (sum(r.draft_ms for r in rounds) / drafted) / t_target if drafted else 0.0
            v = sum(r.verify_ms for r in rounds) / len(rounds) / t_target
            E = emitted / len(rounds)
            ceiling = E / (c_loop * k_mean + v)
            # a tree's head calls each cover a whole frontier, so no one-token step prices its nodes
            step = (None if m.startswith(("lookup", "tree")) else iso["head_ms"] if m.startswith("eagle")
                    else iso["draft_ms"])
            c_iso = step / iso["target_ms"][own] if step else 0.0
            row |= {"acceptance_rate": a["acceptance_rate"], "alpha_empirical": a["alpha_empirical"],
                    "mean_accepted_length": E, "mean_k": k_mean, "c_loop": c_loop, "c_isolated": c_iso,
                    "c_loop_over_isolated": c_loop / c_iso if c_iso else None, "verify_cost": v,
                    "ceiling": ceiling, "fraction_of_ceiling": (tps[m] / base[own]) / ceiling,
                    "fallback_rounds": sum(r.source == "fallback" for r in rounds),
                    "overhead_ms_per_round": sum(r.overhead_ms for r in rounds) / len(rounds)}
        elif t["calls"]:
            row["mean_accepted_length"] = t["tokens"] / t["calls"]
        out[m] = row
    return out


def format_strategies(res: dict) -> str:
    s, iso = res["settings"], res["isolated"]
    lines = [f"pair {res['pair']['name']} on {res['pair']['device']} ({s['threads']} threads), draft "
             f"{s['draft_dtype']}, target {s['target_dtype']}; T={s['temperature']}, top-k={s['top_k']}, "
             f"top-p={s['top_p']}, {s['max_new_tokens']} new tokens; hf K={s['k']}, lookup K={s['lookup_k']}, "
             f"n-gram <= {s['ngram']}",
             "isolated (hot, median): draft step {:.2f} ms{}; target step {}; verify {}".format(
                 iso["draft_ms"], f", EAGLE head step {iso['head_ms']:.2f} ms" if iso.get("head_ms") else "", ", ".join(f"{d} {v:.2f} ms" for d, v in iso["target_ms"].items()),
                 ", ".join(f"{kk + 1} tokens {v:.2f} ms" for kk, v in iso["verify_ms"].items()))]
    for group, rows in res["groups"].items():
        n = s["general_prompts"] if group == "general" else s["copy_prompts"]
        lines += ["", f"{group} prompts ({n}):", "",
                  "| method | tokens/s | speedup (same dtype) | speedup (fastest target-only) | target calls | "
                  "acceptance | tokens/round | c loop / isolated | v | % of E/(cK+v) |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for m, r in rows.items():
            cells = [m, f"{r['tokens_per_s']:.1f}", f"{r['speedup_same_dtype']:.2f}x", f"{r['speedup_vs_fastest']:.2f}x",
                     str(r["target_calls"]), f"{r['acceptance_rate']:.2f}" if "acceptance_rate" in r else "",
                     f"{r['mean_accepted_length']:.2f}" if "mean_accepted_length" in r else ""]
            if "c_loop" in r:
                c_iso = f"{r['c_isolated']:.3f}" if r["c_isolated"] else "-"
                cells += [f"{r['c_loop']:.3f} / {c_iso}", f"{r['verify_cost']:.2f}",
                          f"{100 * r['fraction_of_ceiling']:.0f}%"]
            else:
                cells += ["", "", ""]
            lines.append("| " + " | ".join(cells) + " |")
        fixed = {m: r["tokens_per_s"] for m, r in rows.items() if m.startswith("fixed")}
        if fixed and "adaptive" in rows:
            best = max(fixed, key=fixed.get)
            lines.append("")
            lines.append(f"adaptive / best fixed ({best}): {rows['adaptive']['tokens_per_s'] / fixed[best]:.3f}")
        if "hf assisted default" in rows:
            lines.append(f"adaptive / transformers default assisted: "
                         f"{rows['adaptive']['tokens_per_s'] / rows['hf assisted default']['tokens_per_s']:.2f}x")
        look = next((m for m in rows if m.startswith("lookup")), None)
        hf_look = next((m for m in rows if m.startswith("hf prompt lookup")), None)
        if look and hf_look:
            lines.append(f"lookup / transformers prompt lookup: "
                         f"{rows[look]['tokens_per_s'] / rows[hf_look]['tokens_per_s']:.2f}x")
    return "\n".join(lines)
