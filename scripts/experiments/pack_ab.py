"""oneDNN-packed bf16 linears against plain F.linear on this CPU: forward ms and tokens/s (docs/decisions.md)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from specdemo import SamplingConfig, SpecConfig, load_pair, speculative_generate  # noqa: E402
from specdemo.bench.methods import bench_prompts  # noqa: E402
from specdemo.bench.timing import forward_ms  # noqa: E402
from specdemo.models import CachedLM, PackedLinear, pack_linears  # noqa: E402
from specdemo.models.devices import cpu_bf16_kind, pack_weight  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="smollm2-135m")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    args = ap.parse_args()
    pair = load_pair(args.pair, target_dtype="bfloat16")
    if pair.target.dtype != torch.bfloat16:
        sys.exit("the target did not load in bf16: nothing to pack")
    pack_linears(pair.target)  # a no-op where load_pair packed already
    layers = [m for m in pair.target.modules() if type(m) is PackedLinear]
    head = pair.head
    head_weights = None if head is None else {name: w for name, (w, _) in head.fused().items()}

    def use_packing(on: bool) -> None:
        for m in layers:
            m.__class__ = PackedLinear if on else torch.nn.Linear
        if head is not None:
            head._fused = {name: (w, pack_weight(w) if on else None) for name, w in head_weights.items()}

    print(f"{args.pair} on a CPU with bf16 units: {cpu_bf16_kind()}, {torch.get_num_threads()} threads, "
          f"{len(layers)} target linears")
    ids = torch.randint(pair.vocab_size, (140,), generator=torch.Generator().manual_seed(0))
    logits = {}
    for on in (False, True):
        use_packing(on)
        lm = CachedLM(pair.target, pair.vocab_size)
        lm.feed(ids[:128])
        logits[on] = [lm.feed(ids[128:128 + n], keep_logits=n) for n in (1, 5, 6)]
    same = all(torch.equal(a, b) for a, b in zip(logits[False], logits[True]))
    print(f"packed logits equal the plain ones bit for bit: {same}")
    times: dict = {}
    for _ in range(2):
        for on in (False, True):
            use_packing(on)
            for n in (1, 5, 12):
                times.setdefault((on, n), []).append(forward_ms(pair.target, pair.vocab_size, n))
    print("| forward over n new tokens | plain F.linear (ms) | packed (ms) | plain / packed |\n|---|---:|---:|---:|")
    for n in (1, 5, 12):
        a, b = min(times[(False, n)]), min(times[(True, n)])
        print(f"| {n} | {a:.1f} | {b:.1f} | {a / b:.2f}x |")
    prompts = bench_prompts(pair)[: args.prompts]
    print("| decoder, T | plain tok/s | packed tok/s | packed / plain |\n|---|---:|---:|---:|")
    strategies = ["eagle", "tree"] if head is not None else ["fixed"]
    for temperature in (0.0, 0.7):
        tot: dict = {}
        for prompt in prompts:
            for strategy in strategies:
                for on in (False, True):
                    use_packing(on)
                    spec = SpecConfig(max_new_tokens=args.max_new_tokens, strategy=strategy, seed=1)
                    t0 = time.perf_counter()
                    res = speculative_generate(pair, prompt, SamplingConfig(temperature), spec)
                    cell = tot.setdefault((strategy, on), [0, 0.0])
                    cell[0] += len(res.output_ids)
                    cell[1] += time.perf_counter() - t0
        for strategy in strategies:
            a, b = (tot[(strategy, on)][0] / tot[(strategy, on)][1] for on in (False, True))
            print(f"| {strategy}, T = {temperature:g} | {a:.1f} | {b:.1f} | {b / a:.2f}x |")
    use_packing(True)


if __name__ == "__main__":
    main()
