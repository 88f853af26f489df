"""A round in plain words, from the message catalogue: what the drafter proposed and what the target kept,
rejected, resampled or added ('draft proposed 4; target kept 2, rejected 1 and resampled 1'). The JSON trace and the
CLI carry the English caption (events.Round.caption); the page shows it in its language (app/render.py). Text only:
the app escapes it where it reaches HTML."""

from __future__ import annotations

from typing import TYPE_CHECKING

from specdemo.i18n import tr

if TYPE_CHECKING:  # events.Round.caption calls round_caption: this module reads rounds, it does not import them
    from .events import Round

STOP_KEY = {"eos": "stop.eos", "max_new_tokens": "stop.max_new_tokens", "time_limit": "stop.time_limit"}


def said(text: str, lang: str | None = None) -> str:
    """A token's text as a caption or tooltip quotes it: repr, or, for a kept token that adds no text of its own
    (a piece of a character that a later token completes), words that say so."""
    return repr(text) if text else tr("token.piece", lang)


def stop_text(reason: str | None, lang: str | None = None) -> str:
    """A run's stop reason in words ('eos' -> 'end of text'); an unknown code is shown as it is."""
    return tr(STOP_KEY[reason], lang) if reason in STOP_KEY else (reason or "").replace("_", " ")


PLAIN_STEP_CAPTION_KEY = {"fallback": "caption.fallback", "prefill": "caption.prefill"}


def round_caption(rnd: Round, lang: str | None = None) -> str:
    """The round in plain words, for talks: 'draft proposed 4; target kept 2, rejected 1 and resampled 1'.
    events.Round.caption is this in English: the caption the JSON trace and the CLI carry."""
    parts = [tr("caption.kept", lang, n=rnd.n_accepted)]
    labels = [t.label for t in rnd.tokens]
    if "resampled" in labels:
        parts.append(tr("caption.resampled", lang))
    if "bonus" in labels:
        parts.append(tr("caption.bonus", lang))
    if rnd.source in PLAIN_STEP_CAPTION_KEY:  # the target's own token, named: what it chose
        text = tr(PLAIN_STEP_CAPTION_KEY[rnd.source], lang, y=said("".join(t.text for t in rnd.output), lang))
    elif rnd.tree:
        text = tree_caption(rnd, lang)
    elif rnd.source == "eagle" and rnd.unsure:
        text = tr("caption.eagle_unsure", lang, k=rnd.k, conf=f"{rnd.unsure[0]:.2f}", stop=f"{rnd.unsure[1]:g}",
                  parts=tr("caption.sep", lang).join(parts))
    elif rnd.source in ("eagle", "tree"):  # (a tree round with no budget left drafts nothing)
        text = tr("caption.eagle", lang, k=rnd.k, parts=tr("caption.sep", lang).join(parts))
    elif rnd.source == "lookup":
        text = tr("caption.lookup", lang, k=rnd.k, pos=rnd.copied_from, n=rnd.ngram,
                  parts=tr("caption.sep", lang).join(parts))
    else:
        text = tr("caption.round", lang, k=rnd.k, parts=tr("caption.sep", lang).join(parts))
    if rnd.head:  # a published head (EAGLE-3) is named; the embedded pairs' own heads are "the head"
        text = tr("caption.head_named", lang, head=rnd.head, text=text)
    if rnd.stop_reason:
        text += tr("caption.stopped", lang, reason=stop_text(rnd.stop_reason, lang))
    return text


def tree_end(rnd: Round):
    """The token that ended a tree round: the target's correction (resampled) or its free extra token at a leaf
    (bonus); None where the token budget or EOS cut the round before it."""
    return next((t for t in rnd.tokens if t.label in ("resampled", "bonus")), None)


# how a tree round ended: at a leaf (bonus), off the tree (the correction; at the root itself), or cut by the budget
TREE_CAPTION_KEY = {"leaf": "caption.tree_leaf", "miss": "caption.tree_miss", "miss_root": "caption.tree_miss_root",
                    "cut": "caption.tree_cut"}


def tree_caption(rnd: Round, lang: str | None = None) -> str:
    """'the head drafted a tree of 14 tokens; the target's path went 3 deep, then it chose ' Rome', which the tree
    did not have' (or '... reached a leaf and added ' Rome' as a free extra token')."""
    end, n = tree_end(rnd), rnd.n_accepted
    how = "cut" if end is None else "leaf" if end.label == "bonus" else "miss" if n else "miss_root"
    text = tr(TREE_CAPTION_KEY[how], lang, k=rnd.k, n=n, y=said(end.text, lang) if end is not None else "")
    copied = sum(nd.copied for nd in rnd.tree or [])
    return text + (tr("caption.tree_copied", lang, c=copied) if copied else "")
