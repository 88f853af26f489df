"""What a target step costs through a static cache of the whole context window against one sized to the request,
with and without the cache-length buckets of models/static.py (issue 45; docs/decisions.md, "attention over the
filled cache, by buckets"). A measurement, not a test.

Four static caches of the pair's target, as the app loads it: the whole window (context + 65 slots) and a request
of --request tokens (+ 65), each attending over its buckets (today's code) or over every slot (`static.buckets_for`
switched off, the code before issue 45). One-token steps after each context length, the median of --reps, the four
variants alternated pass by pass so that the machine's load falls on all of them alike. Prints each variant's
milliseconds and the ratios that the rule reads.

    .venv/bin/python scripts/experiments/window_cost.py                       # SmolLM2, as the app loads it
    .venv/bin/python scripts/experiments/window_cost.py --device cuda --passes 5   # with graphs on a GPU
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from specdemo.bench.timing import forward_ms  # noqa: E402
from specdemo.models import static  # noqa: E402
from specdemo.models.loading import load_pair_uncached  # noqa: E402


def slot_of(pair, max_len: int, buckets: bool, graphs: bool) -> static.StaticSlot:
    """A static slot of the target with `max_len` slots; buckets=False: every forward attends over all of them."""
    slot = static.StaticSlot(pair.target, pair.vocab_size, max_len)
    if not buckets:
        slot.buckets = (slot.max_len,)
    if graphs:
        slot.capture((1,))
    return slot


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default="smollm2-135m")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--request", type=int, default=300, help="the request-sized cache's tokens (+ 65 slots)")
    ap.add_argument("--contexts", default="64,160,290")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--passes", type=int, default=3)
    args = ap.parse_args()
    pair = load_pair_uncached(args.pair, device=args.device, decoding="eager")
    pad = max(static.WIDTHS)
    graphs = pair.device.type == "cuda"
    whole = pair.context_window + pad
    variants = {f"{name}, {'buckets' if b else 'every slot'}": slot_of(pair, size, b, graphs)
                for name, size in (("whole window", whole), ("request", args.request + pad)) for b in (True, False)}
    contexts = [int(c) for c in args.contexts.split(",")]
    print(f"{pair.name} target on {pair.device} ({pair.target.dtype}), {'graphs' if graphs else 'static, eager'}; "
          f"whole window {whole} slots, request {args.request + pad}; {torch.get_num_threads()} threads")
    times: dict[tuple[str, int], list[float]] = {}
    for i in range(args.passes + 1):  # the first pass warms every cache and allocation up, and is not counted
        for c in contexts:
            for name, slot in variants.items():
                ms = forward_ms(pair.target, pair.vocab_size, 1, context=c, reps=args.reps if i else 2,
                                lm=static.StaticLM(slot))
                if i:
                    times.setdefault((name, c), []).append(ms)
    print("| context | " + " | ".join(variants) + " | whole ÷ request, buckets | whole ÷ request, every slot |")
    print("|---:|" + "---:|" * (len(variants) + 2))
    for c in contexts:
        med = {name: statistics.median(times[name, c]) for name in variants}
        names = list(variants)
        print(f"| {c} | " + " | ".join(f"{med[n]:.2f} ms" for n in names)
              + f" | {med[names[0]] / med[names[2]]:.3f}× | {med[names[1]] / med[names[3]]:.3f}× |")


if __name__ == "__main__":
    main()
