"""Host time a round spends outside the captured replays, on the graphs' stand-in: each round's wall time less the
time inside ReplayStandIn.replay, one thread. On a GPU the replays run on the device while the host works, but the
host's work after the round's one read, and before the next round's first launch, leaves the GPU idle; this is a
CPU's measure of that work (Python, and the operators dispatched outside the graphs), for comparing settings."""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from specdemo import SamplingConfig, SpecConfig  # noqa: E402
from specdemo.engine.speculative import encode_prompt, speculative_rounds  # noqa: E402
from specdemo.models import static  # noqa: E402
from specdemo.models.loading import load_pair_uncached  # noqa: E402
from specdemo.models.stand_in import ReplayStandIn  # noqa: E402

RUNS = [("eagle K = 4", {"strategy": "eagle"}),
        ("tree (2, 4, 8)", {"strategy": "tree", "tree_topk": 2, "tree_depth": 4, "tree_budget": 8}),
        ("tree (4, 4, 15)", {"strategy": "tree", "tree_topk": 4, "tree_depth": 4, "tree_budget": 15})]


def main() -> None:
    torch.set_num_threads(1)
    inside = [0.0]
    replay = ReplayStandIn.replay

    def timed(self):
        t = time.perf_counter()
        replay(self)
        inside[0] += time.perf_counter() - t

    ReplayStandIn.replay = timed
    pair = load_pair_uncached("smollm2-135m", decoding="graphs")
    static.stand_ins(pair)
    ids = encode_prompt(pair, "Why is the sky blue?", 48)
    print(f"{pair.name}, the graphs' stand-in, 1 thread; 3 runs of 48 tokens after a first (its captures); host ms a "
          "round outside the replays, median over the rounds after the prompt's")
    print("| drafter | T | inspector's candidates | rounds | host ms a round |\n|---|---:|---:|---:|---:|")
    for name, kw in RUNS:
        for t in (0.0, 0.7):
            for top in (0, 3):
                spec, cfg = SpecConfig(k=4, max_new_tokens=48, top_candidates=top, **kw), SamplingConfig(t)
                list(speculative_rounds(pair, ids, cfg, spec))
                host = []
                for _ in range(3):
                    rounds = speculative_rounds(pair, ids, cfg, spec)
                    while True:
                        inside[0], start = 0.0, time.perf_counter()
                        rnd = next(rounds, None)
                        if rnd is None:
                            break
                        if rnd.index:
                            host.append((time.perf_counter() - start - inside[0]) * 1e3)
                print(f"| {name} | {t:g} | {top} | {len(host)} | {statistics.median(host):.3f} |", flush=True)


if __name__ == "__main__":
    main()
