"""What a target step costs through a static cache of the whole context window against one sized to the request,
with and without the cache-length buckets of models/static.py (issue 45; docs/decisions.md, "attention over the
filled cache, by buckets"). A measurement, not a test.

Four static caches of the pair's target, as the app loads it: the whole window (context + 65 slots) and a request
of --request tokens (+ 65), each attending over its buckets (today's code) or over every slot (`static.buckets_for`
switched off, the code before issue 45). One-token steps after each context length, the median of --reps, the four
variants alternated pass by pass so that the machine's load falls on all of them alike. Prints each variant's
milliseconds and the ratios that the rule reads.

With --runs N, whole runs too (issue 45's floor: the pair as the app loads it runs target-only at 0.9x or more of the
request-sized caches): greedy target-only runs of --tokens tokens on the first N bench prompts, through the pair as
the app loads it (graphs on CUDA, static on a CPU; caches of the whole window) and through a copy prepared with
caches sized to the longest of those requests, as the bench's are, the two alternated prompt by prompt.

    .venv/bin/python scripts/experiments/window_cost.py                       # SmolLM2, as the app loads it
    .venv/bin/python scripts/experiments/window_cost.py --device cuda --passes 5 --runs 10   # with graphs on a GPU
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from specdemo.bench.decodings import longest_request  # noqa: E402
from specdemo.bench.methods import bench_prompts  # noqa: E402
from specdemo.bench.timing import forward_ms  # noqa: E402
from specdemo.config import SamplingConfig  # noqa: E402
from specdemo.engine.autoregressive import baseline_generate  # noqa: E402
from specdemo.models import static  # noqa: E402
from specdemo.models.loading import load_pair_uncached  # noqa: E402
from specdemo.models.static_parts import Tally  # noqa: E402


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
    ap.add_argument("--runs", type=int, default=0, help="whole target-only runs on this many bench prompts")
    ap.add_argument("--tokens", type=int, default=128, help="new tokens of each whole run")
    args = ap.parse_args()
    # the per-step variants build slots of their own over the target; with --runs they reuse the pair its whole
    # runs loaded (as the app loads it) rather than loading the models again
    pair = whole_runs(args) if args.runs else load_pair_uncached(args.pair, device=args.device, decoding="eager")
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


def whole_runs(args):
    """Target-only runs through the app's whole-window caches against request-sized ones (see the docstring); the
    pair as the app loads it, for the per-step variants."""
    mode = "graphs" if args.device.startswith("cuda") else "static"
    app = load_pair_uncached(args.pair, device=args.device, decoding=mode)  # the whole window, as the app loads it
    prompts = bench_prompts(app)[:args.runs]
    request = longest_request(app, prompts, args.tokens)
    sized = copy.copy(app)  # shares the models; its own caches (and graphs), as the bench's decodings do
    static.prepare(sized, mode, max_request=request)
    pairs = {"the app's pair": app, "request-sized": sized}
    sizes = {name: p.static_slots["target"].max_len for name, p in pairs.items()}
    totals = {name: [0, 0.0] for name in pairs}
    greedy = SamplingConfig(0.0)
    for p in pairs.values():  # warm-up on every prompt: allocations, and any graph captured on first use
        for prompt in prompts:
            baseline_generate(p, prompt, greedy, args.tokens)
    made = Tally.count
    for i, prompt in enumerate(prompts):
        for name in (list(pairs) if i % 2 == 0 else list(pairs)[::-1]):
            t0 = time.perf_counter()
            trace = baseline_generate(pairs[name], prompt, greedy, args.tokens, seed=i)
            totals[name][1] += time.perf_counter() - t0
            totals[name][0] += len(trace.output_ids)
    rate = {name: n / s for name, (n, s) in totals.items()}
    ratio = rate["the app's pair"] / rate["request-sized"]
    print(f"whole runs, target-only, T = 0, {len(prompts)} prompts x {args.tokens} tokens, decoding {mode}: "
          + ", ".join(f"{name} ({sizes[name]} slots) {rate[name]:.1f} tok/s" for name in pairs)
          + f"; the app's pair / request-sized = {ratio:.3f}x; graphs captured while timing: {Tally.count - made}")
    return app


if __name__ == "__main__":
    main()
