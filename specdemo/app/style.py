"""The page's CSS (what render.py's HTML and gradio's own blocks look like), with presenter mode's sizes; the tree
drawing's own rules are tree_view.TREE_CSS. ui.launch passes both to gradio. No gradio import."""

from __future__ import annotations

import json

from specdemo.i18n import CHOICES, DEFAULT, tr

from .render import kind_colours

MONO = "ui-monospace, SFMono-Regular, Menlo, monospace"

TOKENS = """
.sd-text { font-size: 15px; line-height: 1.9; padding: 10px 12px; border-radius: 8px; min-height: 6em;
  background: var(--block-background-fill, #fff); border: 1px solid var(--border-color-primary, #ddd);
  overflow-wrap: anywhere; }
.sd-tokens { white-space: pre-wrap; word-break: break-word; font-family: MONO; }
.sd-prompt { color: #6B7280; }  /* set apart from the reply, and read from the back of a room: 4.8:1 on white */
.dark .sd-prompt { color: var(--body-text-color-subdued); }
.sd-tok { border-radius: 3px; padding: 1px 0; cursor: help; color: #111; }
/* the four kinds (render.KIND_STYLE, measured by tests/test_stage.py): the three that share the reply have fills
   3:1 apart in contrast (pale, mid, dark), so that they read apart in grey on a washed-out projector; each keeps its
   shape (underline, white on dark with a double underline, bold on amber, struck through), and each has a fill or a
   mark at 3:1 or more against the page */
.sd-accepted { background: ACC_FILL; border-bottom: 2px solid ACC_MARK; }
.sd-rejected { background: REJ_FILL; text-decoration: line-through; text-decoration-thickness: 2px;
  text-decoration-color: REJ_MARK; color: REJ_TEXT; }
.sd-resampled { background: RES_FILL; color: RES_TEXT; text-decoration: underline double;
  text-decoration-color: RES_MARK; text-underline-offset: 2px; }
.sd-bonus { background: BON_FILL; color: BON_TEXT; font-weight: 700; outline: 1px dotted BON_MARK; }
.sd-tok.sd-resampled, .sd-tok.sd-bonus { padding: 1px 2px; }
.sd-piece::after { content: "\\00b7"; opacity: 0.6; }  /* a piece of a character: render.PIECE */
.sd-legend { display: flex; flex-wrap: wrap; gap: 10px; font-size: 14px; margin: 6px 0; }
.sd-legend small { font-size: 14px; }
.sd-legend .sd-tok { padding: 1px 6px; }
.sd-leg { white-space: nowrap; }
/* "the reply" (page_js.VIEW_JS): the kept text read as Markdown (reply.py), chips kept; "the full story": every
   token as it came, the rejected drafts struck through. Both are on the page; a class on the body shows one. */
body:not(.sd-story) .sd-text > .sd-tokens, body.sd-story .sd-text > .sd-reply { display: none; }
body:not(.sd-story) .sd-tokens .sd-rejected, body:not(.sd-story) .sd-legend .sd-leg-rejected { display: none; }
body:not(.sd-story) .sd-tokens .sd-eos { display: none; }  /* the end-of-text token is no part of the reply */
.sd-reply p, .sd-reply li, .sd-reply blockquote { white-space: pre-wrap; }
.sd-reply p, .sd-reply ol, .sd-reply ul, .sd-reply blockquote, .sd-reply .sd-md-pre { margin: 0 0 0.5em; }
.sd-reply ol, .sd-reply ul { padding-left: 1.8em; }
.sd-reply ol { list-style: decimal; } .sd-reply ul { list-style: disc; }
.sd-reply li { margin: 0.1em 0; }
.sd-reply blockquote { border-left: 3px solid #8886; padding-left: 10px; }
.sd-md-b { font-weight: 700; }
.sd-md-i { font-style: italic; }
.sd-md-code, .sd-md-pre { font-family: MONO; }
.sd-md-pre { white-space: pre-wrap; background: #8881; padding: 4px 8px; border-radius: 6px; }
.sd-md-h { font-weight: 700; }
.sd-md-h1 { font-size: 1.3em; } .sd-md-h2 { font-size: 1.2em; } .sd-md-h3 { font-size: 1.1em; }
""".replace("MONO", MONO)
TOKENS = kind_colours(TOKENS)

PAGE = """
/* the first screen (1280x720): a compact header, and a token view that ends above the fold */
#sd-intro h1 { font-size: 1.6em; margin: 0 0 2px; }
#sd-lang, #sd-view { display: flex; flex-direction: row; align-items: center; gap: 10px; padding-top: 4px;
  padding-bottom: 4px; }
#sd-lang > [data-testid="block-info"], #sd-view > [data-testid="block-info"] { margin: 0; }
/* the token view scrolls inside gradio's container: the frame is the container's, so it stays while the text
   scrolls under it */
#sd-token-view .html-container { max-height: max(220px, min(420px, calc(100vh - 398px))) !important;
  border: 1px solid var(--border-color-primary, #ddd); border-radius: 8px; padding: 0; margin: 0 12px;
  background: var(--block-background-fill, #fff); }
#sd-token-view .sd-text { border: none; border-radius: 0; background: none; }
body:has(#sd-notice) #sd-token-view .html-container {  /* the sentence on a missing default pair takes room */
  max-height: max(200px, min(420px, calc(100vh - 458px))) !important; }
/* a long pair name ends before the dropdown's arrow (drawn over the input's right end) */
#sd-pair input { padding-right: 26px; text-overflow: ellipsis; }
/* an accordion's label wraps instead of running out of its box */
.label-wrap > span:first-child { white-space: normal; overflow-wrap: anywhere; text-align: left; }
.label-wrap > .icon { flex: none; width: 1.5em; text-align: center; transition: none; }  /* turned, in its box */
#sd-intro p { margin: 0; }
#sd-notice { border-left: 4px solid #E69F00; padding-left: 8px; }
/* page_js.CLAMP_JS: a typed number that the control put back inside its range, said under it */
.sd-clamp-note { font-size: 14px; color: #8A3B00; margin: 4px 0 0; }
/* the stats (render.stats_html): one row of cards and one line under them, each of fixed height whatever it holds,
   so that nothing above the reply moves while a run streams (tests/test_stage.py samples it) */
.sd-cards { display: grid; grid-template-columns: repeat(6, minmax(0, 1fr)); grid-auto-rows: 80px; gap: 8px;
  height: 80px; overflow: hidden; }
@media (max-width: 760px) { .sd-cards { grid-template-columns: repeat(3, minmax(0, 1fr)); height: 176px; } }
.sd-card { border: 1px solid var(--border-color-primary, #ddd); border-radius: 8px; padding: 3px 8px;
  cursor: help; min-width: 0; overflow: hidden; overflow-wrap: break-word; }
.sd-card b { display: block; font-size: 19px; white-space: nowrap; }
.sd-card span { display: block; font-size: 13px; line-height: 1.25; color: #555; }
.sd-pending b, .sd-stopped b { color: #767676; }
#sd-stats .html-container.pending { opacity: 1; }  /* the live numbers stay readable while the run streams */
/* gradio's timer ("queue: 1/1", "processing | 0.1s"), which gradio 6.31 draws over an event's outputs although
   Generate and run_over ask for no tracker (show_progress="hidden"; the stats name the tracker only for an error's
   mark): a run's stats, text, film strip and step-through say what the run is doing, and a flickering "0.0s" is
   noise on a projector */
:is(#sd-stats, #sd-token-view, #sd-film, #sd-step-tokens, #sd-step-caption) :is(.progress-text, .eta-bar) {
  display: none; }
/* the 18 px that the stats' line took (.sd-line) given back around the token view, so that the keys hint under it
   stays above the fold at 1280x720 */
#sd-stats .html-container { padding-bottom: 0; }
#sd-keys .html-container { padding-top: 0; }
/* three lines: the recorded run's note (render.recorded_note) takes three at 1280 wide in Chinese (158 characters in
   760 px) and nearly fills two in English; the token view above the fold gives up the 18 px */
.sd-line { height: 54px; margin-top: 5px; font-size: 13px; line-height: 18px; overflow: hidden; }
.sd-line .sd-recorded { display: block; height: 100%; box-sizing: border-box; }
.sd-bar { position: relative; height: 26px; margin-top: 5px; border-radius: 6px; background: #0072B21f;
  overflow: hidden; }
.sd-bar-fill { position: absolute; inset: 0 auto 0 0; background: #0072B2; opacity: 0.35; }
.sd-bar > span { position: relative; padding: 0 10px; line-height: 26px; white-space: nowrap; }
/* the race table (views.race_view): words and numbers whole (gradio's prose breaks them anywhere); the numeric
   columns never wrap, the names and headers wrap between words, and the table fits its box at 1280x720 */
#sd-race-table table { table-layout: auto; width: 100%; font-size: 14px; }
#sd-race-table th, #sd-race-table td { overflow-wrap: normal; word-break: normal; hyphens: none; padding: 4px 6px; }
#sd-race-table td:nth-child(n+2):nth-child(-n+6) { white-space: nowrap; }
/* the film strip: the round, its tokens (they wrap), and its verdict (as wide as it needs, up to 45%; it wraps) */
.sd-film { font-family: ui-monospace, monospace; font-size: 13px; max-height: 420px; overflow-y: auto; }
.sd-row { display: grid; grid-template-columns: 4.5em minmax(0, 1fr) fit-content(45%); gap: 8px; align-items: center;
  padding: 3px 6px; border-bottom: 1px solid #8882; cursor: pointer; }
.sd-row > span { min-width: 0; overflow-wrap: anywhere; }
.sd-row > span:nth-child(2) { white-space: pre-wrap; }
.sd-row > span:last-child { text-align: right; }
.sd-row:hover, .sd-row.sd-selected { background: #0072B21a; }
.sd-row .sd-unchecked { color: #999; font-style: italic; }
.sd-cell { border: 1px solid #8886; border-radius: 3px; margin-right: 2px; padding: 0 3px; }
.sd-caption { font-size: 15px; padding: 4px 0; }
.sd-lossy { color: #D55E00; font-weight: 700; }
.sd-recorded { font-size: 13px; border-left: 4px solid #0072B2; background: #0072B214; padding: 0 8px;
  border-radius: 4px; cursor: help; }
/* the keys hint is read from the back of a room: #4B5563 is 7.2:1 on the page's #F9FAFB (gradio's subdued grey,
   #9CA3AF, was 2.4:1); a dark theme keeps its own subdued colour */
.sd-keys { font-size: 13px; color: #4B5563; margin: 2px 0 6px; }
.dark .sd-keys { color: var(--body-text-color-subdued); }
.sd-keys kbd { font-family: ui-monospace, monospace; font-size: 12px; border: 1px solid #8888; border-bottom-width: 2px;
  border-radius: 4px; padding: 0 5px; background: var(--block-background-fill, #fff); }
"""

PRESENTER = """
/* presenter mode: .sd-present on the page's outer column (the toggle in ui.py); sized for a 1280x720 projector */
.sd-present .sd-text { font-size: 26px; line-height: 1.8; }
.sd-present .sd-legend { font-size: 18px; }
/* no text a viewer reads under 16 px (tests/test_stage.py walks every text on the page): gradio's labels, tabs,
   slider ends and key caps included; max() keeps anything already larger as it is */
.sd-present :is(span, button, label, kbd, small, input, textarea, p, li, td, th, a, em, strong, code) {
  font-size: max(16px, 1em); }
.sd-present .sd-legend small { font-size: 16px; }
.sd-present .sd-cards { grid-auto-rows: 116px; height: 116px; }
.sd-present .sd-card b { font-size: 30px; }
.sd-present .sd-card span { font-size: 16px; }
.sd-present .sd-line { height: 52px; font-size: 16px; line-height: 24px; }  /* two lines of the note at 1280 */
@media (max-width: 1199px) { .sd-present .sd-line { height: 76px; } }  /* three below (zh: 1923 px of text) */
.sd-present .sd-bar { height: 34px; margin-top: 9px; }
.sd-present .sd-bar > span { line-height: 34px; }
.sd-present .sd-film { font-size: 18px; }
.sd-present .sd-caption, .sd-present #sd-step-caption, .sd-present #sd-step-caption p { font-size: 24px;
  line-height: 1.4; }
.sd-present #sd-step-caption p { margin: 0; }
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
.sd-present #sd-controls > :not(#sd-run-row):not(:has(#sd-view)):not(:has(#sd-prompt)) { display: none; }
/* a compact prompt stays, so that a speaker can change it without leaving presenter mode */
.sd-present #sd-controls > :has(#sd-prompt) { flex: 1 1 100% !important; min-width: 0; }
.sd-present #sd-prompt textarea { min-height: 0; height: 2.6em !important; font-size: 18px; }
/* a step key scrolls the tabs to the top of the screen (page_js.KEYS_JS): they are a screen tall, so that it can; one
   screen holds the round's sentence, its tree (scrolling in its own box) and the text so far (its end in view) */
.sd-present #sd-tabs { min-height: 100vh; }
.sd-present #sd-step-tokens .sd-tree-title { display: none; }
.sd-present #sd-step-tokens .sd-tree-scroll { max-height: 34vh; }
.sd-present #sd-step-tokens .sd-text { max-height: 22vh; overflow-y: auto; display: flex;
  flex-direction: column-reverse; min-height: 0; }
"""

# gradio's toasts name their level in English ("Warning", "Error"): gradio 6 draws neither a translation nor the
# title that gr.Warning and gr.Error take. On a page in another language (page_js.LOCALE_JS sets body[data-sd-lang]) the
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


CSS = TOKENS + PAGE + PRESENTER + toast_css()
