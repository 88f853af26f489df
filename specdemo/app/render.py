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
import re

from specdemo.engine.captions import round_caption, said, stop_text, tree_end
from specdemo.engine.events import Round, Step, Trace
from specdemo.i18n import EN, template, tr

from .reply import markdown_html

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
# How each kind of token looks (style.TOKENS): its fill, its text, and its mark (underline, strike, outline), on the
# Okabe-Ito hues. Four kinds and a white page cannot all be 3:1 apart in contrast (each step of 3:1 multiplies
# L + 0.05 by 3, and 1.05 / 0.05 leaves room for fewer than three steps), so the three kinds that share the reply
# step from pale to dark, 3:1 apart, and the rejected draft, seen only in the full story, is set apart by its strike.
# docs/decisions.md (2026-11-27, the four kinds on a projector) has the figures.
KIND_STYLE = {
    "accepted": {"fill": "#CDEEE2", "text": "#111111", "mark": "#007A5A"},
    "resampled": {"fill": "#00304F", "text": "#FFFFFF", "mark": "#8FD3FF"},
    "bonus": {"fill": "#AE7400", "text": "#000000", "mark": "#4A3100"},
    "rejected": {"fill": "#FBE3D6", "text": "#7A2E00", "mark": "#D55E00"},
}


def kind_colours(css: str) -> str:
    """`css` with each kind's colours filled in: ACC_FILL, RES_TEXT, BON_MARK, ... (the kind's first three letters
    and the part, KIND_STYLE), so that the text's tokens and the tree's nodes wear the same ones."""
    for kind, style in KIND_STYLE.items():
        for part, colour in style.items():
            css = css.replace(f"{kind[:3].upper()}_{part.upper()}", colour)
    return css


LABELS = ("accepted", "rejected", "resampled", "bonus")
# catalogue keys per label, written out so that tests/test_i18n.py sees every key the code uses
LABEL_KEY = {"accepted": "label.accepted", "rejected": "label.rejected", "resampled": "label.resampled",
             "bonus": "label.bonus"}
CUE_KEY = {"accepted": "cue.accepted", "rejected": "cue.rejected", "resampled": "cue.resampled",
           "bonus": "cue.bonus"}
LEGEND_KEY = {"accepted": "legend.accepted", "rejected": "legend.rejected", "resampled": "legend.resampled",
              "bonus": "legend.bonus"}
# the step-through keys (ui.py's KEYS_JS listens for the same names)
KEYS = {"next": ("\u2192", "PageDown"), "prev": ("\u2190", "PageUp"), "first": ("Home",)}


# bidi embeddings, overrides, isolates and marks: inside a token they would reorder the tokens after it on screen, as
# the spans of the text do not isolate them ("Trojan Source", Boucher and Anderson 2021)
BIDI_CONTROLS = frozenset(map(chr, (*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200E, 0x200F, 0x061C)))


def esc(text: str) -> str:
    """Escape for HTML text and attribute values, and make control characters visible: C0 (except newline and tab),
    DEL, C1 and the bidi controls, as \\xNN or \\uNNNN."""
    def shown(c: str) -> str:
        o = ord(c)
        if c in "\n\t" or (32 <= o < 127 or o > 159) and c not in BIDI_CONTROLS:
            return c
        return f"\\x{o:02x}" if o < 256 else f"\\u{o:04x}"

    return html.escape("".join(map(shown, text)), quote=True)


# what Markdown would read as markup inside a line (`|` would also end a table cell), and what starts gr.Markdown's
# autolinks (GFM's): a `:` after a scheme, an `@` in an address; a `.` after "www" is escaped apart (WWW_DOT)
MD_SPECIAL = "\\`*_[]|~:@"
WWW_DOT = re.compile(r"(?i)(?<=www)\.")


def md_cell(text: str) -> str:
    """Model text (already HTML-escaped) for one cell of a Markdown table or a line of Markdown, shown as it is: a
    backslash, `*`, `_`, `` ` ``, `[`, `]` or `~` would format it, a `|` would end the cell and shift every later
    column, a line break would end the row, and gr.Markdown makes a link of "https://...", "www.x.y" or "a@b.c"
    (on a public Space, a link the model wrote). So each of those characters is escaped, and line breaks become
    spaces."""
    cell = "".join("\\" + c if c in MD_SPECIAL else " " if c in "\r\n" else c for c in text)
    return WWW_DOT.sub(r"\\.", cell)


def trh(key: str, lang: str | None, /, **params) -> str:
    """A catalogue text as HTML: the translation is escaped, and so is every param unless it is already `Html`."""
    filled = {k: v if isinstance(v, Html) else esc(str(v)) for k, v in params.items()}
    return esc(template(key, lang)).format(**filled)


class Html(str):
    """A string that is already HTML (escaped), to pass into `trh` unchanged."""


def visible(text: str) -> str:
    """Newlines and tabs as symbols, for one-line places such as a film-strip row."""
    return text.replace("\n", "\u23ce").replace("\t", "\u21e5")


def fmt(x: float | None, lang: str | None = None) -> str:
    return tr("na", lang) if x is None else f"{x:.4g}"


def token_title(label: str, p, q, r, accept_prob, lang: str | None = None, own: bool = False) -> str:
    """A token's tooltip. own: a round that drafted nothing (a prefill or a lookup fallback), where the target
    chose the token itself, not as a bonus after K accepted drafts."""
    head = tr("tip.own", lang) if own else tr("tip.head", lang, label=tr(LABEL_KEY[label], lang),
                                              cue=tr(CUE_KEY[label], lang))
    lines = [head, tr("tip.p", lang, p=fmt(p, lang))]
    if q is not None:
        lines.append(tr("tip.q", lang, q=fmt(q, lang)))
        if r is not None:  # a tree's walk draws no r: it draws from p, and keeps a child the tree has
            lines.append(tr("tip.r", lang, r=fmt(r, lang)))
        lines.append(tr("tip.keep", lang, a=fmt(accept_prob, lang)))
    return "\n".join(lines)


def kind(rnd: Round, label: str) -> str:
    """How a token of `rnd` is drawn: as its label, except the one token of a round that drafted nothing (a
    prefill, a lookup fallback), which the target chose from its own p, as plain decoding does. Its label is
    "bonus" (the draw after all of zero drafts were kept), but it was not free: it is drawn plain ("own"), not in
    the bonus's amber."""
    return "own" if rnd.k == 0 and label == "bonus" else label


PIECE = "\u00b7"  # what a kept piece of a character shows (CSS .sd-piece draws it in spans; tree_html writes it)


def span(text: str, label: str, title: str, extra: str = "", cls: str = "") -> str:
    """A token as a coloured span. A kept token that adds no text (models.TextStream: it holds only part of a
    character, which a later token completes) shows a dot, drawn by CSS so that the page's text stays the reply."""
    cls += "" if text else " sd-piece"
    return f'<span class="sd-tok sd-{label}{cls}" title="{esc(title)}"{extra}>{esc(text)}</span>'


def kept_texts(rnd: Round) -> list[str]:
    """The texts of a round's accepted drafts, in order, as the reply has them (models.TextStream): where a draft
    on its own is a piece of a character (its bytes as <0xNN>), the reply has "" or the whole character."""
    return [t.text for t in rnd.tokens if t.label == "accepted"]


def legend(lang: str | None = None) -> str:
    """What each colour means; each entry in its own span, so that the reply-as-text view can hide one (CSS)."""
    items = "".join(f'<span class="sd-leg sd-leg-{lbl}">{span(tr(LABEL_KEY[lbl], lang), lbl, tr(CUE_KEY[lbl], lang))}'
                    f" <small>{esc(tr(LEGEND_KEY[lbl], lang))}</small></span>" for lbl in LABELS)
    return f'<div class="sd-legend">{items}</div>'


def keys_hint(lang: str | None = None) -> str:
    """The step-through keys, shown on the page."""
    def keys(names):
        return Html(f" {esc(tr('keys.or', lang))} ".join(f"<kbd>{esc(k)}</kbd>" for k in names))

    return (f'<div class="sd-keys">'
            f'{trh("keys.hint", lang, next=keys(KEYS["next"]), prev=keys(KEYS["prev"]), first=keys(KEYS["first"]))}'
            f"</div>")


def tokens_html(prompt: str, rounds: list[Round] | None = None, steps: list[Step] | None = None,
                upto: int | None = None, lang: str | None = None) -> str:
    """The streamed text, twice: the reply (its kept tokens read as Markdown, reply.py) and the full story (the
    prompt, then one span per token event, the rejected drafts too); the page shows one (page_js.VIEW_JS). `upto` limits
    to the first rounds."""
    prompt_tip = esc(tr("tip.prompt", lang))
    story = [f'<span class="sd-prompt" title="{prompt_tip}">{esc(prompt)}</span>']
    chips: dict[int, tuple[str, str, str]] = {}  # a kept token's (label, title, attributes), by its place
    kept: list[tuple[str, int]] = [(prompt, -1)]
    for rnd in (rounds or [])[:upto]:
        eos = rnd.output[-1] if rnd.stop_reason == "eos" and rnd.output else None  # the end-of-text token
        for t in rnd.tokens:
            where = tr("tip.where", lang, round=rnd.index + 1, position=t.position) + "\n"
            title = where + token_title(t.label, t.p, t.q, t.r, t.accept_prob, lang, own=rnd.k == 0)
            title += "" if t.text else "\n" + tr("tip.piece", lang)
            attrs = f' data-round="{rnd.index}"'
            story.append(span(t.text, kind(rnd, t.label), title, attrs, " sd-eos" if t is eos else ""))
            if t.label != "rejected" and t is not eos:
                chips[len(chips)] = (kind(rnd, t.label), title, attrs)
                kept.append((t.text, len(chips) - 1))
    for s in steps or []:
        story.append(span(s.token.text, "accepted",
                          tr("tip.baseline", lang, n=s.index + 1) + "\n" + tr("tip.p", lang, p=fmt(s.token.p, lang))))

    def chip(key: int, text: str, styles: tuple[str, ...]) -> str:
        if key == -1:
            cls = "".join(" " + c for c in styles)
            return f'<span class="sd-prompt{cls}" title="{prompt_tip}">{esc(text)}</span>'
        label, title, attrs = chips[key]
        return span(text, label, title, attrs, "".join(" " + c for c in styles))

    entries = [(c, key) for text, key in kept for c in (text if text or key < 0 else [""])]
    return (f'<div class="sd-text"><div class="sd-reply">{markdown_html(entries, chip)}</div>'
            f'<div class="sd-tokens">{"".join(story)}</div></div>')


def filmstrip_html(rounds: list[Round], selected: int | None = None, lang: str | None = None) -> str:
    """One row per round, as the papers draw it: the K drafts, coloured by verdict, then the token the target added."""
    if not rounds:
        return f'<div class="sd-film"><i>{esc(tr("film.empty", lang))}</i></div>'
    unchecked = esc(tr("film.unchecked", lang))
    rows = []
    for rnd in rounds:
        cells, kept = [], kept_texts(rnd)
        for i, d in enumerate(rnd.drafts):
            if d.accepted:
                label = "accepted"
            elif d.checked:
                label = "rejected"
            else:
                cells.append(f'<span class="sd-cell sd-unchecked" title="{unchecked}">{esc(visible(d.text))}</span>')
                continue
            text = kept[i] if d.accepted and i < len(kept) else d.text  # a kept draft: what it adds to the reply
            cells.append(span(visible(text), label, token_title(label, d.p, d.q, d.r, d.accept_prob, lang)))
        added = [t for t in rnd.tokens if t.label in ("resampled", "bonus")]
        if added:
            t = added[0]
            cells.append(" \u2192 " + span(visible(t.text), kind(rnd, t.label),
                                           token_title(t.label, t.p, None, None, None, lang, own=rnd.k == 0)))
        verdict = tr("film.kept", lang, n=rnd.n_accepted, k=rnd.k) + (" +1" if added else "")
        if rnd.tree:  # a draft tree: its size, and the depth of the target's path through it
            verdict = tr("film.tree", lang, k=rnd.k, n=rnd.n_accepted) + (" +1" if added else "")
        elif rnd.k == 0 and rnd.source in SOURCE_FILM_KEY:  # nothing drafted: the tag says what the target did
            verdict = tr(SOURCE_FILM_KEY[rnd.source], lang)
        elif rnd.source == "lookup":  # where prompt lookup copied its proposal from (a position in prompt + output)
            verdict = tr("film.copied", lang, pos=rnd.copied_from, n=rnd.ngram) + " \u00b7 " + verdict
        elif rnd.source in SOURCE_FILM_KEY:  # who proposed, where it is not the draft model
            verdict = tr(SOURCE_FILM_KEY[rnd.source], lang) + " \u00b7 " + verdict
        verdict += f" \u00b7 {rnd.ms:.0f} ms"
        cls = "sd-row" + (" sd-row-tree" if rnd.tree else "") + (" sd-selected" if selected == rnd.index else "")
        rows.append(f'<div class="{cls}" data-round="{rnd.index}" role="button" tabindex="0">'
                    f"<b>{trh('film.round', lang, n=rnd.index + 1)}</b><span>{''.join(cells)}</span>"
                    f"<span>{esc(verdict)}</span></div>")
    return f'<div class="sd-film">{"".join(rows)}</div>'


# the stats cards: each one's label (the exact term), and its tooltip in plain words
CARD_KEY = {"spec_tps": "stats.spec_tps", "calls": "stats.calls", "alpha": "stats.alpha", "per_call": "stats.per_call",
            "base_tps": "stats.base_tps", "speedup": "stats.speedup", "not_measured": "stats.not_measured"}
CARD_TIP_KEY = {"spec_tps": "tip.stat_spec_tps", "calls": "tip.stat_calls", "alpha": "tip.stat_alpha",
                "per_call": "tip.stat_per_call", "base_tps": "tip.stat_base_tps", "speedup": "tip.stat_speedup",
                "not_measured": "tip.stat_speedup"}
WAIT_KEY = {"pending": "stats.pending", "stopped": "stats.stopped"}  # a waiting card's word
WAIT_TIP_KEY = {"pending": "tip.pending", "stopped": "tip.stopped"}  # and what its tooltip adds
RECORDED_TIP_KEY = {True: "tip.recorded_tree", False: "tip.recorded_chain"}  # the recorded note's terms, plainly


def card(value: str, name: str, lang: str | None = None, pending: bool = False, stopped: bool = False) -> str:
    """A stats card (CARD_KEY's `name`): its figure, its label, and a tooltip in plain words; a pending card (the
    baseline still runs) shows no figure, and says what it waits for; a stopped one (Stop during the baseline) says
    that the figure will not come."""
    wait = "pending" if pending else "stopped" if stopped else ""
    tip = tr(CARD_TIP_KEY[name], lang) + ("\n" + tr(WAIT_TIP_KEY[wait], lang) if wait else "")
    label = tr(CARD_KEY[name], lang) + (" \u00b7 " + tr(WAIT_KEY[wait], lang) if wait else "")
    cls = f"sd-card sd-{wait}" if wait else "sd-card"
    return f'<div class="{cls}" title="{esc(tip)}"><b>{esc(value)}</b><span>{esc(label)}</span></div>'


def stats_html(spec: Trace | None, base: Trace | None = None, running: str = "", lang: str | None = None,
               pending: bool = False, stopped: bool = False, progress: tuple[int, int] | None = None) -> str:
    """The live numbers: tokens/s of both runs, the measured speedup, target calls, alpha, accepted length; under them
    one line: the recorded run's note, the run's status, or the baseline's progress. pending: the baseline is
    running, so its two cards wait (a speed-up from part of it would move as it runs), and `progress` (tokens done,
    tokens asked for) draws its bar; stopped: Stop ended the baseline, so they say that no figure comes.

    The cards sit in one row of fixed height and the line under them has a fixed height too (style.PAGE), whatever
    they hold: nothing above the reply moves while a run streams."""
    cards = []
    if spec is not None and spec.rounds:
        m = spec.metrics()
        cards += [card(f"{m['tokens_per_s']:.1f}", "spec_tps", lang),
                  card(f"{m['target_calls']} / {m['target_calls_saved']}", "calls", lang),
                  card(f"{m['alpha_empirical']:.2f}", "alpha", lang),
                  card(f"{m['mean_accepted_length']:.2f}", "per_call", lang)]
    if pending or stopped:
        figure = "\u2026" if pending else "\u2014"
        cards += [card(figure, name, lang, pending, stopped) for name in ("base_tps", "speedup")]
    elif base is not None and base.steps:
        bm = base.metrics()
        cards.append(card(f"{bm['tokens_per_s']:.1f}", "base_tps", lang))
        if spec is not None and spec.rounds and bm["tokens_per_s"] > 0:
            cards.append(card(f"{spec.metrics()['tokens_per_s'] / bm['tokens_per_s']:.2f}\u00d7", "speedup",
                              lang))
    elif spec is not None and spec.settings.get("baseline") == "not measured":  # runs.run_stream: the time limit
        cards.append(card("\u2014", "not_measured", lang))
    line = ""
    if spec is not None and spec.metrics()["lossy"]:
        line = f'<span class="sd-lossy">{esc(tr("stats.lossy", lang))}</span> '
    if spec is not None and spec.settings.get("recorded") is not None:  # recorded.py: the run the page opens on
        line += recorded_note(spec, lang)
    elif progress is not None:
        line += progress_bar(*progress, running)
    elif running:
        line += f'<span class="sd-status">{esc(running)}</span>'
    return f'<div class="sd-cards">{"".join(cards)}</div><div class="sd-line">{line}</div>'


def progress_bar(done: int, total: int, label: str) -> str:
    """The baseline's progress, drawn in the stats' own line with every update (gradio's tracker, redrawn between
    a generator's updates, blinked: shown in 27 of 45 samples), so it shows steadily until the baseline ends."""
    pct = 100 * min(done, total) / total if total else 0
    return (f'<div class="sd-bar" role="progressbar" aria-valuemin="0" aria-valuemax="{total}" '
            f'aria-valuenow="{done}" aria-label="{esc(label)}"><div class="sd-bar-fill" style="width: {pct:.1f}%">'
            f'</div><span>{esc(label)}</span></div>')


# The CPU's bf16 matrix units, as the recorded note names them: the recorded speed-up depends on them (with AMX a
# verify is nearly free; without bf16 units it costs about two target steps).
CPU_UNITS_KEY = {"amx": "stats.cpu_amx", "avx512_bf16": "stats.cpu_avx512_bf16", "none": "stats.cpu_none"}


def recorded_note(spec: Trace, lang: str | None = None) -> str:
    """A recorded run says so, with the settings it was made with (K, or a tree's sizes) and when and where
    (recorded.py)."""
    s, rec = spec.settings, spec.settings.get("recorded") or {}
    strategy = s.get("strategy", "fixed")
    name = tr(f"strategy.{strategy}", lang) if f"strategy.{strategy}" in EN else strategy
    device = rec.get("device", "cpu")
    units = CPU_UNITS_KEY.get(rec.get("cpu_bf16"))  # devices.cpu_bf16_kind where it was recorded (none: an old one)
    units = tr(units, lang) if units else ""
    machine = (tr("stats.recorded_cpu", lang, cpu=rec.get("cpu", "?"), units=units, threads=rec.get("threads", "?"))
               if device == "cpu" else device)
    if strategy == "tree" and "tree_budget" in s:
        size = tr("stats.recorded_tree", lang, topk=s["tree_topk"], depth=s["tree_depth"], budget=s["tree_budget"])
        if s.get("tree_prune_below"):
            size = tr("stats.recorded_pruned", lang, tree=size, prune=f"{s['tree_prune_below']:g}")
    else:
        size = f"K = {s.get('k', '?')}"  # a symbol in any language
    text = tr("stats.recorded", lang, pair=s.get("pair", "?"), strategy=name, size=size,
              t=f"{s.get('temperature', 0):g}", seed=s.get("seed", "?"), date=rec.get("date", "?"), machine=machine)
    tip = tr(RECORDED_TIP_KEY[strategy == "tree"], lang)
    return f'<span class="sd-recorded" title="{esc(tip)}">{esc(text)}</span>'


def done_status(spec: Trace, lang: str | None = None) -> str:
    return tr("status.done", lang, reason=stop_text(spec.stop_reason, lang))


def reason(rnd: Round, position: int, lang: str | None = None) -> str:
    """One line (HTML) on why the token at `position` (1-based) was kept, rejected or added."""
    if rnd.tree:
        return tree_reason(rnd, position, lang)
    if position <= len(rnd.drafts):
        d = rnd.drafts[position - 1]
        x = said(d.text, lang)
        if not d.checked:
            return trh("reason.never_checked", lang, x=x)
        if d.accepted:
            why = (tr("reason.always", lang) if d.p >= d.q
                   else f"r = {d.r:.3g} < p/q = {d.accept_prob:.3g}")
            return trh("reason.accepted", lang, x=x, p=f"{d.p:.3g}", q=f"{d.q:.3g}", why=why)
        added = next((t for t in rnd.tokens if t.label == "resampled"), None)
        then = Html(trh("reason.resampled", lang, y=said(added.text, lang)) if added else "")
        return trh("reason.rejected", lang, x=x, p=f"{d.p:.3g}", q=f"{d.q:.3g}", r=f"{d.r:.3g}",
                   ratio=f"{d.accept_prob:.3g}", then=then)
    bonus = next((t for t in rnd.tokens if t.label == "bonus"), None)
    if bonus and rnd.k == 0 and rnd.source in PLAIN_REASON_KEY:  # nothing drafted: the target chose it itself
        return trh(PLAIN_REASON_KEY[rnd.source], lang, y=said(bonus.text, lang))
    if bonus:
        return trh("reason.bonus", lang, k=rnd.k, pos=rnd.k + 1, y=said(bonus.text, lang))
    return trh("reason.no_bonus", lang)


# rounds not drafted by the draft model: their film-strip tag, and the caption of a round that proposed nothing
SOURCE_FILM_KEY = {"fallback": "film.fallback", "prefill": "film.prefill", "eagle": "film.eagle"}
PLAIN_REASON_KEY = {"fallback": "reason.fallback", "prefill": "reason.prefill"}


def step_caption(rounds: list[Round], cursor: int, lang: str | None = None) -> str:
    """The step-through caption (Markdown text; the numbers and the catalogue's words carry no markup, and the round's
    caption, which quotes tokens, is escaped for HTML and Markdown: gr.Markdown draws HTML)."""
    if not rounds:
        return tr("step.generate_first", lang)
    if cursor == 0:
        return tr("step.before", lang, n=len(rounds))
    caption = md_cell(esc(round_caption(rounds[cursor - 1], lang)))  # its quoted tokens are model text
    return tr("step.round", lang, i=cursor, n=len(rounds), caption=caption)


# ------------------------------------------------------------------------------------------------ draft trees


def tree_reason(rnd: Round, position: int, lang: str | None = None) -> str:
    """Why the token at `position` of a tree round's path was kept, or refused, or added (the walk of tree.py)."""
    end = tree_end(rnd)
    if position <= len(rnd.drafts):
        d = rnd.drafts[position - 1]
        if d.accepted:
            return trh("reason.tree_path", lang, x=said(d.text, lang), p=f"{d.p:.3g}", q=f"{d.q:.3g}")
        y = said(end.text, lang) if end is not None else "?"
        return trh("reason.tree_refused", lang, x=said(d.text, lang), q=f"{d.q:.3g}", p=f"{d.p:.3g}", y=y)
    if end is not None and end.label == "bonus":
        return trh("reason.tree_bonus", lang, n=rnd.n_accepted, y=said(end.text, lang))
    return trh("reason.no_bonus", lang)
