"""The benchmark: naive target-only decoding vs speculative sampling vs transformers' assisted generation.

Owns the measurement protocol: one process, one pair, the same prompts and settings for every method, a warm-up
run of each method that is not counted, and the methods interleaved prompt by prompt so that a slow moment of a
shared machine hits all of them alike. It reports tokens/s, speedups, alpha, the cost ratio c and the verify cost
measured in the same run, and the theoretical ceiling those imply. strategies.py (bench --strategies) does
the same for every drafting strategy, target-only decoding in each dtype, and transformers' equivalents. No UI.

Decodings (static.prepare): the bench can run the pair's caches eagerly, over a static cache, or as captured CUDA
graphs (`decoded_views`), each sized to the longest request of its prompt set (`longest_request`); the strategies
bench can race several side by side. transformers' own `generate`, plain or with a static cache under torch.compile
(`compile_generate`), gives the target-only rows that no specdemo code runs.
"""

from __future__ import annotations

import copy
import statistics
import time
from dataclasses import replace

import torch

from specdemo.config import SamplingConfig, SpecConfig
from specdemo.engine.autoregressive import baseline_generate
from specdemo.engine.events import acceptance
from specdemo.engine.speculative import device_sync, encode_prompt, speculative_generate
from specdemo.engine.theory import expected_tokens_per_round, measure, predicted_speedup
from specdemo.engine.tree import sampled_plan
from specdemo.engine.tree_drafter import run_tree_shape, tree_children, tree_prune, tree_shape
from specdemo.models import CachedLM, ModelPair, PackedLinear, load_pair_uncached, static
from specdemo.models.devices import cpu_has_bf16, dtype_name

from .prompts import HELD_OUT

BENCH_PROMPTS = [
    "ROMEO:\n",
    "HAMLET:\nTo be, or not to be, that is the question:\n",
    "KING HENRY V:\nOnce more unto the breach, dear friends, once more;\n",
    "VIOLA:\nI left no ring with her: what means this lady?\n",
    "MACBETH:\n",
    "First Citizen:\nWe are accounted poor citizens, the patricians good.\n",
    "PORTIA:\nThe quality of mercy is not strain'd,\n",
    "JULIET:\nO, swear not by the moon,",
    "LEAR:\n",
    "FALSTAFF:\nWhat, is the old king dead?\n",
]

# prompts on which copying pays: repeat, edit or answer from a quoted passage (prompt lookup's home ground)
COPY_PROMPTS = {
    "shakespeare": [
        "ROMEO:\nBut, soft! what light through yonder window breaks?\nIt is the east, and Juliet is the sun.\n"
        "Arise, fair sun, and kill the envious moon,\nWho is already sick and pale with grief,\n"
        "JULIET:\nSay it again, Romeo, every word:\nROMEO:\nBut, soft! what light through yonder window breaks?\n",
        "HAMLET:\nTo be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n"
        "The slings and arrows of outrageous fortune,\nOr to take arms against a sea of troubles,\n"
        "HORATIO:\nMy lord, repeat it, that I may learn it:\nHAMLET:\nTo be, or not to be, that is the question:\n",
        "PORTIA:\nThe quality of mercy is not strain'd,\nIt droppeth as the gentle rain from heaven\n"
        "Upon the place beneath: it is twice blest;\nNERISSA:\nMadam, you said: The quality of mercy is not strain'd,\n",
        "First Citizen:\nWe are accounted poor citizens, the patricians good.\nWhat authority surfeits on would "
        "relieve us.\nSecond Citizen:\nYou said, We are accounted poor citizens, the patricians good.\n",
    ],
    "smollm2-135m": [
        "Repeat this sentence exactly: \"The quick brown fox jumps over the lazy dog while the farmer sleeps under "
        "the old oak tree.\"",
        "Rewrite this paragraph with the word \"car\" replaced by \"bicycle\": \"My car is red. I drive my car to "
        "work every day, and on weekends my car takes me to the lake.\"",
        "Fix the spelling in this text and return it: \"The weathr today is sunny and warm, so we will go to the "
        "beech and swim in the see.\"",
        "Read the text and answer the question. Text: \"The Eiffel Tower was completed in 1889 for the World's "
        "Fair in Paris. It is 330 metres tall and was the tallest man-made structure in the world for 41 years.\" "
        "Question: When was the Eiffel Tower completed, and how tall is it?",
    ],
}


def bench_prompts(pair: ModelPair) -> list[str]:
    """The bench's prompts for a pair: the Shakespeare prompts, or a chat preset's held-out messages. Messages stay
    plain text: encode_prompt wraps them in the chat template once, as for every other run of a chat pair."""
    if pair.name == "smollm2-135m":
        return list(HELD_OUT)
    return list(BENCH_PROMPTS)


ASSISTANT_SETTINGS = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")


@torch.inference_mode()
def assisted_generate(pair: ModelPair, prompt: str, sampling: SamplingConfig, spec: SpecConfig,
                      mode: str = "constant") -> tuple[int, float]:
    """transformers' own speculative decoding; -> (tokens, seconds).

    mode "constant": `generate(assistant_model=draft)` with a constant K and no confidence stop. "default": what a
    user gets with no settings (transformers 5: num_assistant_tokens=20, a constant schedule, and a stop when the
    draft's probability of its token falls below assistant_confidence_threshold=0.4). "lookup": no draft model,
    `generate(prompt_lookup_num_tokens=spec.k)` (n-grams up to transformers' default max_matching_ngram_size=2).
    """
    ids = torch.tensor([encode_prompt(pair, prompt, spec.max_new_tokens)], device=pair.device)
    config = pair.draft.generation_config
    saved = getattr(config, "_specdemo_saved", None)
    if saved is None:  # the checkpoint's own settings (None: transformers' global defaults apply)
        saved = config._specdemo_saved = {a: getattr(config, a, None) for a in ASSISTANT_SETTINGS}
    for attr, value in saved.items():
        setattr(config, attr, value)
    extra = {}
    if mode == "constant":
        config.num_assistant_tokens = spec.k
        config.num_assistant_tokens_schedule = "constant"
        config.assistant_confidence_threshold = 0.0
        extra["assistant_model"] = pair.draft
    elif mode == "default":
        extra["assistant_model"] = pair.draft
    elif mode == "lookup":
        extra["prompt_lookup_num_tokens"] = spec.k
    else:
        raise ValueError(mode)
    return timed_generate(pair, pair.target, ids, sampling, spec.max_new_tokens, spec.seed, **extra)


def timed_generate(pair: ModelPair, model, ids: torch.Tensor, sampling: SamplingConfig, max_new_tokens: int,
                   seed: int, **extra) -> tuple[int, float]:
    """One `model.generate` from prompt ids [1, n] with the run's sampling settings, timed between two device
    synchronisations; -> (new tokens, seconds). `extra`: generate's own arguments (an assistant, a cache)."""
    kwargs = dict(do_sample=False)
    if not sampling.greedy:
        kwargs = dict(do_sample=True, temperature=sampling.temperature, top_k=sampling.top_k or None,
                      top_p=sampling.top_p)
    torch.manual_seed(seed)
    mask = torch.ones_like(ids)
    device_sync(pair.device)  # the copies above are done before the clock starts, on the pair's own device
    t0 = time.perf_counter()
    out = model.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, pad_token_id=pair.eos_token_id,
                         **extra, **kwargs)
    device_sync(pair.device)
    return out.shape[1] - ids.shape[1], time.perf_counter() - t0


@torch.inference_mode()
def hf_generate(pair: ModelPair, prompt: str, sampling: SamplingConfig, max_new_tokens: int, seed: int,
                compiled: CompiledGenerate | None = None) -> tuple[int, float]:
    """transformers' own target-only decoding, `target.generate` (its dynamic cache, eager forwards), or with
    `compiled` its static cache under torch.compile (CompiledGenerate); -> (tokens, seconds)."""
    ids = torch.tensor([encode_prompt(pair, prompt, max_new_tokens)], device=pair.device)
    if compiled is None:
        return timed_generate(pair, pair.target, ids, sampling, max_new_tokens, seed)
    return timed_generate(pair, compiled.model, ids, sampling, max_new_tokens, seed, **compiled.kwargs)


class CompiledGenerate:
    """transformers' `generate(cache_implementation="static")` with its one-token decode step compiled by
    torch.compile, as transformers does it itself (`compile_config`, GenerationMixin._valid_auto_compile_criteria,
    PreTrainedModel.get_compiled_call): CompileConfig(fullgraph=True, mode="reduce-overhead") on CUDA, which
    replays the step as CUDA graphs; on a CPU mode "default" (there are no graphs to replay), where transformers
    compiles only when asked to (`_compile_all_devices`). The prefill runs eagerly, as in transformers.

    On a CPU whose bf16 linears specdemo packed for oneDNN (models.PackedLinear) inductor cannot lower the packed
    weights, so the compiled model is a plain copy of the target (its own nn.Linear layers, the same weights).

    `warm_up` compiles it: `calls` generate calls on the longest prompt of the run (transformers keeps the largest
    static cache it has made, so the longest request first means one cache size and one compile), timed one by one;
    the first holds the compile. It is not part of any row's time."""

    def __init__(self, pair: ModelPair):
        self.cuda = pair.device.type == "cuda"
        self.configure(fullgraph=True)
        self.model, self.copied = None, False  # warm_up makes it
        self.warmup_s: list[float] = []
        self.error: str | None = None

    def configure(self, fullgraph: bool) -> None:
        """A fresh CompileConfig (transformers recompiles when the config it is handed is a different one)."""
        from transformers import CompileConfig

        self.config = CompileConfig(fullgraph=fullgraph, mode="reduce-overhead" if self.cuda else "default")
        if not self.cuda:
            self.config._compile_all_devices = True  # transformers compiles on CUDA (and a few others) by itself
        self.kwargs = {"cache_implementation": "static", "compile_config": self.config}

    def describe(self) -> dict:
        return {"compile_config": {"fullgraph": self.config.fullgraph, "mode": self.config.mode,
                                   "backend": self.config.backend, "dynamic": self.config.dynamic},
                "plain_copy": self.copied,
                "warmup_s": self.warmup_s, "compile_s": self.warmup_s[0] if self.warmup_s else None,
                "error": self.error}

    def warm_up(self, pair: ModelPair, prompts: list[str], sampling: SamplingConfig, max_new_tokens: int,
                seed: int = 0, calls: int = 3, log=print) -> bool:
        """Compile and warm up, with fullgraph=True and, where that fails, once more with transformers' default
        fullgraph=False; False (with `error` set) where both fail, so that the bench goes on without the row."""
        longest = max(prompts, key=lambda p: len(encode_prompt(pair, p, max_new_tokens)))
        for fullgraph in (True, False):
            self.configure(fullgraph)
            self.warmup_s, self.error = [], None
            try:
                if self.model is None:
                    self.model = plain_copy(pair.target)
                    self.copied = self.model is not pair.target
                for _ in range(calls):
                    self.warmup_s.append(hf_generate(pair, longest, sampling, max_new_tokens, seed, self)[1])
            except Exception as err:  # noqa: BLE001 - a compile that fails drops the row, and says why
                text = str(err).strip()
                self.error = f"{type(err).__name__}: {text.splitlines()[0][:200] if text else ''}"
                log(f"hf generate static compiled: compiling with fullgraph={fullgraph} failed ({self.error})"
                    + ("; trying fullgraph=False" if fullgraph else "; the row is left out"))
                torch._dynamo.reset()
                continue
            log(f"hf generate static compiled: CompileConfig(fullgraph={fullgraph}, mode={self.config.mode!r}); "
                "warm-up calls " + ", ".join(f"{s:.1f} s" for s in self.warmup_s) + " (the first holds the compile)")
            return True
        return False


def plain_copy(model):
    """`model` itself, or where specdemo packed its bf16 linears (PackedLinear) a copy with plain nn.Linear layers
    and the same weights, which torch.compile's inductor can lower."""
    packed = {m: m.packed for m in model.modules() if isinstance(m, PackedLinear)}
    if not packed:
        return model
    try:
        for m in packed:
            m.__class__ = torch.nn.Linear
            del m.packed
        return copy.deepcopy(model)
    finally:
        for m, p in packed.items():
            m.__class__ = PackedLinear
            m.packed = p


def target_variants(pair: ModelPair) -> dict[str, ModelPair]:
    """The pair with its target in every dtype worth timing: its own, float32, and bf16 where the device has it.
    Target-only decoding is timed in each, and speedups are also given against the fastest."""
    targets = {dtype_name(pair.dtype): pair}
    for dt in (torch.float32, torch.bfloat16):
        if dtype_name(dt) not in targets and (dt == torch.float32 or pair.device.type != "cpu" or cpu_has_bf16()):
            targets[dtype_name(dt)] = load_pair_uncached((pair.draft_id, pair.target_id), str(pair.device),
                                                         draft_dtype=pair.draft_dtype, target_dtype=dt)
    return targets


def longest_request(pair: ModelPair, prompts: list[str], max_new_tokens: int) -> int:
    """The longest sequence a run of the bench makes: its longest prompt in tokens (chat template included, as the
    runs encode it) plus the new tokens. The static caches are sized to it, as a per-run cache would be."""
    return max(len(encode_prompt(pair, p, max_new_tokens)) for p in prompts) + max_new_tokens


def decoded_views(pairs: dict[str, ModelPair], decodings: list[str] | None, max_request: int,
                  log=print) -> dict[str, dict[str, ModelPair]]:
    """The pairs (target_variants: one per target dtype) under each decoding asked, keyed by the decoding that runs
    (a CPU runs "graphs" as "static", and "auto" as static.choose_mode says): {decoding: {dtype: pair}}.

    Each is static.prepare'd with its caches sized to `max_request`. The first decoding asked is prepared on the
    pairs themselves; each later one on shallow copies that share their models, tokenizer and head and hold static
    caches (and CUDA graphs) of their own, so that the decodings can alternate prompt by prompt without preparing
    again. A decoding that runs as one already prepared is left out, with a line that says so. No decodings: the
    pairs as they loaded (SPECDEMO_DECODING)."""
    if not decodings:
        return {next(iter(pairs.values())).decoding: pairs}
    out: dict[str, dict[str, ModelPair]] = {}
    for i, asked in enumerate(decodings):
        views = {name: p if i == 0 else copy.copy(p) for name, p in pairs.items()}
        for view in views.values():
            static.prepare(view, asked, max_request=max_request)
        mode = next(iter(views.values())).decoding
        if mode in out:
            log(f"decoding {asked}: runs as {mode} here, which is measured already; left out")
            continue
        out[mode] = views
        log(decoding_line(views, asked))
    return out


def decoding_info(views: dict[str, ModelPair]) -> dict:
    """What a decoding's pairs record: the decoding, the one-line reason, the static caches' size in tokens and the
    seconds each pair's capture took (CUDA graphs; 0 where nothing was captured), by target dtype."""
    first = next(iter(views.values()))
    slots = first.static_slots
    return {"decoding": first.decoding, "note": first.decoding_note,
            "cache_tokens": max((s.max_len for s in slots.values()), default=None),
            "capture_s": {name: sum(s.capture_s for s in p.static_slots.values()) for name, p in views.items()}}


def decoding_line(views: dict[str, ModelPair] | dict, asked: str | None = None) -> str:
    """One line: the decoding that runs, why, the static caches' size and the capture seconds of each pair load.
    views: the decoding's pairs, or their decoding_info."""
    info = views if "capture_s" in views else decoding_info(views)
    size = f"; static caches of {info['cache_tokens']} tokens" if info["cache_tokens"] else ""
    capture = ", ".join(f"{s:.2f} s ({name} pair)" for name, s in info["capture_s"].items())
    asked = f" (asked: {asked})" if asked and asked != info["decoding"] else ""
    return f"decoding {info['decoding']}{asked}: {info['note'] or 'as loaded'}{size}; capture {capture}"


def isolated_draft_ms(pair: ModelPair, strategy: str, width: int = 0) -> float | None:
    """One draft step, hot, median: the draft model's cached forward, or the EAGLE head's step with its LM rows
    (None for lookup, which runs no model)."""
    if strategy == "lookup":
        return None
    if strategy == "eagle":
        return head_step_ms(pair)
    if strategy == "tree":
        return head_step_ms(pair, width=width or tree_shape(SpecConfig(strategy="tree"), pair.head)[0])
    return forward_ms(pair.draft, pair.vocab_size, 1)


def frontier_width(shape: tuple[int, int, int], children: str) -> int:
    """The most nodes one head call of a tree run reads after the root's: top-k children expand `topk` nodes a
    depth; a sampled tree expands what tree.sampled_plan fixes (SmolLM2's (2, 4, 5) on a bf16 CPU: one)."""
    if children == "top":
        return shape[0]
    return max((m for m, _ in sampled_plan(*shape)[1:]), default=1)


@torch.inference_mode()
def head_step_ms(pair: ModelPair, context: int = 128, reps: int = 30, width: int = 0) -> float:
    """Median time of one EAGLE draft step (head layer, LM rows, argmax, next embedding) after `context` positions
    of true features, the way EagleDrafter drafts its second and later tokens. width > 0: one depth of a draft
    tree instead (TreeDrafter): `width` frontier positions in one head call with a tree mask, their LM rows and
    their top-`width` children."""
    from specdemo.engine.drafters import EagleDrafter

    drafter = EagleDrafter(pair.head, pair.target, SamplingConfig(0.0), pair.vocab_size, context + reps + 8 + width)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(pair.vocab_size, (context + 1,), generator=gen).to(pair.device)
    _, feats = CachedLM(pair.target, pair.vocab_size).feed_features(ids[:-1], layers=drafter.feature_layers)
    g = drafter.read(feats, ids[1:])
    times = []
    for _ in range(reps):
        device_sync(pair.device)
        t0 = time.perf_counter()
        if width:
            n = drafter.cache.length
            mask = torch.cat([torch.ones(width, n, dtype=torch.bool, device=pair.device),
                              torch.eye(width, dtype=torch.bool, device=pair.device)], dim=1)
            x = drafter.head.d2t[drafter.head.logits(g).topk(width, dim=-1).indices[0]]
            out = drafter.head.step(g.expand(width, -1), drafter.embed(x).to(drafter.dtype), drafter.cache,
                                    torch.full((width,), n, device=pair.device), mask)
            drafter.head.logits(out).float().log_softmax(-1).topk(width, dim=-1)
        else:
            x = drafter.head.d2t[drafter.head.logits(g).argmax(-1)]
            g = drafter.step(g, x)
        device_sync(pair.device)
        times.append(time.perf_counter() - t0)
        drafter.cache.crop(context)
    return statistics.median(times) * 1e3


@torch.inference_mode()
def tree_verify_ms(pair: ModelPair, nodes: int, context: int = 128, reps: int = 30) -> float:
    """Median time of one target forward over the last fixed token and a `nodes`-node draft tree (the tree mask of
    a bushy tree: two children per node, breadth first) after `context` cached tokens."""
    from specdemo.engine.tree import DraftTree, tree_attention

    lm = CachedLM(pair.target, pair.vocab_size)
    gen = torch.Generator().manual_seed(0)
    lm.feed(torch.randint(pair.vocab_size, (context,), generator=gen).to(pair.device))
    parents = torch.tensor([i // 2 - 1 for i in range(nodes)], device=pair.device)
    depths = torch.zeros(nodes, dtype=torch.long, device=pair.device)
    for i in range(nodes):
        depths[i] = 1 if parents[i] < 0 else depths[parents[i]] + 1
    tree = DraftTree(parents, depths, torch.ones(nodes, device=pair.device), int(depths.max()))
    x = torch.randint(pair.vocab_size, (nodes + 1,), generator=gen).to(pair.device)
    attention = tree_attention(tree, context, 1, pair.dtype)
    times = []
    for _ in range(reps):
        device_sync(pair.device)
        t0 = time.perf_counter()
        lm.feed_features(x, keep_logits=nodes + 1, tree=attention)
        device_sync(pair.device)
        times.append(time.perf_counter() - t0)
        lm.crop(context)
    return statistics.median(times) * 1e3


def run_bench(
    pair: ModelPair,
    sampling: SamplingConfig,
    spec: SpecConfig,
    prompts: list[str] | None = None,
    include_hf: bool = True,
    log=print,
    decoding: str | None = None,
) -> dict:
    """spec.strategy against target-only decoding in each dtype (and transformers' assisted generation with the
    pair's draft model), interleaved prompt by prompt. decoding: how the pairs' caches run (static.prepare, sized to
    the longest request); None keeps the pair's own (SPECDEMO_DECODING at load)."""
    prompts = prompts or BENCH_PROMPTS
    own = dtype_name(pair.dtype)
    views = decoded_views(target_variants(pair), [decoding] if decoding else None,
                          longest_request(pair, prompts, spec.max_new_tokens), log)
    (mode, variants), = views.items()
    naive = {("naive" if d == own else f"naive {d}"): p for d, p in variants.items()}
    methods = [*naive, "speculative"] + (["hf_assisted"] if include_hf else [])
    totals, rounds, steps = interleaved_runs(pair, naive, methods, prompts, sampling, spec, log)
    res = summarize(pair, sampling, spec, len(prompts), naive, totals, rounds, steps)
    res["settings"] |= {"decoding": mode, "decoding_info": decoding_info(variants)}
    return res


def interleaved_runs(pair: ModelPair, naive: dict, methods: list[str], prompts: list[str], sampling: SamplingConfig,
                     spec: SpecConfig, log) -> tuple[dict, list, list]:
    """Every method on every prompt, prompt by prompt (so that a machine's slow minute hurts all methods alike),
    after one warm-up call each: -> (tokens and seconds per method, the speculative rounds, the naive steps)."""
    totals = {m: {"tokens": 0, "seconds": 0.0} for m in methods}
    rounds, steps = [], []

    def run(method: str, prompt: str, seed: int):
        if method in naive:
            tr = baseline_generate(naive[method], prompt, sampling, spec.max_new_tokens, seed)
            return len(tr.output_ids), tr.wall_s, tr
        if method == "speculative":
            tr = speculative_generate(pair, prompt, sampling, replace(spec, seed=seed))
            return len(tr.output_ids), tr.wall_s, tr
        n, s = assisted_generate(pair, prompt, sampling, replace(spec, seed=seed))
        return n, s, None

    for m in methods:  # warm-up: first calls pay for allocation, kernels, lazily built tables
        run(m, prompts[0], spec.seed)
    for i, prompt in enumerate(prompts):
        for m in methods:
            n, s, tr = run(m, prompt, spec.seed + i)
            totals[m]["tokens"] += n
            totals[m]["seconds"] += s
            if m == "speculative":
                rounds += tr.rounds
            elif m == "naive":
                steps += tr.steps
        log(f"  prompt {i + 1}/{len(prompts)}: " + ", ".join(
            f"{m} {totals[m]['tokens'] / totals[m]['seconds']:.1f} tok/s" for m in methods))
    return totals, rounds, steps


def summarize(pair: ModelPair, sampling: SamplingConfig, spec: SpecConfig, n_prompts: int, naive: dict,
              totals: dict, rounds: list, steps: list) -> dict:
    """The bench's figures: rates, speedups, the paper's quantities (alpha, c, the verify's cost) and ceilings."""
    methods, include_hf = list(totals), "hf_assisted" in totals
    tps = {m: totals[m]["tokens"] / totals[m]["seconds"] for m in methods}
    fastest = max((m for m in naive), key=tps.get)
    tree = run_tree_shape(spec, sampling, pair) if spec.strategy == "tree" else None
    k_full = tree[2] if tree else spec.k if spec.strategy != "adaptive" else None
    m = measure(rounds, steps, k_full)  # t_target from the naive runs, t_draft and t_verify from the speculative
    alpha, c, verify_cost = m["alpha_empirical"], m["c"], m["verify_cost"]
    emitted = sum(len(r.output) for r in rounds)
    ceiling_paper = predicted_speedup(alpha, spec.k, c)  # Leviathan et al.: verify costs one target step
    ceiling_measured = predicted_speedup(alpha, spec.k, c, verify_cost)
    speedup = tps["speculative"] / tps["naive"]
    iso_draft = isolated_draft_ms(pair, spec.strategy, frontier_width(tree, tree_children(spec, sampling, pair))
                                  if tree else 0)
    iso_target = forward_ms(pair.target, pair.vocab_size, 1)
    own_logits = forward_ms(pair.target, pair.vocab_size, 1, float32_logits=False)
    result = {
        "pair": pair.describe(),
        "settings": {"k": spec.k, "strategy": spec.strategy, "max_new_tokens": spec.max_new_tokens,
                     "temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p,
                     "prompts": n_prompts, "threads": torch.get_num_threads()},
        "tokens_per_s": tps,
        "speedup_vs_naive": speedup,
        "fastest_naive": fastest,
        "speedup_vs_fastest_naive": tps["speculative"] / tps[fastest],
        "speedup_vs_hf_assisted": tps["speculative"] / tps["hf_assisted"] if include_hf else None,
        "hf_assisted_speedup_vs_naive": tps["hf_assisted"] / tps["naive"] if include_hf else None,
        **m,
        "c_isolated": iso_draft / iso_target if iso_draft is not None else None,
        "t_draft_isolated_ms": iso_draft, "t_target_isolated_ms": iso_target,
        "t_target_own_logits_ms": own_logits,  # the same step with the logits in the model's dtype
        "acceptance_rate": acceptance(rounds)["acceptance_rate"],
        "mean_accepted_length": emitted / len(rounds),
        "drafts_per_round": sum(r.k for r in rounds) / len(rounds),
        "expected_tokens_per_round": expected_tokens_per_round(alpha, spec.k),
        "ceiling_paper": ceiling_paper,
        "ceiling_measured_verify": ceiling_measured,
        "fraction_of_ceiling_paper": speedup / ceiling_paper,
        "fraction_of_ceiling_measured_verify": speedup / ceiling_measured,
        "overhead_ms_per_round": sum(r.overhead_ms for r in rounds) / len(rounds),
        "target_calls": len(rounds),
    }
    if tree:  # the chain's theory lines do not apply; the tree's own costs, in target steps
        full = [r for r in rounds if r.tree and r.k == tree[2]] or [r for r in rounds if r.tree]
        depth_of = [max(nd.depth for nd in r.tree) for r in full]
        result |= {
            "tree_shape": {"topk": tree[0], "depth": tree[1], "budget": tree[2],
                           "prune_below": tree_prune(pair.head, spec), "lookup": spec.tree_lookup},
            "tree_verify_ms_isolated": tree_verify_ms(pair, tree[2]),
            "head_ms_per_depth": sum(r.draft_ms for r in full) / max(1, sum(depth_of)),
            "head_ms_per_depth_isolated": iso_draft,
        }
    return result


def format_bench(res: dict) -> str:
    s = res["settings"]
    tps = res["tokens_per_s"]
    lines = [
        f"pair {res['pair']['name']} on {res['pair']['device']} ({s['threads']} threads), {s['strategy']}, K={s['k']}, "
        f"T={s['temperature']}, top-k={s['top_k']}, top-p={s['top_p']}, {s['max_new_tokens']} new tokens x "
        f"{s['prompts']} prompts" + (f", decoding {s['decoding']}" if s.get("decoding") else ""),
        "",
        "| method | tokens/s | speedup vs naive |",
        "|---|---:|---:|",
        f"| naive target-only (KV cache), {res['pair']['target_dtype']} | {tps['naive']:.1f} | 1.00x |",
    ]
    lines += [f"| naive target-only (KV cache), {m.split()[1]} | {tps[m]:.1f} | {tps[m] / tps['naive']:.2f}x |"
              for m in tps if m.startswith("naive ")]
    lines += [f"| specdemo speculative ({s['strategy']}) | {tps['speculative']:.1f} | {res['speedup_vs_naive']:.2f}x |",
              "", f"speedup vs the fastest target-only ({res['fastest_naive']}): "
              f"{res['speedup_vs_fastest_naive']:.2f}x"]
    if res.get("speedup_vs_hf_assisted"):
        lines.append(f"| transformers assisted generation | {tps['hf_assisted']:.1f} | "
                     f"{res['hf_assisted_speedup_vs_naive']:.2f}x |")
        lines.append("")
        lines.append(f"specdemo vs transformers assisted: {res['speedup_vs_hf_assisted']:.2f}x")
    if "tree_shape" in res:
        t, step = res["tree_shape"], res["t_target_isolated_ms"]
        lines += [
            f"tree top-k {t['topk']}, depth {t['depth']}, budget {t['budget']}"
            + (f", pruned below {t['prune_below']:g}" if t.get("prune_below") else "")
            + (f", a lookup branch of up to {t['lookup']}" if t.get("lookup") else "")
            + f": {res['mean_accepted_length']:.2f} tokens per target call ({res['target_calls']} calls), "
            f"{res['drafts_per_round']:.1f} nodes a round",
            f"verify of the tree ({res['drafts_per_round']:.1f} nodes on average + the last fixed token): "
            f"{res['t_verify_ms']:.2f} ms in the loop = {res['verify_cost']:.2f} target steps; a full tree of "
            f"{t['budget']} nodes in isolation {res['tree_verify_ms_isolated']:.2f} ms = "
            f"{res['tree_verify_ms_isolated'] / step:.2f} steps",
            f"the head per depth: {res['head_ms_per_depth']:.2f} ms in the loop (the root's read included) = "
            f"{res['head_ms_per_depth'] / step:.3f} target steps; one depth in isolation "
            f"{res['head_ms_per_depth_isolated']:.2f} ms = {res['head_ms_per_depth_isolated'] / step:.3f} steps",
            f"loop overhead {res['overhead_ms_per_round']:.2f} ms per round",
        ]
        return "\n".join(lines)
    lines += [
        f"alpha (empirical) {res['alpha_empirical']:.3f}, alpha (mean sum min(p,q)) {res['alpha_overlap']:.3f}, "
        f"acceptance rate {res['acceptance_rate']:.3f}",
        f"mean tokens per round {res['mean_accepted_length']:.2f} (theory for K drafts a round "
        f"{res['expected_tokens_per_round']:.2f}), mean drafts per round {res['drafts_per_round']:.2f}",
        f"t_target {res['t_target_ms']:.2f} ms, t_draft {res['t_draft_ms']:.2f} ms, c = {res['c']:.3f} in the loop"
        + (f", {res['c_isolated']:.3f} in isolation ({res['t_draft_isolated_ms']:.2f} / "
           f"{res['t_target_isolated_ms']:.2f} ms)" if res["c_isolated"] is not None else "") + "; "
        f"(K+1)-token verify {res['t_verify_ms']:.2f} ms = {res['verify_cost']:.2f} target steps",
        f"ceiling E/(cK+1) = {res['ceiling_paper']:.2f}x -> reached {100 * res['fraction_of_ceiling_paper']:.0f}%; "
        f"with the measured verify cost E/(cK+v) = {res['ceiling_measured_verify']:.2f}x -> reached "
        f"{100 * res['fraction_of_ceiling_measured_verify']:.0f}%",
        f"loop overhead {res['overhead_ms_per_round']:.2f} ms per round",
        f"float32 logits: a target step takes {res['t_target_isolated_ms']:.2f} ms, against "
        f"{res['t_target_own_logits_ms']:.2f} ms with the logits in {res['pair']['target_dtype']}",
    ]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ bench --strategies


@torch.inference_mode()
def forward_ms(model, vocab: int, new_tokens: int, context: int = 128, reps: int = 30,
               float32_logits: bool = True, lm=None) -> float:
    """Median time of one cached forward over `new_tokens` tokens after a `context`-token prefix (hot caches).

    The ids live on the model's device, and the device is synchronised before each reading of the clock: on a GPU
    a forward returns once its kernels are queued, so an unsynchronised clock would time the queueing. lm: the
    cache to time it through (a pair's `new_lm`, static or captured); a CachedLM of `model` by default. A static
    cache too small for the prefix shortens it to what fits."""
    if lm is None:
        lm = CachedLM(model, vocab)
    slot = getattr(lm, "slot", None)  # a StaticLM: its cache holds slot.max_len tokens
    if slot is not None:
        context = max(1, min(context, slot.max_len - new_tokens))
    lm.reset()
    if not float32_logits:  # the model's own forward: logits in its dtype (what specdemo did before)
        lm.head32 = None
    device = model.device
    gen = torch.Generator().manual_seed(0)  # drawn on the CPU, so every device times the same ids
    lm.feed(torch.randint(vocab, (context,), generator=gen).to(device))
    x = torch.randint(vocab, (new_tokens,), generator=gen).to(device)
    times = []
    for _ in range(reps):
        device_sync(device)
        t0 = time.perf_counter()
        lm.feed(x, keep_logits=new_tokens)
        device_sync(device)
        times.append(time.perf_counter() - t0)
        lm.crop(context)
    return statistics.median(times) * 1e3
