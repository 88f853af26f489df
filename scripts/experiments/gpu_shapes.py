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
from specdemo.bench.prompts import SELECTION  # noqa: E402
from specdemo.engine.speculative import speculative_rounds  # noqa: E402
from specdemo.models import static  # noqa: E402
from specdemo.models.loading import load_pair_uncached  # noqa: E402

# the H200's rounds at cbaeee1 (assets/benchmarks/gpu-h200-cbaeee1-2026-11-28.txt): an eagle round (K = 4) 4.98 ms, a
# tree round at (2, 4, 8) 5.84 ms; a depth more costs the measured growth's share, about 1.2 ms over 4 depths
# target-only's step at 292.6 tok/s
TARGET_MS, CHAIN_MS, TREE_MS, DEPTH_MS = 1000 / 292.6, 4.98, 5.84, 0.30
TREES = [(2, 4, 8), (2, 4, 15), (3, 4, 15), (4, 4, 15), (2, 5, 15), (3, 5, 15), (4, 5, 15)]


def tokens_per_call(pair, prompts, temperature: float, max_new_tokens: int, **spec_kw) -> tuple[float, float]:
    """(tokens per target call, drafts a round) over the prompts, seed i for prompt i, after the prompt's round."""
    tokens = calls = drafts = 0
    for i, prompt in enumerate(prompts):
        spec = SpecConfig(max_new_tokens=max_new_tokens, seed=i, top_candidates=0, **spec_kw)
        for r in speculative_rounds(pair, pair.encode(prompt), SamplingConfig(temperature), spec):
            if r.index:
                tokens, calls, drafts = tokens + len(r.tokens), calls + 1, drafts + r.k
    return tokens / calls, drafts / calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--trees", default=";".join(",".join(map(str, t)) for t in TREES))
    args = ap.parse_args()
    pair = load_pair_uncached("smollm2-135m", decoding="graphs")
    static.stand_ins(pair)  # the captured path's code: the chain and the tree grown in one replay, one read a round
    prompts, temps, own = SELECTION[: args.prompts], (0.0, 0.7), pair.head.cfg
    print(f"{pair.name} on {pair.device} ({pair.dtype}), the graphs' stand-in; SELECTION {len(prompts)} prompts x "
          f"{args.max_new_tokens} tokens; tokens per call from each run's second round")
    print("| drafter | T = 0: tokens/call (drafts) | T = 0.7 | modelled H200 ms a round | modelled × target-only, T = 0 "
          "| T = 0.7 | geometric mean |\n|---|---:|---:|---:|---:|---:|---:|")

    def row(name, ms, runs):
        cells = [tokens_per_call(pair, prompts, t, args.max_new_tokens, **kw) for t, kw in zip(temps, runs)]
        speed = [tau * TARGET_MS / ms for tau, _ in cells]  # modelled speed-up over target-only on the H200
        print(f"| {name} | {cells[0][0]:.3f} ({cells[0][1]:.2f}) | {cells[1][0]:.3f} ({cells[1][1]:.2f}) | {ms:.2f} | "
              f"{speed[0]:.3f} | {speed[1]:.3f} | {math.sqrt(speed[0] * speed[1]):.3f} |", flush=True)

    chain = {"strategy": "eagle", "k": 4}
    row(f"chain K = 4, the stop's cut at {own.stop_below:g} (today)", CHAIN_MS, [chain, chain])
    try:
        pair.head.cfg = replace(own, stop_below=0.0)
        row("chain K = 4, no cut", CHAIN_MS, [chain, chain])
    finally:
        pair.head.cfg = own
    for topk, depth, budget in (tuple(int(x) for x in s.split(",")) for s in args.trees.split(";")):
        kw = {"strategy": "tree", "tree_topk": topk, "tree_depth": depth, "tree_budget": budget}
        row(f"tree ({topk}, {depth}, {budget})", TREE_MS + DEPTH_MS * (depth - 4),
            [kw | {"tree_children": "top"}, kw | {"tree_children": "sampled"}])


if __name__ == "__main__":
    main()
