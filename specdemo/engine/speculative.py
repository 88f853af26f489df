"""The speculative sampling loop (Chen et al. 2023, arXiv:2302.01318; Leviathan et al. 2023, arXiv:2211.17192).

Owns the round-by-round loop as a generator of `Round` events, and the KV caches of both models: they always hold
a prefix of the fixed tokens and are cropped back to it after every round. It does not decide how to sample (see
sampling.py), how to draft (drafters.py) or how a round reads on the page (story.py, and the app).

Per round, with the sequence `seq` fixed so far (prompt + output, N tokens), `speculative_rounds` runs five steps,
each a function below:
  1. a drafter (drafters.py: the draft model with a fixed or adaptive K, prompt lookup, or the EAGLE head on the
     target's features, as a chain or a tree) proposes x_1..x_K with the distributions q_1..q_K it drew them from
     (K = 0 is a plain target step);
  2. `verify_forward`: the target scores [not yet cached tokens of seq] + x_1..x_K in ONE forward, giving the
     float32 logits of positions 1..K+1 (its last hidden states where the verdict is captured), which step 3 warps
     into p_1..p_{K+1};
  3. `judge`: `verify` accepts the longest prefix with r_t < min(1, p_t(x_t)/q_t(x_t)) and draws the next token from
     the residual norm(max(0, p - q)) at the first rejection, or from p_{K+1} as a bonus if all K were accepted (a
     tree: the walk of walk.py); the verdict crosses to the host in one copy;
  4. `kept_ids` and `roll_back`: the kept tokens join seq, the target's cache is cropped to them, and the drafter is
     told the outcome (with the target's last hidden states at the kept positions, if it reads them), so it rolls
     its own cache back;
  5. `round_story` (story.py): the round as the page shows it.

Per round there is one device-to-host copy (the verdict) and no other host sync: phase times on a GPU come from
CUDA events, read after that copy, and drafters draft without reading anything back (lookup searches a host copy
of the sequence), except that a drafter with a stop rule reads its confidence once per position where the rule
decides (drafters.confidence: adaptive, and eagle with a stop_below), and a tree grown step by step reads one
number a depth where it prunes (tree.grow, sampled_tree) and its lookup branch where it grafts one: a sync each on
a GPU and free on a CPU. On captured graphs eagle drafts all K in one replay with no stop (the verify's graph takes
K + 1 rows anyway), a tree grows in one replay, and a verdict is one replay (judge_graph.py).
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Collection, Iterator

import torch

from specdemo.config import SamplingConfig, SpecConfig
from specdemo.i18n import Translatable
from specdemo.models import CachedLM, ModelPair, dtype_name
from specdemo.models.devices import cpu_bf16_kind, packs_bf16, upload_ids

from .drafters import Drafter, Proposal, RoundOutcome
from .events import Round, Trace
from .judge_graph import ChainJudge, TreeJudge, candidate_width, chain_judge, split_flat, tree_judge
from .sampling import verify, warp
from .story import Judged, round_story, tree_verdict_from_host, tree_verdict_on_host, verdict_from_host, verdict_on_host
from .strategy import make_drafter, max_drafts
from .tree import TreeForward
from .tree_drafter import run_tree_prune, run_tree_shape, tree_children
from .walk import walk, walk_sampled


class PromptError(Translatable, ValueError):
    """The prompt cannot be generated from (empty, or too long for the context window). The message is a catalogue
    key (specdemo/i18n): English in str(err), the visitor's language in the app."""


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


def verify_forward(target: CachedLM, seq: torch.Tensor, proposal: Proposal, drafter: Drafter,
                   sampling: SamplingConfig, dtype: torch.dtype, warped: bool = True, hidden: bool = False):
    """Step 2: one target forward over its unseen fixed tokens and the k drafts. Returns p_1..p_{k+1} (warped as the
    draft's q were; warped=False: their float32 logits, which `judge` warps; hidden: the target's last hidden
    states there, for a captured verdict), the features a drafter reads, where the forward started and how many
    fixed tokens it fed. A tree's nodes attend to their ancestors only; a chain's mask is the causal one, so it
    needs none."""
    fed_from = target.length
    unseen = seq.numel() - fed_from
    tree = proposal.tree
    attention = None if tree is None or tree.is_chain else TreeForward(tree, fed_from, unseen, dtype)
    more = {"want_hidden": True} if hidden else {}
    logits, features = target.feed_features(torch.cat([seq[fed_from:], proposal.tokens]), keep_logits=proposal.k + 1,
                                            layers=drafter.feature_layers, tree=attention, **more)
    return (warp(logits, sampling) if warped and not hidden else logits), features, fed_from, unseen


def captured_judge(pair: ModelPair, proposal: Proposal, sampling: SamplingConfig, spec: SpecConfig
                   ) -> ChainJudge | TreeJudge | None:
    """Where the target's forwards are captured, the round's verdict as one replay: a chain's (k = 0: a plain
    step's), a top-k tree's, or a tree of sampled children grown in a graph (sampled_graph.py); None: judged
    eagerly (elsewhere, and for a sampled tree grown step by step)."""
    tree = proposal.tree
    if tree is None:
        return chain_judge(pair, sampling, spec.lenience, spec.top_candidates)
    return tree_judge(pair, sampling, spec.top_candidates) if tree.drawn is None or tree.size is not None else None


def judge(pair: ModelPair, proposal: Proposal, logits: torch.Tensor, gen: torch.Generator, sampling: SamplingConfig,
          spec: SpecConfig, captured: ChainJudge | TreeJudge | None = None, base: int = 0) -> Judged:
    """Step 3: judge all k drafts at once from the target's logits, then copy the verdict (and the inspector's top
    candidates) to the host in one sync: a chain by the modified rejection test with its q, a tree by the exact walk
    (walk.py); each as one captured replay where the target's forwards are captured (judge_graph.py, which takes the
    target's last hidden states as `logits`; a sampled tree grown step by step is walked eagerly). A captured tree
    verdict also moves the path's rows in the target's cache up to slot `base`, the first after the fixed tokens."""
    tree, top_m = proposal.tree, spec.top_candidates
    if tree is None:
        flat = captured.judge(logits, proposal.tokens, proposal.q, gen) if captured is not None else None
        if captured is not None and flat is None:  # no graph could be captured: judged eagerly
            logits = captured.logits(logits)
        if flat is not None:
            drafts, rows, n_acc, next_tok, p_next, top = verdict_from_host(
                pair, split_flat(flat, proposal.k, top_m, captured.vocab), top_m,
                candidate_width(top_m, captured.vocab))
        else:
            p = warp(logits, sampling)
            v = verify(proposal.tokens, proposal.q, p, gen, greedy=sampling.greedy, lenience=spec.lenience)
            drafts, rows, n_acc, next_tok, p_next, top = verdict_on_host(pair, proposal.tokens, proposal.q, p, v,
                                                                         top_m)
        return Judged(drafts, n_acc, next_tok, p_next, list(range(n_acc)), top, rows=rows)
    host = captured.judge(logits, proposal.tokens, tree, gen, base) if captured is not None else None
    if host is not None:  # the walk and the round's numbers in one replay (judge_graph.TreeJudge)
        nodes, path, p_go, next_tok, p_next, leaf, top = tree_verdict_from_host(pair, host, tree, top_m,
                                                                                captured.width())
    else:
        p = warp(logits if captured is None else captured.logits(logits), sampling)
        tv = (walk(proposal.tokens, tree, p, gen, greedy=sampling.greedy) if tree.drawn is None
              else walk_sampled(proposal.tokens, tree, p, gen))
        nodes, path, p_go, next_tok, p_next, leaf, top = tree_verdict_on_host(pair, proposal.tokens, tree, p, tv,
                                                                              top_m)
    return Judged([nodes[i].token_id for i in path], len(path), next_tok, p_next, path, top, nodes=nodes, p_go=p_go,
                  leaf=leaf, moved=host is not None)


def roll_back(target: CachedLM, drafter: Drafter, seq: torch.Tensor, proposal: Proposal, judged: Judged,
              new_ids: list[int], features, fed_from: int, unseen: int) -> None:
    """Step 4b: keep only the cached tokens that are still part of seq (its last token is fed next round): the fed
    fixed tokens, then the kept drafts (a tree's path moves up to sit right after them). The drafter rolls its own
    cache back, and a drafter that reads features gets the target's at the kept positions."""
    tree = proposal.tree
    kept = seq.numel() - 1
    kept_rows = (list(range(unseen)) + [unseen + i for i in judged.path])[: kept - fed_from]
    if tree is None or tree.is_chain or judged.moved:  # the kept path is already in place
        target.crop(min(target.length, kept))
    else:
        target.keep_rows(fed_from, kept_rows)
    if drafter.wants_features and features is not None:
        if tree is None:
            features = features[: kept - fed_from]
        elif kept_rows == list(range(len(kept_rows))):  # the kept path leads the tree's rows: a view
            features = features[: len(kept_rows)]
        else:  # a list index would copy the rows' numbers in from pageable memory, which waits for a GPU
            features = features.index_select(0, upload_ids(kept_rows, features.device))
    else:
        features = None
    drafter.observe(RoundOutcome(judged.n_acc, proposal.k, seq.numel(), features, fed_from, tuple(new_ids)))


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
    target = target_lm or pair.new_lm("target")
    target.reset()
    drafter = drafter or make_drafter(spec, sampling, pair, draft_lm)
    clock = PhaseClock(dev)
    k_cap, eos = max_drafts(spec), pair.eos_token_ids  # the most drafts a round may make; the EOS ids
    seq = torch.tensor(prompt_ids, dtype=torch.long, device=dev)
    stream = pair.text_stream()  # what each kept token adds to the output (a piece of a character adds "")
    busy = 0.0  # this run's own time; excludes whatever the consumer does between rounds
    for index in itertools.count():
        remaining = spec.max_new_tokens - (seq.numel() - len(prompt_ids))
        t0, m0 = time.perf_counter(), clock.mark()

        # 1. draft: the drafter proposes up to k tokens and the q rows it drew them from
        #    (near the budget, draft fewer: a round emits at most k + 1 tokens)
        proposal = drafter.propose(seq, min(k_cap, remaining - 1), gen)
        m1 = clock.mark()

        # 2. verify: one target forward over the drafts -> p_1..p_{k+1}
        captured = captured_judge(pair, proposal, sampling, spec)
        logits, features, fed_from, unseen = verify_forward(target, seq, proposal, drafter, sampling, pair.dtype,
                                                            warped=False, hidden=captured is not None)
        m2 = clock.mark()

        # 3. judge: accept or reject every draft at once; one copy to the host
        judged = judge(pair, proposal, logits, gen, sampling, spec, captured, fed_from + unseen)
        if proposal.tree is not None and proposal.tree.size is not None:  # grown in a graph: its real nodes
            proposal = dataclasses.replace(proposal, tokens=proposal.tokens[: len(judged.nodes)])

        # 4. keep the accepted drafts + the resampled/bonus token, cut at EOS and at the budget; roll the caches back
        new_ids, stop_reason = kept_ids(judged.drafts, judged.n_acc, judged.next_tok, eos, remaining)
        seq = torch.cat([seq, upload_ids(new_ids, dev)])  # on CUDA without a second sync
        roll_back(target, drafter, seq, proposal, judged, new_ids, features, fed_from, unseen)

        # 5. tell the story of the round
        positions, tokens, bonus_top = round_story(pair, proposal, judged, new_ids, stream)
        t3 = time.perf_counter()
        busy += t3 - t0
        yield Round(
            index=index, k=proposal.k, prefix_len=seq.numel() - len(new_ids), drafts=positions, tokens=tokens,
            n_accepted=min(judged.n_acc, len(new_ids)),  # an EOS among the kept drafts ends the output there
            draft_ms=clock.ms(m0, m1), verify_ms=clock.ms(m1, m2),
            overhead_ms=max(0.0, (t3 - t0) * 1e3 - clock.ms(m0, m2)), elapsed_s=busy, lossy=spec.lossy,
            stop_reason=stop_reason, bonus_top=bonus_top, source=proposal.source,
            copied_from=proposal.copied_from, ngram=proposal.ngram, unsure=proposal.unsure, tree=judged.nodes,
            head=getattr(drafter, "published", None) if proposal.source in ("eagle", "tree") else None,
        )
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
           "decoding": pair.decoding,  # eager, static, graphs or compiled (models.static): how the forwards ran
           "draft_dtype": dtype_name(pair.draft_dtype), "target_dtype": dtype_name(pair.dtype)}
    out |= {"temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p}
    if spec is not None:
        out |= {"k": spec.k, "max_new_tokens": spec.max_new_tokens, "seed": spec.seed, "lenience": spec.lenience,
                "strategy": spec.strategy}
        if spec.strategy == "lookup":
            out["ngram"] = spec.ngram
        if spec.strategy in ("eagle", "tree") and pair.head is not None:  # the head drafts; the draft model idles
            out["head_dtype"] = dtype_name(pair.head.lm_rows.dtype)
            if getattr(pair.head, "published_name", None):  # a published EAGLE-3 head: named (ours are the pair's)
                out["head"] = pair.head.published_name
        if spec.strategy == "tree" and pair.head is not None:  # the sizes it drafted with (0s resolved, capped)
            out["tree_topk"], out["tree_depth"], out["tree_budget"] = run_tree_shape(spec, sampling, pair)
            out["tree_children"] = tree_children(spec, sampling, pair)
            out["tree_prune_below"] = run_tree_prune(spec, sampling, pair)
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
