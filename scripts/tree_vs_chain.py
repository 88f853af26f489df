"""The EAGLE head's tree against its chain, on more runs than one `bench --strategies` pass: every held-out bench
prompt of a pair under several seeds, the three drafters interleaved prompt by prompt in one process (chain `eagle`,
the tree with sampled children, the tree with top-k children), 128 new tokens each. Prints tokens/s, tokens per
target call and each one's speed over the chain's. At T > 0 one pass of 10 prompts moved the tree/chain ratio by
+-7% between runs (2026-11-25); this is the tighter measurement the README quotes.

    .venv/bin/python scripts/tree_vs_chain.py --temperature 0.7 --seeds 2
    .venv/bin/python scripts/tree_vs_chain.py --temperature 0.3 --seeds 2
    .venv/bin/python scripts/tree_vs_chain.py --selection --prompts 20 --max-new-tokens 48 --seeds 1 \\
        --temperature 0.3,0.7,1   # the rule that chose `auto` children (drafters.AUTO_TREE_CHILDREN)

The rule for `auto` children, written 2026-11-25 13:39 UTC after the held-out T = 0.7 run above (sampled 1.037x,
top 1.063x the chain) and before any measurement on SELECTION: on SELECTION (20 prompts x 48 tokens, one seed,
the shipped shape), at T = 0.3, 0.7 and 1, with the three drafters interleaved in one process, `auto` means "top"
for every T up to the largest measured T at which top-k children are faster than sampled ones there and at every
lower measured T; above it (or everywhere, if top loses at 0.3) it stays "sampled".

The rule for cutting sampled children (TreeDrafter.prune_children), written 2026-11-25 21:30 UTC before any
measurement of it, on the AMD EPYC with AVX-512 BF16 (bf16, packed): on SELECTION (20 prompts x 48 tokens, one
seed, the shipped shape, the four drafters interleaved in one process, `--selection --prompts 20
--max-new-tokens 48 --seeds 1 --temperature 0.3,0.7 --cut-children`), the cut becomes the default for sampled
trees if its tokens/s is at least 1.02x the uncut sampled tree's at T = 0.7 and at least 0.99x at T = 0.3 (the
page's); otherwise it stays off, an option of this script only.

The rule for scoring top-k trees by the warped q at T > 0 (TreeDrafter.warped_scores), written 2026-11-26 00:03 UTC
before any measurement of it, on the AMD EPYC with AVX-512 BF16 (bf16, packed, RoPE's inv_freq in float32): on
SELECTION (`--selection --prompts 20 --max-new-tokens 48 --seeds 1 --temperature 0.3,0.7 --warped`, the shipped
shape, the four drafters interleaved in one process), warped scores become the default for top-k children at T > 0
if "tree top, warped" reaches at least 1.02x the tokens/s of "tree top" at T = 0.7 and at least 0.99x at T = 0.3.
If they do, `auto` is decided again by the rule for `auto` above, on the same run's two temperatures, with the
warped top-k tree in place of the top-k tree; otherwise warped scores stay off, an option of this script only.

The rule for a lookup branch on SmolLM2's trees by default (SpecConfig.tree_lookup; the head's config would carry
it), written 2026-11-26 00:51 UTC after the held-out T = 0 bench (`bench --strategy tree --tree-lookup 8`: 1.93x
target-only, 2.87 tokens a call) and before any measurement on SELECTION, on the AMD EPYC with AVX-512 BF16 (bf16,
packed): on SELECTION (`--selection --prompts 20 --max-new-tokens 48 --seeds 1 --temperature 0,0.3,0.7 --lookup
8`, the shipped shape, the drafters interleaved in one process), a branch of up to 8 copied tokens becomes the
head's default for top-k trees if "tree top + lookup 8" reaches at least 1.03x the tokens/s of "tree top" at T = 0
and at least 0.99x at T = 0.3 and at T = 0.7; otherwise it stays an option, off by default.

The rules for the tree's size at T > 0 on a bf16 CPU (the head's tree["sampled_bf16_cpu"] and
tree["auto_top_to_t_bf16_cpu"]), on the AMD EPYC with AVX-512 BF16 (bf16, packed), after an offline model of
per-node head and target path probabilities on SELECTION said smaller trees would pay at T = 0.7 there.
Rule 1, written 2026-11-26 02:42 UTC before any run of its candidates: on SELECTION (`--selection --prompts 20
--max-new-tokens 48 --seeds 1 --temperature 0.7,0.3` with the seven `--tree` candidates top:3,5,15:0.02 (shipped),
top:3,5,15:0.05, top:3,5,6:0.02, top:2,4,5:0, sampled:2,4,5, sampled:2,5,6, sampled:3,4,6), a candidate replaces
what T > 0 runs on a bf16 CPU only if its speed over the chain beats the shipped one's by 3% or more at T = 0.7 and
is no more than 1% below it at T = 0.3; the best such by the mean of the two wins; then the held-out run (24 x 128,
one seed, T = 0.7) must confirm that it beats the shipped tree. Sampled (2, 4, 5) won and was confirmed at T = 0.7,
but held out at T = 0.3 it was slower than the shipped top-k tree. Rule 2, written 2026-11-26 03:00 UTC after those
held-out runs and before its own measurement: on SELECTION with 3 seeds (`--selection --prompts 20 --max-new-tokens
48 --seeds 3 --temperature 0.3,0.7 --tree top:3,5,15:0.02 --tree sampled:2,4,5`), at each temperature the faster of
the two is what `auto` runs there, top-k only up to the highest temperature at which it wins at that and every
lower measured one (the rule for `auto` above), and sampled children above it in (2, 4, 5). Top-k won at 0.3 and
sampled (2, 4, 5) at 0.7: README, "A small sampled tree on a bf16 CPU". (Rules 1 and 2 ran as a scratch script
calling compare() before --tree existed.) Since then the "tree sampled" row drafts (2, 4, 5) on a bf16 CPU at
T > 0, as `auto` does there; the earlier rules rerun as they ran with `--tree sampled:3,5,15` (and the top-k row
as `--tree top:3,5,15`).

The rule for the chain's confidence stop on sampled trees (TreeDrafter.sampled_stop: a node below the root whose
warped head q has its top below the head's stop_below, 0.3 for SmolLM2, gets no children), written 2026-11-26
05:27 UTC before any measurement of it, on the AMD EPYC with AVX-512 BF16 (bf16, packed): on SELECTION
(`--selection --prompts 20 --max-new-tokens 48 --seeds 2 --temperature 0.7,1 --tree sampled:2,4,5 --stop`, the
drafters interleaved in one process), the stop becomes the default for sampled trees if "tree sampled, stop"
reaches at least 1.02x the tokens/s of "sampled (2,4,5)" at T = 0.7 and at least 0.99x at T = 1; otherwise it stays
off, an option of this script only. If it becomes the default, the held-out run (`--temperature 0.7 --seeds 4`)
gives the README's figures, whatever they are.

When issue 24's T = 0.7 floor (the tree at least 1.05x the chain, same session) counts as met, written 2026-11-26
08:27 UTC before the run it judges, after the sampled walk's rewrite (d19e188): in one session on one machine, held
out, `--temperature 0.7 --seeds 4` gives the sampled tree at least 1.05x the chain AND `python -m specdemo bench
--pair smollm2-135m --strategies --temperature 0.7` gives the tree at least 1.05x the chain. One such session is
reported as it is; earlier sessions' figures (1.005x and 1.048x / 1.030x) are reported beside it.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from specdemo import SamplingConfig, SpecConfig, load_pair, speculative_generate  # noqa: E402
from specdemo.bench import bench_prompts  # noqa: E402
from specdemo.drafters import TreeDrafter  # noqa: E402

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
        from smollm2_prompts import SELECTION  # noqa: PLC0415

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
