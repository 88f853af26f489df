"""Measure the embedded Shakespeare pair for its model card; writes assets/models/card_metrics.json (docs/models.md)."""

from __future__ import annotations

import json
import math
import platform
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specdemo import SamplingConfig, SpecConfig, load_pair, speculative_generate  # noqa: E402
from specdemo.bench.timing import forward_ms  # noqa: E402
from specdemo.engine.events import acceptance  # noqa: E402

K = 4


@torch.inference_mode()
def held_out_loss(model, data: torch.Tensor, block: int = 256) -> float:
    n = (len(data) - 1) // block
    total = 0.0
    for i in range(0, n, 16):
        rows = range(i, min(i + 16, n))
        x = torch.stack([data[j * block : (j + 1) * block] for j in rows])
        y = torch.stack([data[j * block + 1 : (j + 1) * block + 1] for j in rows])
        total += F.cross_entropy(model(x).logits.flatten(0, 1), y.flatten(), reduction="sum").item()
    return total / (n * block)


def latency_ms(model, vocab: int, new_tokens: int, context: int = 128, reps: int = 200) -> float:
    """Median time of one cached forward over `new_tokens` tokens after a `context`-token prefix."""
    return forward_ms(model, vocab, new_tokens, context, reps)


def alpha_on(pair, prompts, temperature: float, k: int, max_new_tokens: int, chat=None, strategy: str = "fixed"
             ) -> dict:
    """Acceptance over the positions the target judged, on `prompts` (one seed each): the empirical rate and the
    mean overlap sum min(p, q). strategy "eagle" measures the pair's EAGLE head instead of its draft model. Also
    the run's tokens, rounds, drafts, drafting rounds (not eagle's prefill), `short_rounds` (drafting rounds that
    drafted fewer than k) and wall time."""
    rounds, tokens, wall = [], 0, 0.0
    for i, prompt in enumerate(prompts):
        tr = speculative_generate(pair, prompt, SamplingConfig(temperature),
                                  SpecConfig(k=k, max_new_tokens=max_new_tokens, seed=i, top_candidates=0,
                                             strategy=strategy), chat=chat)
        rounds += tr.rounds
        tokens, wall = tokens + len(tr.output_ids), wall + tr.wall_s
    a = acceptance(rounds)
    return {"alpha_empirical": a["alpha_empirical"], "alpha_overlap": a["alpha_overlap"],
            "judged_positions": a["judged"], "prompts": len(prompts), "tokens": tokens,
            "rounds": len(rounds), "drafted": a["drafted"],
            "drafting_rounds": sum(r.source != "prefill" for r in rounds),
            "short_rounds": sum(r.k < k for r in rounds if r.source != "prefill"), "wall_s": wall}


def held_out_prompts(pair, n: int = 20, length: int = 24) -> list[str]:
    """n prompts cut from the held-out plays at evenly spaced speech starts."""
    text = (ROOT / "data" / "val.txt").read_text(encoding="utf-8")
    starts = [i + 2 for i in range(len(text)) if text.startswith("\n\n", i)]
    picks = [starts[j * len(starts) // n] for j in range(n)]
    return [pair.decode(pair.encode(text[s : s + 400])[:length]) for s in picks]


def main() -> None:
    pair = load_pair("shakespeare", device="cpu")
    val = torch.load(ROOT / "data" / "val.pt").long()
    out: dict = {"hardware": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads",
                 "torch": torch.__version__}
    for role, model, path in (("target", pair.target, pair.target_id), ("draft", pair.draft, pair.draft_id)):
        loss = held_out_loss(model, val)
        meta = json.loads((Path(path) / "training.json").read_text())
        out[role] = {
            "parameters": sum(p.numel() for p in model.parameters()),
            "layers": model.config.n_layer, "width": model.config.n_embd, "heads": model.config.n_head,
            "held_out_loss": loss, "held_out_ppl": math.exp(loss),
            "training_minutes": meta["minutes"], "training_steps": meta["steps"],
            "training_tokens": meta["steps"] * meta["batch"] * meta["block"],
        }
    out["latency_ms"] = {
        "target_1_token": latency_ms(pair.target, pair.vocab_size, 1),
        "draft_1_token": latency_ms(pair.draft, pair.vocab_size, 1),
        f"target_verify_{K + 1}_tokens": latency_ms(pair.target, pair.vocab_size, K + 1),
    }
    lat = out["latency_ms"]
    out["c"] = lat["draft_1_token"] / lat["target_1_token"]
    out["verify_cost"] = lat[f"target_verify_{K + 1}_tokens"] / lat["target_1_token"]
    prompts = held_out_prompts(pair)
    for temperature in (0.0, 1.0):
        out[f"T{temperature:g}"] = alpha_on(pair, prompts, temperature, K, 64)
    sample = speculative_generate(pair, "ROMEO:\n", SamplingConfig(0.8), SpecConfig(k=K, max_new_tokens=96, seed=0))
    out["sample_romeo_T0.8_seed0"] = "ROMEO:\n" + sample.text
    (ROOT / "assets" / "models" / "card_metrics.json").write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
