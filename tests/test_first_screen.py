"""The page's first minute, without a browser: the prefill round in words, the legend's meanings, each preset's page
defaults, and the recorded run the page opens on (rebuilt from its JSON, and the same tokens as a live run with its
settings). The browser checks of the first screen are in test_browser.py."""

from __future__ import annotations

import re

import pytest

from specdemo import SamplingConfig, SpecConfig, plots, render, speculative_generate


@pytest.fixture(scope="module")
def eagle_run(pair):
    """A real run drafted by the Shakespeare pair's EAGLE head: round 1 is the prefill (the target alone)."""
    trace = speculative_generate(pair, "ROMEO:\n", SamplingConfig(0.8), SpecConfig(k=4, max_new_tokens=24,
                                                                                     strategy="eagle"))
    assert trace.rounds[0].source == "prefill" and trace.rounds[0].k == 0
    return trace


@pytest.mark.parametrize("lang,words", [
    ("en", ("the target read the prompt and chose the first token", "The target read the prompt and chose")),
    ("zh-CN", ("目标模型读入提示词，选出了第一个 token", "目标模型读入提示词，按它自己的 p 选出了第一个 token")),
])
def test_the_prefill_round_says_the_target_read_the_prompt_and_chose_the_first_token(eagle_run, lang, words):
    rnd = eagle_run.rounds[0]
    first = repr(rnd.output[0].text)
    caption = render.step_caption(eagle_run.rounds, 1, lang)
    reason = render.reason(rnd, 1, lang)  # where the inspector opens a round without drafts
    film = render.filmstrip_html(eagle_run.rounds, lang=lang).split('data-round="1"')[0]  # round 1's row
    title = plots.inspector(rnd, 1, lang=lang).layout.title.text
    assert words[0] in caption and render.esc(first) in render.esc(caption)
    assert reason.startswith(words[1]) and render.esc(first) in reason
    for text in (caption, reason, re.sub(r'class="[^"]*"', "", film), title):
        assert "0 drafts" not in text and "0/0" not in text and "bonus" not in text and "额外" not in text, text
    assert {"en": "prefill: the target read the prompt", "zh-CN": "预填充"}[lang] in film
    assert {"en": "the target's p for the first token", "zh-CN": "目标模型对第一个 token 的 p"}[lang] in title
    tokens = render.tokens_html(eagle_run.prompt, eagle_run.rounds[:1], lang=lang)
    assert render.esc(render.tr("tip.own", lang)) in tokens  # its tooltip: the target's own choice, not a bonus
    # a round the head drafted still explains its bonus the usual way
    drafted = next(r for r in eagle_run.rounds if r.k and r.n_accepted == r.k)
    assert render.reason(drafted, drafted.k + 1, lang) != render.reason(rnd, 1, lang)
    assert "target read the prompt and chose the first token" in rnd.caption  # the JSON trace's English caption


def test_the_legend_says_what_each_colour_means():
    en, zh = render.legend("en"), render.legend("zh-CN")
    for words in ("the draft&#x27;s guess that the target kept", "the draft&#x27;s guess that it refused",
                  "the target&#x27;s correction", "the target&#x27;s free extra token"):
        assert words in en, words
    for words in ("目标模型保留的草稿猜测", "目标模型拒绝的草稿猜测", "目标模型的修正", "目标模型免费多给的 token"):
        assert words in zh, words
    assert "struck through</small>" not in en and ">bold<" not in en
