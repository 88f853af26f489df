"""The EAGLE head's tree against its chain, interleaved prompt by prompt (rules and outcomes: docs/decisions.md)."""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from specdemo import SamplingConfig, SpecConfig, load_pair, speculative_generate  # noqa: E402
from specdemo.bench.methods import bench_prompts  # noqa: E402
from specdemo.engine.tree_drafter import TreeDrafter  # noqa: E402

RUNS = {"eagle": {"strategy": "eagle"}, "tree sampled": {"strategy": "tree", "tree_children": "sampled"},
        "tree top": {"strategy": "tree", "tree_children": "top"}}
CUT = {"tree sampled, cut": {"strategy": "tree", "tree_children": "sampled", "prune_children": True}}
STOP = {"tree sampled, stop": {"strategy": "tree", "tree_children": "sampled", "sampled_stop": True}}
WARPED = {"tree top, warped": {"strategy": "tree", "tree_children": "top", "warped_scores": True}}
TOGGLES = ("prune_children", "warped_scores", "sampled_stop")  # TreeDrafter switches: off but in the run that sets one


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="smollm2-135m")
    ap.add_argument("--temperature", default="0.7", help="one temperature, or several: 0.3,0.7,1")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--first-seed", type=int, default=0, help="the first seed's number (seeds first..first+seeds-1)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--selection", action="store_true",
                    help="SmolLM2's SELECTION prompts (where its defaults are chosen) instead of the held-out ones")
    ap.add_argument("--prompts", type=int, default=0, help="only the first N prompts (0: all)")
    ap.add_argument("--cut-children", action="store_true",
                    help="also the sampled tree whose rows stop drawing by prune_below (TreeDrafter.prune_children)")
    ap.add_argument("--stop", action="store_true",
                    help="also the sampled tree with the chain's confidence stop (TreeDrafter.sampled_stop)")
    ap.add_argument("--lookup", type=int, default=0,
                    help="also the top-k tree with a prompt-lookup branch of up to N tokens (SpecConfig.tree_lookup)")
    ap.add_argument("--warped", action="store_true",
                    help="also the top-k tree scored by the head's warped q (TreeDrafter.warped_scores)")
    ap.add_argument("--tree", action="append", default=[], metavar="CHILDREN:K,D,N[:PRUNE]",
                    help="race these trees against the chain instead of the two default ones (the --cut-children, "
                         "--warped, --stop and --lookup rows still come on top): children top or sampled, top-k, "
                         "depth, budget, and prune_below (default: the head's own); repeatable")
    args = ap.parse_args()
    pair = load_pair(args.pair)
    if args.selection:
        from specdemo.bench.prompts import SELECTION  # noqa: PLC0415

        prompts = list(SELECTION)
    else:
        prompts = bench_prompts(pair)
    prompts = prompts[: args.prompts or len(prompts)]
    trees = dict(tree_run(t) for t in args.tree) if args.tree else {k: v for k, v in RUNS.items() if k != "eagle"}
    runs = {"eagle": RUNS["eagle"]} | trees | (CUT if args.cut_children else {}) | (WARPED if args.warped else {})
    runs |= STOP if args.stop else {}
    if args.lookup:
        runs |= {f"tree top + lookup {args.lookup}": {"strategy": "tree", "tree_children": "top",
                                                      "tree_lookup": args.lookup}}
    for temperature in (float(t) for t in args.temperature.split(",")):
        compare(pair, prompts, SamplingConfig(temperature), args.seeds, args.max_new_tokens, runs, args.first_seed)


def tree_run(text: str) -> tuple[str, dict]:
    """'sampled:2,4,5' or 'top:3,5,15:0.05' -> (row name, SpecConfig fields)."""
    children, sizes, *prune = text.split(":")
    topk, depth, budget = (int(x) for x in sizes.split(","))
    fields = {"strategy": "tree", "tree_children": children, "tree_topk": topk, "tree_depth": depth,
              "tree_budget": budget, "tree_prune": float(prune[0]) if prune else None}
    return f"{children} ({topk},{depth},{budget})" + (f" {prune[0]}" if prune else ""), fields


def compare(pair, prompts: list[str], sampling: SamplingConfig, seeds: int, max_new_tokens: int, runs: dict,
            first_seed: int = 0) -> None:
    speculative_generate(pair, prompts[0], sampling, SpecConfig(max_new_tokens=16, strategy="tree"))  # warm-up
    cells = []  # per (seed, prompt): {name: (tokens, seconds, target calls)}
    for s in range(first_seed, first_seed + seeds):
        for i, prompt in enumerate(prompts):
            cells.append({})
            for name, kw in runs.items():
                kw = dict(kw)
                for toggle in TOGGLES:
                    setattr(TreeDrafter, toggle, kw.pop(toggle, False))
                spec = SpecConfig(max_new_tokens=max_new_tokens, seed=100 * s + i, top_candidates=0, **kw)
                try:
                    tr = speculative_generate(pair, prompt, sampling, spec)
                finally:  # the class defaults stay off for every other run, whatever happens in this one
                    for toggle in TOGGLES:
                        setattr(TreeDrafter, toggle, False)
                cells[-1][name] = (len(tr.output_ids), tr.wall_s, len(tr.rounds))
        print(f"  seed {s + 1 - first_seed}/{seeds} done", flush=True)
    print(f"{pair.name}, T = {sampling.temperature:g}: {len(prompts)} prompts x {seeds} seeds (from {first_seed}) x "
          f"{max_new_tokens} tokens")
    print("| drafter | tokens/s | tokens per target call | speed / chain | 90% interval |\n|---|---:|---:|---:|---:|")
    for name in runs:
        n, secs, calls = (sum(c[name][j] for c in cells) for j in range(3))
        lo, hi = interval(cells, name)
        print(f"| {name} | {n / secs:.1f} | {n / calls:.2f} | {over_chain(cells, name):.3f}x | {lo:.3f}-{hi:.3f} |",
              flush=True)


def over_chain(cells: list[dict], name: str) -> float:
    """`name`'s speed over the chain's on these runs: the ratio of their tokens/s, each summed over the runs."""
    rate, chain = (sum(c[m][0] for c in cells) / sum(c[m][1] for c in cells) for m in (name, "eagle"))
    return rate / chain


def interval(cells: list[dict], name: str, draws: int = 2000, level: float = 0.9) -> tuple[float, float]:
    """A paired bootstrap interval for `name`'s speed over the chain's: resample the (seed, prompt) runs with
    replacement, each keeping both drafters' tokens and seconds, and take the ratio of summed rates each time. It
    measures how much the ratio depends on which prompts and seeds ran, not the machine's drift between runs."""
    gen = random.Random(0)
    ratios = sorted(over_chain([gen.choice(cells) for _ in cells], name) for _ in range(draws))
    return ratios[int(draws * (1 - level) / 2)], ratios[int(draws * (1 + level) / 2) - 1]


if __name__ == "__main__":
    main()
