"""Does the CPU's default path do the same work as before? Operators dispatched from Python (torch.profiler's aten
events with no aten event around them) over one whole run of each strategy at T = 0 and 0.7, with the run's first
12 tokens and its rounds, on the pair as it loads here (eager on a CPU). Run it in two checkouts and compare the
lines: the same tokens and rounds with the same or fewer operators mean the default path gained no work, which a
timing race on a loaded 2-core machine cannot show. A measurement, not a test.

    PYTHONPATH=. .venv/bin/python scripts/experiments/same_work.py [--pair shakespeare]
"""

from __future__ import annotations

import argparse

from torch.profiler import ProfilerActivity, profile

from specdemo.config import SamplingConfig, SpecConfig
from specdemo.engine.speculative import speculative_generate
from specdemo.models.loading import load_pair_uncached


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="shakespeare")
    ap.add_argument("--prompt", default="ROMEO:\nWhat light")
    args = ap.parse_args()
    pair = load_pair_uncached(args.pair, device="cpu")
    print("decoding", pair.decoding)
    for t in (0.0, 0.7):
        for strategy in ("fixed", "adaptive", "lookup", "eagle", "tree"):
            spec = SpecConfig(k=4, max_new_tokens=24, strategy=strategy, seed=1)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                trace = speculative_generate(pair, args.prompt, SamplingConfig(t), spec)
            ops = sum(1 for e in prof.events() if e.name.startswith("aten::")
                      and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")))
            print(t, strategy, ops, trace.output_ids[:12], len(trace.rounds))


if __name__ == "__main__":
    main()
