"""The message catalogue: every string a visitor reads, in English and 简体中文, keyed by a stable id.

Owns the words, not the layout. One dict per language (`MESSAGES[lang][key]`), read from one JSON file per
language beside this one (en.json, zh-CN.json), and the lookups:

- `tr(key, lang, **params)`: the text for server-built things (render.py's HTML, plots.py's figures, handlers.py's
  messages, and through `Translatable` the errors of the engine and the models). Params fill `{name}` slots with `str.format`; a param that
  is itself a `Msg` is translated too.
  A key missing in a language falls back to English; a key missing in English raises KeyError (a bug, which
  tests/test_i18n.py catches by scanning the source for lookups).
- `template(key, lang)`: the raw text, for callers that escape it before filling the slots (render.trh).
- `label(key)`: a `gr.I18nData` for gradio components (labels, buttons, tabs, Markdown); the browser picks the
  language from the catalogue that `gradio_i18n()` hands to `demo.launch(i18n=...)`.
- `Msg(key, **params)`: a message to translate later, e.g. a field name inside an error.
- `Translatable`: a mixin for exceptions whose message lives here. `str(err)` is English (logs, the CLI, the API);
  `err.text(lang)` is the visitor's language. A plain string that is not a key passes through as it is.
- `pick(lang, accept_language)`: the visitor's language from the page's switch, else from an Accept-Language header.

To add a string: add the key to en.json and to zh-CN.json (tests/test_i18n.py fails if either lacks it, if their
`{slots}` differ, or if a Chinese entry is left in English without being listed in `SAME_IN_BOTH`), then look it up with
`tr("key", lang)` or `label("key")`. To add a language: add its JSON file, and list it in `MESSAGES` and `CHOICES`.

Terms in Chinese follow the Chinese literature on speculative sampling: 投机采样, 草稿模型, 目标模型,
接受 / 拒绝 / 重采样, 额外 token (bonus), 残差分布, 接受率. Numbers and formulas stay as they are. The CLI, the logs
and the JSON trace stay in English.
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT = "en"

EN: dict[str, str] = json.loads((HERE / "en.json").read_text(encoding="utf-8"))
ZH: dict[str, str] = json.loads((HERE / "zh-CN.json").read_text(encoding="utf-8"))

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
