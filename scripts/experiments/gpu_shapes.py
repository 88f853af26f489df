"""Tokens per target call of the drafts a GPU would run, on the captured path's own code (the graphs' stand-in on a
CPU), for the rules of 2026-11-28 on the captured chain's cut and the CUDA tree (rules and outcomes:
docs/decisions.md). Acceptance does not depend on the device, so tokens per call measured here price a GPU round
with the H200's measured costs."""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from specdemo import SamplingConfig, SpecConfig  # noqa: E402
from specdemo.bench.methods import bench_prompts  # noqa: E402
from specdemo.bench.prompts import SELECTION  # noqa: E402
from specdemo.engine.speculative import encode_prompt, speculative_rounds  # noqa: E402
from specdemo.models import static  # noqa: E402
from specdemo.models.loading import load_pair_uncached  # noqa: E402

# the H200's rounds at cbaeee1 (assets/benchmarks/gpu-h200-cbaeee1-2026-11-28.txt): an eagle round (K = 4) 4.98 ms, a
# tree round at (2, 4, 8) 5.84 ms; a depth more costs the measured growth's share, about 1.2 ms over 4 depths
# target-only's step at 292.6 tok/s
TARGET_MS, CHAIN_MS, TREE_MS, DEPTH_MS = 1000 / 292.6, 4.98, 5.84, 0.30
TREES = [(2, 4, 8), (2, 4, 15), (3, 4, 15), (4, 4, 15), (2, 5, 15), (3, 5, 15), (4, 5, 15)]


def tokens_per_call(pair, prompts, temperature: float, max_new_tokens: int, seeds: int = 1, **spec_kw
                    ) -> tuple[float, float]:
    """(tokens per target call, drafts a round) over the prompts, seed 1000 s + i for prompt i in pass s (of `seeds`),
    after the prompt's round;
    each prompt a chat message, as the bench and the page send it."""
    tokens = calls = drafts = 0
    for s, (i, prompt) in ((s, p) for s in range(seeds) for p in enumerate(prompts)):
        spec = SpecConfig(max_new_tokens=max_new_tokens, seed=1000 * s + i, top_candidates=0, **spec_kw)
        ids = encode_prompt(pair, prompt, max_new_tokens)
        for r in speculative_rounds(pair, ids, SamplingConfig(temperature), spec):
            if r.index:
                tokens, calls, drafts = tokens + len(r.output), calls + 1, drafts + r.k  # kept, not the rejected
    return tokens / calls, drafts / calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--trees", default=";".join(",".join(map(str, t)) for t in TREES),
                    help="top-k,depth,budget[,prune_below] trees, ';' between (default prune_below: the run's own, "
                         "tree_drafter.run_tree_prune: none on this stand-in from 6be6bf3 on, the head's before)")
    ap.add_argument("--no-chain", action="store_true", help="only the trees")
    ap.add_argument("--stop-rows", action="store_true",
                    help="the chain with the head's stop_below and with 0 (the same at 2fc105b and after, where the "
                         "captured chain has no stop; at 017ac90 the captured chain cut at its stop)")
    ap.add_argument("--held-out", action="store_true", help="the bench's held-out prompts instead of SELECTION")
    ap.add_argument("--temperature", type=float, default=None, help="only this temperature (default: 0 and 0.7)")
    ap.add_argument("--seeds", type=int, default=1, help="passes over the prompts, each with other seeds")
    args = ap.parse_args()
    pair = load_pair_uncached("smollm2-135m", decoding="graphs")
    static.stand_ins(pair)  # the captured path's code: the chain and the tree grown in one replay, one read a round
    prompts = (bench_prompts(pair) if args.held_out else SELECTION)[: args.prompts]
    temps = (0.0, 0.7) if args.temperature is None else (args.temperature,)
    where = "held-out" if args.held_out else "SELECTION"
    print(f"{pair.name} on {pair.device} ({pair.dtype}), the graphs' stand-in; {where} {len(prompts)} prompts x "
          f"{args.max_new_tokens} tokens, {args.seeds} seed(s) each; tokens kept per target call from each run's "
          "second round")
    print("| drafter | " + " | ".join(f"T = {t:g}: tokens/call (drafts)" for t in temps) + " | modelled H200 ms a "
          "round | " + " | ".join(f"modelled × target-only, T = {t:g}" for t in temps) + " | geometric mean |")
    print("|---|" + "---:|" * (2 * len(temps) + 2))

    def row(name, ms, runs):
        cells = [tokens_per_call(pair, prompts, t, args.max_new_tokens, args.seeds, **kw) for t, kw in zip(temps, runs)]
        speed = [tau * TARGET_MS / ms for tau, _ in cells]  # modelled speed-up over target-only on the H200
        print(f"| {name} | " + " | ".join(f"{tau:.3f} ({d:.2f})" for tau, d in cells) + f" | {ms:.2f} | "
              + " | ".join(f"{x:.3f}" for x in speed) + f" | {math.prod(speed) ** (1 / len(speed)):.3f} |", flush=True)

    chain, own = {"strategy": "eagle", "k": 4}, pair.head.cfg
    if args.stop_rows:
        row(f"chain K = 4, the head's stop_below ({own.stop_below:g})", CHAIN_MS, [chain] * len(temps))
        try:
            pair.head.cfg = replace(own, stop_below=0.0)
            row("chain K = 4, stop_below 0", CHAIN_MS, [chain] * len(temps))
        finally:
            pair.head.cfg = own
    elif not args.no_chain:
        row("chain K = 4", CHAIN_MS, [chain] * len(temps))
    for sizes in (s.split(",") for s in args.trees.split(";")):
        topk, depth, budget = (int(x) for x in sizes[:3])
        kw = {"strategy": "tree", "tree_topk": topk, "tree_depth": depth, "tree_budget": budget}
        if len(sizes) > 3:
            kw["tree_prune"] = float(sizes[3])
        row(f"tree ({topk}, {depth}, {budget})" + (f" pruned below {sizes[3]}" if len(sizes) > 3 else ""),
            TREE_MS + DEPTH_MS * (depth - 4),
            [kw | {"tree_children": "top" if t == 0 else "sampled"} for t in temps])


if __name__ == "__main__":
    main()
