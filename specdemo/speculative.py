"""The speculative sampling loop (Chen et al. 2023, arXiv:2302.01318; Leviathan et al. 2023, arXiv:2211.17192).

Owns the round-by-round loop as a generator of `Round` events, and the KV caches of both models: they always hold
a prefix of the fixed tokens and are cropped back to it after every round. It does not decide how to sample (see
sampling.py) or how to show anything (render.py, plots.py).

Per round, with the sequence `seq` fixed so far (prompt + output, N tokens):
  1. a drafter (drafters.py: the draft model with a fixed or adaptive K, prompt lookup, or the EAGLE head on the
     target's features) proposes x_1..x_K with the distributions q_1..q_K it drew them from (K = 0 is a plain
     target step);
  2. the target scores [not yet cached tokens of seq] + x_1..x_K in ONE forward, giving warped p_1..p_{K+1};
  3. `verify` accepts the longest prefix with r_t < min(1, p_t(x_t)/q_t(x_t)) and draws the next token from the
     residual norm(max(0, p - q)) at the first rejection, or from p_{K+1} as a bonus if all K were accepted;
  4. the target's cache is cropped to the tokens that were kept, and the drafter is told the outcome (with the
     target's last hidden states at the kept positions, if it reads them), so it rolls its own cache back.

Per round there is one device-to-host copy and no other host sync: phase times on a GPU come from CUDA events,
read after that copy.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch

from .config import SamplingConfig, SpecConfig
from .events import Candidate, DraftPosition, Round, Token, Trace
from .drafters import Drafter, RoundOutcome, make_drafter, max_drafts
from .i18n import Translatable
from .models import CachedLM, ModelPair, dtype_name
from .sampling import verify, warp


class PromptError(Translatable, ValueError):
    """The prompt cannot be generated from (empty, or too long for the context window). The message is a catalogue
    key (i18n.py): English in str(err), the visitor's language in the app."""


def encode_prompt(pair: ModelPair, prompt: str, max_new_tokens: int, chat: bool | None = None) -> list[int]:
    """Tokenise and check the prompt against the pair's context window (prompt + new tokens must fit).

    chat=True treats the prompt as a user message and wraps it with the tokenizer's chat template (instruct targets);
    the output is then the assistant's reply, ended by the template's end-of-turn token (the tokenizer's EOS).
    chat=None takes the pair's default (on for instruct presets such as smollm2-135m)."""
    chat = pair.chat if chat is None else chat
    if not prompt or not prompt.strip():
        raise PromptError("err.prompt_empty")
    if chat and not pair.has_chat_template:
        raise PromptError("err.no_chat_template")
    ids = pair.encode_chat(prompt) if chat else pair.encode(prompt)
    if not ids:
        raise PromptError("err.prompt_no_tokens")
    window = pair.context_window
    if len(ids) + max_new_tokens > window:
        raise PromptError("err.prompt_window", n=len(ids), new=max_new_tokens, window=window)
    return ids


def device_sync(device: torch.device) -> None:
    """Wait for queued GPU work so that a phase's time is its own (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class PhaseClock:
    """Marks between a round's phases without a host sync: CUDA events on a GPU (their times are read once the
    round's single device-to-host copy has waited for the work), perf_counter elsewhere."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def ms(self, a, b) -> float:
        return a.elapsed_time(b) if self.cuda else (b - a) * 1e3


def to_host(*tensors: torch.Tensor) -> list[list[float]]:
    """Copy several small device tensors to Python lists with ONE device-to-host transfer.

    Everything travels as float32, which holds token ids exactly up to 2**24 (every vocabulary in use is smaller).
    """
    sizes = [t.numel() for t in tensors]
    flat = torch.cat([t.reshape(-1).float() for t in tensors]).tolist()
    out, i = [], 0
    for n in sizes:
        out.append(flat[i : i + n])
        i += n
    return out


def candidate_ids(p_rows: torch.Tensor, q_rows: torch.Tensor, m: int) -> torch.Tensor:
    """[rows, 2m] token ids: the top-m under p followed by the top-m under q (duplicates removed on the host)."""
    m = min(m, p_rows.shape[-1])
    if m <= 0:
        return p_rows.new_zeros((p_rows.shape[0], 0), dtype=torch.long)
    return torch.cat([p_rows.topk(m, dim=-1).indices, q_rows.topk(m, dim=-1).indices], dim=-1)


def top_candidates(pair: ModelPair, ids: list, p_vals: list, q_vals: list, width: int) -> list[list[Candidate]]:
    """Rebuild per-position candidate lists from the flat host copies, sorted by max(p, q)."""
    rows = []
    n_rows = len(ids) // width if width else 0
    for i in range(n_rows):
        seen: dict[int, Candidate] = {}
        for j in range(i * width, (i + 1) * width):
            tid = int(ids[j])
            if tid not in seen:
                seen[tid] = Candidate(tid, pair.token_text(tid), p_vals[j], q_vals[j])
        rows.append(sorted(seen.values(), key=lambda c: -max(c.p, c.q)))
    return rows


@torch.inference_mode()
def verdict_on_host(pair: ModelPair, draft_tokens, q_draft, p, v, top_m: int) -> tuple:
    """The round's one device-to-host copy: the drafts, their per-position numbers (p, q, min(1, p/q), r, overlap),
    the verdict (accepted count, next token and its p) and, for the inspector, the top_m candidates per position."""
    top_tensors = []
    if top_m > 0:
        q_padded = torch.cat([q_draft, torch.zeros_like(p[:1])])  # the bonus position has no draft distribution
        top_ids = candidate_ids(p, q_padded, top_m)
        top_tensors = [top_ids, p.gather(1, top_ids), q_padded.gather(1, top_ids)]
    host = to_host(
        draft_tokens, v.p_of_draft, v.q_of_draft, v.accept_prob, v.r, v.overlap,
        torch.stack([v.n_accepted, v.next_token]), p.view(-1).gather(0, v.n_accepted * p.shape[1] + v.next_token),
        *top_tensors,
    )
    draft_list, p_x, q_x, acc, r, overlap, (n_acc, next_tok), (p_next,), *top_host = host
    k = len(draft_list)
    top = top_candidates(pair, *top_host, width=top_tensors[0].shape[1]) if top_m > 0 else [[] for _ in range(k + 1)]
    return [int(t) for t in draft_list], (p_x, q_x, acc, r, overlap), int(n_acc), int(next_tok), p_next, top


def kept_ids(draft_list: list[int], n_acc: int, next_tok: int, eos: int | None, remaining: int):
    """The accepted drafts and the resampled/bonus token, cut after EOS and at the token budget: (ids, stop_reason)."""
    new_ids = draft_list[:n_acc] + [next_tok]
    stop_reason = None
    if eos is not None and eos in new_ids:
        new_ids = new_ids[: new_ids.index(eos) + 1]
        stop_reason = "eos"
    if len(new_ids) >= remaining:
        new_ids = new_ids[:remaining]
        stop_reason = stop_reason or "max_new_tokens"
    return new_ids, stop_reason


def round_tokens(pair: ModelPair, draft_list: list[int], rows: tuple, top: list, n_acc: int, k: int,
                 new_ids: list[int], next_tok: int, p_next: float) -> tuple[list[DraftPosition], list[Token]]:
    """The round as events: every drafted position (judged or not), and the tokens it kept with their labels."""
    p_x, q_x, acc, r, overlap = rows
    positions = [
        DraftPosition(position=t + 1, token_id=tid, text=pair.token_text(tid), q=q_x[t], p=p_x[t], r=r[t],
                      accept_prob=acc[t], overlap=overlap[t], checked=t <= n_acc, accepted=t < n_acc, top=top[t])
        for t, tid in enumerate(draft_list)
    ]
    tokens = [
        Token(d.token_id, d.text, "accepted", d.position, d.p, d.q, d.r, d.accept_prob)
        for d in positions[: min(n_acc, len(new_ids))]
    ]
    if n_acc < k and len(new_ids) > n_acc:
        d = positions[n_acc]
        tokens.append(Token(d.token_id, d.text, "rejected", d.position, d.p, d.q, d.r, d.accept_prob))
        tokens.append(Token(next_tok, pair.token_text(next_tok), "resampled", n_acc + 1, p=p_next))
    elif len(new_ids) > n_acc:
        tokens.append(Token(next_tok, pair.token_text(next_tok), "bonus", k + 1, p=p_next))
    return positions, tokens


def speculative_rounds(
    pair: ModelPair,
    prompt_ids: list[int],
    sampling: SamplingConfig,
    spec: SpecConfig,
    draft_lm: CachedLM | None = None,
    target_lm: CachedLM | None = None,
    drafter: Drafter | None = None,
) -> Iterator[Round]:
    """Yield one Round per target forward until max_new_tokens or EOS. Never emits more than max_new_tokens.

    The drafter (spec.strategy, see drafters.py) proposes the tokens; everything else is the same for every strategy.
    """
    dev = pair.device
    gen = torch.Generator(device=dev).manual_seed(spec.seed)
    target = target_lm or CachedLM(pair.target, pair.vocab_size)
    target.reset()
    drafter = drafter or make_drafter(spec, sampling, pair, draft_lm)
    clock = PhaseClock(dev)
    k_cap = max_drafts(spec)
    seq = torch.tensor(prompt_ids, dtype=torch.long, device=dev)
    prompt_len = len(prompt_ids)
    eos = pair.eos_token_id
    top_m = spec.top_candidates
    busy = 0.0  # this run's own time; excludes whatever the consumer does between rounds
    index = 0
    while True:
        produced = seq.numel() - prompt_len
        remaining = spec.max_new_tokens - produced
        t0, m0 = time.perf_counter(), clock.mark()

        # 1. draft: the drafter proposes up to k tokens and the q rows it drew them from
        #    (near the budget, draft fewer: a round emits at most k + 1 tokens)
        proposal = drafter.propose(seq, min(k_cap, remaining - 1), gen)
        draft_tokens, q_draft, k = proposal.tokens, proposal.q, proposal.k
        m1 = clock.mark()

        # 2. verify: one target forward over its unseen tokens + the k drafts -> p_1..p_{k+1} (and its features)
        fed_from = target.length
        logits, features = target.feed_features(torch.cat([seq[fed_from:], draft_tokens]), keep_logits=k + 1,
                                                layers=drafter.feature_layers)
        p = warp(logits, sampling)  # [k+1, V]
        m2 = clock.mark()

        # 3. accept/reject all k at once, then copy the verdict (and the inspector's top candidates) in one sync
        v = verify(draft_tokens, q_draft, p, gen, greedy=sampling.greedy, lenience=spec.lenience)
        draft_list, rows, n_acc, next_tok, p_next, top = verdict_on_host(pair, draft_tokens, q_draft, p, v, top_m)

        # 4. the tokens that stay: accepted drafts + the resampled/bonus token, cut at EOS and at the budget
        new_ids, stop_reason = kept_ids(draft_list, n_acc, next_tok, eos, remaining)
        seq = torch.cat([seq, torch.tensor(new_ids, dtype=torch.long, device=dev)])
        # roll back: keep only cached tokens that are still part of seq (the last one is fed next round); the
        # drafter rolls its own cache back, and a drafter that reads features gets the target's at kept positions
        kept = seq.numel() - 1
        target.crop(min(target.length, kept))
        if drafter.wants_features and features is not None:
            features = features[: kept - fed_from]
        else:
            features = None
        drafter.observe(RoundOutcome(n_acc, k, seq.numel(), features, fed_from))

        positions, tokens = round_tokens(pair, draft_list, rows, top, n_acc, k, new_ids, next_tok, p_next)
        t3 = time.perf_counter()
        busy += t3 - t0
        yield Round(
            index=index, k=k, prefix_len=seq.numel() - len(new_ids), drafts=positions, tokens=tokens,
            n_accepted=n_acc, draft_ms=clock.ms(m0, m1), verify_ms=clock.ms(m1, m2),
            overhead_ms=max(0.0, (t3 - t0) * 1e3 - clock.ms(m0, m2)), elapsed_s=busy, lossy=spec.lossy,
            stop_reason=stop_reason, bonus_top=top[k] if n_acc == k else [], source=proposal.source,
            copied_from=proposal.copied_from, ngram=proposal.ngram, unsure=proposal.unsure,
        )
        index += 1
        if stop_reason:
            return


def speculative_generate(
    pair: ModelPair,
    prompt: str,
    sampling: SamplingConfig | None = None,
    spec: SpecConfig | None = None,
    on_round=None,
    chat: bool | None = None,
) -> Trace:
    """Run speculative sampling to the end and return its Trace. `on_round(round)` is called as rounds arrive.
    chat: wrap the prompt with the chat template (None: the pair's default; see encode_prompt)."""
    sampling = sampling or SamplingConfig()
    spec = spec or SpecConfig()
    chat = pair.chat if chat is None else chat
    prompt_ids = encode_prompt(pair, prompt, spec.max_new_tokens, chat)
    trace = Trace("speculative", prompt, prompt_ids, settings=run_settings(pair, sampling, spec) | {"chat": chat})
    t0 = time.perf_counter()
    with pair.lock:
        for rnd in speculative_rounds(pair, prompt_ids, sampling, spec):
            trace.rounds.append(rnd)
            if on_round is not None:
                on_round(rnd)
    trace.wall_s = time.perf_counter() - t0
    finish(pair, trace)
    return trace


def run_settings(pair: ModelPair, sampling: SamplingConfig, spec: SpecConfig | None = None) -> dict:
    # public names only (ModelPair.draft_label/target_label): a trace can be shared, and the app returns it
    out = {"pair": pair.name, "draft": pair.draft_label, "target": pair.target_label, "device": str(pair.device),
           "draft_dtype": dtype_name(pair.draft_dtype), "target_dtype": dtype_name(pair.dtype)}
    out |= {"temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p}
    if spec is not None:
        out |= {"k": spec.k, "max_new_tokens": spec.max_new_tokens, "seed": spec.seed, "lenience": spec.lenience,
                "strategy": spec.strategy}
        if spec.strategy == "lookup":
            out["ngram"] = spec.ngram
        if spec.strategy == "eagle" and pair.head is not None:  # the head drafts; the draft model sits idle
            out["head_dtype"] = dtype_name(pair.head.lm_rows.dtype)
    return out


def finish(pair: ModelPair, trace: Trace) -> None:
    """Fill the trace's text and stop reason from its events."""
    trace.text = pair.decode(trace.output_ids)
    events = trace.rounds or trace.steps
    trace.stop_reason = events[-1].stop_reason if events else None
