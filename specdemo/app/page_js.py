"""The page's JavaScript, by what it does: ui.py attaches each to its component or event. Each runs in the browser
only; the server never reads it back."""

from __future__ import annotations

import json

from specdemo import i18n

# Delegated click: any element with data-round inside the component selects that round (film strip rows, tokens).
CLICK_JS = """
const pick = (e) => {
  const el = e.target.closest('[data-round]');
  if (el) trigger('click', {round: Number(el.dataset.round)});
};
element.addEventListener('click', pick);
element.addEventListener('keydown', (e) => { if (e.key === 'Enter' || e.key === ' ') pick(e); });
"""

# The film strip's rows also bring the round they open into view: the inspector sits under the strip, and a click
# near the strip's end would open it off screen (the round's sliders, its chart and its reason, from the top).
FILM_CLICK_JS = CLICK_JS + """
element.addEventListener('click', (e) => {
  if (e.target.closest('[data-round]')) document.querySelector('#sd-round-row')?.scrollIntoView({block: 'start'});
});
"""

# Step-through keys, on the whole page (render.KEYS shows the same names): next, previous, first round. Keys typed into
# a field, a slider, a tab list or a dropdown keep their usual meaning, and so do all keys before a run is on screen.
# One step is in flight at a time, from a key or a step button: a quick press waits until the view of the press
# before it has landed (or 1.5 s, for a step that changes nothing on screen), since two views sent at once could
# land in either order and leave the earlier one on screen (docs/decisions.md, "step keys in the order pressed").
# A step that cannot move (next on the last round; previous or first before round 1, as views.step_view marks the
# cursor) is dropped while the step-through is open: it would change nothing, and the keys after it waited 1.5 s.
KEYS_JS = """
window.sdStepTrigger = trigger;
if (!window.sdKeysBound) {
  window.sdKeysBound = true;
  const steps = {ArrowRight: 1, PageDown: 1, ArrowLeft: -1, PageUp: -1, Home: 0};
  // a checkbox is no field: arrows and Page keys mean nothing to it, and presenter mode's is what a speaker ticks
  // just before stepping (its focus stays there)
  const typing = 'input:not([type="checkbox"]), textarea, select, [contenteditable], [role="slider"], [role="tab"], '
    + '[role="listbox"], [role="option"], [role="combobox"]';
  const waiting = [];
  let inFlight = null, before = null;  // the timer that stops waiting for a view that changes nothing; the caption
  const caption = () => document.querySelector('#sd-step-caption [data-testid="markdown"]')?.textContent ?? '';
  const stuck = (step) => {
    const at = document.querySelector('#sd-step-tokens .sd-step-at');
    if (!at || !at.closest('#sd-step-tokens').offsetParent) return false;  // closed: the step opens its tab
    const cursor = Number(at.dataset.cursor);
    return step === 1 ? cursor >= Number(at.dataset.rounds) : cursor === 0;
  };
  const next = () => {
    while (inFlight === null && waiting.length && stuck(waiting[0])) waiting.shift();
    if (inFlight !== null || !waiting.length) return;
    inFlight = setTimeout(landed, 1500);
    before = caption();
    window.sdStepTrigger('click', {step: waiting.shift()});
  };
  const landed = () => { clearTimeout(inFlight); inFlight = null; next(); };
  // the step's view has landed once the caption says something else (each step's caption names its round)
  new MutationObserver(() => { if (inFlight !== null && caption() !== before) landed(); })
    .observe(document.body, {subtree: true, childList: true, characterData: true});
  // the step buttons join the same line: a quick double click on Next is two steps, drawn in order
  const buttons = {'sd-first-round': 0, 'sd-prev-round': -1, 'sd-next-round': 1};
  document.addEventListener('click', (e) => {
    const button = e.target.closest?.('#sd-first-round, #sd-prev-round, #sd-next-round');
    if (!button) return;
    e.stopImmediatePropagation();  // gradio's own click event for the button is not sent: the line sends it
    e.preventDefault();
    waiting.push(buttons[button.id]);
    next();
  }, true);
  document.addEventListener('keydown', (e) => {
    if (!Object.hasOwn(steps, e.key) || e.ctrlKey || e.metaKey || e.altKey || e.shiftKey) return;
    if (e.target && e.target.closest && e.target.closest(typing)) return;
    if (!document.querySelector('#sd-token-view .sd-tok')) return;
    e.preventDefault();
    waiting.push(steps[e.key]);
    next();
    document.querySelector('#sd-tabs')?.scrollIntoView({block: 'start'});  // the step-through opens there
  });
}
"""

# A number typed outside a control's range: gradio puts a slider's back inside without a word (a temperature of -1
# becomes 0, of 99 becomes 2), and keeps a number box's, which the server then refuses in its own English words
# ("Value -3 is less than minimum value 0"). This puts either back inside (an input event, as typing sends) and says
# so in one line under the control, in the page's language, until the next value that fits. Bound once on the whole
# page, so that it holds for every slider and number box, folded ones included.
CLAMP_JS = """
if (!window.sdClampBound) {
  window.sdClampBound = true;
  const SAY = MESSAGES;
  document.addEventListener('change', (e) => {
    const box = e.target;
    if (!box.matches || !box.matches('input[type=number]')) return;
    const block = box.closest('.block');
    if (!block) return;
    const v = parseFloat(box.value), lo = parseFloat(box.min), hi = parseFloat(box.max);
    const key = v < lo ? 'low' : v > hi ? 'high' : null;
    let note = block.querySelector(':scope .sd-clamp-note');
    // a value in range takes the note away, unless it is the bound the note names (a second change event, such as
    // the blur after Enter, reports the value put there)
    if (!key) { if (note && box.value !== note.dataset.bound) note.remove(); return; }
    if (!note) {
      note = document.createElement('div');
      note.className = 'sd-clamp-note';
      note.setAttribute('role', 'status');
      block.appendChild(note);
    }
    const say = SAY[document.body.dataset.sdLang] || SAY.en, bound = key === 'low' ? box.min : box.max;
    note.textContent = say[key].replace('{value}', box.value).replace('{bound}', bound);
    note.dataset.bound = bound;
    box.value = bound;
    box.dispatchEvent(new Event('input', {bubbles: true}));
  }, true);
}
"""

# A chart drawn while its tab was hidden takes plotly's default width (700 px), since its box had none: in a wider
# box it leaves half the box empty, in a narrower one it is cut off. Each tab's panel is watched, and when one is
# shown, the page gets a resize event, on which plotly fits every chart to its box (gradio draws them responsive).
# A tab's panel is made on its first visit, so new panels are watched as they come.
RESIZE_JS = """
if (!window.sdTabResizeBound) {
  window.sdTabResizeBound = true;
  let queued = false;
  const resize = () => {
    if (queued) return;
    queued = true;
    requestAnimationFrame(() => { queued = false; window.dispatchEvent(new Event('resize')); });
  };
  const seen = new WeakSet();
  const shown = new ResizeObserver((entries) => { if (entries.some((e) => e.contentRect.width > 0)) resize(); });
  const watch = () => document.querySelectorAll('.tabitem').forEach((el) => {
    if (!seen.has(el)) { seen.add(el); shown.observe(el); }
  });
  watch();
  new MutationObserver(watch).observe(document.body, {childList: true, subtree: true});
}
"""

# On load: define the client-side locale switch, and send the browser's language to handlers.initial_lang (in place
# of the hidden textbox's value).
# gradio translates the i18n labels with svelte-i18n; its `changeLocale` lives in the frontend's core module, which
# the page has already loaded (an ES module is one instance per URL, so importing it again returns the same store).
DETECT_JS = """
(_) => {
  window.sdSetLocale = async (code) => {
    const url = performance.getEntriesByType('resource').map((e) => e.name)
      .find((n) => /\\/assets\\/core-[^/]*\\.js(\\?|$)/.test(n));
    if (!url) return false;
    const core = await import(url);
    if (typeof core.changeLocale !== 'function') return false;
    core.changeLocale(code);
    return true;
  };
  return navigator.language || (navigator.languages || [])[0] || '';
}
"""

# On a language change: switch gradio's own labels (no reload) and the page title; the server redraws the rest.
LOCALE_JS = """
async (lang) => {
  document.title = TITLES[lang] || TITLES.en;
  document.body.dataset.sdLang = lang;
  if (window.sdSetLocale) await window.sdSetLocale(lang);
  document.body.dataset.sdLocaleDone = lang;  // gradio has redrawn the page in it (tests wait for this)
}
""".replace("TITLES", json.dumps({code: i18n.MESSAGES[code]["app.title"] for _, code in i18n.CHOICES}))
CLAMP_JS = CLAMP_JS.replace("MESSAGES", json.dumps({code: {"low": i18n.MESSAGES[code]["ui.clamped_low"],
                                                           "high": i18n.MESSAGES[code]["ui.clamped_high"]}
                                                    for _, code in i18n.CHOICES}))

# The reply as text (kept tokens only) or the full story (the rejected drafts too): a class on the page that style.CSS
# reads, so the switch is instant and holds for every token view, live or recorded, without a server call.
VIEW_JS = "(view) => { document.body.classList.toggle('sd-story', view === 'story'); }"

# The trace downloads from the JSON already on the page, built in the browser: a server-side file would put the
# server's cache path into the page and into the API's answer (see handlers.generate_ui).
DOWNLOAD_JS = """
(trace) => {
  if (!trace || !trace.speculative) return;
  const url = URL.createObjectURL(new Blob([JSON.stringify(trace, null, 1)], {type: 'application/json'}));
  const a = document.createElement('a');
  a.href = url;
  a.download = 'specdemo-trace.json';
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}
"""


# Shift+Enter in the prompt does what the Generate button does, and only when it would: while a run goes on (the
# button disabled, handlers.run_started) it starts nothing, and handlers.refuse_busy says so in one sentence.
SUBMIT_JS = """
(busy, lang) => {
  const go = document.querySelector('#sd-generate');
  if (go && !go.disabled) { go.click(); return [false, lang]; }
  return [true, lang];
}
"""
