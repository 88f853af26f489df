"""Plotly figures, built from events: the race, acceptance per round, where each round's time goes, accepted
lengths, acceptance by position, measured speedup against theory, the round inspector (p, q, residual), the K sweep
and the distribution check.

Owns figure construction only; no gradio import, no model calls. Plotly does NOT escape text: it reads a subset of
HTML in every title, tick label, legend entry, hover label and annotation (`<b>`, `<br>`, `<a href>`, ...) and
decodes entities such as `&lt;`. So every label that comes from a model or a caller passes through `plain`, which
writes `&`, `<` and `>` as entities: a token `<b>` shows as the four characters `<b>`. The catalogue's own texts
carry no markup.
"""

from __future__ import annotations

import dataclasses
import html

import plotly.graph_objects as go

from specdemo.engine.events import Candidate, DraftPosition, Round, Trace, acceptance
from specdemo.engine.theory import best_k, measure, predicted_speedup
from specdemo.i18n import tr

from .render import PALETTE

# The legend sits at the foot of the whole figure (yref "container"): plotly.js reserves its height below the bottom
# margin, which the x axis's automargin has already widened to hold the tick labels and the axis title, so the
# legend cannot cover the title however many rows it wraps to (a legend at y = -0.25 of the plot did, issue 44).
LEGEND = dict(orientation="h", yref="container", y=0, yanchor="bottom", x=0, xanchor="left")
LAYOUT = dict(template="plotly_white", height=300, margin=dict(l=50, r=20, t=50, b=10), legend=LEGEND,
              font=dict(size=12), xaxis=dict(automargin=True), yaxis=dict(automargin=True))

# One look per strategy, and one for target-only decoding, in every chart that draws a run (the race, the strategy
# race, the K sweep, the theory chart's measured point): Okabe & Ito's colour-blind-safe palette ("Color Universal
# Design", 2008), the five of its colours with at least 3:1 contrast on the white page (WCAG 2.1, 1.4.11: black 21,
# blue 5.2, vermillion 3.9, bluish green 3.4, reddish purple 3.1), and its orange darkened to #9A6A00 (4.7; the pure
# orange gives 2.2). Each has its own dash too, so no two look alike in grey or to any colour vision.
STRATEGY_STYLE = {
    "target": {"color": "#000000", "dash": "solid"},
    "fixed": {"color": "#0072B2", "dash": "dash"},
    "adaptive": {"color": "#D55E00", "dash": "dot"},
    "lookup": {"color": "#009E73", "dash": "dashdot"},
    "eagle": {"color": "#CC79A7", "dash": "longdash"},
    "tree": {"color": "#9A6A00", "dash": "longdashdot"},
}
THEORY_STYLE = {"color": "#777777", "dash": "dash"}  # the closed forms: grey, so no strategy is taken for them


def strategy_line(strategy: str, width: float = 3) -> dict:
    """A run's line: its strategy's colour and dash (STRATEGY_STYLE; "target" for target-only decoding)."""
    return dict(STRATEGY_STYLE[strategy], width=width)


def run_strategy(trace: Trace) -> str:
    """The strategy a speculative run used (its settings; traces from before strategies existed were "fixed")."""
    strategy = trace.settings.get("strategy", "fixed")
    return strategy if strategy in STRATEGY_STYLE else "fixed"


def label_strategy(label: str, lang: str | None) -> str:
    """The strategy that a race line's label (views.race_label) names: the longest strategy name it starts with
    ("EAGLE tree (top-k 4, ...)" starts with "EAGLE tree", not only "EAGLE")."""
    names = sorted(((tr(f"strategy.{s}", lang), s) for s in STRATEGY_STYLE if s != "target"), key=lambda n: -len(n[0]))
    return next((s for name, s in names if label.startswith(name)), "fixed")


def _axes_from_zero(fig: go.Figure, y_top: float = 1.0) -> go.Figure:
    """An empty figure's axes from 0 (plotly's autorange for no data runs from -1); a figure with data keeps its
    own ranges."""
    if not any(len(t.x or ()) or len(t.y or ()) for t in fig.data):
        fig.update_xaxes(range=[0, 1], autorange=False)
        fig.update_yaxes(range=[0, y_top], autorange=False)
    return fig


def _fig(title: str, x: str, y: str) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(title=dict(text=title, x=0.02), xaxis_title=x, yaxis_title=y, **LAYOUT)
    return fig


def _note(fig: go.Figure, text: str) -> go.Figure:
    """An empty chart's one line of text, in its middle: what is missing, or why nothing is drawn."""
    fig.add_annotation(text=text, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
    return fig


PRESENT_FONT = 17  # presenter mode's type: the tick labels and annotations (the n= counts), and any bar text


def present(fig: go.Figure, on: bool) -> go.Figure:
    """Presenter mode: larger type and taller charts, for a 1280x720 projector. Off returns the figure as it is."""
    if on:
        fig.update_layout(font=dict(size=PRESENT_FONT), title_font_size=24,
                          height=max(fig.layout.height or 300, 300) + 50, margin=dict(l=70, r=20, t=60, b=10),
                          legend=dict(font_size=16))
        fig.update_traces(selector=dict(type="bar"), textfont_size=PRESENT_FONT)
    return fig


def plain(text: str) -> str:
    """Text that plotly shows as it is: `&`, `<` and `>` as entities (plotly decodes each entity once)."""
    return html.escape(text, quote=False)


def _token_label(text: str, lang: str | None) -> str:
    """A token as a tick label: its repr (newlines and control characters visible), escaped for plotly."""
    return plain(repr(text)[1:-1]) or tr("chart.empty_token", lang)


def race_hover(lang: str | None) -> str:
    """A race line's hover: the run's name, its tokens so far (a whole number) and the seconds (2 decimals). The name
    comes from the trace (fullData.name, already escaped by `plain`), so no label is pasted into the template."""
    return tr("chart.race_hover", lang, name="%{fullData.name}", tokens="%{y:d}", s="%{x:.2f}")


def _race_line(fig: go.Figure, xs: list, ys: list, name: str, strategy: str, lang: str | None, **kw) -> None:
    fig.add_scatter(x=xs, y=ys, name=name, line=dict(strategy_line(strategy), shape="hv"),
                    hovertemplate=race_hover(lang), hoverlabel=dict(namelength=0), **kw)


def race(spec: Trace | None, base: Trace | None, lang: str | None = None) -> go.Figure:
    """Tokens generated against wall time, for both runs, each from its own start: Round.elapsed_s and
    Step.elapsed_s, the run's own perf_counter time (the page's work between rounds left out), on a GPU too. The
    CUDA-event times are the rounds' draft_ms and verify_ms (speculative.PhaseClock): the theory chart's cost ratio
    c is made of them, and the film strip adds the host's overhead_ms to them for each round's time."""
    fig = _fig(tr("chart.race", lang), tr("chart.race_x", lang), tr("chart.race_y", lang))
    if spec is not None and spec.rounds:
        xs, ys, n = [0.0], [0], 0
        for r in spec.rounds:
            n += len(r.output)
            xs.append(r.elapsed_s)
            ys.append(n)
        _race_line(fig, xs, ys, tr("chart.speculative", lang), run_strategy(spec), lang, mode="lines+markers",
                   marker=dict(size=5))
    if base is not None and base.steps:
        _race_line(fig, [0.0] + [s.elapsed_s for s in base.steps], list(range(len(base.steps) + 1)),
                   tr("chart.target_only", lang), "target", lang, mode="lines")
    return _axes_from_zero(fig)


def strategy_race(runs: dict[str, list[tuple[float, int]]], lang: str | None = None) -> go.Figure:
    """Tokens generated against wall time for each run of the strategy race: {label: [(seconds, tokens), ...]};
    the first run is target-only decoding, each other is drawn in the look of the strategy its label names."""
    fig = _fig(tr("chart.strategy_race", lang), tr("chart.race_x", lang), tr("chart.race_y", lang))
    for i, (label, points) in enumerate(runs.items()):
        strategy = label_strategy(label, lang) if i else "target"
        _race_line(fig, [0.0] + [p[0] for p in points], [0] + [p[1] for p in points], plain(label), strategy, lang,
                   mode="lines")
    fig.update_layout(height=380)  # six runs' legend takes up to three rows from the figure's foot at 1280x720
    if not runs:  # before the race has run: say how to start it, as the inspector does before a round is opened
        _note(fig, tr("chart.strategy_race_empty", lang, button=tr("race.run", lang)))
    return _axes_from_zero(fig)


def most_kept(rnd: Round) -> int:
    """The most drafts a round could keep: its K for a chain; for a tree its depth, since its nodes are alternatives
    and one path through them is kept."""
    return max((nd.depth for nd in rnd.tree), default=0) if rnd.tree else rnd.k


ACCEPTED_OF_KEY = {False: "chart.accepted_of_k", True: "chart.accepted_of_depth"}


def acceptance_per_round(spec: Trace | None, lang: str | None = None) -> go.Figure:
    """Each round's kept drafts, stacked on the rest of what it could have kept (K, or a tree's depth). The axis
    names the one the run has: a long title that named both was cut off in presenter mode."""
    tree = spec is not None and any(r.tree for r in spec.rounds)
    fig = _fig(tr("chart.acc_round", lang), tr("chart.round", lang), tr(ACCEPTED_OF_KEY[tree], lang))
    if spec is not None and spec.rounds:
        rs = spec.rounds
        fig.add_bar(x=[r.index + 1 for r in rs], y=[r.n_accepted for r in rs], name=tr("chart.accepted", lang),
                    marker_color=PALETTE["accepted"])
        fig.add_bar(x=[r.index + 1 for r in rs], y=[most_kept(r) - r.n_accepted for r in rs],
                    name=tr("chart.not_accepted", lang), marker_color=PALETTE["rejected"], marker_pattern_shape="/")
        fig.update_layout(barmode="stack")
    return _axes_from_zero(fig)


# a round's three phases in the time chart: the drafter in its strategy's colour (round_times), the target's verify
# in target-only's black, the bookkeeping in grey with a hatch, so that no two read alike in grey or on a projector
PHASE_KEY = {"draft_ms": "chart.t_draft", "verify_ms": "chart.t_verify", "overhead_ms": "chart.t_book"}
CLOCK_KEY = {True: "chart.times_y_cuda", False: "chart.times_y_host"}  # the y axis: which clock timed the phases
PHASE_STYLE = {"verify_ms": dict(color=STRATEGY_STYLE["target"]["color"]),
               "overhead_ms": dict(color="#8C8C8C", pattern_shape="x")}


def round_times(spec: Trace | None, base: Trace | None, lang: str | None = None) -> go.Figure:
    """Where each round's time goes: its draft, its verify and the rest (the verdict's copy, the roll-back and the
    round's story), stacked, in ms, beside the median target-only step when the baseline ran. On a GPU the draft
    and verify are CUDA-event times (speculative.PhaseClock), and the axis says so; elsewhere the host's clock."""
    cuda = spec is not None and str(spec.settings.get("device", "")).startswith("cuda")
    fig = _fig(tr("chart.times", lang), tr("chart.round", lang), tr(CLOCK_KEY[cuda], lang))
    if spec is not None and spec.rounds:
        xs = [r.index + 1 for r in spec.rounds]
        for field_name, key in PHASE_KEY.items():
            color = PHASE_STYLE.get(field_name, dict(color=STRATEGY_STYLE[run_strategy(spec)]["color"]))
            fig.add_bar(x=xs, y=[round(getattr(r, field_name), 3) for r in spec.rounds], name=tr(key, lang),
                        marker=dict(color=color["color"], pattern_shape=color.get("pattern_shape", "")))
        fig.update_layout(barmode="stack")
        if base is not None and base.steps:
            ms = sorted(s.step_ms for s in base.steps)
            x, y = [xs[0] - 0.5, xs[-1] + 0.5], [ms[len(ms) // 2]] * 2
            # target-only's black dashes over a wide white line, so that the step shows across the black verify bars
            fig.add_scatter(x=x, y=y, mode="lines", line=dict(color="#FFFFFF", width=6), showlegend=False,
                            hoverinfo="skip")
            fig.add_scatter(x=x, y=y, mode="lines", name=tr("chart.t_step", lang),
                            line=dict(STRATEGY_STYLE["target"], width=2, dash="dash"))
    return _axes_from_zero(fig)


def accepted_length_histogram(spec: Trace | None, lang: str | None = None) -> go.Figure:
    fig = _fig(tr("chart.hist", lang), tr("chart.hist_x", lang), tr("chart.rounds", lang))
    if spec is not None and spec.rounds:
        lengths = [len(r.output) for r in spec.rounds]
        k = max(most_kept(r) for r in spec.rounds)
        counts = [lengths.count(i) for i in range(1, k + 2)]
        fig.add_bar(x=list(range(1, k + 2)), y=counts, marker_color=PALETTE["target"], name=tr("chart.rounds", lang))
        fig.update_xaxes(dtick=1)
    return _axes_from_zero(fig)


POSITION_KEY = {False: "chart.draft_position", True: "chart.draft_depth"}  # a chain's draft position, a tree's depth


def acceptance_by_position(spec: Trace | None, lang: str | None = None) -> go.Figure:
    """P(accept | judged) at each draft position 1..K, with the overlap sum min(p, q) beside it. Only the positions
    some round drafted: a tree's k counts its nodes, but its drafts are the path's depths (and the refused child)."""
    tree = spec is not None and any(r.tree for r in spec.rounds)
    fig = _fig(tr("chart.by_pos", lang), tr(POSITION_KEY[tree], lang), tr("chart.rate", lang))
    if spec is not None and spec.rounds:
        k = max((d.position for r in spec.rounds for d in r.drafts), default=0)
        acc, ovl, n = [], [], []
        for pos in range(1, k + 1):
            a = acceptance(spec.rounds, pos)
            n.append(a["judged"])
            acc.append(a["alpha_empirical"] if a["judged"] else None)
            ovl.append(a["alpha_overlap"] if a["judged"] else None)
        xs = list(range(1, k + 1))
        fig.add_bar(x=xs, y=acc, name=tr("chart.accepted_judged", lang), marker_color=PALETTE["accepted"])
        fig.add_scatter(x=xs, y=ovl, name=tr("chart.overlap", lang), mode="lines+markers",
                        line=dict(color=PALETTE["draft"], dash="dash"))
        # how many were judged, over each bar: annotations in the layout's font (the tick labels' size, presenter
        # mode's too; a bar's own text shrinks to the bar), on white, above the overlap line that may cross them
        for x, y, c in zip(xs, acc, n, strict=True):
            fig.add_annotation(x=x, y=y or 0, text=f"n={c}", showarrow=False, yanchor="bottom", yshift=2,
                               bgcolor="rgba(255, 255, 255, 0.85)")
        fig.update_yaxes(range=[0, 1.15])
        fig.update_xaxes(dtick=1)
    return _axes_from_zero(fig)


NO_K = ("tree",)  # the strategies whose rounds are not K drafts in a row: the theory chart's K axis means nothing


def _no_axes(fig: go.Figure) -> go.Figure:
    """A chart that has only a note: no axis titles, ticks or grid (a K axis from 0 to 1 would read as data)."""
    for update in (fig.update_xaxes, fig.update_yaxes):
        update(title_text="", showticklabels=False, showgrid=False, zeroline=False, showline=False)
    return fig


def speedup_vs_theory(spec: Trace | None, base: Trace | None, k_max: int = 12, lang: str | None = None) -> go.Figure:
    fig = _fig(tr("chart.theory", lang), tr("chart.k_axis", lang), tr("chart.speedup_axis", lang))
    ran, timed = spec is not None and bool(spec.rounds), base is not None and bool(base.steps)
    if ran and spec.settings.get("strategy") in NO_K:  # a tree's round is not K drafts in a row: no E/(cK+1) for it
        m = spec.metrics()
        per_call = f"{m['mean_accepted_length']:.2f}"
        note = (tr("chart.theory_tree", lang, per_call=per_call,
                   speedup=f"{m['tokens_per_s'] / base.metrics()['tokens_per_s']:.2f}") if timed
                else tr("chart.theory_tree_no_base", lang, per_call=per_call))
        return _axes_from_zero(_no_axes(_note(fig, note)))
    if not ran or not timed:
        return _axes_from_zero(_note(fig, tr("chart.theory_needs_baseline", lang)))
    model = measure(spec.rounds, base.steps, spec.settings["k"])
    a, c, v = model["alpha_empirical"], model["c"], model["verify_cost"]
    ks = list(range(1, k_max + 1))
    fig.add_scatter(x=ks, y=[predicted_speedup(a, k, c) for k in ks], mode="lines",
                    name=f"E/(cK+1), \u03b1={a:.2f}, c={c:.3f}", line=THEORY_STYLE)
    fig.add_scatter(x=ks, y=[predicted_speedup(a, k, c, v) for k in ks], mode="lines",
                    line=dict(THEORY_STYLE, dash="dot"), name=tr("chart.verify_cost", lang, v=f"{v:.2f}"))
    kb, sb = best_k(a, c, k_max)
    fig.add_scatter(x=[kb], y=[sb], mode="markers+text", text=[tr("chart.best_k", lang, k=kb)],
                    textposition="top center",
                    marker=dict(symbol="star", size=14, color=PALETTE["bonus"]), name=tr("chart.best_k_theory", lang))
    measured = spec.metrics()["tokens_per_s"] / base.metrics()["tokens_per_s"]
    fig.add_scatter(x=[spec.settings["k"]], y=[measured], mode="markers", name=tr("chart.measured", lang),
                    marker=dict(symbol="diamond", size=13, color=STRATEGY_STYLE[run_strategy(spec)]["color"]))
    fig.add_hline(y=1.0, line=dict(color="#999", width=1))
    return fig


# rounds that drafted nothing: the target chose the token from its own p (not a bonus after K accepted drafts)
PLAIN_TITLE_KEY = {"prefill": "chart.inspector_prefill", "fallback": "chart.inspector_fallback"}
# a chain's positions are 1..K, and K + 1 is the target's bonus; a tree's are the depths of its kept path
DRAFT_TITLE_KEY = {False: "chart.inspector_draft", True: "chart.inspector_draft_tree"}
BONUS_TITLE_KEY = {False: "chart.inspector_bonus", True: "chart.inspector_bonus_tree"}
TICKS_TO_ONE = [0, 0.2, 0.4, 0.6, 0.8, 1]


def inspector_title(rnd: Round, position: int, lang: str | None = None) -> str:
    """What the inspector shows: the drafted token at a chain's position or a tree's depth, or the target's own p."""
    if position <= len(rnd.drafts):
        d = rnd.drafts[position - 1]
        return tr(DRAFT_TITLE_KEY[bool(rnd.tree)], lang, round=rnd.index + 1, pos=position, x=plain(repr(d.text)))
    if rnd.k == 0 and rnd.source in PLAIN_TITLE_KEY:
        return tr(PLAIN_TITLE_KEY[rnd.source], lang, round=rnd.index + 1)
    return tr(BONUS_TITLE_KEY[bool(rnd.tree)], lang, round=rnd.index + 1, pos=position)


def drafted_candidates(rnd: Round, d: DraftPosition, top: int) -> list[Candidate]:
    """The top candidates at a drafted position, with the drafted token among them whatever its p and q: the top
    lists (the target's, and a chain's draft's) can miss it, a sampled draft or a tree's child to which the target
    gave almost nothing. In a tree, q is the head's p of the children of the path's node one depth up (the
    drafted child's is d.q); sorted by max(p, q), as the engine sorts a chain's list."""
    cands = list(d.top[:top])
    if rnd.tree:
        parent = next((nd.id for nd in rnd.tree if nd.on_path and nd.depth == d.position - 1), -1)
        head_p = {nd.token_id: nd.head_p for nd in rnd.tree if nd.parent == parent}
        cands = [dataclasses.replace(c, q=head_p.get(c.token_id, 0.0)) for c in cands]
    if all(c.token_id != d.token_id for c in cands):
        cands.append(Candidate(d.token_id, d.text, d.p, d.q))
    return sorted(cands, key=lambda c: -max(c.p, c.q))


def _probability_axis(fig: go.Figure, heights: list[float], marked: float | None) -> None:
    """From 0 to a little above the highest bar, with room above the marked bar for the "drafted" arrow and its
    word; where that room runs past 1, no tick is drawn above 1, since no probability is."""
    top = max(max(heights, default=0.0) * 1.05, (marked or 0.0) * 1.35) or 1.0
    fig.update_yaxes(range=[0, top], autorange=False)
    if top > 1:
        fig.update_yaxes(tickmode="array", tickvals=TICKS_TO_ONE)


def inspector(rnd: Round, position: int, top: int = 10, lang: str | None = None) -> go.Figure:
    """Top tokens at one position of a round: p (target), q (draft) and the normalised residual max(0, p - q); at a
    drafted position the drafted token too, with its p and q (a tree: the head's p), under a "drafted" arrow."""
    drafted = rnd.drafts[position - 1] if position <= len(rnd.drafts) else None
    q_name, overlap = tr("chart.q_draft", lang), None
    if drafted is None:
        cands = rnd.bonus_top[:top]
    elif rnd.tree:  # q is the head's p of the node's children; the walk has no residual: a miss is the target's draw
        cands, q_name = drafted_candidates(rnd, drafted, top), tr("chart.q_tree", lang)
    else:
        cands, overlap = drafted_candidates(rnd, drafted, top), drafted.overlap
    fig = _fig(inspector_title(rnd, position, lang), tr("chart.token", lang), tr("chart.probability", lang))
    labels = [_token_label(c.text, lang) for c in cands]
    # identical texts (different ids) would share a bar; make them distinct
    labels = [f"{lbl} #{c.token_id}" if labels.count(lbl) > 1 else lbl for lbl, c in zip(labels, cands, strict=True)]
    p, q = [c.p for c in cands], [c.q for c in cands]
    fig.add_bar(x=labels, y=p, name=tr("chart.p_target", lang), marker_color=PALETTE["target"])
    fig.add_bar(x=labels, y=q, name=q_name, marker_color=PALETTE["draft"], marker_pattern_shape="/")
    res = []
    if overlap is not None and overlap < 1 - 1e-6:
        res = [max(0.0, c.p - c.q) / (1 - overlap) for c in cands]
        fig.add_bar(x=labels, y=res, name=tr("chart.residual", lang), marker_color=PALETTE["residual"],
                    marker_pattern_shape=".")
    marked = None
    if drafted is not None:
        i = next(i for i, c in enumerate(cands) if c.token_id == drafted.token_id)
        marked = max(p[i], q[i], *res[i:i + 1])
        fig.add_annotation(x=labels[i], y=marked, text=tr("chart.drafted", lang), showarrow=True, arrowhead=2)
    _probability_axis(fig, p + q + res, marked)
    fig.update_layout(barmode="group", height=340)
    return fig


def inspector_empty(lang: str | None = None) -> go.Figure:
    fig = _fig(tr("chart.inspector", lang), tr("chart.token", lang), tr("chart.probability", lang))
    return _axes_from_zero(_note(fig, tr("chart.inspector_empty", lang)))


def k_sweep(results: list[dict], alpha: float | None, c: float | None, lang: str | None = None) -> go.Figure:
    """Measured speedup per K (results: [{k, speedup, alpha}]; runs.k_sweep drafts with fixed K), with the theory
    curve from the sweep's alpha and c."""
    fig = _fig(tr("chart.sweep", lang), "K", tr("chart.speedup_axis", lang))
    if results:
        fig.add_scatter(x=[r["k"] for r in results], y=[r["speedup"] for r in results], mode="lines+markers",
                        name=tr("chart.measured", lang), line=strategy_line("fixed"))
    if results and alpha is not None and c is not None:
        ks = list(range(1, max(r["k"] for r in results) + 1))
        fig.add_scatter(x=ks, y=[predicted_speedup(alpha, k, c) for k in ks], mode="lines", name="E/(cK+1)",
                        line=THEORY_STYLE)
    fig.add_hline(y=1.0, line=dict(color="#999", width=1))
    fig.update_xaxes(dtick=1)
    return _axes_from_zero(fig, y_top=2)


def distribution(tokens: list[str], target_p: list[float], freq: list[float], reference: list[float] | None,
                 n: int, lang: str | None = None, position: int | None = None) -> go.Figure:
    """Top tokens of the checked position: the target's exact p, the speculative samples' frequencies and q. The
    title names the position as the tab's text does (views.dist_text): token `position` of the reply, which is not
    the first where the strategy drafts nothing at first (runs.first_token_distribution); "the checked token" where
    the caller does not say."""
    title = (tr("chart.dist", lang, n=n) if position is None else tr("chart.dist_at", lang, n=n, pos=position))
    fig = _fig(title, tr("chart.token", lang), tr("chart.probability", lang))
    labels = [_token_label(t, lang) for t in tokens]
    labels = [f"{lbl} #{i}" if labels.count(lbl) > 1 else lbl for i, lbl in enumerate(labels)]
    fig.add_bar(x=labels, y=target_p, name=tr("chart.dist_p", lang), marker_color=PALETTE["target"])
    fig.add_bar(x=labels, y=freq, name=tr("chart.dist_samples", lang), marker_color=PALETTE["accepted"],
                marker_pattern_shape="/")
    if reference is not None:
        fig.add_bar(x=labels, y=reference, name=tr("chart.dist_q", lang), marker_color=PALETTE["draft"], opacity=0.6)
    fig.update_layout(barmode="group", height=340)
    return fig

