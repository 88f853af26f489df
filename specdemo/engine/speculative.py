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

Per round there is one device-to-host copy (the verdict) and no other host sync: phase times on a GPU come from
CUDA events, read after that copy, and drafters draft without reading anything back (lookup searches a host copy
of the sequence), except that a drafter with a stop rule reads its confidence once per position where the rule
decides (drafters.confidence: adaptive, and eagle with a stop_below), a sync each on a GPU and free on a CPU.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterator

import torch

from specdemo.config import SamplingConfig, SpecConfig
from specdemo.i18n import Translatable
from specdemo.models import CachedLM, ModelPair, dtype_name
from specdemo.models.devices import cpu_bf16_kind, packs_bf16

from .drafters import Drafter, RoundOutcome, make_drafter, max_drafts, run_tree_shape, tree_children, tree_prune
from .events import Candidate, DraftPosition, Round, Token, Trace, TreeNode
from .sampling import verify, warp
from .tree import DraftTree, TreeVerdict, tree_attention, walk, walk_sampled


class PromptError(Translatable, ValueError):
    """The prompt cannot be generated from (empty, or too long for the context window). The message is a catalogue
    key (i18n.py): English in str(err), the visitor's language in the app."""


def encode_prompt(pair: ModelPair, prompt: str, max_new_tokens: int, chat: bool | None = None) -> list[int]:
    """Tokenise and check the prompt against the pair's context window (prompt + new tokens must fit).

    chat=True treats the prompt as a user message and wraps it with the tokenizer's chat template (instruct targets);
    the output is then the assistant's reply, ended by the template's end-of-turn token (ModelPair.eos_token_ids).
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


def kept_ids(draft_list: list[int], n_acc: int, next_tok: int, eos_ids: Collection[int], remaining: int):
    """The accepted drafts and the resampled/bonus token, cut after the first EOS (any of `eos_ids`,
    ModelPair.eos_token_ids) and at the token budget: (ids, stop_reason)."""
    new_ids = draft_list[:n_acc] + [next_tok]
    stop_reason = None
    end = next((i for i, t in enumerate(new_ids) if t in eos_ids), None)
    if end is not None:
        new_ids = new_ids[: end + 1]
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


@torch.inference_mode()
def tree_verdict_on_host(pair: ModelPair, tokens: torch.Tensor, tree: DraftTree, p: torch.Tensor, v: TreeVerdict,
                         top_m: int) -> tuple:
    """A tree round's one device-to-host copy: the nodes (token, parent, depth, head p, target p), the walk (path,
    where it ended, the target's token there and its p) and, for the inspector, the top_m under p at every row.
    Returns (nodes, path rows, next token, p of it, ended at a leaf, top candidates per p row)."""
    top_tensors = []
    if top_m > 0:
        top_ids = p.topk(min(top_m, p.shape[1]), dim=-1).indices
        top_tensors = [top_ids, p.gather(1, top_ids)]
    p_next = p.view(-1).gather(0, v.end_row * p.shape[1] + v.next_token)
    host = to_host(tokens, tree.parents, tree.depths, tree.head_p, v.p_of_node, v.on_path, v.p_continue,
                   v.q_of_node, v.accept_of_node, torch.stack([v.end_row, v.next_token, v.end_is_leaf.long()]),
                   p_next, *top_tensors)
    (ids, parents, depths, head_p, p_node, on_path, p_go, q_node, acc_node, (end_row, next_tok, leaf), (p_next_host,),
     *top_host) = host
    assert all(-1 <= a < i for i, a in enumerate(parents)), f"a tree node without its parent: {parents}"
    sampled = tree.drawn is not None
    copied_from = len(ids) if tree.copied_from is None else tree.copied_from
    nodes = [TreeNode(i, int(t), pair.token_text(int(t)), int(a), int(d), hp, pn, bool(o), qn if sampled else None, an,
                      i >= copied_from)
             for i, (t, a, d, hp, pn, o, qn, an) in enumerate(zip(ids, parents, depths, head_p, p_node, on_path,
                                                                    q_node, acc_node))]
    top = [[] for _ in range(len(nodes) + 1)]
    if top_m > 0:
        width = top_tensors[0].shape[1]
        top = [[Candidate(int(c), pair.token_text(int(c)), pc, 0.0)
                for c, pc in zip(top_host[0][r * width:(r + 1) * width], top_host[1][r * width:(r + 1) * width])]
               for r in range(len(nodes) + 1)]
    path = [nd.id for nd in nodes if nd.on_path]
    return nodes, path, p_go, int(next_tok), p_next_host, bool(leaf), top


def tree_round_tokens(pair: ModelPair, nodes: list[TreeNode], path: list[int], p_go: list[float], top: list,
                      new_ids: list[int], next_tok: int, p_next: float, leaf: bool
                      ) -> tuple[list[DraftPosition], list[Token]]:
    """A tree round as events. The positions are the path's nodes (accepted) and, where the walk ended at a node
    with children, the head's likeliest child there (judged and refused: the target drew another token). A node's
    q is its head probability; its accept_prob is its chance to be kept when tested (p for a deterministic child,
    min(1, r/q) for a sampled one); overlap is the chance the walk goes on from its parent to one of its
    children."""
    rows = [0] + [i + 1 for i in path]  # the p rows the walk visited
    positions = []
    for t, i in enumerate(path):
        nd = nodes[i]
        positions.append(DraftPosition(t + 1, nd.token_id, nd.text, nd.head_p, nd.p, 0.0, nd.accept_prob,
                                       p_go[rows[t]], True, True, top[rows[t]]))
    end = path[-1] if path else -1
    children = [nd for nd in nodes if nd.parent == end]
    if not leaf and children:
        best = max(children, key=lambda nd: nd.head_p)
        positions.append(DraftPosition(len(path) + 1, best.token_id, best.text, best.head_p, best.p, 0.0,
                                       best.accept_prob, p_go[rows[-1]], True, False, top[rows[-1]]))
    n_acc = len(path)
    tokens = [Token(d.token_id, d.text, "accepted", d.position, d.p, d.q, None, d.accept_prob)
              for d in positions[: min(n_acc, len(new_ids))]]
    if len(new_ids) > n_acc:
        if not leaf and children:
            refused = positions[n_acc]
            tokens.append(Token(refused.token_id, refused.text, "rejected", refused.position, refused.p, refused.q,
                                None, refused.accept_prob))
        tokens.append(Token(next_tok, pair.token_text(next_tok), "bonus" if leaf else "resampled", n_acc + 1,
                            p=p_next))
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
    eos = pair.eos_token_ids  # the generation config's EOS ids and the tokenizer's
    top_m = spec.top_candidates
    stream = pair.text_stream()  # what each kept token adds to the output (a piece of a character adds "")
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

        # 2. verify: one target forward over its unseen tokens + the k drafts -> p_1..p_{k+1} (and its features);
        #    a tree's nodes attend to their ancestors only (a chain's mask is the causal one, so it needs none)
        fed_from = target.length
        unseen = seq.numel() - fed_from
        tree = proposal.tree
        attention = None if tree is None or tree.is_chain else tree_attention(tree, fed_from, unseen, pair.dtype)
        logits, features = target.feed_features(torch.cat([seq[fed_from:], draft_tokens]), keep_logits=k + 1,
                                                layers=drafter.feature_layers, tree=attention)
        p = warp(logits, sampling)  # [k+1, V]: p at the last fixed token, then at each drafted token
        m2 = clock.mark()

        # 3. judge all k at once, then copy the verdict (and the inspector's top candidates) in one sync:
        #    a chain by the modified rejection test with its q, a tree by the exact walk (tree.py)
        if tree is None:
            v = verify(draft_tokens, q_draft, p, gen, greedy=sampling.greedy, lenience=spec.lenience)
            draft_list, rows, n_acc, next_tok, p_next, top = verdict_on_host(pair, draft_tokens, q_draft, p, v, top_m)
            path = list(range(n_acc))
        else:
            tv = (walk(draft_tokens, tree, p, gen, greedy=sampling.greedy) if tree.drawn is None
                  else walk_sampled(draft_tokens, tree, p, gen))
            nodes, path, p_go, next_tok, p_next, leaf, top = tree_verdict_on_host(pair, draft_tokens, tree, p, tv,
                                                                                  top_m)
            draft_list, n_acc = [nodes[i].token_id for i in path], len(path)

        # 4. the tokens that stay: accepted drafts + the resampled/bonus token, cut at EOS and at the budget
        new_ids, stop_reason = kept_ids(draft_list, n_acc, next_tok, eos, remaining)
        seq = torch.cat([seq, torch.tensor(new_ids, dtype=torch.long, device=dev)])
        # roll back: keep only cached tokens that are still part of seq (the last one is fed next round): the fed
        # fixed tokens, then the kept drafts (a tree's path moves up to sit right after them); the drafter rolls
        # its own cache back, and a drafter that reads features gets the target's at kept positions
        kept = seq.numel() - 1
        kept_rows = (list(range(unseen)) + [unseen + i for i in path])[: kept - fed_from]
        if tree is None or tree.is_chain:  # the kept path is already in place
            target.crop(min(target.length, kept))
        else:
            target.keep_rows(fed_from, kept_rows)
        if drafter.wants_features and features is not None:
            features = features[: kept - fed_from] if tree is None else features[kept_rows]
        else:
            features = None
        drafter.observe(RoundOutcome(n_acc, k, seq.numel(), features, fed_from, tuple(new_ids)))

        if tree is None:
            positions, tokens = round_tokens(pair, draft_list, rows, top, n_acc, k, new_ids, next_tok, p_next)
            bonus_top = top[k] if n_acc == k else []
        else:
            positions, tokens = tree_round_tokens(pair, nodes, path, p_go, top, new_ids, next_tok, p_next, leaf)
            bonus_top = top[path[-1] + 1 if path else 0] if leaf else []
        for t in tokens:  # the kept ones, in order, take the text they add to the output
            if t.label != "rejected":
                t.text = stream.push(t.token_id)
        t3 = time.perf_counter()
        busy += t3 - t0
        yield Round(
            index=index, k=k, prefix_len=seq.numel() - len(new_ids), drafts=positions, tokens=tokens,
            n_accepted=n_acc, draft_ms=clock.ms(m0, m1), verify_ms=clock.ms(m1, m2),
            overhead_ms=max(0.0, (t3 - t0) * 1e3 - clock.ms(m0, m2)), elapsed_s=busy, lossy=spec.lossy,
            stop_reason=stop_reason, bonus_top=bonus_top, source=proposal.source,
            copied_from=proposal.copied_from, ngram=proposal.ngram, unsure=proposal.unsure,
            tree=None if tree is None else nodes,
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
        if spec.strategy in ("eagle", "tree") and pair.head is not None:  # the head drafts; the draft model idles
            out["head_dtype"] = dtype_name(pair.head.lm_rows.dtype)
        if spec.strategy == "tree" and pair.head is not None:  # the sizes it drafted with (0s resolved, capped)
            out["tree_topk"], out["tree_depth"], out["tree_budget"] = run_tree_shape(spec, sampling, pair)
            out["tree_children"] = tree_children(spec, sampling, pair)
            out["tree_prune_below"] = tree_prune(pair.head, spec)
            if spec.tree_lookup:
                out["tree_lookup"] = spec.tree_lookup
    if pair.device.type == "cpu" and "bfloat16" in (out["draft_dtype"], out["target_dtype"], out.get("head_dtype")):
        # bf16 sums depend on the CPU's bf16 units and on packing (devices.packs_bf16): name both, so that the
        # dtypes name the numbers (issue 39)
        out["cpu_bf16"] = cpu_bf16_kind()
        out["bf16_packed"] = packs_bf16(pair.device, torch.bfloat16)
    return out


def finish(pair: ModelPair, trace: Trace) -> None:
    """Fill the trace's text and stop reason from its events."""
    trace.text = pair.decode(trace.output_ids)
    events = trace.rounds or trace.steps
    trace.stop_reason = events[-1].stop_reason if events else None
