"""Pure view functions: from what a run left (traces, a sweep, a race, a distribution) to the page's outputs.

Owns what every output shows, in one language and one size (presenter mode). Each function returns a dict keyed by
output name (ui.py maps the names to its components), so a handler names what it updates instead of counting
positions in a tuple. Nothing here runs a model: the same data redraws in another language without a rerun.
"""

from __future__ import annotations

import functools

import gradio as gr

from specdemo import i18n
from specdemo.config import PRESETS
from specdemo.engine.events import Trace
from specdemo.i18n import tr
from specdemo.models import static
from specdemo.models.loading import preset_unavailable

from . import plots, render, tree_view
from .validation import has_head

CHARTS = ("race", "acc_round", "times", "hist", "by_pos", "theory")  # the run's six charts, in ui.py's order
TAB_KEYS = ("tab.film", "tab.charts", "tab.sweep", "tab.race", "tab.dist", "tab.step", "tab.export")  # ui.py's order
TABS = {f"tab_{key.split('.')[1]}": key for key in TAB_KEYS}  # output name -> label key


def shown_prompt(trace: Trace) -> str:
    """The prompt as the token view shows it: in chat mode the user's message, with the reply below it."""
    return trace.prompt + "\n\n" if trace.settings.get("chat") else trace.prompt


def whole_baseline(base: Trace | None) -> Trace | None:
    """The baseline if it has finished, else None: one still running, or cut by Stop, measures nothing."""
    return base if base is not None and base.stop_reason is not None else None


def trace_payload(spec: Trace | None, base: Trace | None, stopped: bool = False) -> dict | None:
    """The trace download's JSON. A baseline that did not finish (Stop cut it) is left out, as on the page
    (`whole_baseline`). `stopped` (handlers.run_over marked the state) says that Stop cut the run short."""
    if spec is None:
        return None
    base = whole_baseline(base)
    return {"speculative": spec.to_dict(), "baseline": base.to_dict() if base is not None else None} | (
        {"stopped": True} if stopped else {})


def charts(spec: Trace | None, base: Trace | None, lang: str | None = None, presenter: bool = False) -> dict:
    """The six run charts (race, acceptance per round, where each round's time goes, accepted lengths, by position,
    theory) in one language. The race draws a baseline as far as it has run; the charts that read its speed (the
    target-only step, the measured speed-up) only a finished one (`whole_baseline`): its first step holds the prompt's
    prefill, so a part of it measures a speed-up that is not the run's."""
    whole = whole_baseline(base)
    figs = (plots.race(spec, base, lang), plots.acceptance_per_round(spec, lang), plots.round_times(spec, whole, lang),
            plots.accepted_length_histogram(spec, lang), plots.acceptance_by_position(spec, lang),
            plots.speedup_vs_theory(spec, whole, lang=lang))
    return {name: plots.present(f, presenter) for name, f in zip(CHARTS, figs, strict=True)}


@functools.lru_cache(maxsize=8)
def _empty_charts(lang: str | None, presenter: bool) -> dict:
    return charts(None, None, lang, presenter)


def empty_charts(lang: str | None = None, presenter: bool = False) -> dict:
    """The six run charts with nothing drawn yet, built once per language and size (building six plotly figures
    takes about 0.2 s here, too slow for a run's first update). Nobody changes a figure after it is built."""
    return dict(_empty_charts(lang, bool(presenter)))


def run_view(spec: Trace | None, base: Trace | None, status: str | None = None, lang: str | None = None,
             selected: int | None = None) -> dict:
    """The token view, the stats and the film strip of a run (`status` while it runs; the summary once done), with
    round `selected` (1-based) marked in the film strip."""
    if spec is None:
        return {"tokens": render.tokens_html("", [], lang=lang), "stats": render.stats_html(None, lang=lang),
                "film": render.filmstrip_html([], lang=lang)}
    if status is None:  # a recorded run says what it is (render.recorded_note); a running one, redrawn by a
        #                 language switch before its next update, that it runs
        status = ("" if spec.settings.get("recorded") is not None else render.done_status(spec, lang)
                  if spec.stop_reason is not None else tr("status.speculative", lang))
    return {"tokens": render.tokens_html(shown_prompt(spec), spec.rounds, lang=lang),
            "stats": render.stats_html(spec, base, status, lang),
            "film": render.filmstrip_html(spec.rounds, None if selected is None else selected - 1, lang)}


def baseline_stats(spec: Trace, base: Trace, lang: str | None = None) -> dict:
    """The stats while the target-only baseline runs: the finished speculative run's cards, and how far it is."""
    done, total = len(base.steps), spec.settings["max_new_tokens"]
    return {"stats": render.stats_html(spec, None, tr("status.baseline", lang, n=done, total=total), lang,
                                       pending=True, progress=(done, total))}


def round_slider(state, reset: bool = True, value: int = 1) -> dict:
    """The round slider for the run in `state`: as many stops as rounds (a slider needs max > min), on round
    `value` unless reset is False."""
    n = len(rounds_of(state))
    return gr.update(maximum=max(2, n), interactive=n > 1, **({"value": value} if reset else {}))


def first_shown_round(state) -> int:
    """The round a finished run opens on (1-based): its first tree round, so that the drawing is on the page
    without a search (the prefill before it has no tree), else round 1."""
    return next((r.index + 1 for r in rounds_of(state) if r.tree), 1)


def finished(spec: Trace | None, base: Trace | None, state, lang=None, presenter=False) -> dict:
    """A finished run everywhere: the text, stats and film strip, its charts, the inspector on the round it opens on
    (first_shown_round), marked in the film strip, and the step-through before its first round."""
    n = first_shown_round(state)
    return (run_view(spec, base, lang=lang, selected=n if rounds_of(state) else None)
            | charts(spec, base, lang, presenter) | opened_round(state, n, lang, presenter)
            | step_view(state, lang) | {"round_sl": round_slider(state, value=n)})


def opening(state, lang=None, presenter=False) -> dict:
    """What the page shows before any click: the run in `state` (the recorded run, recorded.py) drawn like any
    finished run, or the empty views where there is none. ui.py takes these as the components' values (round_sl:
    the round slider's value)."""
    spec, base = (state["spec"], state["base"]) if state else (None, None)
    return finished(spec, base, state, lang, presenter) | {"round_sl": first_shown_round(state)}


RUN_BUTTONS = ("go_btn", "sweep_btn", "dist_btn", "race_btn")  # what starts a model run; Stop ends any of them


def run_buttons(running: bool) -> dict:
    """One model run at a time on a page: while one runs, what would start another is disabled and Stop is not;
    when none runs, the other way round."""
    return {name: gr.Button(interactive=not running) for name in RUN_BUTTONS} | {
        "stop_btn": gr.Button(interactive=running)}


def stopped_view(state, lang=None) -> dict:
    """The page after Stop, from the run as far as the session's state holds it: a run stopped in its baseline says
    so on the baseline's two cards; one stopped while drafting says so under its cards, and its text, film strip and
    step-through are drawn again from the state, which may hold rounds whose update the cancel kept from the page
    (the step keys read the state, and counted rounds the film strip did not show). A run that had ended (or none)
    leaves the page as it is."""
    spec, base = (state.get("spec"), state.get("base")) if state else (None, None)
    if spec is None or spec.settings.get("recorded") is not None:
        return {}
    if spec.stop_reason is None:
        return run_view(spec, None, tr("status.stopped", lang), lang) | step_view(state, lang)
    if base is not None and base.stop_reason is None:
        return {"stats": render.stats_html(spec, None, tr("status.stopped", lang), lang, stopped=True)}
    return {}


# ------------------------------------------------------------------------------------------------ inspection


def rounds_of(state) -> list:
    return state["spec"].rounds if state and state.get("spec") else []


def round_index(rounds: list, round_no) -> int:
    """The index in `rounds` (not empty) of round `round_no` (1-based, as the slider says), clamped to the run."""
    return min(max(int(round_no or 1), 1), len(rounds)) - 1


def default_position(state, round_no) -> int:
    """Open a round at its most telling position: the rejection if there was one, else the bonus."""
    rounds = rounds_of(state)
    if not rounds:
        return 1
    rnd = rounds[round_index(rounds, round_no)]
    rejected = [d.position for d in rnd.drafts if d.checked and not d.accepted]
    return rejected[0] if rejected else last_position(rnd)


def last_position(rnd) -> int:
    """Where the token the target added sits: K + 1 in a chain round, the path's length + 1 in a tree round (whose
    k counts every node of the tree)."""
    return rnd.n_accepted + 1 if rnd.tree else rnd.k + 1


def root_text(rounds: list, idx: int) -> str | None:
    """The last fixed token before round idx (a tree's root), where an earlier round shows it."""
    before = rounds[idx - 1].output if idx > 0 else []
    return before[-1].text if before else None


def inspector(state, round_no, position, lang=None, presenter=False) -> dict:
    """The round inspector: p, q and the residual at one position, and why that token was kept or resampled."""
    rounds = rounds_of(state)
    if not rounds:
        return {"insp_plot": plots.present(plots.inspector_empty(lang), presenter),
                "insp_reason": f'<div class="sd-caption">{render.trh("reason.generate_first", lang)}</div>'}
    idx = round_index(rounds, round_no)
    rnd = rounds[idx]
    last = last_position(rnd)
    pos = min(max(int(position or 1), 1), last)
    if pos == last and not rnd.bonus_top and rnd.drafts:
        pos = next((d.position for d in rnd.drafts if d.checked and not d.accepted), len(rnd.drafts))
    tree = tree_view.tree_html(rnd, lang, root_text(rounds, idx))  # a tree round's drawing, below the reason
    return {"insp_plot": plots.present(plots.inspector(rnd, pos, lang=lang), presenter),
            "insp_reason": f'<div class="sd-caption">{render.reason(rnd, pos, lang)}</div>{tree}'}


def opened_round(state, round_no, lang=None, presenter=False) -> dict:
    """A round opened at its most telling position: the position slider, as long as the round (a chain's K + 1, a
    tree's path + 1), and the inspector."""
    pos, rounds = default_position(state, round_no), rounds_of(state)
    top = last_position(rounds[round_index(rounds, round_no)]) if rounds else 2
    return {"pos_sl": gr.update(value=pos, maximum=max(2, top))} | inspector(state, round_no, pos, lang, presenter)


def step_view(state, lang=None) -> dict:
    """The step-through's text up to the cursor and its caption; above the text, a tree round's drawing."""
    rounds = rounds_of(state)
    cursor = state.get("cursor", 0) if rounds else 0
    prompt = shown_prompt(state["spec"]) if rounds else ""
    tree = tree_view.tree_html(rounds[cursor - 1], lang, root_text(rounds, cursor - 1)) if cursor else ""
    at = f'<span class="sd-step-at" data-cursor="{cursor}" data-rounds="{len(rounds)}" hidden></span>'  # for KEYS_JS
    return {"step_tokens": at + tree + render.tokens_html(prompt, rounds, upto=cursor, lang=lang) if rounds
            else render.tokens_html("", []), "step_caption": render.step_caption(rounds, cursor, lang)}


# ------------------------------------------------------------------------------------------------ experiments


def sweep_text(sweep: dict, lang=None) -> str:
    results, best = sweep["results"], max(sweep["results"], key=lambda r: r["speedup"])
    table = tr("sweep.header", lang) + "\n|---:|---:|---:|---:|\n" + "\n".join(
        f"| {r['k']} | {r['tokens_per_s']:.1f} | {r['speedup']:.2f}x | {r['alpha']:.2f} |" for r in results)
    summary = tr("sweep.summary", lang, base=f"{sweep['base_tps']:.1f}", k=best["k"], speedup=f"{best['speedup']:.2f}",
                 alpha=f"{sweep['alpha']:.2f}", c=f"{sweep['c']:.3f}", kb=sweep["kb"], sb=f"{sweep['sb']:.2f}")
    first, last = sweep.get("k_range", (results[0]["k"], results[-1]["k"]))
    if len(results) < last - first + 1:  # still running, or Stop (or the time limit) ended it here
        done = tr("sweep.so_far", lang, n=len(results), total=last - first + 1, first=first, last=last)
        summary = f"{done} {summary}"
    return f"{summary}\n\n{table}"


def sweep_view(sweep: dict | None, lang=None, presenter=False) -> dict:
    if not sweep:
        return {"sweep_plot": plots.present(plots.k_sweep([], None, None, lang), presenter), "sweep_md": ""}
    return {"sweep_plot": plots.present(plots.k_sweep(sweep["results"], sweep["alpha"], sweep["c"], lang), presenter),
            "sweep_md": sweep_text(sweep, lang)}


DIVERGENCE_KEY = {True: "race.differs_tie", False: "race.differs_bug"}


def divergence_text(d, lang=None) -> str:
    """A T = 0 difference from target-only decoding, in words (a table cell): where, which tokens, both gaps."""
    return tr(DIVERGENCE_KEY[d.near_tie], lang, pos=d.position, spec=render.md_cell(render.esc(repr(d.spec_text))),
              base=render.md_cell(render.esc(repr(d.base_text))), gv=f"{d.gap_verify:+.3f}", gs=f"{d.gap_step:+.3f}",
              tol=f"{d.tolerance:.3f}")


def same_text(same, lang=None) -> str:
    if same == "same":
        return tr("race.same", lang)
    if same == "sampling":
        return tr("race.differs_sampling", lang)
    return divergence_text(same, lang)


def race_label(entry: dict, lang=None) -> str:
    suffix = {"fixed": f" = {entry['k']}", "eagle": f", K = {entry['k']}"}.get(entry["strategy"], "")
    if entry["strategy"] == "lookup" and entry.get("ngram"):
        suffix = f" n = {entry['ngram']}"
    if entry["strategy"] == "tree" and entry.get("tree"):  # the tree's sizes: (top-k, depth, budget)
        return tr("race.tree", lang, topk=entry["tree"][0], depth=entry["tree"][1], budget=entry["tree"][2])
    return tr(f"strategy.{entry['strategy']}", lang) + suffix


def race_view(race: dict | None, lang=None, presenter=False) -> dict:
    """The strategy race as a tokens-over-time chart and a table, from the data runs.strategy_race yields."""
    if not race:
        return {"race_plot": plots.present(plots.strategy_race({}, lang), presenter), "race_md": ""}
    target_only = tr("race.target_only", lang)
    lines = {target_only: race["base_points"]}
    rows = [f"| {target_only} | {race['base_tps']:.1f} | 1.00x | {race['base_n']} | | | |"]
    for e in race["entries"]:
        lines[race_label(e, lang)] = e["points"]
        rows.append(f"| {race_label(e, lang)} | {e['tokens_per_s']:.1f} | {e['tokens_per_s'] / race['base_tps']:.2f}x"
                    f" | {e['rounds']} | {e['alpha']:.2f} | {e['per_call']:.2f} | {same_text(e['same'], lang)} |")
    header = tr("race.header", lang) + "\n|---|---:|---:|---:|---:|---:|:---:|\n"
    table = header + "\n".join(rows) + "\n\n" + tr("race.columns", lang)
    return {"race_plot": plots.present(plots.strategy_race(lines, lang), presenter), "race_md": table}


DIST_WHO_KEY = {"draft": "dist.who_draft", "eagle": "dist.who_eagle", "lookup": "dist.who_lookup",
                "tree": "dist.who_tree"}
DIST_NOTE_KEY = {"eagle": "dist.note_eagle", "lookup": "dist.note_lookup", "tree": "dist.note_tree"}


def dist_text(dist: dict, lang=None) -> str:
    """What the distribution check sampled (which position, drafted by whom), how far the samples are from p, and
    the chi-square test against p."""
    who = tr(DIST_WHO_KEY.get(dist.get("source"), "dist.who_draft"), lang)
    before = dist.get("before") or ""
    if len(before) > 60:
        before = "…" + before[-60:]
    where = (tr("dist.first", lang, who=who) if dist.get("position", 1) == 1 else
             tr("dist.later", lang, pos=dist["position"], who=who, before=render.md_cell(render.esc(repr(before)))))
    parts = [where] + ([tr(note, lang)] if (note := DIST_NOTE_KEY.get(dist.get("source"))) else [])
    parts += [tr("dist.summary", lang, n=dist["n"], tv=f"{dist['tv']:.3f}", tv_ref=f"{dist['tv_ref']:.3f}")]
    if dist.get("tv_pq") is not None:
        parts.append(tr("dist.q", lang, tv_pq=f"{dist['tv_pq']:.3f}"))
    if dist.get("pvalue") is not None:
        parts.append(tr("dist.chi2", lang, chi2=f"{dist['chi2']:.1f}", dof=dist["dof"], pvalue=f"{dist['pvalue']:.3g}"))
    lossy = tr("dist.lossy", lang, b=dist["lenience"]) if dist["lenience"] < 1 else ""
    return " ".join(parts) + lossy


def dist_view(dist: dict | None, lang=None, presenter=False) -> dict:
    """The distribution check's chart and summary; with no result, both cleared."""
    if not dist:
        return {"dist_plot": None, "dist_md": ""}
    fig = plots.distribution(dist["tokens"], dist["p"], dist["freq"], dist["q"], dist["n"], lang,
                             position=dist.get("position"))
    return {"dist_plot": plots.present(fig, presenter), "dist_md": dist_text(dist, lang)}


# ------------------------------------------------------------------------------------------------ the page


def strategy_choices(pair_name, custom_head: bool = False):
    """The strategy selector's choices for a pair: eagle and tree only where the pair has a head (a pure function of
    the preset, so a pair change updates it without loading anything; a custom pair loaded with an EAGLE-3 head
    says so with custom_head)."""
    choices = [(i18n.label("strategy.fixed"), "fixed"), (i18n.label("strategy.adaptive"), "adaptive"),
               (i18n.label("strategy.lookup"), "lookup")]
    if has_head(pair_name) or custom_head:
        choices += [(i18n.label("strategy.eagle"), "eagle"), (i18n.label("strategy.tree"), "tree")]
    return choices


def preset_defaults(pair_name: str, limits) -> dict:
    """A preset's page defaults (config.PairPreset): K, the temperature and the token budget, within the limits."""
    p = PRESETS[pair_name]
    return {"k": min(p.k, limits.max_k), "temperature": p.temperature,
            "max_new": min(p.max_new_tokens, limits.max_new_tokens)}


def missing_notice(name: str, err: Exception, lang=None) -> str:
    """One sentence on the page when the default pair could not be loaded and the page opened on the embedded
    Shakespeare pair instead (app.py): why, and how to get the readable pair."""
    if getattr(err, "key", None) == "err.target_install":  # a preset's wheel is not installed and no hub
        return tr("notice.missing_install", lang, name=name)
    why = err.text(lang) if hasattr(err, "text") else str(err)
    return tr("notice.missing", lang, name=name, why=why)


DECODING_KEY = {"eager": "decoding.eager", "static": "decoding.static", "graphs": "decoding.graphs"}
DECODING_NOTE_KEY = {static.WHY_CPU: "decoding.why_cpu", static.WHY_GRAPHS: "decoding.why_graphs",  # the loader's
                     static.WHY_ZEROGPU: "decoding.why_zerogpu", static.WHY_WINDOW: "decoding.why_window"}  # reasons


def decoding_info(desc: dict, lang=None) -> str:
    """How the pair decodes, in one sentence (Markdown): eager, static cache or CUDA graphs, and why. The reason is
    the loader's own line: its most common ones (DECODING_NOTE_KEY) in the page's language, any other in English
    (it can quote an exception), escaped for HTML and for Markdown."""
    mode = desc.get("decoding")
    if not mode:  # a pair state saved before the pair said how it decodes
        return ""
    shown = tr(DECODING_KEY[mode], lang) if mode in DECODING_KEY else render.md_cell(render.esc(str(mode)))
    note = (desc.get("decoding_note") or "").strip()
    if not note:
        return tr("pair.decoding_bare", lang, mode=shown)
    why = tr(DECODING_NOTE_KEY[note], lang) if note in DECODING_NOTE_KEY else render.md_cell(render.esc(note))
    return tr("pair.decoding", lang, mode=shown, note=why)


def pair_line(pair_name: str, draft_id: str = "", target_id: str = "") -> str:
    """Which models a pair choice means, as the selector's line under its label ("draft → target"): the selector
    itself shows the short name only, which fits its box (issue 44: the whole name needed 426 px of its 344)."""
    if pair_name in PRESETS:
        draft_id, target_id = PRESETS[pair_name].draft, PRESETS[pair_name].target
    if not (draft_id and target_id):
        return ""
    return f"{str(draft_id).strip().split('/')[-1]} \u2192 {str(target_id).strip().split('/')[-1]}"
def pair_choice(name: str) -> str:
    """A preset's entry in the pair selector: its short name, which fits the box (the models it means are on the line
    above the box: pair_line), and for a preset this server cannot load (a GPU Space's 8B pairs on a CPU) the
    reason, in English as the model names are (models.preset_unavailable)."""
    why = preset_unavailable(name)
    return f"{name} (unavailable: {why})" if why is not None else name


def pair_info(desc: dict, lang=None) -> str:
    """The loaded pair (Markdown), from ModelPair.describe(): the models and the device, and below them how the pair
    decodes (ModelPair.decoding and decoding_note, which models.static.prepare chose at load)."""
    loaded = tr("pair.loaded", lang, draft=desc["draft"], draft_m=f"{desc['draft_parameters'] / 1e6:.1f}",
                target=desc["target"], target_m=f"{desc['target_parameters'] / 1e6:.1f}", device=desc["device"],
                dtype=desc["dtype"], context=desc["context_window"])
    if desc.get("head"):  # a published EAGLE-3 head, given with a custom pair (the presets' own heads go unnamed)
        loaded += tr("pair.head", lang, head=desc["head"])
    decoding = decoding_info(desc, lang)
    return f"{loaded}  \n{decoding}" if decoding else loaded  # on a line of its own (a Markdown line break)


def tab_labels(lang) -> dict:
    """The tabs' labels in `lang`, as plain text (gradio does not re-translate a closed tab's label by itself)."""
    return {name: gr.Tab(label=tr(key, lang)) for name, key in TABS.items()}


def everything(lang, presenter, state, round_no, position, sweep, dist, race, pair_desc) -> dict:
    """Everything specdemo renders itself, again, in `lang` and presenter size: the results stay on screen. A
    baseline is drawn only whole (a speed-up from part of it would move), and a run that Stop cut short
    (handlers.run_over marks its state) says so again, as it did before the switch (stopped_view)."""
    spec = state.get("spec") if state else None
    base = whole_baseline(state.get("base") if state else None)
    selected = int(round_no or 1) if rounds_of(state) else None  # the round the inspector shows, marked
    out = {"legend": render.legend(lang), "keys": render.keys_hint(lang)} | run_view(spec, base, lang=lang,
                                                                                       selected=selected)
    out |= charts(spec, base, lang, presenter) | inspector(state, round_no, position, lang, presenter)
    out |= step_view(state, lang) | sweep_view(sweep, lang, presenter) | dist_view(dist, lang, presenter)
    out |= race_view(race, lang, presenter)
    part = state.get("base") if state else None  # a baseline that runs still: say so, as the run's updates do
    if spec is not None and spec.stop_reason is not None and part is not None and part.stop_reason is None:
        out |= baseline_stats(spec, part, lang)
    if state and state.get("stopped"):
        out |= stopped_view(state, lang)
    if pair_desc:
        out["pair_status"] = pair_info(pair_desc, lang)
    return out
