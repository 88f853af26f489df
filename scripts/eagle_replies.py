"""The smollm2-135m target writes its head's training data (`train_eagle.py prompts` and `replies`): user prompts
of its own (self-instruct, in specdemo/bench/prompts.py's self_prompts.json) and chat replies to a family of prompts,
saved as token ids in shards under assets/training/smollm2-135m/ (both committed)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import torch
from eagle_data import REPLIES, load_target

from specdemo.bench.prompts import SELF_PROMPTS, clean_prompt, normalized, self_prompts, training_prompts

TEMPS = (0.0, 0.7, 1.0)  # shard i is written at TEMPS[i % 3]


def save_shard(path: Path, records: list[tuple[list[int], list[int]]], temp: float) -> None:
    """Token ids of (prompt, reply) records as uint16, flattened with lengths: a few tens of kB per shard."""
    prompt_lens = np.array([len(p) for p, _ in records], dtype=np.int32)
    reply_lens = np.array([len(r) for _, r in records], dtype=np.int32)
    ids = np.array([t for p, r in records for t in p + r], dtype=np.uint16)
    tmp = path.with_suffix(".tmp.npz")
    np.savez_compressed(tmp, ids=ids, prompt_lens=prompt_lens, reply_lens=reply_lens, temperature=np.float32(temp))
    tmp.rename(path)


@torch.inference_mode()
def write_prompts(args) -> None:
    """The target writes new user prompts (bench/prompts.py's third family, self-instruct): shown four earlier
    prompts as a list, two templated and two of its own once it has some, it continues the list at T = 0.8, and
    every clean new item is kept. Appends to self_prompts.json after every batch, up to --count; resumable."""
    import random

    torch.set_num_threads(args.threads)
    tok, model = load_target("smollm2-135m")
    tok.padding_side = "left"
    templated, written = training_prompts(), self_prompts()
    seen = {normalized(p) for p in templated + written}
    deadline = time.time() + args.minutes * 60
    while len(written) < args.count and time.time() < deadline:
        t0, before = time.time(), len(written)
        rng = random.Random(before)
        metas = []
        for _ in range(args.batch):
            shown = rng.sample(templated, 2) + rng.sample(written or templated, 2)
            rng.shuffle(shown)
            metas.append("Messages that people sent to a helpful AI assistant, one per line:\n"
                         + "".join(f"- {m}\n" for m in shown) + "-")
        enc = tok(metas, padding=True, return_tensors="pt")
        torch.manual_seed(before)
        out = model.generate(**enc, do_sample=True, temperature=0.8, top_k=0, top_p=1.0, max_new_tokens=64,
                             pad_token_id=tok.eos_token_id)
        for row in out[:, enc["input_ids"].shape[1] :]:
            lines = ("-" + tok.decode(row, skip_special_tokens=True)).split("\n")
            for line in lines[:-1]:  # the last line may be cut off by the token budget
                if not line.startswith("-"):
                    break  # the list ended
                prompt = clean_prompt(line, seen)
                if prompt is not None:
                    seen.add(normalized(prompt))
                    written.append(prompt)
        written = written[: args.count]
        tmp = SELF_PROMPTS.with_suffix(".tmp")
        tmp.write_text(json.dumps(written, ensure_ascii=False, indent=0) + "\n")
        tmp.rename(SELF_PROMPTS)
        print(f"{len(written)} prompts (+{len(written) - before} in {time.time() - t0:.0f}s)", flush=True)


def family_prompts(family: str) -> tuple[list[str], str]:
    """The prompts of a family and its shard names' prefix: "templated" (shard_*) or "self" (self_*)."""
    return (training_prompts(), "shard") if family == "templated" else (self_prompts(), "self")


@torch.inference_mode()
def replies(args) -> None:
    """The target writes replies to a family's prompts, a batch per shard; existing shards are skipped."""
    torch.set_num_threads(args.threads)
    tok, model = load_target("smollm2-135m")
    tok.padding_side = "left"
    prompts, prefix = family_prompts(args.family)
    REPLIES.mkdir(parents=True, exist_ok=True)
    deadline = time.time() + args.minutes * 60
    # the self family grows by appending: write only full shards, so a later, longer list keeps every shard's prompts
    # (and, with the same --batch, its temperature and seed)
    n_batches = len(prompts) // args.batch if args.family == "self" else math.ceil(len(prompts) / args.batch)
    for b in range(n_batches):
        path = REPLIES / f"{prefix}_{b:05d}.npz"
        if path.exists():
            continue
        if time.time() > deadline:
            break
        t0 = time.time()
        batch = prompts[b * args.batch : (b + 1) * args.batch]
        temp = TEMPS[b % len(TEMPS)]
        enc = tok.apply_chat_template([[{"role": "user", "content": p}] for p in batch], add_generation_prompt=True,
                                      padding=True, return_tensors="pt", return_dict=True)
        kw = dict(do_sample=temp > 0, max_new_tokens=args.max_new_tokens, pad_token_id=tok.eos_token_id,
                  eos_token_id=tok.eos_token_id)
        if temp > 0:
            kw |= dict(temperature=temp, top_k=0, top_p=1.0)
        torch.manual_seed(1000 + b)
        out = model.generate(**enc, **kw)
        new = out[:, enc["input_ids"].shape[1] :].tolist()
        records = []
        for i, ids in enumerate(new):
            n = ids.index(tok.eos_token_id) + 1 if tok.eos_token_id in ids else len(ids)
            records.append((enc["input_ids"][i][enc["attention_mask"][i].bool()].tolist(), ids[:n]))
        save_shard(path, records, temp)
        n_tok = sum(len(r) for _, r in records)
        print(f"shard {b}/{n_batches} T={temp}: {n_tok} reply tokens in {time.time() - t0:.0f}s "
              f"({n_tok / (time.time() - t0):.0f} tok/s)", flush=True)
