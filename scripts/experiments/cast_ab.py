"""Drift of a bf16 target from float32 when RoPE's inv_freq is rounded to bf16 (rule and outcome: docs/decisions.md)."""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from specdemo.bench.prompts import HELD_OUT  # noqa: E402
from specdemo.engine.speculative import encode_prompt  # noqa: E402
from specdemo.models import cast_model, load_pair_uncached  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=10)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    args = ap.parse_args()
    pair = load_pair_uncached("smollm2-135m", target_dtype="float32", draft_dtype="float32")
    ref = pair.target
    variants = {"bf16, inv_freq float32 (cast_model)": cast_model(copy.deepcopy(ref), torch.bfloat16),
                "bf16, inv_freq rounded (.to)": copy.deepcopy(ref).to(torch.bfloat16)}
    bands = [(0, 128), (128, 256), (256, 512), (512, 4096)]
    stats = {v: {b: [0.0, 0, 0, 0.0] for b in bands} for v in ["float32", *variants]}  # kl, agree, n, nll
    with torch.inference_mode():
        for prompt in HELD_OUT[: args.prompts]:
            ids = torch.tensor([encode_prompt(pair, prompt, args.max_new_tokens, True)])
            full = ref.generate(ids, max_new_tokens=args.max_new_tokens, do_sample=False)
            start = ids.shape[1]
            ref_lp = ref(full).logits[0, :-1].float().log_softmax(-1)
            nxt = full[0, 1:]
            for name, model in [("float32", ref), *variants.items()]:
                lp = ref_lp if model is ref else model(full).logits[0, :-1].float().log_softmax(-1)
                kl = (ref_lp.exp() * (ref_lp - lp)).sum(-1)
                agree = lp.argmax(-1) == ref_lp.argmax(-1)
                nll = -lp.gather(1, nxt.view(-1, 1)).view(-1)
                for pos in range(start - 1, full.shape[1] - 1):
                    for b in bands:
                        if b[0] <= pos < b[1]:
                            s = stats[name][b]
                            s[0] += float(kl[pos]); s[1] += int(agree[pos]); s[2] += 1; s[3] += float(nll[pos])
    print(f"SmolLM2-135M-Instruct, {args.prompts} held-out prompts + the float32 greedy reply ({args.max_new_tokens}"
          f" tokens at most), scored by each variant; positions count the prompt's tokens")
    print("| variant | positions | replies' tokens | mean KL from float32 | argmax = float32's | NLL of the reply |")
    print("|---|---|---:|---:|---:|---:|")
    for name, by in stats.items():
        for (lo, hi), (kl, agree, n, nll) in by.items():
            if n:
                print(f"| {name} | {lo}-{hi - 1} | {n} | {kl / n:.4f} | {agree / n:.1%} | {nll / n:.3f} |")


if __name__ == "__main__":
    main()
