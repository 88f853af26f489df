"""What an EAGLE head is trained on and scored by (scripts/train_eagle.py): draft steps 1..3 unrolled as in drafting
(training-time test: steps 2 and 3 read the head's own predicted features), the loss over them (forward KL on the
draft vocabulary, smooth-L1 on the feature, an optional total-variation term) and the dev scores (top-1 agreement and
sum min(p, q) per draft step)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from eagle_data import HeadFeatures, Teacher, collate


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
