"""The message catalogue (specdemo/i18n: en.json, zh-CN.json): both languages hold the same keys with the same {slots}, every key the
code looks up exists, nothing is left untranslated, and what specdemo renders itself (HTML, figures, errors) comes
out in the language asked for, escaped. The page itself is tested in tests/test_browser.py."""

from __future__ import annotations

import ast
import dataclasses
import html
import re
import string
from pathlib import Path

import pytest

from specdemo import SamplingConfig, SpecConfig, i18n, speculative_generate
from specdemo.app import handlers, plots, render, style, views
from specdemo.i18n import EN, ZH, Msg, tr

ROOT = Path(__file__).resolve().parent.parent
# the CLI (__main__.py) stays in English and looks nothing up
SOURCES = sorted(p for p in (ROOT / "specdemo").rglob("*.py") if p.name != "__main__.py") + [ROOT / "app.py"]
LOOKUPS = {"tr", "trh", "template", "label", "L", "Msg", "UserError", "PromptError", "ModelLoadError",
           "HeadError", "StrategyUnavailable"}
CJK = re.compile(r"[\u3000-\u303f\u3400-\u9fff\uff00-\uffef]")  # CJK characters and punctuation


def slots(text: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(text) if name is not None}


def keys_in_source() -> dict[str, list[str]]:
    """Every literal catalogue key in the package: first arguments of the lookups, values of the *_KEY tables,
    and subscripts such as EN["app.title"]. Returns {key: [where, ...]}."""
    found: dict[str, list[str]] = {}

    def add(node, where):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.setdefault(node.value, []).append(where)

    for path in SOURCES:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            where = f"{path.name}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Call) and node.args:
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if name in LOOKUPS:
                    add(node.args[0], where)
            elif isinstance(node, ast.Assign) and any(getattr(t, "id", "").endswith("_KEY") for t in node.targets):
                for value in getattr(node.value, "values", []):
                    add(value, where)
            elif isinstance(node, ast.Subscript) and getattr(node.value, "id", None) in ("EN", "ZH"):
                add(node.slice, where)
            elif (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Subscript)
                  and getattr(node.value.value, "attr", None) == "MESSAGES"):
                add(node.slice, where)
    return found


def test_every_english_string_has_a_chinese_entry_and_back():
    assert sorted(set(EN) - set(ZH)) == [], "English strings without a Chinese entry"
    assert sorted(set(ZH) - set(EN)) == [], "Chinese entries without an English string"
    assert set(i18n.MESSAGES) == {code for _, code in i18n.CHOICES}


@pytest.mark.parametrize("key", sorted(EN))
def test_both_languages_fill_the_same_slots(key):
    assert slots(EN[key]) == slots(ZH[key]), key
    assert ZH[key].strip(), key


def test_chinese_entries_are_chinese():
    copied = [k for k in EN if ZH[k] == EN[k] and k not in i18n.SAME_IN_BOTH]
    assert copied == [], f"left in English: {copied}"
    no_cjk = [k for k in ZH if not CJK.search(ZH[k]) and k not in i18n.SAME_IN_BOTH]
    assert no_cjk == [], f"no Chinese characters: {no_cjk}"


def test_every_key_the_code_uses_exists_and_every_entry_is_used():
    used = keys_in_source()
    assert len(used) > 150  # the scan sees the lookups (a broken scan would pass the checks below vacuously)
    missing = {k: w for k, w in used.items() if k not in EN}
    assert missing == {}, f"keys looked up but not in the catalogue: {missing}"
    unused = sorted(set(EN) - set(used))
    assert unused == [], f"catalogue entries no code looks up: {unused}"


def test_lookup_falls_back_and_refuses_unknown_keys():
    assert tr("ui.generate", "zh-CN") == "生成" and tr("ui.generate", "en") == "Generate"
    assert tr("ui.generate", "zh-TW") == "生成" and tr("ui.generate", "fr") == "Generate"
    assert tr("err.range", "zh-CN", name=Msg("field.temperature"), lo=0, hi=2, value=5) == \
        "温度必须在 0 到 2 之间，收到的是 5。"
    with pytest.raises(KeyError):
        tr("no.such.key", "en")
    with pytest.raises(KeyError):
        i18n.label("no.such.key")


@pytest.mark.parametrize("lang,header,expected", [
    ("zh-CN", None, "zh-CN"), ("zh-TW", None, "zh-CN"), ("zh", None, "zh-CN"), ("en", "zh-CN", "en"),
    ("fr-FR", None, "en"), (None, "zh-CN,zh;q=0.9,en;q=0.8", "zh-CN"), ("", "en-US,en;q=0.9,zh-CN;q=0.8", "en"),
    (None, "fr-FR,fr;q=0.9,zh-CN;q=0.5", "zh-CN"), (None, "de-DE;q=bad", "en"), (None, None, "en"),
])
def test_the_visitor_language(lang, header, expected):
    assert i18n.pick(lang, header) == expected


@pytest.fixture(scope="module")
def run(pair):
    """A real run of the embedded pair with rejections, resamples and bonus tokens in it."""
    trace = speculative_generate(pair, "ROMEO:\n", SamplingConfig(1.0), SpecConfig(k=4, max_new_tokens=48, seed=3))
    labels = {t.label for r in trace.rounds for t in r.tokens}
    assert {"accepted", "rejected", "resampled", "bonus"} <= labels
    return trace


def test_rendered_html_follows_the_language_and_escapes_it(run):
    zh = {
        "legend": render.legend("zh-CN"),
        "tokens": render.tokens_html(run.prompt, run.rounds, lang="zh-CN"),
        "film": render.filmstrip_html(run.rounds, lang="zh-CN"),
        "stats": render.stats_html(run, None, render.done_status(run, "zh-CN"), "zh-CN"),
        "keys": render.keys_hint("zh-CN"),
    }
    assert "被目标模型接受" in zh["legend"] and "额外 token" in zh["legend"]
    assert "p(x) 目标模型 = " in zh["tokens"] and "q(x) 草稿模型 = " in zh["tokens"] and "第 1 轮" in zh["tokens"]
    assert "第1轮" in zh["film"] and "接受 " in zh["film"]
    assert "接受率 α" in zh["stats"] and "完成（" in zh["stats"]
    assert "<kbd>PageDown</kbd>" in zh["keys"] and "下一轮" in zh["keys"]
    for page in zh.values():
        assert not re.search(r"kept by|accepted /|round \d|target =", page), page[:200]
    # a translation that holds '<' reaches the page escaped, in both languages
    lossy = run.__class__(run.mode, run.prompt, run.prompt_ids, run.settings | {"lenience": 0.5}, run.rounds)
    lossy.wall_s = run.wall_s
    for lang, words in (("en", "lenience b &lt; 1"), ("zh-CN", "宽松系数 b &lt; 1")):
        assert words in render.stats_html(lossy, lang=lang)
    en_reasons = [render.reason(r, pos) for r in run.rounds for pos in range(1, r.k + 2)]
    zh_reasons = [render.reason(r, pos, "zh-CN") for r in run.rounds for pos in range(1, r.k + 2)]
    assert any(x.startswith("Rejected") for x in en_reasons) and any(x.startswith("拒绝") for x in zh_reasons)
    assert any("额外给出了一个 token" in x for x in zh_reasons)
    assert all("<" not in x.replace("&lt;", "") for x in zh_reasons + en_reasons)  # no raw markup, only text


def test_a_kept_piece_of_a_character_shows_a_dot_and_says_so_in_both_languages(run):
    """A kept token that adds no text of its own (models.TextStream: it holds part of a character that a later token
    completes) still has its coloured box: a dot drawn by CSS, so the page's text stays the reply; its tooltip and
    the reasons and captions that quote it say what it is, in the visitor's language. The film strip shows a kept
    draft as the reply has it, not as the draft's loose bytes."""
    import copy

    rnd = copy.deepcopy(next(r for r in run.rounds if any(t.label == "bonus" for t in r.tokens) and r.n_accepted))
    bonus = next(t for t in rnd.tokens if t.label == "bonus")
    bonus.text = ""
    rnd.tokens[0].text = "你"  # an accepted draft that completes a character: the reply has it whole
    rnd.drafts[0].text = "<0xA0>"  # while the draft on its own is a loose byte
    for lang, tip, said in (("en", "a piece of a character:", "a piece of a character"),
                            ("zh-CN", "一个字符的一部分：", " 「一个字符的一部分」")):  # quoted like a token
        html = render.tokens_html(run.prompt, [rnd], lang=lang)
        piece = re.search(r'<span class="sd-tok sd-bonus sd-piece" title="([^"]*)"[^>]*></span>', html)
        assert piece and tip in piece.group(1), html
        assert html.count("sd-piece") == 2  # only the piece (in the reply and in the full story): every other kept
        # token has text
        assert said in render.reason(rnd, rnd.k + 1, lang)
        assert "''" not in render.reason(rnd, rnd.k + 1, lang)
        film = render.filmstrip_html([rnd], lang=lang)
        assert ">你</span>" in film and "0xA0" not in film and film.count("sd-piece") == 1, film
    assert ".sd-piece::after" in style.CSS


def test_step_captions_in_both_languages(run):
    assert render.step_caption([], 0, "zh-CN") == "请先生成，然后一轮一轮地往下看。"
    assert render.step_caption(run.rounds, 0, "zh-CN").startswith("第 1 轮之前")
    en, zh = render.step_caption(run.rounds, 2, "en"), render.step_caption(run.rounds, 2, "zh-CN")
    assert en.startswith(f"Round 2 of {len(run.rounds)}: draft proposed 4; target kept")
    assert zh.startswith(f"第 2 轮（共 {len(run.rounds)} 轮）：草稿模型提出 4 个 token，目标模型接受了")
    assert run.rounds[1].caption in en  # the JSON trace's English caption is the English page's caption


def test_the_trace_caption_is_the_pages_english_caption_for_every_kind_of_round(pair, run):
    """One caption, not twins: the JSON trace's (events.Round.caption) is render.round_caption in English, for
    rounds drafted by the draft model, copied by lookup, a lookup fallback, the head's prefill and its rounds, and
    a round that stops the run."""
    runs = [run] + [speculative_generate(pair, "ROMEO:\nROMEO:\n", SamplingConfig(0.0),
                                         SpecConfig(k=3, max_new_tokens=24, strategy=s)) for s in ("lookup", "eagle")]
    rounds = [r for t in runs for r in t.rounds]
    assert {"draft", "lookup", "fallback", "prefill", "eagle"} <= {r.source for r in rounds}
    assert any(r.stop_reason for r in rounds)
    for r in rounds:
        assert r.caption == render.round_caption(r, "en") == r.to_dict()["caption"], r.source


def test_figures_follow_the_language_and_presenter_mode(run, pair):
    base = None
    figs = tuple(views.charts(run, base, "zh-CN", presenter=False).values()) + (
        plots.inspector(run.rounds[0], 1, lang="zh-CN"), plots.inspector_empty("zh-CN"),
        plots.k_sweep([{"k": 1, "speedup": 1.2}], 0.8, 0.1, "zh-CN"),
        plots.distribution(["a", ""], [0.5, 0.5], [0.4, 0.6], [0.3, 0.7], 100, "zh-CN"))
    for fig in figs:
        texts = [fig.layout.title.text, fig.layout.xaxis.title.text, fig.layout.yaxis.title.text]
        texts += [t.name for t in fig.data if t.name] + [a.text for a in fig.layout.annotations]
        assert CJK.search(fig.layout.title.text), fig.layout.title.text
        english = [t for t in texts if t and re.search(r"\b(tokens|round|accepted|speedup|probability|draft)\b", t)]
        assert english == [], english
    big = views.charts(run, base, "en", presenter=True).values()
    small = views.charts(run, base, "en", presenter=False).values()
    for b, s in zip(big, small, strict=True):
        assert b.layout.font.size > s.layout.font.size and b.layout.height > s.layout.height


def test_redraw_keeps_a_run_and_switches_everything(run):
    state = {"spec": run, "base": None, "cursor": 2}
    sweep = {"results": [{"k": 2, "speedup": 1.3, "tokens_per_s": 90.0, "alpha": 0.8}], "alpha": 0.8, "c": 0.1,
             "base_tps": 70.0, "kb": 4, "sb": 1.9}
    dist = {"n": 100, "lenience": 0.5, "tokens": ["a"], "p": [1.0], "freq": [1.0], "q": [1.0], "tv": 0.0,
            "tv_ref": 0.0, "tv_pq": 0.0}
    desc = {"draft": "d", "target": "t", "draft_parameters": 1e6, "target_parameters": 1e7, "device": "cpu",
            "dtype": "float32", "context_window": 512}
    out = handlers.redraw("zh-CN", True, state, 2, 1, sweep, dist, None, desc)
    assert set(out) == set(handlers.REDRAW_OUTPUTS)
    legend, keys, tokens, stats, film = (out[k] for k in ("legend", "keys", "tokens", "stats", "film"))
    assert run.rounds[0].tokens[0].text.strip()[:3] in tokens and "p(x) 目标模型" in tokens
    assert "完成" in stats and "第2轮" in film and "被目标模型接受" in legend
    insp_reason, step_tokens, step_caption = out["insp_reason"], out["step_tokens"], out["step_caption"]
    assert "第 2 轮" in out["insp_plot"].layout.title.text and CJK.search(insp_reason)
    assert step_caption.startswith("第 2 轮（共") and 'class="sd-tok' in step_tokens
    assert out["sweep_md"].startswith("基线 70.0 token/s") and "| K | token/s | 加速比 |" in out["sweep_md"]
    assert "有损" in out["dist_md"] and out["pair_status"].startswith("**已加载**")
    empty = handlers.redraw("en", False, None, 1, 1, None, None, None, None)
    assert "Rounds appear here" in empty["film"] and "pair_status" not in empty  # pair status skipped, not blanked
    # a switch while the run still drafts says it runs, in the new language (it said "done ()" until its next update)
    running = dataclasses.replace(run, stop_reason=None)
    mid = handlers.redraw("zh-CN", False, {"spec": running, "base": None}, 1, 1, None, None, None, None)["stats"]
    assert tr("status.speculative", "zh-CN") in mid and "完成" not in mid
    assert "Generate first" in empty["insp_reason"]


def test_a_switch_while_the_baseline_runs_says_it_runs():
    """A language or presenter switch during the target-only baseline drew the finished speculative run's "done"
    until the baseline's next update: it says the baseline runs, with its count, as the run's own updates do."""
    from specdemo.app import recorded

    spec, base = recorded.load("smollm2-135m")
    spec = dataclasses.replace(spec, settings={k: v for k, v in spec.settings.items() if k != "recorded"})  # live
    running = dataclasses.replace(base, stop_reason=None, steps=base.steps[:5])
    total = spec.settings["max_new_tokens"]
    for lang in ("en", "zh-CN"):
        stats = handlers.redraw(lang, False, {"spec": spec, "base": running}, 1, 1, None, None, None, None)["stats"]
        assert html.escape(tr("status.baseline", lang, n=5, total=total), quote=False) in stats, stats
        assert tr("status.done", lang, reason="")[:2] not in stats
    done = handlers.redraw("en", False, {"spec": spec, "base": base}, 1, 1, None, None, None, None)["stats"]
    assert "running" not in done


def test_redraws_take_turns_over_all_sessions(run):
    """A redraw answers outside the queue (queue=False), so at most two run at once over every session: a third,
    from a session of its own, waits for a place (a caller with a new session per call took every core)."""
    import threading

    from specdemo.app import session_locks

    class Session:
        session_hash = "another"

    for _ in range(2):
        session_locks.REDRAWS.acquire()
    done = []
    third = threading.Thread(target=lambda: done.append(handlers.redraw("en", False, {"spec": run, "base": None}, 1, 1,
                                                                        None, None, None, None, Session())))
    try:
        third.start()
        third.join(timeout=3)
        assert third.is_alive() and not done, "a third redraw ran beside two"
    finally:
        session_locks.REDRAWS.release()
        session_locks.REDRAWS.release()
    third.join(timeout=60)
    assert len(done) == 1 and "done" in done[0]["stats"]  # and then it ran


def test_a_redraw_waits_for_a_step_and_draws_its_cursor(run):
    """A switch's redraw and a step key of the same session take turns on the session's lock, and the redraw draws
    the cursor as the step left it: the step view never goes back to the round the redraw's event read."""
    import threading
    from types import SimpleNamespace

    request = SimpleNamespace(session_hash="redraw-order")
    state = {"spec": run, "base": None, "cursor": 1}
    out = {}
    with handlers.session_turn(request):  # held as a key press holds it, while the redraw's event arrives
        worker = threading.Thread(target=lambda: out.update(handlers.redraw("en", False, state, 1, 1, None, None,
                                                                            None, None, request)))
        worker.start()
        worker.join(0.5)
        assert worker.is_alive() and not out  # it waits for the step
        state["cursor"] = 3  # what the step wrote
    worker.join(60)
    assert out["step_caption"].startswith("Round 3 of")
    after = handlers.step_round(state, 1, "en", request)  # and a press after the redraw goes on from there
    assert after["step_caption"].startswith("Round 4 of") and state["cursor"] == 4


@pytest.mark.parametrize("kwargs,en,zh", [
    (dict(prompt=""), "The prompt is empty", "提示词是空的"),
    (dict(k=99), "K must be between 1 and", "K必须在 1 到"),
    (dict(temperature="x"), "Temperature must be a number", "温度必须是数字"),
    (dict(top_p=0.0), "Top-p must be above 0", "Top-p 必须大于 0"),
    (dict(seed=1.5), "Seed must be a whole number", "随机种子必须是整数"),
    (dict(pair_name="nope"), "Unknown model pair 'nope'", "未知的模型对 'nope'"),
    (dict(pair_name="custom", draft_id="", target_id="x"), "Enter both a draft and a target", "自定义模型对需要同时填写"),
    (dict(pair_name="custom", draft_id="/etc", target_id="x/y"), "Custom models are Hugging Face Hub repo ids",
     "自定义模型请填写 Hugging Face Hub 的仓库 id"),
    (dict(chat="yes"), "chat must be true, false or null", "chat 只能是 true、false 或 null"),
])
def test_errors_in_both_languages(kwargs, en, zh, monkeypatch):
    monkeypatch.delenv("SPECDEMO_ALLOW_LOCAL", raising=False)
    args = dict(pair_name="shakespeare", draft_id="", target_id="", prompt="ROMEO:", k=4, temperature=0.8, top_k=0,
                top_p=1.0, max_new_tokens=8, seed=0, run_baseline=False, lenience=1.0)
    args.update(kwargs)
    with pytest.raises(handlers.UserError) as info:
        handlers.validate(**args)
    assert str(info.value).startswith(en) and handlers.error_text(info.value, "en").startswith(en)
    assert handlers.error_text(info.value, "zh-CN").startswith(zh)


def test_engine_prompt_errors_are_translated_too(pair):
    from specdemo.engine.speculative import PromptError, encode_prompt

    with pytest.raises(PromptError) as info:
        encode_prompt(pair, "ROMEO " * 400, 200)
    assert str(info.value).startswith("The prompt is ") and "context window is 512 tokens" in str(info.value)
    assert handlers.error_text(info.value, "zh-CN").startswith("提示词有 ")
    assert "512 个 token" in handlers.error_text(info.value, "zh-CN")


def test_chat_mode_without_a_template_is_refused_in_both_languages(pair):
    from specdemo.engine.speculative import PromptError, encode_prompt

    assert not pair.has_chat_template  # the Shakespeare pair is a plain text model
    with pytest.raises(PromptError) as info:
        encode_prompt(pair, "ROMEO:", 8, chat=True)
    assert str(info.value).startswith("This pair's tokenizer has no chat template")
    assert handlers.error_text(info.value, "zh-CN").startswith("这对模型的分词器没有对话模板")


def test_load_failures_are_translated_and_stay_english_in_str():
    """models.py's ModelLoadError carries its catalogue entry through handlers.get_pair to the page."""
    with pytest.raises(handlers.UserError) as info:
        handlers.get_pair(("/no/such/draft", "/no/such/target"))
    en, zh = str(info.value), handlers.error_text(info.value, "zh-CN")
    assert en.startswith("Could not load the target model 'local:target': no such folder") and "/no/such" not in en
    assert zh.startswith("无法加载目标模型 'local:target'：没有这个文件夹") and "内置模型对" in zh and "/no/such" not in zh


def test_gradios_toast_titles_are_replaced_on_the_chinese_page():
    """gradio 6 draws "Warning"/"Error" above a toast in English whatever the locale; style.CSS draws the
    catalogue's word instead on a page whose language is not English (body[data-sd-lang], set by page_js.LOCALE_JS)."""
    for level, key in style.TOAST_KEY.items():
        assert f'body[data-sd-lang="zh-CN"] .toast-title.{level}::before {{ content: "{ZH[key]}";' in style.CSS
    assert 'data-sd-lang="en"' not in style.CSS


PLAIN = {  # issue 38: each term on the first screen, and the plain words beside it, in both languages
    "en": {"alpha (accepted / judged)": "share of the drafter's guesses", "target calls used / saved": "how many runs",
           "r = ": "a random number in [0, 1)", "pruned below": "guesses that the head finds less likely",
           "head p = ": "how likely the EAGLE head found it", "lenience (lossy": "faster, but no longer exactly"},
    "zh-CN": {"接受率 α（接受 / 检验）": "被保留的比例", "目标模型调用：实际 / 节省": "省下了几次",
              "r = ": "中的随机数", "剪去累计概率低于": "可能性低于该值的猜测", "草稿头概率": "草稿头认为它有多可能",
              "宽松系数（有损": "更快，但不再严格"},
}


@pytest.mark.parametrize("lang", ["en", "zh-CN"])
def test_the_first_screen_says_its_terms_in_plain_words_too(lang, run):
    """The stats cards, the recorded note, the token tooltips, the tree's tooltips and the lenience box keep their
    exact terms (for experts) and give each in plain words, in a tooltip or beside it (issue 38, item 10). The
    subtitle says nothing about K, which a tree or prompt lookup does not have (item 9); the key hint says that the
    keys work on any run on the page, the recorded one too (item 11)."""
    from specdemo.app import recorded, tree_view

    spec, base = recorded.load("smollm2-135m")
    stats = html.unescape(render.stats_html(spec, base, lang=lang))
    tips = dict(re.findall(r'title="([^"]+)"><b>[^<]*</b><span>([^<]+)</span>', stats))
    assert len(tips) == 6 and all(tip not in label for tip, label in tips.items())
    tree = next(r for r in spec.rounds if r.tree)
    tokens = html.unescape(render.tokens_html(run.prompt, run.rounds, lang=lang))
    shown = {"stats": stats, "tokens": tokens, "tree": html.unescape(tree_view.tree_html(tree, lang)),
             "lenience": tr("ui.lenience_box", lang)}
    for term, plain in PLAIN[lang].items():
        holder = next(text for text in shown.values() if term in text)  # the exact term is kept...
        assert plain in holder, (term, plain)  # ...and said plainly where it is
    recorded_tip = re.search(r'class="sd-recorded" title="([^"]+)"', stats).group(1)
    assert {"en": "top-k", "zh-CN": "top-k"}[lang] in recorded_tip and "T" in recorded_tip
    assert "K" not in tr("app.intro", lang).split("\n", 1)[1]
    assert "生成之后" not in ZH["keys.hint"] and "录制" in ZH["keys.hint"]
