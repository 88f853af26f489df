"""The strategies benchmark (`bench --strategies`): every drafting strategy against target-only decoding in each
dtype the machine offers and transformers' assisted generation, on the same prompts, interleaved prompt by prompt.

Owns the comparison of drafting strategies: tokens/s, speedups against the pair's own and the fastest target-only
decoding, target calls, acceptance, c in the loop against c in isolation, the verify cost, and the share of the
ceiling E / (cK + v) each run reached; strategies_table.py prints it as a table. The protocol it shares with the
main benchmark lives in methods.py; the decodings, transformers' rows and the isolated costs in decodings.py,
hf_rows.py and timing.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from specdemo.config import SamplingConfig, SpecConfig
from specdemo.engine.autoregressive import baseline_generate
from specdemo.engine.events import acceptance
from specdemo.engine.speculative import speculative_generate
from specdemo.engine.tree_drafter import run_tree_prune, run_tree_shape
from specdemo.models import ModelPair
from specdemo.models.devices import dtype_name
from specdemo.models.static_parts import Tally

from .decodings import decoded_views, decoding_info, longest_request, target_variants
from .compiled_apart import CompiledApart
from .hf_rows import assisted_generate, hf_generate
from .methods import COPY_PROMPTS, bench_prompts
from .timing import forward_ms, head_step_ms


class CallCounter:
    """Counts a model's forward calls (transformers' generate does not report how many target calls it made), while
    it is entered: the hook is on the model only around the calls it counts, so no other row runs with it (a
    compiled forward would trace it)."""

    def __init__(self, model):
        self.model, self.n, self.handle = model, 0, None

    def hook(self, *_):
        self.n += 1

    def __enter__(self):
        self.handle = self.model.register_forward_hook(self.hook)
        return self

    def __exit__(self, *_):
        self.handle.remove()


HF_GENERATE, HF_COMPILED = "hf generate", "hf generate static compiled"  # transformers' target-only rows


def row_name(method: str, decoding: str | None, multi: bool) -> str:
    """A row's name: the method, and where several decodings race, the decoding in brackets ('adaptive [static]')."""
    return f"{method} [{decoding}]" if multi and decoding else method


def run_strategies(pair: ModelPair, sampling: SamplingConfig, k: int, max_new_tokens: int, n_prompts: int = 10,
                   seed: int = 0, ngram: int = 3, lookup_k: int = 8, k_search: bool = True, include_hf: bool = True,
                   log=print, tree: tuple[int, int, int] = (0, 0, 0), tree_prune_below: float | None = None,
                   decodings: list[str] | None = None, compiled: bool = False) -> dict:
    """Every drafting strategy against target-only decoding (in each dtype the machine offers) and transformers'
    generate (plain, and with `compiled` its static cache under torch.compile) and assisted generation (constant K,
    its default schedule, prompt lookup), interleaved prompt by prompt. Where the pair has a head, its chain (eagle)
    and its tree, of the sizes `tree` (top-k, depth, budget; 0 = the head's own), pruned below `tree_prune_below`
    (None = what the app's run prunes at, tree_drafter.run_tree_prune).

    decodings: how specdemo's own rows run their caches (static.prepare, sized to the longest request; None: as the
    pair loaded). With several, every specdemo row runs under each, the decodings back to back on every prompt in
    an order that turns prompt by prompt, and each row's rate is also given as a ratio to the first decoding's.

    The general prompts and the copy-friendly ones are timed as two groups. Speedups are against target-only in
    the pair's target dtype under the same decoding, and against the fastest target-only row of the run (any dtype,
    any decoding, transformers' generate included).
    """
    general = bench_prompts(pair)[:n_prompts]
    copy = list(COPY_PROMPTS.get(pair.name, COPY_PROMPTS["shakespeare"]))
    own = dtype_name(pair.dtype)
    request = longest_request(pair, general + copy, max_new_tokens)
    views = decoded_views(target_variants(pair), decodings, request, log)
    modes = list(views)
    multi = len(modes) > 1
    ks = list(range(1, 9)) if k_search else [k]
    trees = tree_methods(pair, sampling, tree, tree_prune_below)
    own_methods = method_names(pair, views[modes[0]], ks, k, lookup_k, False, list(trees))
    runs = [(general[0], seed)] + [(p, seed + i) for group in (general, copy) for i, p in enumerate(group)]
    hf_methods, compiler = hf_entrants(pair, sampling, k, lookup_k, include_hf, compiled, runs, max_new_tokens, log)
    race = Race(own_methods, hf_methods, modes, {
        d: method_runner(v[own], v, sampling, k, max_new_tokens, ngram, lookup_k, CallCounter(pair.target), trees,
                         compiler) for d, v in views.items()})
    groups = race.time_groups({"general": general, "copy": copy}, seed, log)
    # isolated costs, hot caches, same run, through each decoding's caches: one draft step, one target step (each
    # dtype), one (k+1)-token verify, and under captured graphs one verify at each wider captured width (the rows a
    # tree pads to: what the CUDA tree's rule in docs/decisions.md needs); the head's step is measured once
    head_ms = head_step_ms(pair) if pair.head is not None else None
    iso = {d: isolated(v[own], v, sorted({*ks, k, lookup_k, *captured_tree_widths(v[own])}), head_ms)
           for d, v in views.items()}
    settings = {
        "k": k, "lookup_k": lookup_k, "ngram": ngram, "max_new_tokens": max_new_tokens, "temperature":
        sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p, "general_prompts": len(general),
        "copy_prompts": len(copy), "threads": torch.get_num_threads(), "target_dtype": own,
        "draft_dtype": dtype_name(pair.draft_dtype), "decoding": modes[0] if not multi else None,
        "decodings": modes, "reference_decoding": modes[0], "max_request": request, "captures": race.captures}
    summaries = {g: summarise(tot, race.meta, own, iso, modes[0]) for g, tot in groups.items()}
    return {"pair": pair.describe(), "settings": settings,
            "decoding_info": {d: decoding_info(v) for d, v in views.items()},
            "hf_compiled": compiler.describe() if compiler else None,
            "isolated": iso[modes[0]], "isolated_by_decoding": iso,
            "groups": {g: rows for g, (rows, _) in summaries.items()},
            "fastest_target_only": {g: fastest for g, (_, fastest) in summaries.items()},
            "ratios": {g: ratios(rows, modes) for g, (rows, _) in summaries.items()} if multi else None}


def hf_entrants(pair: ModelPair, sampling: SamplingConfig, k: int, lookup_k: int, include_hf: bool, compiled: bool,
                runs: list[tuple[str, int]], max_new_tokens: int, log) -> tuple[list[str], CompiledApart | None]:
    """transformers' rows in the race (method_names) and, with `compiled`, its target-only generate plain and
    compiled (also under --no-hf); the compiled row only where its own process (compiled_apart.py) compiled and
    timed every (prompt, seed) of `runs`. -> (the rows, the CompiledApart with its results, or None)."""
    hf_methods = method_names(pair, {}, [], k, lookup_k, include_hf)
    if not compiled:
        return hf_methods, None
    hf_methods = list(dict.fromkeys([HF_GENERATE, *hf_methods]))
    compiler = CompiledApart(pair)
    if compiler.warm_up(runs, sampling, max_new_tokens, log=log):
        hf_methods.append(HF_COMPILED)
    return hf_methods, compiler


@dataclass
class Race:
    """A strategies run's rows and how each runs: specdemo's `own_methods` under every decoding of `modes` (the
    reference first; row_name), transformers' `hf_methods` once. meta: row -> (method, decoding; None for
    transformers' rows, which run under the reference decoding's runner); runs: decoding -> method_runner's run."""

    own_methods: list[str]
    hf_methods: list[str]
    modes: list[str]
    runs: dict

    def __post_init__(self):
        self.multi = len(self.modes) > 1
        self.captures: dict = {}  # time_groups: the graphs captured on first use, in the warm-up and while timing
        self.meta = ({row_name(m, d, self.multi): (m, d) for m in self.own_methods for d in self.modes}
                     | {m: (m, None) for m in self.hf_methods})

    def run(self, row: str, prompt: str, s: int):
        method, d = self.meta[row]
        return self.runs[d or self.modes[0]](method, prompt, s)

    def order(self, i: int) -> list[str]:
        """The rows in the order they run on the i-th prompt of a group: each specdemo method under the decodings
        back to back, who goes first turning prompt by prompt, then transformers' rows."""
        turn = self.modes[i % len(self.modes):] + self.modes[: i % len(self.modes)]
        return [row_name(m, d, self.multi) for m in self.own_methods for d in turn] + self.hf_methods

    def time_groups(self, groups: dict[str, list[str]], seed: int, log) -> dict[str, dict]:
        """One warm-up call of every row on the first group's first prompt (not counted), then each group prompt by
        prompt: -> {group: {row: tokens, seconds, target calls, rounds and steps}}.

        Where that warm-up captured graphs (a pair that captures its drafting and verdicts on first use, as on
        CUDA), a longer run meets new cache buckets and plans, and would capture inside its timing. So every
        specdemo row then also runs once on every prompt with its seed, untimed, and the timing replays what those
        runs captured: a Space's steady state. The captures of the warm-up and of the timing are counted apart
        (`captures`), as transformers' compile seconds are. transformers' rows keep their one warm-up (its
        assisted generation carries its schedule from one call to the next)."""
        first = next(iter(groups.values()))[0]
        start = Tally.count, Tally.seconds
        for row in self.meta:  # warm-up: first calls pay for allocation, kernels, lazily built tables
            self.run(row, first, seed)
        every_prompt = Tally.count > start[0]
        if every_prompt:  # the first prompt with its seed has just run
            for prompt, s in [(p, seed + i) for prompts in groups.values() for i, p in enumerate(prompts)][1:]:
                for row, (_, decoding) in self.meta.items():
                    if decoding is not None:
                        self.run(row, prompt, s)
        warmed = Tally.count, Tally.seconds
        timed = {group: self.time_group(group, prompts, seed, log) for group, prompts in groups.items()}
        self.captures = {"every_prompt_warmed": every_prompt, "warm_up": warmed[0] - start[0],
                         "warm_up_s": warmed[1] - start[1], "timed": Tally.count - warmed[0],
                         "timed_s": Tally.seconds - warmed[1]}
        return timed

    def time_group(self, group: str, prompts: list[str], seed: int, log) -> dict[str, dict]:
        """Every row on every prompt of one group (the i-th prompt with seed + i), with a line of rates so far."""
        tot = {row: {"tokens": 0, "seconds": 0.0, "calls": 0, "rounds": [], "steps": [], "prompt_rates": []}
               for row in self.meta}
        for i, prompt in enumerate(prompts):
            for row in self.order(i):
                n, secs, calls, tr = self.run(row, prompt, seed + i)
                t = tot[row]
                t["tokens"] += n
                t["seconds"] += secs
                t["calls"] += calls
                t["prompt_rates"].append(n / secs if secs > 0 else 0.0)
                if tr is not None:
                    t["rounds" if tr.mode == "speculative" else "steps"] += tr.rounds or tr.steps
            log(f"  {group} prompt {i + 1}/{len(prompts)}, tok/s so far: " + ", ".join(
                f"{row} {t['tokens'] / t['seconds']:.1f}" for row, t in tot.items() if t["seconds"] > 0))
        return tot


SLOW_ROUND = 3.0  # a round that takes over this many times the row's median round is counted as slow


def round_spread(rounds: list) -> dict:
    """How a row's rounds spread in time, leaving out each run's first round (it reads the prompt): the median and
    the slowest round's milliseconds, how many took over SLOW_ROUND times the median (a fallback, a capture or a
    stall; the H200's tree had one prompt at a third of its rate on 2026-11-28), and their share of the time."""
    times = sorted(r.ms for r in rounds if r.index > 0)
    if not times:
        return {}
    median = times[len(times) // 2]
    slow = [x for x in times if x > SLOW_ROUND * median]
    return {"round_ms_median": median, "round_ms_max": times[-1], "slow_rounds": len(slow),
            "slow_share": sum(slow) / sum(times) if sum(times) > 0 else 0.0}


def captured_tree_widths(pair: ModelPair) -> list[int]:
    """The drafts (rows - 1) of each width above 8 rows that the pair's target has captured (or recorded, on the
    graphs' stand-in), where a wide tree's verify replays; none for a target that captures nothing, since there a
    verify costs what its rows cost and a wide one is slow to time on a CPU."""
    slot = pair.static_slots.get("target")
    return [w - 1 for w in slot.widths if w > 8] if slot is not None and slot.graphs else []


def isolated(pair: ModelPair, targets: dict[str, ModelPair], verify_ks: list[int], head_ms: float | None) -> dict:
    """One decoding's isolated costs (hot, median), each forward through the pair's own caches (new_lm)."""
    return {"draft_ms": forward_ms(pair.draft, pair.vocab_size, 1, lm=pair.new_lm("draft")), "head_ms": head_ms,
            "target_ms": {name: forward_ms(p.target, p.vocab_size, 1, lm=p.new_lm("target"))
                          for name, p in targets.items()},
            "verify_ms": {kk: forward_ms(pair.target, pair.vocab_size, kk + 1, lm=pair.new_lm("target"))
                          for kk in verify_ks}}


def ratios(rows: dict, modes: list[str]) -> dict:
    """Each later decoding's tokens/s over the first's, method by method: {decoding: {method: ratio}}, with the
    geometric mean, the lowest and the highest of them."""
    out = {}
    for d in modes[1:]:
        r = {row["method"]: row["vs_reference"] for row in rows.values() if row["decoding"] == d}
        out[d] = {"by_method": r, "geometric_mean": math.exp(sum(map(math.log, r.values())) / len(r)),
                  "lowest": min(r, key=r.get), "highest": max(r, key=r.get)}
    return out


def method_names(pair: ModelPair, targets: dict, ks: list[int], k: int, lookup_k: int, include_hf: bool,
                 trees: list[str] = ()) -> list[str]:
    """The race's entrants: target-only in each dtype of `targets`, fixed K for each K in `ks`, adaptive, lookup,
    eagle and the head's `trees` (tree_methods; if the pair has a head), and transformers' generate (target-only)
    and its three assisted modes. No targets and no ks: transformers' rows alone."""
    methods = [f"target-only {name}" for name in targets]
    if ks:
        methods += [f"fixed K={kk}" for kk in ks] + ["adaptive", f"lookup K={lookup_k}"]
        if pair.head is not None:
            methods += [f"eagle K={k}", *trees]
    if include_hf:
        methods += [HF_GENERATE, f"hf assisted K={k}", "hf assisted default", f"hf prompt lookup K={lookup_k}"]
    return methods


def tree_methods(pair: ModelPair, sampling: SamplingConfig, sizes: tuple[int, int, int] = (0, 0, 0),
                 prune_below: float | None = None) -> dict[str, dict]:
    """The head's trees in the race, by row name (tree_method): the SpecConfig fields each runs with. One with
    top-k children and, at T > 0, one with sampled children, each of the sizes `sizes` (0 = what a run with those
    children drafts with here, tree_drafter.run_tree_shape), pruned below `prune_below` (None = what each run
    drafts with, tree_drafter.run_tree_prune: resolved per run, so that each decoding of a race runs what the app
    runs under it; the row's name gives the pair's own decoding's)."""
    if pair.head is None:
        return {}
    out = {}
    for children in ("top",) if sampling.greedy else ("top", "sampled"):
        spec = SpecConfig(strategy="tree", tree_topk=sizes[0], tree_depth=sizes[1], tree_budget=sizes[2],
                          tree_prune=prune_below, tree_children=children)
        shape, prune = run_tree_shape(spec, sampling, pair), run_tree_prune(spec, sampling, pair)
        out[tree_method(shape, children, prune)] = {"tree_topk": shape[0], "tree_depth": shape[1],
                                                    "tree_budget": shape[2], "tree_children": children,
                                                    "tree_prune": prune_below}
    return out


def tree_method(shape: tuple[int, int, int], children: str = "top", prune_below: float = 0.0) -> str:
    """A tree's row name: 'tree 2x4 N=8' (top-k, depth, budget) with top-k children, 'tree 2x4 N=8 sampled' with
    children drawn from the head; ' prune 0.02' where the run prunes (tree_drafter.run_tree_prune)."""
    return (f"tree {shape[0]}x{shape[1]} N={shape[2]}" + (f" prune {prune_below:g}" if prune_below else "")
            + (" sampled" if children == "sampled" else ""))


def method_runner(pair: ModelPair, targets: dict, sampling: SamplingConfig, k: int, max_new_tokens: int, ngram: int,
                  lookup_k: int, counter: CallCounter, trees: dict[str, dict] | None = None,
                  compiled: CompiledApart | None = None):
    """run(method, prompt, seed) -> (tokens, seconds, target calls, trace or None), for any of `method_names` and
    HF_COMPILED (with `compiled`, warmed up). transformers' generate makes one target call a token."""

    def run(method: str, prompt: str, s: int):
        if method.startswith("target-only"):
            tr = baseline_generate(targets[method.split()[-1]], prompt, sampling, max_new_tokens, s)
            return len(tr.output_ids), tr.wall_s, len(tr.steps), tr
        if method == HF_COMPILED:  # timed in its own process before the race (compiled_apart.py)
            n, secs = compiled.result(prompt, s)
            return n, secs, n, None
        if method == HF_GENERATE:
            n, secs = hf_generate(pair, prompt, sampling, max_new_tokens, s)
            return n, secs, n, None
        if method.startswith("hf"):
            mode = "lookup" if "lookup" in method else "default" if "default" in method else "constant"
            spec = SpecConfig(k=lookup_k if mode == "lookup" else k, max_new_tokens=max_new_tokens, seed=s)
            with counter:
                before = counter.n
                n, secs = assisted_generate(pair, prompt, sampling, spec, mode)
            return n, secs, counter.n - before, None
        strategy = method.split()[0]
        kk = int(method.split("=")[1]) if "=" in method and strategy != "tree" else k
        sizes = trees[method] if strategy == "tree" else {}
        spec = SpecConfig(k=kk, max_new_tokens=max_new_tokens, seed=s, strategy=strategy, ngram=ngram,
                          top_candidates=0, **sizes)
        tr = speculative_generate(pair, prompt, sampling, spec)
        return len(tr.output_ids), tr.wall_s, len(tr.rounds), tr

    return run


def summarise(tot: dict, meta: dict, own: str, iso: dict, reference: str) -> tuple[dict, str]:
    """Per row: tokens/s, speedups, target calls, acceptance, tokens per round, c (loop vs isolated), v and the
    share of the ceiling E / (c K + v) that the run reached, all from this run's own measurements; -> (rows, the
    fastest target-only row). meta: row -> (method, decoding; None for transformers' rows, which are set against
    the `reference` decoding). "Same dtype" is target-only in the pair's dtype under the row's decoding; the
    fastest target-only is the fastest of every target-only row, transformers' generate included; t_target (for c
    and v) is the mean step of the row's decoding's target-only in the pair's dtype; isolated costs are the row's
    decoding's (iso: decoding -> costs)."""
    tps = {m: t["tokens"] / t["seconds"] for m, t in tot.items() if t["seconds"] > 0}
    own_row = {d: row for row, (m, d) in meta.items() if m == f"target-only {own}"}
    fastest = max((row for row, (m, _) in meta.items() if row in tps and (
        m.startswith("target-only") or m in (HF_GENERATE, HF_COMPILED))), key=tps.get)
    t_target = {d: sum(s.step_ms for s in tot[row]["steps"]) / len(tot[row]["steps"]) for d, row in own_row.items()}
    out = {}
    for name, t in tot.items():
        method, decoding = meta[name]
        d = decoding or reference
        row = {"method": method, "decoding": decoding, "tokens_per_s": tps[name],
               "speedup_same_dtype": tps[name] / tps[own_row[d]], "speedup_vs_fastest": tps[name] / tps[fastest],
               "target_calls": t["calls"], "tokens": t["tokens"], "prompt_rates": t["prompt_rates"]}
        if decoding is not None and decoding != reference:
            row["vs_reference"] = tps[name] / tps[row_name(method, reference, True)]
        rounds = t["rounds"]
        if rounds:
            a = acceptance(rounds)
            drafted = a["drafted"]
            emitted = sum(len(r.output) for r in rounds)
            k_mean = drafted / len(rounds)
            c_loop = (sum(r.draft_ms for r in rounds) / drafted) / t_target[d] if drafted else 0.0
            v = sum(r.verify_ms for r in rounds) / len(rounds) / t_target[d]
            E = emitted / len(rounds)
            ceiling = E / (c_loop * k_mean + v)
            # a tree's head calls each cover a whole frontier, so no one-token step prices its nodes
            step = (None if method.startswith(("lookup", "tree")) else iso[d]["head_ms"]
                    if method.startswith("eagle") else iso[d]["draft_ms"])
            c_iso = step / iso[d]["target_ms"][own] if step else 0.0
            row |= {"acceptance_rate": a["acceptance_rate"], "alpha_empirical": a["alpha_empirical"],
                    "mean_accepted_length": E, "mean_k": k_mean, "c_loop": c_loop, "c_isolated": c_iso,
                    "c_loop_over_isolated": c_loop / c_iso if c_iso else None, "verify_cost": v,
                    "ceiling": ceiling, "fraction_of_ceiling": row["speedup_same_dtype"] / ceiling,
                    "fallback_rounds": sum(r.source == "fallback" for r in rounds),
                    "overhead_ms_per_round": sum(r.overhead_ms for r in rounds) / len(rounds)} | round_spread(rounds)
        elif t["calls"]:
            row["mean_accepted_length"] = t["tokens"] / t["calls"]
        out[name] = row
    return out, fastest
