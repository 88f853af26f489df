"""What the views draw, checked without a browser: the experiment tables as a Markdown renderer reads them (every
row keeps its columns whatever text a token carries), the reply's reading view as Markdown with its chips (against
markdown-it, and with hostile text), the stats while the baseline runs, and the round a finished run opens on."""

from __future__ import annotations

import html
import re
from html.parser import HTMLParser

import pytest
from markdown_it import MarkdownIt

from specdemo import SamplingConfig, SpecConfig, speculative_generate
from specdemo.app import recorded, render, reply, views
from specdemo.engine.events import Round, Token
from specdemo.engine.ties import Divergence


def table_cells(markdown: str) -> list[list[str]]:
    """The text of every cell of the first table, row by row, as a GFM renderer splits them."""
    tokens = MarkdownIt("commonmark").enable("table").parse(markdown)
    rows, row, inside = [], None, False
    for tok in tokens:
        if tok.type == "tr_open":
            row = []
        elif tok.type == "tr_close":
            rows.append(row)
        elif tok.type in ("th_open", "td_open"):
            inside = True
        elif tok.type in ("th_close", "td_close"):
            inside = False
        elif tok.type == "inline" and inside:
            row.append(tok.content)
    return rows


HOSTILE = [("a|b", " |"), ("||", "x\\|y"), ("\n|\n", "|\r\n"), ("*a*", "`_[b](c)_`~~")]


@pytest.mark.parametrize("spec_text,base_text", HOSTILE)
@pytest.mark.parametrize("lang", ["en", "zh-CN"])
def test_a_pipe_in_a_token_keeps_the_race_table_whole(spec_text, base_text, lang):
    """A T = 0 divergence names the two tokens in the race table; a `|` (or a line break) in either must not split
    the cell: every row has the header's columns, and the verdict cell shows both tokens as they are (their repr),
    neither formatted by Markdown nor missing a backslash."""
    parted = Divergence(position=3, spec_token=7, base_token=9, spec_text=spec_text, base_text=base_text,
                        gap_verify=0.01, gap_step=-0.01, logit=12.0)
    race = {"base_tps": 100.0, "base_n": 8, "base_points": [(0.01, 1), (0.08, 8)],
            "entries": [{"strategy": "fixed", "k": 3, "tokens_per_s": 150.0, "rounds": 4, "alpha": 0.6,
                         "per_call": 2.0, "points": [(0.05, 8)], "same": parted}]}
    rows = table_cells(views.race_view(race, lang)["race_md"])
    assert len(rows) == 3 and {len(r) for r in rows} == {len(rows[0])} == {7}, rows
    shown = html.unescape(MarkdownIt("commonmark").renderInline(rows[2][-1]))
    assert repr(spec_text) in shown and repr(base_text) in shown, shown


# ------------------------------------------------------------------------------------ the reply as Markdown (issue 38)

# what the reading view may draw (reply.py and render.span), and the attributes it may carry: nothing from a model
ALLOWED_TAGS = {"div", "span", "p", "ol", "ul", "li", "blockquote", "pre", "hr"}
ALLOWED_ATTRS = {"class", "title", "data-round", "value"}


class Parts(HTMLParser):
    """The reply view's tags, and each chip's (text, classes, title), in order."""

    def __init__(self):
        super().__init__()
        self.tags, self.attrs, self.chips, self.open = [], set(), [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs |= {name for name, _ in attrs}
        self.open.append((tag, dict(attrs)))
        if tag == "span":
            self.chips.append(["", dict(attrs).get("class", ""), dict(attrs).get("title")])

    def handle_endtag(self, tag):
        if self.open:
            self.open.pop()

    def handle_data(self, data):
        if self.open and self.open[-1][0] == "span":
            self.chips[-1][0] += data


def reply_part(page_html: str) -> str:
    """The reading view of render.tokens_html (the full story follows it)."""
    start = page_html.index('<div class="sd-reply">')
    return page_html[start:page_html.index('<div class="sd-tokens">')]


def parts(fragment: str) -> Parts:
    p = Parts()
    p.feed(fragment)
    return p


BLOCK = re.compile(r"</?(?:p|li|ol|ul|blockquote|pre|hr|h\d|div)\b[^>]*>")


def words(fragment: str) -> list[str]:
    """The words a reader sees: a block's edge separates them, an inline tag (a chip, bold) does not."""
    return html.unescape(re.sub(r"<[^>]+>", "", BLOCK.sub(" ", fragment))).split()


def test_the_reply_reads_as_markdown_and_keeps_its_chips():
    """The recorded SmolLM2 reply is a numbered list with bold headings: the reading view draws a list of three
    items, bold where the reply asks for it, and no `**`; every character stays in the chip of the token that wrote
    it (the same tooltip as in the full story), and the full story still shows the marks as they came."""
    spec, _ = recorded.load("smollm2-135m")
    page = render.tokens_html(views.shown_prompt(spec), spec.rounds, lang="en")
    shown = reply_part(page)
    assert "**" not in html.unescape(re.sub(r"<[^>]+>", "", shown))
    assert shown.count("<ol>") == 1 and shown.count("<li") == 3
    assert re.findall(r'<li value="(\d)">', shown) == ["1", "2", "3"]
    bold = "".join(text for text, cls, _ in parts(shown).chips if "sd-md-b" in cls)
    assert "Avoiding Caffeine:" in bold and "Keeping a Regular Sleep Schedule:" in bold and "Caffeine can" not in bold
    story = page[page.index('<div class="sd-tokens">'):]
    assert "**" in html.unescape(re.sub(r"<[^>]+>", "", story))
    titles = {t for _, _, t in parts(story).chips}
    assert all(t in titles for text, cls, t in parts(shown).chips if "sd-tok" in cls)  # a chip keeps its tooltip
    kept = "".join(t.text for r in spec.rounds for t in r.output if "<|im_end|>" not in t.text)
    assert words(shown)[words(shown).index("Here"):] == " ".join(
        re.sub(r"^\d\. ", "", line) for line in kept.replace("**", "").split("\n")).split()


def chip(key, text, styles):
    return f'<span class="{" ".join(("k",) + styles)}" data-round="{key}">{html.escape(text)}</span>'


MARKDOWN = [
    "Here are tips:\n\n1. **Avoid caffeine:** it keeps you up.\n2. *Sleep* at `10 pm`.\n\n- a\n- b\n  - nested\n",
    "# Title\nsome _em_ and snake_case_name, 2*3*4 and ***both***\n\n> a **quote**\n\n```\ncode **as is**\n```\n",
    "A line\nand the next line\n\n---\n\nend \\*not em\\* and **unclosed",
]


@pytest.mark.parametrize("text", MARKDOWN)
@pytest.mark.parametrize("per", [1, 3, 7])
def test_the_reading_view_agrees_with_a_markdown_renderer(text, per):
    """reply.markdown_html on text split into tokens of `per` characters: the same words as markdown-it draws, the
    same bold, italic and code, the same number of list items, whatever the token boundaries."""
    md = MarkdownIt("commonmark", {"html": False})
    theirs = md.render(text)
    ours = reply.markdown_html([(c, i // per) for i, c in enumerate(text)], chip)
    assert words(ours) == words(theirs)
    assert ours.count("<li") == theirs.count("<li>") and ours.count("<ol>") == theirs.count("<ol>")
    for tag, cls in (("strong", "sd-md-b"), ("em", "sd-md-i"), ("code", "sd-md-code")):
        want = "".join(re.findall(rf"<{tag}>(.*?)</{tag}>", theirs, re.S)).replace("<em>", "").replace("</em>", "")
        want = want.replace("<strong>", "").replace("</strong>", "")
        got = "".join(t for t, c, _ in parts(ours).chips if cls in c)
        assert "".join(html.unescape(want).split()) == "".join(got.split()), (tag, want, got)


def hostile_round(texts: list[str]) -> Round:
    tokens = [Token(i, t, "accepted", i + 1, 0.5, 0.5, 0.1, 1.0) for i, t in enumerate(texts)]
    return Round(index=0, k=len(texts), prefix_len=1, drafts=[], tokens=tokens, n_accepted=len(texts), draft_ms=1.0,
                 verify_ms=1.0, overhead_ms=0.0, elapsed_s=0.01)


def test_markdown_from_a_model_draws_no_html_of_its_own():
    """Raw HTML, links and images in a reply stay text in the reading view, escaped, in both languages: the view is
    built from its own few tags, and its only attributes are its own."""
    texts = ["<script>alert(1)</script>", " **<b onmouseover=alert(2)>", "bold</b>**", "\n\n[x](javascript:alert(3))",
             " ![i](x.png)", ' <img src=x onerror="alert(4)">', "\n\n- `<i>`", "\n# <h1>"]
    for lang in ("en", "zh-CN"):
        shown = reply_part(render.tokens_html("<u>prompt</u>\n\n", [hostile_round(texts)], lang=lang))
        p = parts(shown)
        assert set(p.tags) <= ALLOWED_TAGS and p.attrs <= ALLOWED_ATTRS, (set(p.tags), p.attrs)
        text = html.unescape(re.sub(r"<[^>]+>", "", shown))
        for raw in ("<script>alert(1)</script>", "<b onmouseover=alert(2)>", "[x](javascript:alert(3))",
                    '<img src=x onerror="alert(4)">', "<u>prompt</u>", "<i>", "<h1>"):
            assert raw in text, raw


def test_the_step_caption_quotes_model_text_as_text(monkeypatch):
    """The step-through caption is Markdown that gr.Markdown draws as HTML, and it quotes tokens (the target's own
    token in a prefill round, a published head's name): a token that is a tag, or two that pair up as bold, are
    shown as written, in both languages; a bidi override in one cannot reorder the caption after it."""
    md = MarkdownIt("commonmark", {"html": True})  # gr.Markdown passes HTML through (then sanitises it)
    for lang in ("en", "zh-CN"):
        for text in ("<b>", " **x** and `y` and [z](javascript:1) </div>", "\u202eevil"):
            rnd = hostile_round([text])
            monkeypatch.setattr(rnd, "source", "prefill")
            monkeypatch.setattr(rnd, "head", "org/<i>head</i>")
            drawn = md.render(render.step_caption([rnd], 1, lang))
            assert re.findall(r"<(\w+)", drawn) == ["p"], drawn
            shown = html.unescape(re.sub(r"<[^>]+>", "", drawn))
            assert "org/<i>head</i>" in shown and "\u202e" not in shown
            assert repr(text).replace("\u202e", "\\u202e") in shown, (text, shown)


def test_a_bidi_control_in_a_token_is_shown_not_obeyed():
    """A token holding a right-to-left override (or an isolate, or a C1 control) would reorder or hide the tokens
    after it in the reply, whose spans do not isolate it: it is drawn as its code (render.esc, which every view
    uses for model text)."""
    for text, code in (("\u202eevil", "\\u202e"), ("a\u2067b", "\\u2067"), ("x\x85y", "\\x85")):
        page = render.tokens_html("", [hostile_round([text, " next"])])
        assert not any(c in page for c in "\u202e\u2067\x85") and code in page, (text, page)


def test_the_speedup_card_waits_for_the_baseline_in_both_languages():
    """While the baseline runs, its two cards show no figure and say what they wait for; once it is done, the
    figure. Every card has a tooltip in plain words, not its label again."""
    spec, base = recorded.load("shakespeare")
    for lang, waiting in (("en", "Waiting for the target-only baseline"), ("zh-CN", "正在等待只用目标模型的基线")):
        running = render.stats_html(spec, None, "x", lang, pending=True)
        assert running.count("sd-pending") == 2 and "\u00d7" not in running and waiting in running
        done = render.stats_html(spec, base, "", lang)
        assert "sd-pending" not in done and "\u00d7</b>" in done
        cards = re.findall(r'<div class="sd-card[^"]*" title="([^"]+)"><b>[^<]*</b><span>([^<]+)</span>', done)
        assert len(cards) == 6 and all(len(tip) > len(label) + 8 for tip, label in cards), cards


def test_a_finished_run_opens_on_its_first_tree_round(pair):
    """The tree is on the page after a run: the inspector opens on the first round that has one (the prefill
    before it has none), its film-strip row marked, its drawing under the reason; a run without trees opens on
    round 1."""
    trace = speculative_generate(pair, "ROMEO:\n", SamplingConfig(0.8), SpecConfig(strategy="tree", max_new_tokens=16))
    first = next(r.index for r in trace.rounds if r.tree)
    assert first >= 1  # the prefill comes first
    state = {"spec": trace, "base": None, "cursor": 0}
    shown = views.finished(trace, None, state, "zh-CN")
    assert shown["round_sl"]["value"] == first + 1 and views.opening(state)["round_sl"] == first + 1
    assert f'<div class="sd-tree" data-round="{first}"' in shown["insp_reason"]
    assert re.search(rf'class="sd-row sd-row-tree sd-selected" data-round="{first}"', shown["film"])
    chain = speculative_generate(pair, "ROMEO:\n", SamplingConfig(0.8), SpecConfig(k=3, max_new_tokens=8))
    assert views.first_shown_round({"spec": chain}) == 1 and "sd-tree" not in views.finished(
        chain, None, {"spec": chain, "base": None, "cursor": 0})["insp_reason"]


def test_a_token_the_target_chose_alone_is_not_drawn_as_a_bonus(pair):
    """A round that drafted nothing (prompt lookup with nothing to copy; an EAGLE run's prefill) ends in the
    target's draw from its own p. The trace labels it "bonus", but it cost a target call: the page draws it plain
    ("own"), not in the amber that means "the target's free extra token"; a true bonus stays amber."""
    trace = speculative_generate(pair, "abc", SamplingConfig(0.0), SpecConfig(strategy="lookup", max_new_tokens=8))
    alone = [r for r in trace.rounds if r.k == 0]
    assert alone and all([t.label for t in r.tokens] == ["bonus"] for r in alone)
    page = render.tokens_html("abc", trace.rounds) + render.filmstrip_html(trace.rounds)
    for r in alone:
        assert re.search(rf'class="sd-tok sd-own[^"]*" title="[^"]*"[^>]* data-round="{r.index}"', page), r.index
    assert f'data-round="{alone[0].index}"' in page and "sd-own" in render.filmstrip_html(alone)
    chain = speculative_generate(pair, "ROMEO:\n", SamplingConfig(0.0), SpecConfig(k=2, max_new_tokens=24))
    bonus = [r for r in chain.rounds if r.k and r.n_accepted == r.k]
    assert bonus and "sd-own" not in render.tokens_html("", chain.rounds)
    assert render.tokens_html("", chain.rounds).count('class="sd-tok sd-bonus') >= len(bonus)


@pytest.mark.parametrize("lang,word", [("en", "so far"), ("zh-CN", "目前完成了")])
def test_a_k_sweep_cut_short_says_how_far_it_got(lang, word):
    """A sweep that Stop or the time limit ended shows the Ks it finished; its text says that it is part of the
    range asked for (a table of K = 1..7 for 1..8 read as a whole sweep), and a whole sweep does not."""
    rows = [{"k": k, "tokens_per_s": 10.0 + k, "speedup": 1 + k / 10, "alpha": 0.6} for k in range(1, 8)]
    sweep = {"results": rows, "alpha": 0.6, "c": 0.1, "base_tps": 10.0, "kb": 4, "sb": 1.5, "k_range": (1, 8)}
    cut = views.sweep_text(sweep, lang)
    assert word in cut and "7" in cut.split("\n")[0] and "8" in cut.split("\n")[0]
    whole = views.sweep_text(sweep | {"k_range": (1, 7)}, lang)
    assert word not in whole


def test_the_position_slider_is_as_long_as_the_round_it_opens(pair):
    """A chain round's positions run to K + 1 (the bonus), a tree round's to its path + 1; the slider ran to 17
    whatever the round, so most of its stops opened nothing."""
    for spec in (SpecConfig(k=3, max_new_tokens=12), SpecConfig(strategy="tree", max_new_tokens=12)):
        trace = speculative_generate(pair, "ROMEO:\n", SamplingConfig(0.8), spec)
        state = {"spec": trace, "base": None, "cursor": 0}
        for rnd in trace.rounds:
            slider = views.opened_round(state, rnd.index + 1)["pos_sl"]
            want = rnd.n_accepted + 1 if rnd.tree else rnd.k + 1
            assert slider["maximum"] == max(2, want) and 1 <= slider["value"] <= want, (spec.strategy, rnd.index)


def test_generate_shows_the_speedup_only_once_the_baseline_is_done(pair):
    """Generate's stream (handlers.generate_ui, the real Shakespeare pair, drafting trees): while the baseline runs,
    the stats show its two cards pending and no speed-up; the last update shows the figure, and opens the inspector
    on the run's first tree round."""
    from specdemo.app import handlers

    updates = list(handlers.generate_ui("shakespeare", "", "", "ROMEO:\n", 3, 0.8, 0, 1.0, 24, 0, True, 1.0, None,
                                        "tree", "en"))
    baseline = [u for u in updates[:-1] if "sd-pending" in u.get("stats", "")]
    assert baseline, "no update while the baseline ran"
    assert all("\u00d7</b>" not in u["stats"] for u in updates[:-1])  # no figure from part of the baseline
    last = updates[-1]
    assert "sd-pending" not in last["stats"] and "\u00d7</b>" in last["stats"]
    # nor in the charts: the baseline's first update draws them all, and its one step (the prompt's prefill) gave
    # the theory chart a measured speed-up many times the run's, which stayed there after a Stop
    drawn = [u["theory"].to_json() for u in updates[:-1] if "theory" in u]
    assert len(drawn) >= 2 and all("x measured" not in fig for fig in drawn)
    assert "x measured" in last["theory"].to_json()
    spec = last["state"]["spec"]
    first = next(r.index for r in spec.rounds if r.tree)
    assert last["round_sl"]["value"] == first + 1
    assert f'<div class="sd-tree" data-round="{first}"' in last["insp_reason"]


class Balance(HTMLParser):
    def __init__(self):
        super().__init__()
        self.stack, self.bad = [], False

    def handle_starttag(self, tag, attrs):
        if tag != "hr":
            self.stack.append(tag)

    def handle_endtag(self, tag):
        self.bad |= not self.stack or self.stack.pop() != tag


def test_any_text_draws_balanced_html_and_invents_nothing():
    """2,000 random replies of Markdown's marks, cut into random tokens: every one draws (no exception), its tags
    close in order, and what it shows is the reply's own characters, in order, less some marks."""
    import random

    marks = list("ab *_`#->1.)\n\\~[]()<&") + ["", "\n\n", "**", "```", "1. ", "- ", "  - ", "# ", "> "]
    rng = random.Random(38)
    for _ in range(2000):
        tokens = ["".join(rng.choice(marks) for _ in range(rng.randint(0, 4))) for _ in range(rng.randint(0, 30))]
        entries = [(c, i) for i, t in enumerate(tokens) for c in (t or [""])]
        drawn = reply.markdown_html(entries, chip)
        check = Balance()
        check.feed(drawn)
        assert not check.bad and not check.stack, (tokens, drawn)
        shown, source = iter("".join(tokens)), html.unescape(re.sub(r"<[^>]+>", "", drawn))
        assert all(c in shown for c in source), (tokens, drawn)  # a subsequence of the reply
