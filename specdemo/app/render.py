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
import json

from specdemo.engine.captions import round_caption, said, stop_text, tree_end
from specdemo.engine.events import Round, Step, Trace
from specdemo.i18n import CHOICES, DEFAULT, EN, template, tr

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
.sd-piece::after { content: "\\00b7"; opacity: 0.6; }  /* a piece of a character: render.PIECE */
.sd-legend { display: flex; flex-wrap: wrap; gap: 10px; font-size: 13px; margin: 6px 0; }
.sd-legend .sd-tok { padding: 1px 6px; }
.sd-leg { white-space: nowrap; }
/* the reply as text (ui.VIEW_JS): the rejected drafts, and their legend entry, show only in the full story */
body:not(.sd-story) .sd-tokens .sd-rejected, body:not(.sd-story) .sd-legend .sd-leg-rejected { display: none; }
body:not(.sd-story) .sd-tokens .sd-eos { display: none; }  /* the end-of-text token is no part of the reply */
/* the first screen (1280x720): a compact header, and a token view that ends above the fold */
#sd-intro h1 { font-size: 1.6em; margin: 0 0 2px; }
#sd-lang, #sd-view { display: flex; flex-direction: row; align-items: center; gap: 10px; padding-top: 4px;
  padding-bottom: 4px; }
#sd-lang > [data-testid="block-info"], #sd-view > [data-testid="block-info"] { margin: 0; }
#sd-token-view .html-container { max-height: max(220px, min(420px, calc(100vh - 380px))) !important; }
body:has(#sd-notice) #sd-token-view .html-container {  /* the sentence on a missing default pair takes room */
  max-height: max(200px, min(420px, calc(100vh - 440px))) !important; }
#sd-intro p { margin: 0; }
#sd-notice { border-left: 4px solid #E69F00; padding-left: 8px; }
.sd-cards { display: grid; grid-template-columns: repeat(auto-fit, minmax(118px, 1fr)); gap: 8px; }
.sd-card { border: 1px solid var(--border-color-primary, #ddd); border-radius: 8px; padding: 4px 10px; }
.sd-card b { display: block; font-size: 19px; }
.sd-card span { font-size: 12px; color: var(--body-text-color-subdued, #666); }
.sd-film { font-family: ui-monospace, monospace; font-size: 13px; max-height: 420px; overflow-y: auto; }
.sd-row { display: grid; grid-template-columns: 4.5em 1fr 14em; gap: 8px; align-items: center;
  padding: 3px 6px; border-bottom: 1px solid #8882; cursor: pointer; white-space: pre; overflow: hidden; }
.sd-row:hover, .sd-row.sd-selected { background: #0072B21a; }
.sd-row .sd-unchecked { color: #999; font-style: italic; }
.sd-cell { border: 1px solid #8886; border-radius: 3px; margin-right: 2px; padding: 0 3px; }
.sd-caption { font-size: 15px; padding: 4px 0; }
.sd-lossy { color: #D55E00; font-weight: 700; }
.sd-recorded { font-size: 13px; border-left: 4px solid #0072B2; background: #0072B214; padding: 4px 8px;
  margin-bottom: 6px; border-radius: 4px; }
.sd-keys { font-size: 13px; color: var(--body-text-color-subdued, #666); margin: 2px 0 6px; }
.sd-keys kbd { font-family: ui-monospace, monospace; font-size: 12px; border: 1px solid #8888; border-bottom-width: 2px;
  border-radius: 4px; padding: 0 5px; background: var(--block-background-fill, #fff); }
/* presenter mode: .sd-present on the page's outer column (the toggle in ui.py); sized for a 1280x720 projector */
.sd-present .sd-tokens { font-size: 26px; line-height: 1.8; }
.sd-present .sd-legend { font-size: 18px; }
.sd-present .sd-card b { font-size: 30px; }
.sd-present .sd-card span { font-size: 16px; }
.sd-present .sd-film { font-size: 18px; }
.sd-present .sd-row { grid-template-columns: 4.5em 1fr 12em; }
.sd-present .sd-caption, .sd-present #sd-step-caption, .sd-present #sd-step-caption p { font-size: 24px;
  line-height: 1.5; }
.sd-present .sd-keys { font-size: 16px; }
.sd-present #sd-intro { display: none; }
.sd-present #sd-main { flex-direction: column; }
.sd-present #sd-controls { min-width: 0 !important; width: 100%; max-width: none; flex-direction: row !important;
  flex-wrap: wrap; align-items: center; }
.sd-present #sd-run-row { flex: 0 0 340px; }
.sd-present #sd-switches { flex-direction: row !important; flex-wrap: nowrap; align-items: center; flex-grow: 1; }
.sd-present #sd-switches > * { flex: 0 0 auto; width: auto; }
.sd-present #sd-header > :not(#sd-switches):not(:has(#sd-notice:not(.hidden))) { display: none; }
.sd-present #sd-controls > :has(#sd-view) { flex: 0 1 auto !important; width: auto !important; min-width: 0; }
.sd-present #sd-results { width: 100%; max-width: none; }
.sd-present #sd-controls > :not(#sd-run-row):not(:has(#sd-view)) { display: none; }
"""

# gradio's toasts name their level in English ("Warning", "Error"): gradio 6 draws neither a translation nor the
# title that gr.Warning and gr.Error take. On a page in another language (ui.LOCALE_JS sets body[data-sd-lang]) the
# catalogue's word is drawn in its place.
TOAST_KEY = {"warning": "toast.warning", "error": "toast.error"}


def toast_css() -> str:
    rules = []
    for _, code in CHOICES:
        if code == DEFAULT:
            continue
        for level, key in TOAST_KEY.items():
            sel = f'body[data-sd-lang="{code}"] .toast-title.{level}'
            word = json.dumps(tr(key, code), ensure_ascii=False)
            rules.append(f"{sel} {{ font-size: 0; }}\n{sel}::before {{ content: {word}; font-size: var(--text-lg); }}")
    return "\n".join(rules) + "\n"


CSS += toast_css()


def esc(text: str) -> str:
    """Escape for HTML text and attribute values, and make control characters visible (except newline/tab)."""
    shown = "".join(
        c if c in "\n\t" or (ord(c) >= 32 and ord(c) != 127) else f"\\x{ord(c):02x}" for c in text
    )
    return html.escape(shown, quote=True)


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
        lines += [tr("tip.q", lang, q=fmt(q, lang)), f"r = {fmt(r, lang)}", f"min(1, p/q) = {fmt(accept_prob, lang)}"]
    return "\n".join(lines)


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
    """The streamed text: the prompt, then one span per token event. `upto` limits to the first rounds."""
    parts = [f'<span class="sd-prompt" title="{esc(tr("tip.prompt", lang))}">{esc(prompt)}</span>']
    for rnd in (rounds or [])[:upto]:
        eos = rnd.output[-1] if rnd.stop_reason == "eos" and rnd.output else None  # the end-of-text token
        for t in rnd.tokens:
            where = tr("tip.where", lang, round=rnd.index + 1, position=t.position) + "\n"
            title = where + token_title(t.label, t.p, t.q, t.r, t.accept_prob, lang, own=rnd.k == 0)
            title += "" if t.text else "\n" + tr("tip.piece", lang)
            parts.append(span(t.text, t.label, title, f' data-round="{rnd.index}"', " sd-eos" if t is eos else ""))
    for s in steps or []:
        parts.append(span(s.token.text, "accepted",
                          tr("tip.baseline", lang, n=s.index + 1) + "\n" + tr("tip.p", lang, p=fmt(s.token.p, lang))))
    return f'<div class="sd-tokens">{"".join(parts)}</div>'


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
            cells.append(" \u2192 " + span(visible(t.text), t.label,
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
        verdict += f" \u00b7 {rnd.draft_ms + rnd.verify_ms + rnd.overhead_ms:.0f} ms"
        cls = "sd-row sd-selected" if selected == rnd.index else "sd-row"
        rows.append(f'<div class="{cls}" data-round="{rnd.index}" role="button" tabindex="0">'
                    f"<b>{trh('film.round', lang, n=rnd.index + 1)}</b><span>{''.join(cells)}</span>"
                    f"<span>{esc(verdict)}</span></div>")
    return f'<div class="sd-film">{"".join(rows)}</div>'


def card(value: str, label: str) -> str:
    return f'<div class="sd-card"><b>{esc(value)}</b><span>{esc(label)}</span></div>'


def stats_html(spec: Trace | None, base: Trace | None = None, running: str = "", lang: str | None = None) -> str:
    """The live numbers: tokens/s of both runs, the measured speedup, target calls, alpha, accepted length."""
    cards = []
    if spec is not None and spec.rounds:
        m = spec.metrics()
        cards += [
            card(f"{m['tokens_per_s']:.1f}", tr("stats.spec_tps", lang)),
            card(f"{m['target_calls']} / {m['target_calls_saved']}", tr("stats.calls", lang)),
            card(f"{m['alpha_empirical']:.2f}", tr("stats.alpha", lang)),
            card(f"{m['mean_accepted_length']:.2f}", tr("stats.per_call", lang)),
        ]
    if base is not None and base.steps:
        bm = base.metrics()
        cards.append(card(f"{bm['tokens_per_s']:.1f}", tr("stats.base_tps", lang)))
        if spec is not None and spec.rounds and bm["tokens_per_s"] > 0:
            cards.append(card(f"{spec.metrics()['tokens_per_s'] / bm['tokens_per_s']:.2f}\u00d7",
                              tr("stats.speedup", lang)))
    elif spec is not None and spec.settings.get("baseline") == "not measured":  # runs.run_stream: the time limit
        cards.append(card("\u2014", tr("stats.not_measured", lang)))
    note = ""
    if spec is not None and spec.metrics()["lossy"]:
        note = f'<div class="sd-lossy">{esc(tr("stats.lossy", lang))}</div>'
    if spec is not None and spec.settings.get("recorded") is not None:  # recorded.py: the run the page opens on
        note += recorded_note(spec, lang)
    status = f"<div><small>{esc(running)}</small></div>" if running else ""
    return f'{note}<div class="sd-cards">{"".join(cards)}</div>{status}'


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
    return f'<div class="sd-recorded">{esc(text)}</div>'


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
    """The step-through caption (Markdown text; the numbers and the catalogue's words carry no markup)."""
    if not rounds:
        return tr("step.generate_first", lang)
    if cursor == 0:
        return tr("step.before", lang, n=len(rounds))
    return tr("step.round", lang, i=cursor, n=len(rounds), caption=round_caption(rounds[cursor - 1], lang))


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
