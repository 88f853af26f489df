"""Measure the smollm2-135m pair for its model card; writes assets/models/smollm2_card_metrics.json (docs/models.md)."""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evaluate_pair import alpha_on, latency_ms  # noqa: E402

from specdemo import SamplingConfig, SpecConfig, load_pair, speculative_generate  # noqa: E402
from specdemo.bench.prompts import HELD_OUT  # noqa: E402
from specdemo.models.devices import dtype_name  # noqa: E402

K = 4


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--prompts", type=int, default=len(HELD_OUT), help="how many held-out prompts")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    args = ap.parse_args()
    prompts = HELD_OUT[: args.prompts]
    pair = load_pair("smollm2-135m", device="cpu")
    meta = json.loads((Path(pair.draft.name_or_path) / "training.json").read_text())
    out: dict = {"hardware": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads",
                 "torch": torch.__version__, "describe": pair.describe(), "draft_training": meta}
    lat = {"target_1_token": latency_ms(pair.target, pair.vocab_size, 1, reps=30),
           "draft_1_token": latency_ms(pair.draft, pair.vocab_size, 1, reps=100),
           f"target_verify_{K + 1}_tokens": latency_ms(pair.target, pair.vocab_size, K + 1, reps=30)}
    out["latency_ms"] = lat
    out["c"] = lat["draft_1_token"] / lat["target_1_token"]
    out["verify_cost"] = lat[f"target_verify_{K + 1}_tokens"] / lat["target_1_token"]
    for temperature in (0.0, 0.7):
        out[f"T{temperature:g}"] = alpha_on(pair, prompts, temperature, K, args.max_new_tokens, chat=True) | {
            "max_new_tokens": args.max_new_tokens}
    if pair.head is not None:
        from specdemo.bench.timing import head_step_ms

        head = {"head_step_ms": head_step_ms(pair), "head_dtype": dtype_name(pair.head.lm_rows.dtype),
                "training": pair.head.cfg.training | {"history": pair.head.cfg.training.get("history", [])[-3:]}}
        head["c"] = head["head_step_ms"] / lat["target_1_token"]
        for temperature in (0.0, 0.7):
            head[f"T{temperature:g}"] = alpha_on(pair, prompts, temperature, K, args.max_new_tokens, chat=True,
                                                 strategy="eagle")
        out["eagle"] = head
    for prompt in ("What is the capital of France?", "Write a short story about a fox who wants to fly."):
        tr = speculative_generate(pair, prompt, SamplingConfig(0.0), SpecConfig(k=K, max_new_tokens=args.max_new_tokens), chat=True)
        out.setdefault("samples_T0", {})[prompt] = tr.text
    (ROOT / "assets" / "models" / "smollm2_card_metrics.json").write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
