"""HTML for the token view, the film strip, the stats cards and the round inspector's caption.

Owns every piece of HTML that specdemo produces, built only from events (never by searching the text), with every
model- or user-supplied string passed through `esc` (html.escape plus visible control characters), tooltips
included. No gradio import: the UI only places these strings.

The palette is Okabe & Ito's colour-blind-safe set, and every label has a second, non-colour cue:
accepted plain on green, rejected struck through on vermillion, resampled underlined on blue, bonus bold with a
dotted outline on yellow.
"""

from __future__ import annotations

import html

from .events import Round, Step, Trace

PALETTE = {  # Okabe-Ito colours (Okabe & Ito 2008, "Color Universal Design")
    "accepted": "#009E73",
    "rejected": "#D55E00",
    "resampled": "#0072B2",
    "bonus": "#E69F00",
    "draft": "#CC79A7",
    "target": "#0072B2",
    "residual": "#D55E00",
    "baseline": "#555555",
}
CUE = {
    "accepted": "kept by the target",
    "rejected": "struck through: the target rejected this draft",
    "resampled": "underlined: drawn from the residual max(0, p - q)",
    "bonus": "bold: a free token from the target after all K were accepted",
}

CSS = """
.sd-tokens { white-space: pre-wrap; word-break: break-word; font-family: ui-monospace, SFMono-Regular, Menlo,
  monospace; font-size: 15px; line-height: 1.9; padding: 10px 12px; border-radius: 8px; min-height: 6em;
  background: var(--block-background-fill, #fff); border: 1px solid var(--border-color-primary, #ddd); }
.sd-prompt { color: var(--body-text-color-subdued, #666); }
.sd-tok { border-radius: 3px; padding: 1px 0; cursor: help; color: #111; }
.sd-accepted { background: #009E7333; border-bottom: 2px solid #009E73; }
.sd-rejected { background: #D55E0026; text-decoration: line-through; text-decoration-thickness: 2px;
  text-decoration-color: #D55E00; color: #7a2e00; }
.sd-resampled { background: #0072B233; text-decoration: underline; text-decoration-thickness: 2px;
  text-decoration-color: #0072B2; }
.sd-bonus { background: #E69F0040; font-weight: 700; outline: 1px dotted #9a6a00; }
.sd-legend { display: flex; flex-wrap: wrap; gap: 10px; font-size: 13px; margin: 6px 0; }
.sd-legend .sd-tok { padding: 1px 6px; }
.sd-cards { display: grid; grid-template-columns: repeat(auto-fit, minmax(130px, 1fr)); gap: 8px; }
.sd-card { border: 1px solid var(--border-color-primary, #ddd); border-radius: 8px; padding: 6px 10px; }
.sd-card b { display: block; font-size: 20px; }
.sd-card span { font-size: 12px; color: var(--body-text-color-subdued, #666); }
.sd-film { font-family: ui-monospace, monospace; font-size: 13px; max-height: 420px; overflow-y: auto; }
.sd-row { display: grid; grid-template-columns: 3.5em 1fr 14em; gap: 8px; align-items: center;
  padding: 3px 6px; border-bottom: 1px solid #8882; cursor: pointer; white-space: pre; overflow: hidden; }
.sd-row:hover, .sd-row.sd-selected { background: #0072B21a; }
.sd-row .sd-unchecked { color: #999; font-style: italic; }
.sd-cell { border: 1px solid #8886; border-radius: 3px; margin-right: 2px; padding: 0 3px; }
.sd-caption { font-size: 15px; padding: 4px 0; }
.sd-lossy { color: #D55E00; font-weight: 700; }
"""


def esc(text: str) -> str:
    """Escape for HTML text and attribute values, and make control characters visible (except newline/tab)."""
    shown = "".join(
        c if c in "\n\t" or (ord(c) >= 32 and ord(c) != 127) else f"\\x{ord(c):02x}" for c in text
    )
    return html.escape(shown, quote=True)


def visible(text: str) -> str:
    """Newlines and tabs as symbols, for one-line places such as a film-strip row."""
    return text.replace("\n", "\u23ce").replace("\t", "\u21e5")


def fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4g}"


def token_title(label: str, p, q, r, accept_prob) -> str:
    lines = [f"{label}: {CUE[label]}", f"p(x) target = {fmt(p)}"]
    if q is not None:
        lines += [f"q(x) draft = {fmt(q)}", f"r = {fmt(r)}", f"min(1, p/q) = {fmt(accept_prob)}"]
    return "\n".join(lines)


def span(text: str, label: str, title: str, extra: str = "") -> str:
    return f'<span class="sd-tok sd-{label}" title="{esc(title)}"{extra}>{esc(text)}</span>'


def legend() -> str:
    items = "".join(span(lbl, lbl, CUE[lbl]) + f"<small>{esc(CUE[lbl].split(':')[0])}</small>" for lbl in CUE)
    return f'<div class="sd-legend">{items}</div>'


def tokens_html(prompt: str, rounds: list[Round] | None = None, steps: list[Step] | None = None,
                upto: int | None = None) -> str:
    """The streamed text: the prompt, then one span per token event. `upto` limits to the first rounds."""
    parts = [f'<span class="sd-prompt" title="prompt">{esc(prompt)}</span>']
    for rnd in (rounds or [])[:upto]:
        for t in rnd.tokens:
            where = f"round {rnd.index + 1}, position {t.position}\n"
            title = where + token_title(t.label, t.p, t.q, t.r, t.accept_prob)
            parts.append(span(t.text, t.label, title, f' data-round="{rnd.index}"'))
    for s in steps or []:
        parts.append(span(s.token.text, "accepted", f"token {s.index + 1}\np(x) target = {fmt(s.token.p)}"))
    return f'<div class="sd-tokens">{"".join(parts)}</div>'


def filmstrip_html(rounds: list[Round], selected: int | None = None) -> str:
    """One row per round, as the papers draw it: the K drafts, coloured by verdict, then the token the target added."""
    if not rounds:
        return '<div class="sd-film"><i>Rounds appear here as they run. Click a row to inspect it.</i></div>'
    rows = []
    for rnd in rounds:
        cells = []
        for d in rnd.drafts:
            if d.accepted:
                label = "accepted"
            elif d.checked:
                label = "rejected"
            else:
                cells.append(f'<span class="sd-cell sd-unchecked" title="never checked: an earlier draft was '
                             f'rejected">{esc(visible(d.text))}</span>')
                continue
            cells.append(span(visible(d.text), label, token_title(label, d.p, d.q, d.r, d.accept_prob)))
        added = [t for t in rnd.tokens if t.label in ("resampled", "bonus")]
        if added:
            t = added[0]
            cells.append(" \u2192 " + span(visible(t.text), t.label, token_title(t.label, t.p, None, None, None)))
        verdict = f"kept {rnd.n_accepted}/{rnd.k}" + (" +1" if added else "")
        if rnd.source == "lookup":  # where prompt lookup copied its proposal from (a position in prompt + output)
            verdict = f"copied from token {rnd.copied_from} ({rnd.ngram}-gram match) \u00b7 " + verdict
        elif rnd.source == "fallback":
            verdict = "nothing to copy: one target step \u00b7 " + verdict
        verdict += f" \u00b7 {rnd.draft_ms + rnd.verify_ms + rnd.overhead_ms:.0f} ms"
        cls = "sd-row sd-selected" if selected == rnd.index else "sd-row"
        rows.append(f'<div class="{cls}" data-round="{rnd.index}" role="button" tabindex="0">'
                    f"<b>R{rnd.index + 1}</b><span>{''.join(cells)}</span><span>{esc(verdict)}</span></div>")
    return f'<div class="sd-film">{"".join(rows)}</div>'


def card(value: str, label: str) -> str:
    return f'<div class="sd-card"><b>{esc(value)}</b><span>{esc(label)}</span></div>'


def stats_html(spec: Trace | None, base: Trace | None = None, running: str = "") -> str:
    """The live numbers: tokens/s of both runs, the measured speedup, target calls, alpha, accepted length."""
    cards = []
    if spec is not None and spec.rounds:
        m = spec.metrics()
        cards += [
            card(f"{m['tokens_per_s']:.1f}", "speculative tokens/s"),
            card(f"{m['target_calls']} / {m['target_calls_saved']}", "target calls used / saved"),
            card(f"{m['alpha_empirical']:.2f}", "alpha (accepted / judged)"),
            card(f"{m['mean_accepted_length']:.2f}", "tokens per target call"),
        ]
    if base is not None and base.steps:
        bm = base.metrics()
        cards.append(card(f"{bm['tokens_per_s']:.1f}", "baseline tokens/s"))
        if spec is not None and spec.rounds and bm["tokens_per_s"] > 0:
            cards.append(card(f"{spec.metrics()['tokens_per_s'] / bm['tokens_per_s']:.2f}\u00d7", "measured speedup"))
    note = ""
    if spec is not None and spec.metrics()["lossy"]:
        note = '<div class="sd-lossy">Lossy run: lenience b &lt; 1, so the output does not follow the target.</div>'
    status = f"<div><small>{esc(running)}</small></div>" if running else ""
    return f'{note}<div class="sd-cards">{"".join(cards)}</div>{status}'


def reason(rnd: Round, position: int) -> str:
    """One line on why the token at `position` (1-based) was kept, rejected or added."""
    if position <= len(rnd.drafts):
        d = rnd.drafts[position - 1]
        x = esc(repr(d.text))
        if not d.checked:
            return f"Draft {x} was never checked: an earlier draft in this round was rejected."
        if d.accepted:
            why = "p \u2265 q, so it is always kept" if d.p >= d.q else f"r = {d.r:.3g} < p/q = {d.accept_prob:.3g}"
            return f"Accepted {x}: p = {d.p:.3g}, q = {d.q:.3g}; {why}."
        added = next((t for t in rnd.tokens if t.label == "resampled"), None)
        then = f" and resampled {esc(repr(added.text))} from norm(max(0, p \u2212 q))" if added else ""
        return (f"Rejected {x}: p = {d.p:.3g} < q = {d.q:.3g} and r = {d.r:.3g} \u2265 p/q = {d.accept_prob:.3g}"
                f"{then}. The residual only puts mass where the target wants more than the draft gave, which is "
                f"what makes the output follow p exactly.")
    bonus = next((t for t in rnd.tokens if t.label == "bonus"), None)
    if bonus:
        return (f"All {rnd.k} drafts were accepted, so the target's own p at position {rnd.k + 1} gave a bonus "
                f"token {esc(repr(bonus.text))}.")
    return "No bonus at this position: the round ended earlier."
