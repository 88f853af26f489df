"""Plotly figures, built from events: the race, acceptance per round, accepted lengths, acceptance by position,
measured speedup against theory, the round inspector (p, q, residual), the K sweep and the distribution check.

Owns figure construction only; no gradio import, no model calls. Every label that comes from a model is plain text
in plotly (which escapes it); nothing here writes HTML.
"""

from __future__ import annotations

import plotly.graph_objects as go

from .events import Round, Trace
from .render import PALETTE
from .theory import best_k, measure, predicted_speedup

LAYOUT = dict(template="plotly_white", height=300, margin=dict(l=50, r=20, t=50, b=45),
              legend=dict(orientation="h", y=-0.25), font=dict(size=12))


def _fig(title: str, x: str, y: str) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(title=dict(text=title, x=0.02), xaxis_title=x, yaxis_title=y, **LAYOUT)
    return fig


def race(spec: Trace | None, base: Trace | None) -> go.Figure:
    """Tokens generated against wall time, for both runs, each from its own start."""
    fig = _fig("Race: tokens generated over time", "seconds since start", "tokens")
    if spec is not None and spec.rounds:
        xs, ys, n = [0.0], [0], 0
        for r in spec.rounds:
            n += len(r.output)
            xs.append(r.elapsed_s)
            ys.append(n)
        fig.add_scatter(x=xs, y=ys, mode="lines+markers", name="speculative", line=dict(color=PALETTE["accepted"],
                        shape="hv", width=3), marker=dict(size=5))
    if base is not None and base.steps:
        fig.add_scatter(x=[0.0] + [s.elapsed_s for s in base.steps], y=list(range(len(base.steps) + 1)),
                        mode="lines", name="target only", line=dict(color=PALETTE["baseline"], shape="hv", width=2))
    return fig


RACE_COLOURS = {"target only": "baseline", "adaptive": "accepted", "lookup": "bonus"}


def strategy_race(runs: dict[str, list[tuple[float, int]]]) -> go.Figure:
    """Tokens generated against wall time for each run of the strategy race: {label: [(seconds, tokens), ...]}."""
    fig = _fig("Strategy race: tokens generated over time", "seconds since start", "tokens")
    for label, points in runs.items():
        colour = PALETTE.get(RACE_COLOURS.get(label, "target"), None)
        fig.add_scatter(x=[0.0] + [p[0] for p in points], y=[0] + [p[1] for p in points], mode="lines",
                        name=label, line=dict(color=colour, shape="hv", width=3 if label != "target only" else 2))
    return fig


def acceptance_per_round(spec: Trace | None) -> go.Figure:
    fig = _fig("Drafts accepted per round", "round", "accepted of K")
    if spec is not None and spec.rounds:
        rs = spec.rounds
        fig.add_bar(x=[r.index + 1 for r in rs], y=[r.n_accepted for r in rs], name="accepted",
                    marker_color=PALETTE["accepted"])
        fig.add_bar(x=[r.index + 1 for r in rs], y=[r.k - r.n_accepted for r in rs], name="not accepted",
                    marker_color=PALETTE["rejected"], marker_pattern_shape="/")
        fig.update_layout(barmode="stack")
    return fig


def accepted_length_histogram(spec: Trace | None) -> go.Figure:
    fig = _fig("Tokens per target call", "tokens emitted in a round", "rounds")
    if spec is not None and spec.rounds:
        lengths = [len(r.output) for r in spec.rounds]
        k = max(r.k for r in spec.rounds)
        counts = [lengths.count(i) for i in range(1, k + 2)]
        fig.add_bar(x=list(range(1, k + 2)), y=counts, marker_color=PALETTE["target"], name="rounds")
        fig.update_xaxes(dtick=1)
    return fig


def acceptance_by_position(spec: Trace | None) -> go.Figure:
    """P(accept | judged) at each draft position 1..K, with the overlap sum min(p, q) beside it."""
    fig = _fig("Acceptance by draft position", "draft position", "rate")
    if spec is not None and spec.rounds:
        k = max(r.k for r in spec.rounds)
        acc, ovl, n = [], [], []
        for pos in range(1, k + 1):
            judged = [d for r in spec.rounds for d in r.drafts if d.position == pos and d.checked]
            n.append(len(judged))
            acc.append(sum(d.accepted for d in judged) / len(judged) if judged else None)
            ovl.append(sum(d.overlap for d in judged) / len(judged) if judged else None)
        xs = list(range(1, k + 1))
        fig.add_bar(x=xs, y=acc, name="accepted / judged", marker_color=PALETTE["accepted"],
                    text=[f"n={c}" for c in n], textposition="outside")
        fig.add_scatter(x=xs, y=ovl, name="mean sum min(p, q)", mode="lines+markers",
                        line=dict(color=PALETTE["draft"], dash="dash"))
        fig.update_yaxes(range=[0, 1.15])
        fig.update_xaxes(dtick=1)
    return fig


def speedup_vs_theory(spec: Trace | None, base: Trace | None, k_max: int = 12) -> go.Figure:
    fig = _fig("Speedup: measured vs theory over K", "K (drafts per round)", "speedup over target only")
    if spec is None or not spec.rounds or base is None or not base.steps:
        fig.add_annotation(text="Run with the baseline on to measure c and compare with theory.", showarrow=False,
                           x=0.5, y=0.5, xref="paper", yref="paper")
        return fig
    model = measure(spec.rounds, base.steps, spec.settings["k"])
    a, c, v = model["alpha_empirical"], model["c"], model["verify_cost"]
    ks = list(range(1, k_max + 1))
    fig.add_scatter(x=ks, y=[predicted_speedup(a, k, c) for k in ks], mode="lines",
                    name=f"E/(cK+1), alpha={a:.2f}, c={c:.3f}", line=dict(color=PALETTE["target"]))
    fig.add_scatter(x=ks, y=[predicted_speedup(a, k, c, v) for k in ks], mode="lines",
                    line=dict(dash="dot", color=PALETTE["draft"]), name=f"with measured verify cost {v:.2f}")
    kb, sb = best_k(a, c, k_max)
    fig.add_scatter(x=[kb], y=[sb], mode="markers+text", text=[f"best K={kb}"], textposition="top center",
                    marker=dict(symbol="star", size=14, color=PALETTE["bonus"]), name="best K (theory)")
    measured = spec.metrics()["tokens_per_s"] / base.metrics()["tokens_per_s"]
    fig.add_scatter(x=[spec.settings["k"]], y=[measured], mode="markers", name="measured",
                    marker=dict(symbol="diamond", size=13, color=PALETTE["accepted"]))
    fig.add_hline(y=1.0, line=dict(color="#999", width=1))
    return fig


def inspector(rnd: Round, position: int, top: int = 10) -> go.Figure:
    """Top tokens at one position of a round: p (target), q (draft) and the normalised residual max(0, p - q)."""
    if position <= len(rnd.drafts):
        d = rnd.drafts[position - 1]
        cands, chosen, overlap = d.top, d.text, d.overlap
        title = f"Round {rnd.index + 1}, position {position}: draft proposed {d.text!r}"
    else:
        cands, chosen, overlap = rnd.bonus_top, None, None
        title = f"Round {rnd.index + 1}, bonus position {position}: target's own p"
    cands = cands[:top]
    fig = _fig(title, "token", "probability")
    labels = [repr(c.text)[1:-1] or "(empty)" for c in cands]
    # identical texts (different ids) would share a bar; make them distinct
    labels = [f"{lbl} #{c.token_id}" if labels.count(lbl) > 1 else lbl for lbl, c in zip(labels, cands, strict=True)]
    fig.add_bar(x=labels, y=[c.p for c in cands], name="p target", marker_color=PALETTE["target"])
    fig.add_bar(x=labels, y=[c.q for c in cands], name="q draft", marker_color=PALETTE["draft"],
                marker_pattern_shape="/")
    if overlap is not None and overlap < 1 - 1e-6:
        res = [max(0.0, c.p - c.q) / (1 - overlap) for c in cands]
        fig.add_bar(x=labels, y=res, name="residual norm(max(0, p-q))", marker_color=PALETTE["residual"],
                    marker_pattern_shape=".")
    if chosen is not None:
        label = repr(chosen)[1:-1] or "(empty)"
        if label in labels:
            top_y = max(max(c.p, c.q) for c in cands)
            fig.add_annotation(x=label, y=top_y, text="drafted", showarrow=True, arrowhead=2)
    fig.update_layout(barmode="group", height=340)
    return fig


def inspector_empty() -> go.Figure:
    fig = _fig("Round inspector", "token", "probability")
    fig.add_annotation(text="Generate, then click a round in the film strip.", showarrow=False, x=0.5, y=0.5,
                       xref="paper", yref="paper")
    return fig


def k_sweep(results: list[dict], alpha: float | None, c: float | None) -> go.Figure:
    """Measured speedup per K (results: [{k, speedup, alpha}]), with the theory curve from the sweep's alpha and c."""
    fig = _fig("K sweep: measured vs predicted speedup", "K", "speedup over target only")
    if results:
        fig.add_scatter(x=[r["k"] for r in results], y=[r["speedup"] for r in results], mode="lines+markers",
                        name="measured", line=dict(color=PALETTE["accepted"], width=3))
    if results and alpha is not None and c is not None:
        ks = list(range(1, max(r["k"] for r in results) + 1))
        fig.add_scatter(x=ks, y=[predicted_speedup(alpha, k, c) for k in ks], mode="lines", name="E/(cK+1)",
                        line=dict(color=PALETTE["target"], dash="dash"))
    fig.add_hline(y=1.0, line=dict(color="#999", width=1))
    fig.update_xaxes(dtick=1)
    return fig


def distribution(tokens: list[str], target_p: list[float], freq: list[float], reference: list[float] | None,
                 title: str) -> go.Figure:
    fig = _fig(title, "token", "probability")
    labels = [repr(t)[1:-1] or "(empty)" for t in tokens]
    labels = [f"{lbl} #{i}" if labels.count(lbl) > 1 else lbl for i, lbl in enumerate(labels)]
    fig.add_bar(x=labels, y=target_p, name="target p (exact)", marker_color=PALETTE["target"])
    fig.add_bar(x=labels, y=freq, name="speculative samples", marker_color=PALETTE["accepted"],
                marker_pattern_shape="/")
    if reference is not None:
        fig.add_bar(x=labels, y=reference, name="draft q", marker_color=PALETTE["draft"], opacity=0.6)
    fig.update_layout(barmode="group", height=340)
    return fig

