"""The command line: `python -m specdemo generate ...` and `python -m specdemo bench ...`.

Owns argument parsing and terminal output (ANSI colours plus a non-colour cue per label, or JSON). Everything it
prints comes from the engine's events; it computes nothing of its own. In a terminal `generate` prints every round
inline in colour, rejected drafts struck through; without one (piped, or NO_COLOR) it prints the text the target
kept, and `--rounds` lists the rounds with plain marks.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

STYLE = {  # colour plus a second cue (strike, underline, bold), so the labels read without colour too
    "accepted": "\x1b[32m",  # green
    "rejected": "\x1b[31;9m",  # red, struck through
    "resampled": "\x1b[34;4m",  # blue, underlined
    "bonus": "\x1b[35;1m",  # magenta, bold
}
RESET = "\x1b[0m"
MARK = {  # --rounds: wdiff-style marks, readable without colour
    "accepted": ("", ""),
    "rejected": ("[-", "-]"),
    "resampled": ("{+", "+}"),
    "bonus": ("{*", "*}"),
}
ROUNDS_LEGEND = ("rounds: drafts the target kept as they are, [-rejected draft-] (not in the text), "
                 "{+resampled by the target+}, {*bonus token from the target*}")


def add_common(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--pair", default="shakespeare", help="preset name (see --list-pairs)")
    ap.add_argument("--draft", help="draft model id or path (overrides --pair, needs --target)")
    ap.add_argument("--target", help="target model id or path (overrides --pair, needs --draft)")
    ap.add_argument("--head", help="a published EAGLE-3 head (vLLM's speculators format), Hub id or folder, for the "
                    "target: strategies eagle and tree draft with it (checked against the target before anything runs)")
    ap.add_argument("--k", type=int, default=4, help="draft tokens per round")
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--top-k", type=int, default=0, help="0 = off")
    ap.add_argument("--top-p", type=float, default=1.0, help="1 = off")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lenience", type=float, default=1.0, help="b in (0,1]; below 1 is lossy")
    ap.add_argument("--strategy", default="fixed", help="drafting strategy: fixed, adaptive, lookup, eagle (the "
                    "pair's EAGLE head drafts a chain, for a pair with a head) or tree (it drafts a tree, EAGLE-2)")
    ap.add_argument("--ngram", type=int, default=3, help="lookup: the longest n-gram matched (1-8)")
    ap.add_argument("--tree-topk", type=int, default=0, help="tree: children per node, and nodes expanded per "
                    "depth (1-16; 0 = the head's own)")
    ap.add_argument("--tree-depth", type=int, default=0, help="tree: the deepest drafted token (1-16; 0 = the "
                    "head's own)")
    ap.add_argument("--tree-budget", type=int, default=0, help="tree: the most nodes a tree keeps (0 = the head's "
                    "own; SPECDEMO_MAX_TREE caps it)")
    ap.add_argument("--tree-prune", type=float, default=None, help="tree: leave out nodes whose cumulative head "
                    "probability is below this (0 = keep all; default: the head's own, 0.02 for smollm2-135m, but "
                    "none where CUDA graphs grow the tree at T = 0)")
    ap.add_argument("--tree-lookup", type=int, default=0, help="tree, top-k children: also graft up to this many "
                    "tokens copied by prompt lookup onto each tree (0-16; 0 = none)")
    ap.add_argument("--tree-children", default="auto", help="tree: top (the head's top-k children), sampled "
                    "(drawn from the head, T > 0) or auto (default: top at T = 0; at T > 0 sampled, "
                    "or top up to the head's measured T where the target runs in bf16 on a CPU: 0.3 for smollm2-135m, "
                    "whose sampled tree there is 2 wide, 4 deep, 5 nodes)")
    ap.add_argument("--device", default=None, help="cuda, mps or cpu (default: the best available)")
    ap.add_argument("--draft-dtype", default=None, help="auto, float32, bfloat16 or float16 (default: auto)")
    ap.add_argument("--target-dtype", default=None, help="auto, float32, bfloat16 or float16 (default: auto)")
    ap.add_argument("--json", action="store_true", help="machine-readable output")


def colour(text: str, label: str, enabled: bool) -> str:
    if not enabled:
        return text
    return f"{STYLE[label]}{text}{RESET}"


def one_line(text: str) -> str:
    """A token's text with newlines, tabs and carriage returns written as escapes, so that a round keeps one line."""
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")


def round_line(rnd, use_colour: bool) -> str:
    """One round on one line: its tokens in order, marked by label (and coloured in a terminal), then its caption.
    A tree round says the tree's size and how deep the target's path went: 'round 3 [tree 14 · kept 3 +1]: ...'."""
    body = "".join(colour(MARK[t.label][0] + one_line(t.text) + MARK[t.label][1], t.label, use_colour)
                   for t in rnd.tokens)
    tag = ""
    if rnd.tree:
        added = any(t.label in ("resampled", "bonus") for t in rnd.tokens)
        tag = f" [tree {rnd.k} \u00b7 kept {rnd.n_accepted}{' +1' if added else ''}]"
    return f"round {rnd.index + 1}{tag}: {body}   ({rnd.caption})"


def spec_of(args, **kw):
    """The SpecConfig that the command line asks for (kw: what a command sets itself, such as the seed)."""
    from . import SpecConfig

    return SpecConfig(**{"k": args.k, "max_new_tokens": args.max_new_tokens, "seed": args.seed,
                         "lenience": args.lenience, "strategy": args.strategy, "ngram": args.ngram,
                         "tree_topk": args.tree_topk, "tree_depth": args.tree_depth,
                         "tree_budget": args.tree_budget, "tree_children": args.tree_children,
                         "tree_prune": args.tree_prune, "tree_lookup": args.tree_lookup} | kw)


def divergence_line(d) -> str:
    """Where and why a T = 0 speculative text parts from target-only decoding (see specdemo/ties.py)."""
    why = ("a near-tie: both gaps are within bf16 rounding" if d.near_tie else
           "NOT a near-tie: a bug, please report it")
    return (f"[T = 0 texts part at output token {d.position}: speculative {d.spec_text!r} (id {d.spec_token}), "
            f"target-only {d.base_text!r} (id {d.base_token}); logit gap spec - base {d.gap_verify:+.4f} in the "
            f"verify forward, {d.gap_step:+.4f} in the one-token step (+/- {d.tolerance:.3f}): {why}]")


def cmd_generate(args, pair, sampling) -> int:
    from specdemo.engine.ties import explain_divergence

    from . import baseline_generate, speculative_generate

    use_colour = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    for i in range(args.num_samples):
        spec = spec_of(args, seed=args.seed + i,
                       top_candidates=8 if args.json else 0)  # only the JSON trace shows the top candidates
        trace = speculative_generate(pair, args.prompt, sampling, spec, chat=args.chat)
        base = None
        if args.baseline:
            base = baseline_generate(pair, args.prompt, sampling, args.max_new_tokens, args.seed + i, chat=args.chat)
        parted = None
        if base is not None and sampling.greedy and base.output_ids != trace.output_ids:
            parted = explain_divergence(pair, trace.prompt_ids, trace.rounds, base.output_ids)
        if args.json:
            out = trace.to_dict()
            if base is not None:
                out["baseline"] = {"text": base.text, "token_ids": base.output_ids, "metrics": base.metrics(),
                                   "divergence": parted.to_dict() if parted else None}
            print(json.dumps(out))
            continue
        if use_colour:  # every round inline, rejected drafts struck through in red
            body = "".join(colour(t.text, t.label, True) for r in trace.rounds for t in r.tokens)
        else:  # no colour to tell a rejected draft from the text: the text the target kept
            body = trace.text
        m = trace.metrics()
        print(f"--- sample {i + 1} (seed {spec.seed}) ---")
        print((f"[user] {args.prompt}\n[assistant] " if trace.settings["chat"] else args.prompt) + body)
        if args.rounds:
            print(f"[{ROUNDS_LEGEND}]")
            for r in trace.rounds:
                print(round_line(r, use_colour))
        head = f" with EAGLE-3 head {trace.settings['head']}" if "head" in trace.settings else ""
        print(f"[{spec.strategy}{head}: {m['new_tokens']} tokens in {m['rounds']} target calls "
              f"({m['target_calls_saved']} saved), "
              f"alpha {m['alpha_empirical']:.2f} (accepted / judged), "  # the page's two figures, by its names
              f"{m['mean_accepted_length']:.2f} tokens per target call, "
              f"{m['tokens_per_s']:.1f} tok/s{', LOSSY' if m['lossy'] else ''}]")
        if base is not None:
            bm = base.metrics()
            print(f"[baseline: {bm['new_tokens']} tokens, {bm['tokens_per_s']:.1f} tok/s -> speedup "
                  f"{m['tokens_per_s'] / bm['tokens_per_s']:.2f}x]")
            if parted is not None:
                print(divergence_line(parted))
    if not args.json and use_colour:
        print("legend: " + " ".join(colour(lbl, lbl, True) for lbl in STYLE))
    return 0


def bench_decodings(args) -> list[str] | None:
    """The decodings a bench asks for (--decoding, or --decodings' list), checked before any model loads; None
    keeps the pair's own (SPECDEMO_DECODING)."""
    from specdemo.models.static import MODES

    from .config import ConfigError

    asked = [d.strip() for d in args.decodings.split(",") if d.strip()] if args.decodings else (
        [args.decoding] if args.decoding else None)
    if asked is None:
        return None
    if not asked or any(d not in MODES for d in asked):
        raise ConfigError(f"--decodings takes a comma-separated list of {', '.join(MODES)}, got {args.decodings!r}")
    if len(set(asked)) < len(asked):
        raise ConfigError(f"--decodings names a decoding twice: {args.decodings!r}")
    if len(asked) > 1 and (args.identity or not args.strategies):
        raise ConfigError("--decodings with more than one decoding races them in --strategies: add --strategies "
                          "(--identity checks one, --decoding)")
    return asked


def check_bench(args) -> None:
    """A bench's own settings, refused before any model loads."""
    from .config import ConfigError

    bench_decodings(args)
    if args.compiled and not args.strategies:
        raise ConfigError("--compiled adds a row to --strategies: add --strategies")
    if args.identity and (args.strategies or args.temperature != 0):
        raise ConfigError("--identity runs at T = 0 on its own: drop --strategies and --temperature")


def cmd_bench(args, pair, sampling) -> int:
    from specdemo.bench.methods import bench_prompts, format_bench, run_bench
    from specdemo.bench.strategies import run_strategies
    from specdemo.bench.strategies_table import format_strategies

    log = (lambda *a: print(*a, file=sys.stderr)) if args.json else print
    decodings = bench_decodings(args)
    if args.identity:
        from specdemo.bench.decodings import decoded_views, decoding_line, longest_request
        from specdemo.bench.identity import check_identity, format_identity
        from specdemo.models import dtype_name

        prompts = bench_prompts(pair)[: args.prompts]
        request = longest_request(pair, prompts, args.max_new_tokens)
        views = decoded_views({dtype_name(pair.dtype): pair}, decodings, request, lambda *a: None)
        log(decoding_line(next(iter(views.values())), decodings[0] if decodings else None))
        res = check_identity(pair, prompts, args.max_new_tokens, args.k, args.lookup_k, args.seed, log=log)
        print(json.dumps(res, indent=2) if args.json else format_identity(res))
        return 1 if res["bugs"] else 0
    if args.strategies:
        res = run_strategies(pair, sampling, args.k, args.max_new_tokens, args.prompts, seed=args.seed,
                             ngram=args.ngram, lookup_k=args.lookup_k, k_search=not args.no_k_search,
                             include_hf=not args.no_hf, log=log,
                             tree=(args.tree_topk, args.tree_depth, args.tree_budget),
                             tree_prune_below=args.tree_prune, decodings=decodings, compiled=args.compiled)
        print(json.dumps(res, indent=2) if args.json else format_strategies(res))
        return 0
    spec = spec_of(args, top_candidates=0)
    prompts = bench_prompts(pair)[: args.prompts]
    res = run_bench(pair, sampling, spec, prompts, include_hf=not args.no_hf, log=log,
                    decoding=decodings[0] if decodings else None)
    print(json.dumps(res, indent=2) if args.json else format_bench(res))
    return 0


def parser() -> argparse.ArgumentParser:
    """The CLI's arguments: `generate` and `bench`, each with the common settings (add_common)."""
    ap = argparse.ArgumentParser(prog="python -m specdemo", description="Speculative sampling, exact and observable.")
    ap.add_argument("--list-pairs", action="store_true", help="print the presets and exit")
    sub = ap.add_subparsers(dest="command")
    gen = sub.add_parser("generate", help="generate with speculative sampling and show every round")
    add_common(gen)
    gen.add_argument("--prompt", default="ROMEO:\n")
    gen.add_argument("--baseline", action="store_true", help="also run target-only decoding and compare speed")
    gen.add_argument("--num-samples", type=int, default=1)
    gen.add_argument("--rounds", action="store_true",
                     help="also print every round on its own line, marked: [-rejected draft-], {+resampled+}, "
                          "{*bonus*}; without a terminal the text alone is printed otherwise")
    mode = gen.add_mutually_exclusive_group()
    mode.add_argument("--chat", dest="chat", action="store_true", default=None,
                      help="the prompt is a user message, wrapped with the chat template (default for instruct "
                           "presets such as smollm2-135m)")
    mode.add_argument("--raw", dest="chat", action="store_false", help="continue the prompt as plain text")
    bench = sub.add_parser("bench", help="naive vs speculative vs transformers assisted generation")
    add_common(bench)
    bench.add_argument("--prompts", type=int, default=10, help="how many of the built-in prompts to use")
    bench.add_argument("--no-hf", action="store_true", help="skip transformers' rows: generate and assisted "
                       "generation (--compiled still adds generate, plain and compiled)")
    bench.add_argument("--strategies", action="store_true",
                       help="time target-only (each dtype), fixed K=1..8, adaptive, lookup, the EAGLE head's chain "
                            "and tree (where the pair has one; --tree-* sizes) and transformers' equivalents, "
                            "interleaved prompt by prompt; adds the copy-friendly prompts")
    bench.add_argument("--lookup-k", type=int, default=8, help="--strategies: tokens copied per lookup round")
    bench.add_argument("--no-k-search", action="store_true", help="--strategies: only the given K for fixed")
    modes = bench.add_mutually_exclusive_group()
    modes.add_argument("--decoding", choices=["auto", "eager", "static", "graphs"], default=None,
                       help="how the pair's KV caches run (models/static.py): eager (dynamic cache), static (one "
                            "preallocated cache per model), graphs (static, each forward width a captured CUDA graph; "
                            "static on a CPU) or auto; sized to the longest prompt + --max-new-tokens (default: "
                            "SPECDEMO_DECODING, else auto)")
    modes.add_argument("--decodings", default=None, metavar="LIST",
                       help="--strategies: race several decodings in one run, e.g. eager,static: every specdemo row "
                            "under each, back to back on every prompt (who goes first turns prompt by prompt), with "
                            "each row's tok/s as a ratio to the first decoding's")
    bench.add_argument("--compiled", action="store_true",
                       help="--strategies: add transformers' generate(cache_implementation=\"static\") under "
                            "torch.compile (CUDA graphs on CUDA), compiled and warmed up before the timed runs (its "
                            "compile time is printed apart); slow to compile on a CPU")
    bench.add_argument("--identity", action="store_true",
                       help="instead of timing: at T = 0, does every strategy give the tokens of the project's own "
                            "target-only, prompt by prompt ('identity N/M' per strategy; exit 1 on a parting that "
                            "is not a bf16 near-tie)")
    bench.set_defaults(max_new_tokens=128, temperature=0.0)
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)

    from specdemo.engine.speculative import PromptError
    from specdemo.engine.strategy import check_head
    from specdemo.models import ModelLoadError, StrategyUnavailable, load_pair

    from .config import PRESETS, ConfigError, SamplingConfig

    if args.list_pairs:
        for name, p in PRESETS.items():
            print(f"{name:12s} {p.draft} -> {p.target}\n{'':12s} {p.description}")
        return 0
    if args.command is None:
        ap.print_help()
        return 2
    if args.command == "generate":
        args.prompt = args.prompt.replace("\\n", "\n")  # let a shell user type ROMEO:\n
    try:
        spec_of(args)  # bad settings fail before any model loads
        if bool(args.draft) != bool(args.target):
            raise ModelLoadError("--draft and --target go together")
        if not args.head:  # a pair given a head has one; the head itself is checked once the target is there
            check_head(args.strategy, None if args.draft else args.pair)  # refused before anything loads
        decoding = None
        if args.command == "bench":
            check_bench(args)
            if bench_decodings(args):  # the bench prepares the decoding it asks for, sized to its prompts: the load
                decoding = "eager"  # captures nothing that would be thrown away
        pair = load_pair((args.draft, args.target) if args.draft else args.pair, device=args.device,
                         draft_dtype=args.draft_dtype, target_dtype=args.target_dtype, decoding=decoding,
                         head=args.head)
        check_head(args.strategy, pair.name, pair)
        sampling = SamplingConfig(args.temperature, args.top_k, args.top_p)
        if args.command == "generate":
            if args.num_samples < 1:
                raise ConfigError("--num-samples must be at least 1")
            return cmd_generate(args, pair, sampling)
        return cmd_bench(args, pair, sampling)
    except (ModelLoadError, ConfigError, PromptError, StrategyUnavailable) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
