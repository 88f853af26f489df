"""What a sampled tree's children cost to draw on this CPU: Gumbel-top-k (the draws until 2026-11-27) against
successive inverse-CDF draws (sampled_tree.draw_children), side by side in one run (rule and outcome:
docs/decisions.md, "sampled children by successive draws").

For each draft vocabulary (the Shakespeare head's 4,096, SmolLM2's 8,192, a published EAGLE-3 head's 32,000) and
each (rows, children) a plan gives a depth, both methods draw from the same peaked q, alternating call by call;
the median of each is printed with their ratio.

    python scripts/experiments/draw_cost.py --calls 400
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from specdemo.engine.sampled_tree import draw_children  # noqa: E402


def gumbel_top(q: torch.Tensor, c: int, gen: torch.Generator) -> torch.Tensor:
    """The earlier draws: c without replacement by the top c of log q + Gumbel noise (Kool et al. 2019,
    arXiv:1903.06059), the noise from V float64 uniforms a row."""
    u = torch.rand(q.shape, generator=gen, dtype=torch.float64)
    return (q.log().double() - (-u.log()).log()).topk(c, dim=-1).indices


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=400)
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(0)
    print(f"torch threads {torch.get_num_threads()}; median µs a call over {args.calls} calls each, alternated")
    print("| draft vocabulary | rows x children | Gumbel-top-k | successive | successive / Gumbel |")
    print("|---:|---|---:|---:|---:|")
    for vocab in (4096, 8192, 32000):
        for m, c in ((1, 2), (1, 3), (2, 2), (3, 3), (1, 1)):
            q = torch.softmax(torch.randn(m, vocab, generator=gen) * 4, -1)
            times = {"gumbel": [], "successive": []}
            for i in range(args.calls + 20):
                for name in (("gumbel", "successive") if i % 2 else ("successive", "gumbel")):
                    t = time.perf_counter()
                    if name == "gumbel":
                        gumbel_top(q, c, gen)
                    else:
                        draw_children(q, torch.rand(m, c, generator=gen, dtype=torch.float64))
                    if i >= 20:  # the first calls warm up
                        times[name].append(time.perf_counter() - t)
            g, s = (statistics.median(times[k]) * 1e6 for k in ("gumbel", "successive"))
            print(f"| {vocab} | {m} x {c} | {g:.0f} | {s:.0f} | {s / g:.2f} |")


if __name__ == "__main__":
    main()
