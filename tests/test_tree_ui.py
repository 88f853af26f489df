"""Draft trees as a person sees and calls them (issue 24, "Seeing it" and "Bad input"): the caption, the film strip,
the inspector's reason, the drawing of a round's tree (tree_view.tree_html), the JSON trace, the refusals of bad sizes
(validation.py), the CLI's flags, /generate's parameters and the page in headless Chromium. Every run is a real
tree run of the embedded Shakespeare pair; the engine's own tests are in test_tree.py."""

from __future__ import annotations

import dataclasses
import html
import json
import os
import re
import xml.etree.ElementTree as ET

import pytest
from conftest import CHROMIUM
from test_browser import open_settings, set_slider

from specdemo import SamplingConfig, SpecConfig, speculative_generate
from specdemo.app import render, style, tree_view, views
from specdemo.app.validation import UserError, validate
from specdemo.engine.events import Round, Trace
from specdemo.limits import Limits

SVG = "{http://www.w3.org/2000/svg}"
SHAPE = dict(tree_topk=2, tree_depth=2, tree_budget=4)  # small: rounds that reach a leaf and rounds that miss


@pytest.fixture(scope="module")
def tree_trace(pair) -> Trace:
    """A sampled tree run: some rounds end off the tree (the target's correction), some at a leaf (a bonus)."""
    return speculative_generate(pair, "ROMEO:\n", SamplingConfig(0.8),
                                SpecConfig(strategy="tree", max_new_tokens=32, seed=0, **SHAPE))


def ending(rnd: Round) -> str:
    labels = [t.label for t in rnd.tokens]
    return "leaf" if "bonus" in labels else "miss" if "resampled" in labels else "cut"


def tree_rounds(trace: Trace, kind: str | None = None) -> list[Round]:
    return [r for r in trace.rounds if r.tree and kind in (None, ending(r))]


def test_the_run_has_both_endings(tree_trace):
    assert tree_trace.rounds[0].source == "prefill" and tree_trace.rounds[0].tree is None
    assert tree_rounds(tree_trace, "leaf") and tree_rounds(tree_trace, "miss"), "the seed should give both endings"


def test_caption_film_strip_and_reason_say_what_the_walk_did(tree_trace):
    for rnd in tree_rounds(tree_trace):
        end = next((t for t in rnd.tokens if t.label in ("resampled", "bonus")), None)
        en, zh = render.round_caption(rnd, "en"), render.round_caption(rnd, "zh-CN")
        assert en.startswith(f"the head drafted a tree of {rnd.k} tokens; ")
        assert zh.startswith(f"草稿头起草了一棵含 {rnd.k} 个 token 的树；")
        assert rnd.caption == en and rnd.to_dict()["caption"] == en  # the JSON trace's caption is the English one
        if ending(rnd) == "leaf":
            assert f"went {rnd.n_accepted} deep, reached a leaf and added {end.text!r} as a free extra token" in en
            assert "到达叶子节点" in zh
        elif rnd.n_accepted:
            assert f"went {rnd.n_accepted} deep, then it chose {end.text!r}, which the tree did not have" in en
        else:
            assert en.endswith(f"the target chose {end.text!r}, which the tree did not have")
        film = html.unescape(render.filmstrip_html([rnd], lang="en"))
        assert f"tree {rnd.k} \u00b7 kept {rnd.n_accepted} +1 \u00b7 " in film
        film_zh = html.unescape(render.filmstrip_html([rnd], lang="zh-CN"))
        assert f"树 {rnd.k} \u00b7 接受 {rnd.n_accepted} +1" in film_zh
        # the inspector opens on the refused child, or on the bonus at the leaf, and says why
        state = {"spec": tree_trace, "base": None, "cursor": 0}
        pos = views.default_position(state, rnd.index + 1)
        reason = html.unescape(views.inspector(state, rnd.index + 1, pos)["insp_reason"])
        if ending(rnd) == "leaf":
            assert pos == rnd.n_accepted + 1 and f"reached a leaf after {rnd.n_accepted} kept tokens" in reason
        else:
            refused = rnd.drafts[pos - 1]
            assert not refused.accepted and f"likeliest child here was {refused.text!r}" in reason
            assert f"the target drew {end.text!r}" in reason
        assert 'class="sd-tree"' in reason  # the drawing sits below the reason
        if rnd.n_accepted:
            kept = html.unescape(views.inspector(state, rnd.index + 1, 1)["insp_reason"])
            assert f"Kept {rnd.drafts[0].text!r}" in kept


def nodes_of(svg_html: str) -> list[ET.Element]:
    svg = ET.fromstring(re.search(r"<svg .*</svg>", svg_html, re.S).group(0))  # well-formed XML: all escaped
    return [g for g in svg.iter(f"{SVG}g") if "sd-tree-node" in g.get("class", "")]


def kind_of(g: ET.Element) -> str:
    return g.get("class").split()[-1].removeprefix("sd-tree-")


def test_the_drawing_marks_the_path_the_refused_children_and_the_unused_branches(tree_trace):
    for rnd in tree_rounds(tree_trace):
        root = views.root_text(tree_trace.rounds, rnd.index)
        drawn = tree_view.tree_html(rnd, "en", root)
        groups = nodes_of(drawn)
        kinds = [kind_of(g) for g in groups]
        path = [nd for nd in rnd.tree if nd.on_path]
        end = path[-1].id if path else -1
        refused = [nd for nd in rnd.tree if nd.parent == end] if ending(rnd) == "miss" else []
        assert kinds.count("root") == 1 and kinds.count("path") == len(path) == rnd.n_accepted
        assert kinds.count("refused") == len(refused)
        assert kinds.count("unused") == rnd.k - len(path) - len(refused)
        assert kinds.count("resampled" if ending(rnd) == "miss" else "bonus") == 1
        by_id = {int(g.get("data-node")): g for g in groups if g.get("data-node").isdigit()}
        assert sorted(by_id) == [nd.id for nd in rnd.tree]
        for nd in rnd.tree:  # hovering a node shows the head's probability and the target's p
            tip = by_id[nd.id].find(f"{SVG}title").text
            assert f"head p = {nd.head_p:.3g} (" in tip and f"target p = {nd.p:.3g} (" in tip
            assert f"depth {nd.depth}" in tip
            # a sampled child (T > 0) also says what it was drawn from and its chance to be kept when tested
            assert nd.q is not None and f"(q = {nd.q:.3g} once" in tip and f"min(1, r/q) = {nd.accept_prob:.3g}" in tip
        # the shade follows the head's probability
        shade = sorted((nd.head_p, float(re.search(r"fill-opacity: ([\d.]+)", by_id[nd.id].find(f"{SVG}rect")
                                                   .get("style")).group(1))) for nd in rnd.tree)
        assert [s for _, s in shade] == sorted(s for _, s in shade)
        # depth runs left to right; the path (and the token that ended the round) runs along the top row
        x = {g.get("data-node"): [float(v) for v in re.findall(r"[\d.]+", g.get("transform"))] for g in groups}
        for nd in rnd.tree:
            assert x[str(nd.id)][0] > x[str(nd.parent) if nd.parent >= 0 else "root"][0]
        assert {x[str(nd.id)][1] for nd in path} <= {min(y for _, y in x.values())}
        assert root is None or f"{root!r}: the last fixed token" in html.unescape(drawn)
    assert tree_view.tree_html(tree_trace.rounds[0]) == ""  # the prefill round has no tree


def test_the_theory_chart_says_the_chains_model_does_not_apply_to_a_tree(tree_trace, pair):
    from specdemo import baseline_generate
    from specdemo.app import plots

    base = baseline_generate(pair, "ROMEO:\n", SamplingConfig(0.8), max_new_tokens=8)
    fig = plots.speedup_vs_theory(tree_trace, base, lang="en")
    per_call = f"{tree_trace.metrics()['mean_accepted_length']:.2f} tokens per target call"
    note = fig.layout.annotations[0].text
    assert not fig.data and "does not apply" in note and per_call in note
    chain = dataclasses.replace(tree_trace, settings=tree_trace.settings | {"strategy": "eagle"})
    assert plots.speedup_vs_theory(chain, base, lang="en").data  # the chain's curves, for comparison


def test_a_tree_rounds_bar_stacks_its_kept_path_on_its_depth_not_its_node_count(tree_trace):
    """A tree's nodes are alternatives: a round keeps at most one path, as deep as the tree. So its bar in "drafts
    accepted per round" is the path plus the rest of the depth, not the path plus every other node."""
    from specdemo.app import plots

    fig = plots.acceptance_per_round(tree_trace, lang="en")
    kept, rest = fig.data[0].y, fig.data[1].y
    drafted = [r for r in tree_trace.rounds if r.tree]
    assert drafted and any(len(r.tree) > max(nd.depth for nd in r.tree) for r in drafted)  # bushy, not chains
    for r in tree_trace.rounds:
        deepest = max((nd.depth for nd in r.tree), default=0) if r.tree else r.k
        assert (kept[r.index], kept[r.index] + rest[r.index]) == (r.n_accepted, deepest)
    assert "of tree depth" in fig.layout.yaxis.title.text
    assert "树深" in plots.acceptance_per_round(tree_trace, "zh-CN").layout.yaxis.title.text
    hist = plots.accepted_length_histogram(tree_trace, lang="en")
    assert list(hist.data[0].x) == list(range(1, max(plots.most_kept(r) for r in tree_trace.rounds) + 2))


HOSTILE = "<script>alert('x')</script><img src=x onerror=alert(1)>\x07&"


def hostile_round(trace: Trace) -> Round:
    rnd = tree_rounds(trace, "miss")[0]
    tree = [dataclasses.replace(nd, text=HOSTILE + str(nd.id)) for nd in rnd.tree]
    tokens = [dataclasses.replace(t, text=HOSTILE) for t in rnd.tokens]
    return dataclasses.replace(rnd, tree=tree, tokens=tokens)


def test_the_drawing_escapes_every_token(tree_trace):
    drawn = tree_view.tree_html(hostile_round(tree_trace), "en", root=HOSTILE)
    assert "<script" not in drawn and "<img" not in drawn and "\x07" not in drawn
    texts = [g.find(f"{SVG}text").text for g in nodes_of(drawn)]
    assert all(t.startswith("<script>") for t in texts)  # shown as text, cut to fit a node
    titles = [g.find(f"{SVG}title").text for g in nodes_of(drawn)]
    assert all("<img src=x onerror=alert(1)>\\x07&" in t for t in titles)  # the tooltips say it all, as text


def test_the_json_trace_carries_every_node_and_reads_back(tree_trace):
    data = json.loads(json.dumps(tree_trace.to_dict()))
    settings = data["settings"]
    assert (settings["strategy"], settings["tree_topk"], settings["tree_depth"], settings["tree_budget"],
            settings["tree_children"]) == ("tree", 2, 2, 4, "sampled")  # T > 0: "auto" draws the children
    for rnd, back in zip(tree_trace.rounds, data["rounds"], strict=True):
        if not rnd.tree:
            assert back["tree"] is None
            continue
        nodes = back["tree"]
        assert [set(n) for n in nodes] == [{"id", "token_id", "text", "parent", "depth", "head_p", "p", "on_path", "q",
                                            "accept_prob"}] * len(nodes)
        assert all(0 < n["q"] <= 1 and 0 <= n["accept_prob"] <= 1 for n in nodes)  # drawn from q, tested with it
        assert len(nodes) == back["k"] <= 4 and all(n["depth"] <= 2 and -1 <= n["parent"] < n["id"] for n in nodes)
        path = [n for n in nodes if n["on_path"]]
        assert len(path) == back["n_accepted"] and [n["depth"] for n in path] == list(range(1, len(path) + 1))
        assert [n["text"] for n in path] == [t["text"] for t in back["tokens"][: len(path)]]
    assert Trace.from_dict(data).rounds == tree_trace.rounds


# ------------------------------------------------------------------------------------------------ bad input


def ask(limits: Limits | None = None, pair_name: str = "shakespeare", draft: str = "", target: str = "", **sizes):
    return validate(pair_name, draft, target, "ROMEO:\n", 4, 0.8, 0, 1.0, 16, 0, False, 1.0,
                    limits or Limits(max_tree=8), None, "tree", 3, **sizes)


@pytest.mark.parametrize("sizes,en,zh", [
    (dict(tree_topk=17), "Tree top-k must be 0 (the head's own) or between 1 and 16, got 17.",
     "草稿树 top-k必须是 0"),
    (dict(tree_depth=-1), "Tree depth must be 0 (the head's own) or between 1 and 16, got -1.",
     "草稿树深度必须是 0"),
    (dict(tree_budget=9), "Tree budget must be at most 8 nodes on this server (SPECDEMO_MAX_TREE), got 9.",
     "本服务器上草稿树规模最多 8 个节点"),
    (dict(tree_budget="2.5"), "Tree budget must be a whole number, got 2.5.", "草稿树规模必须是整数"),
    (dict(tree_topk="many"), "Tree top-k must be a number, got 'many'.", "草稿树 top-k必须是数字"),
    (dict(tree_prune=1), "Tree pruning must be a cumulative head probability below 1 (0: none; negative: the run's "
     "default), got 1.", "草稿树剪枝阈值必须是小于 1 的"),
    (dict(tree_prune="nan"), "Tree pruning must be a finite number.", "草稿树剪枝阈值必须是有限"),
    (dict(tree_lookup=17), "Tree lookup branch must be between 0 and 16, got 17.", "草稿树的查找分支必须"),
    (dict(tree_lookup=-1), "Tree lookup branch must be between 0 and 16, got -1.", "草稿树的查找分支必须"),
])
def test_bad_tree_sizes_are_refused_in_one_sentence(sizes, en, zh):
    with pytest.raises(UserError) as info:
        ask(**sizes)
    assert info.value.text("en") == en and info.value.text("zh-CN").startswith(zh)
    assert info.value.text("en").count(". ") == 0  # one sentence


def test_the_server_limit_caps_the_budget_and_zero_takes_the_heads_own():
    assert [ask(tree_prune=v).spec.tree_prune for v in (None, -1, 0, 0.005, "0.5")] == [None, None, 0.0, 0.005, 0.5]
    assert [ask(tree_lookup=v).spec.tree_lookup for v in (0, 8, "16")] == [0, 8, 16]
    assert ask(tree_budget=8).spec.tree_budget == 8
    assert ask(Limits(max_tree=64), tree_budget=64).spec.tree_budget == 64
    spec = ask(tree_topk=0, tree_depth=0, tree_budget=0).spec
    assert (spec.strategy, spec.tree_topk, spec.tree_depth, spec.tree_budget) == ("tree", 0, 0, 0)


def test_a_pair_without_a_head_refuses_the_tree():
    with pytest.raises(UserError, match="cannot draft with the EAGLE head: none was trained for it"):
        ask(pair_name="gpt2")
    with pytest.raises(UserError, match="Only the embedded pairs have an EAGLE head"):
        ask(pair_name="custom", draft="owner/draft", target="owner/target")


def test_the_strategy_choices_offer_the_tree_only_with_a_head():
    assert "tree" in [v for _, v in views.strategy_choices("shakespeare")]
    assert "tree" not in [v for _, v in views.strategy_choices("gpt2")]
    from specdemo.app import handlers

    away, held = handlers.update_strategies("gpt2", "tree")  # a pair change away from the head
    assert away["value"] == "fixed" and held == "tree"
    back, held = handlers.update_strategies("smollm2-135m", "fixed", held)  # and back: the tree comes back
    assert back["value"] == "tree" and held == ""
    assert handlers.update_strategies("smollm2-135m", "tree")[0]["value"] == "tree"
    assert handlers.update_strategies("smollm2-135m", "lookup", "")[0]["value"] == "lookup"  # the visitor's pick
    # a custom pair loaded with an EAGLE-3 head offers the head's strategies, also when the selector comes back to it
    # (a failed change away puts it back on the loaded pair, whose state did not change); any other pair state not
    with_head = {"chosen": {"pair": "custom", "draft": "d", "target": "t", "head": "h"}, "head": "local:h"}
    away, held = handlers.update_strategies("gpt2", "tree", "", with_head)
    assert away["value"] == "fixed" and held == "tree"
    back, held = handlers.update_strategies("custom", "fixed", held, with_head)
    assert back["value"] == "tree" and held == "" and "tree" in [v for _, v in back["choices"]]
    for loaded in (None, {"chosen": {"pair": "custom", "draft": "d", "target": "t"}},
                   {"chosen": {"pair": "smollm2-135m"}, "head": "local:h"}):
        assert handlers.update_strategies("custom", "tree", "", loaded)[0]["value"] == "fixed", loaded


# ------------------------------------------------------------------------------------------------ the CLI


def test_the_cli_prints_each_tree_round_with_its_size(capsys):
    from specdemo.__main__ import main

    args = ["generate", "--pair", "shakespeare", "--strategy", "tree", "--temperature", "0", "--max-new-tokens", "16",
            "--tree-topk", "2", "--tree-depth", "3", "--tree-budget", "6"]
    assert main(args + ["--json"]) == 0
    trace = json.loads(capsys.readouterr().out)
    assert (trace["settings"]["tree_depth"], trace["settings"]["tree_budget"]) == (3, 6)
    assert main(args + ["--rounds"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("round ")]
    assert len(lines) == len(trace["rounds"])
    for line, rnd in zip(lines, trace["rounds"], strict=True):
        if rnd["tree"]:
            added = " +1" if any(t["label"] in ("resampled", "bonus") for t in rnd["tokens"]) else ""
            assert line.startswith(f"round {rnd['index'] + 1} [tree {rnd['k']} \u00b7 kept {rnd['n_accepted']}"
                                   f"{added}]: "), line
        assert line.endswith(f"({rnd['caption']})")
    assert main(args[:-2] + ["--tree-budget", "-1"]) == 2
    assert "tree_budget must be 0 (the head's default) or at least 1" in capsys.readouterr().err
    assert main(["generate", "--pair", "gpt2", "--strategy", "tree"]) == 2
    assert "EAGLE head" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ /generate


def test_generate_endpoint_takes_the_tree_sizes(client, pair):
    out = client.predict(pair="shakespeare", prompt="ROMEO:\n", temperature=0.8, max_new_tokens=24, seed=2,
                         baseline=False, strategy="tree", tree_topk=2, tree_depth=3, tree_budget=5, tree_prune=0.01,
                         tree_lookup=6, api_name="/generate")
    trace = out["speculative"]
    assert trace["text"] == pair.decode(trace["token_ids"]) and 0 < len(trace["token_ids"]) <= 24
    s = trace["settings"]
    assert (s["strategy"], s["tree_topk"], s["tree_depth"], s["tree_budget"]) == ("tree", 2, 3, 5)
    assert s["tree_prune_below"] == 0.01 and s["tree_lookup"] == 6
    rounds = [r for r in trace["rounds"] if r["source"] == "tree" and r["tree"]]
    # the head's nodes within the budget; copied ones (prompt lookup) after them, marked, within SPECDEMO_MAX_TREE
    assert rounds and all(sum(not n.get("copied") for n in r["tree"]) <= 5 and r["k"] == len(r["tree"])
                          for r in rounds)
    assert all([n.get("copied", False) for n in r["tree"]] == sorted(n.get("copied", False) for n in r["tree"])
               for r in rounds)
    assert all(n["depth"] <= 3 and n["text"] == pair.token_text(n["token_id"]) for r in rounds for n in r["tree"])
    with pytest.raises(Exception) as info:
        client.predict(pair="shakespeare", prompt="ROMEO:\n", strategy="tree", tree_budget=10_000,
                       api_name="/generate")
    assert "Tree budget must be at most" in str(info.value) and "SPECDEMO_MAX_TREE" in str(info.value)


def test_the_race_and_the_distribution_check_draft_the_pages_tree(client):
    """The experiment tabs take the page's tree sizes: the race's tree row names them, and the distribution check
    draws its first tree token from a tree of that size (its summary says which strategy drew it)."""
    job = client.submit("shakespeare", "", "", "ROMEO:\n", 3, 0.0, 0, 1.0, 12, 0, None, "en", False, 3, 2, 2, 4,
                        api_name="/strategy_race")
    _, table = job.result(timeout=600)[:2]
    assert "EAGLE tree (top-k 2, depth 2, 4 nodes)" in table, table
    with pytest.raises(Exception) as info:  # refused in one sentence (here by the page's slider, which ends there)
        client.submit("shakespeare", "", "", "ROMEO:\n", 3, 0.0, 0, 1.0, 12, 0, None, "en", False, 3, 2, 2, 10_000,
                      api_name="/strategy_race").result(timeout=120)
    assert f"maximum value {Limits.from_env().max_tree}" in str(info.value) or "Tree budget must be at most" in str(
        info.value), info.value
    _, summary = client.submit("shakespeare", "", "", "ROMEO:\n", 1.0, 0, 1.0, 1.0, 100, 0, None, "en", False,
                               "tree", 3, 3, 2, 2, 4, api_name="/distribution_check").result(timeout=600)[:2]
    assert summary and "tree" in summary.lower(), summary


# ------------------------------------------------------------------------------------------------ the page

browser_only = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian chromium is not installed")


@browser_only
def test_the_drawing_keeps_hostile_text_inert_in_chromium(tree_trace, tmp_path):
    from conftest import CHROMIUM_ARGS
    from playwright.sync_api import sync_playwright

    page_file = tmp_path / "tree.html"
    page_file.write_text(f"<!doctype html><meta charset=utf-8><style>{style.CSS + tree_view.TREE_CSS}</style>"
                         f"{tree_view.tree_html(hostile_round(tree_trace), 'en', root=HOSTILE)}")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        pg = b.new_page()
        dialogs = []
        pg.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        pg.goto(page_file.as_uri())
        pg.locator(".sd-tree-node").first.hover()
        assert dialogs == [] and pg.locator(".sd-tree script, .sd-tree img").count() == 0
        assert pg.locator(".sd-tree-node text").first.text_content().startswith("<script>")
        b.close()



def tree_kinds(page, where: str) -> dict:
    return page.eval_on_selector_all(f"{where} .sd-tree-node", """gs => {
        const out = {};
        for (const g of gs) { const k = g.classList[1].replace('sd-tree-', ''); out[k] = (out[k] || 0) + 1; }
        return out; }""")


@browser_only
def test_a_tree_round_is_drawn_on_the_page_and_stepped_through_in_presenter_mode(browser, app_url):
    """In Chinese at 1280x720: choose the EAGLE tree, generate, open tree rounds in the inspector until one ends off
    the tree; its drawing shows the path, the refused children and the faded branches, with tooltips. Then presenter
    mode and the arrow keys bring the first tree round's drawing onto the projector's screen, enlarged."""
    context = browser.new_context(viewport={"width": 1280, "height": 720}, locale="zh-CN")
    page = context.new_page()
    page.goto(app_url)
    page.wait_for_function("(document.querySelector('#sd-pair-status')?.innerText || '').includes('已加载')",
                           timeout=120000)
    open_settings(page)  # the folded settings: who drafts, the budget
    page.locator("#sd-strategy").get_by_text("EAGLE 草稿树", exact=True).click()
    page.wait_for_selector("#sd-tree-sizes", state="visible")
    assert "草稿树规模" in page.inner_text("#sd-tree-sizes")
    set_slider(page, "sd-max-new", 40)
    page.locator("#sd-prompt textarea").fill("ROMEO:\n")
    page.click("#sd-generate")
    page.wait_for_function("document.querySelector('#sd-stats').innerText.includes('完成')"
                           " && !document.querySelector('#sd-stats .sd-recorded')", timeout=300000)
    rows = page.locator("#sd-film .sd-row")
    verdicts = [rows.nth(i).inner_text() for i in range(rows.count())]
    assert sum(bool(re.search(r"树 \d+ · 接受 \d+", v)) for v in verdicts) >= len(verdicts) - 2, verdicts
    for i in range(1, min(rows.count(), 12)):  # round 1 is the prefill
        rows.nth(i).click()
        page.wait_for_selector(f"#sd-reason .sd-tree[data-round='{i}']", timeout=60000)
        kinds = tree_kinds(page, "#sd-reason")
        if kinds.get("refused") and kinds.get("unused"):
            break
    else:
        pytest.fail(f"no round in the first 12 ended off the tree with unused branches: {verdicts[:12]}")
    kept = int(re.search(r"接受 (\d+)", verdicts[i]).group(1))
    assert kinds["root"] == 1 and kinds.get("path", 0) == kept and kinds["resampled"] == 1
    svg = page.locator("#sd-reason .sd-tree svg")
    svg.scroll_into_view_if_needed()
    size = svg.bounding_box()
    assert size["width"] > 300 and size["height"] > 60
    style = page.eval_on_selector_all("#sd-reason .sd-tree-node", """gs => gs.map(g => [g.classList[1],
        getComputedStyle(g).opacity, getComputedStyle(g.querySelector('rect')).stroke])""")
    assert all(float(o) < 0.6 for c, o, _ in style if c == "sd-tree-unused")  # faded
    assert all(float(o) == 1 and s == "rgb(0, 158, 115)" for c, o, s in style if c == "sd-tree-path")
    tip = page.locator("#sd-reason .sd-tree-refused title").first.text_content()
    assert "草稿头概率" in tip and "目标模型 p =" in tip and "被拒绝" in tip
    assert "草稿头最看好的子节点" in page.inner_text("#sd-reason")
    # presenter mode, stepped from the keyboard to round 2, the first tree round
    page.locator("#sd-presenter input").check()
    page.wait_for_function("document.querySelector('#sd-app').classList.contains('sd-present')")
    # the switch's redraw (a separate event: charts enlarged, the step view redrawn from the cursor it read) has
    # arrived before the keys move the cursor; otherwise it could land after them and show the round before
    page.wait_for_function("(document.querySelector('#sd-race .gtitle')?.style.fontSize || '') === '24px'",
                           timeout=60000)
    page.locator("#sd-stats").click()
    for n in (1, 2):  # one key at a time, each step on screen before the next key
        page.keyboard.press("ArrowRight")
        page.wait_for_function(f"(document.querySelector('#sd-step-caption')?.innerText || '').includes('第 {n} 轮')",
                               timeout=60000)
    assert "草稿头起草了一棵含" in page.inner_text("#sd-step-caption")
    drawing = page.locator("#sd-step-tokens .sd-tree svg")
    drawing.wait_for(timeout=30000)
    box = drawing.bounding_box()
    assert 0 <= box["y"] < 720 and box["x"] >= 0 and box["x"] + box["width"] <= 1280, box  # on the screen
    scale = page.eval_on_selector("#sd-step-tokens .sd-tree svg",
                                  "s => s.getBoundingClientRect().width / s.viewBox.baseVal.width")
    assert scale >= 1.2, scale  # enlarged for the projector
    context.close()


def test_the_inspector_reaches_the_end_of_a_deep_tree_round(pair):
    """A tree's path can keep depth + 1 tokens (17 at the deepest allowed tree), beyond a chain's K + 1 (13): the
    position slider, as long as the round it opens (views.opened_round), reaches the last position of a real deep
    round, and the inspector draws it."""
    trace = speculative_generate(pair, "ROMEO:\n", SamplingConfig(0.0),
                                 SpecConfig(strategy="tree", max_new_tokens=64, seed=0, tree_topk=1, tree_depth=16,
                                            tree_budget=16))
    deep = max((r for r in trace.rounds if r.tree), key=views.last_position)
    deepest = views.last_position(deep)
    assert deepest > 5, deepest  # the walk went deep somewhere
    state = {"spec": trace, "base": None, "cursor": 0}
    assert views.opened_round(state, deep.index + 1)["pos_sl"]["maximum"] == deepest
    assert views.inspector(state, deep.index + 1, deepest)["insp_plot"] is not None


@pytest.mark.parametrize("lang", ["en", "zh-CN"])
def test_the_acceptance_chart_names_the_depth_for_a_tree_and_k_for_a_chain(tree_trace, pair, lang):
    """One short axis title, the one the run has (a title that named both was cut off in presenter mode)."""
    from specdemo.app import plots
    from specdemo.i18n import tr

    chain = speculative_generate(pair, "ROMEO:\n", SamplingConfig(0.8), SpecConfig(k=3, max_new_tokens=8))
    tree_axis = plots.acceptance_per_round(tree_trace, lang).layout.yaxis.title.text
    chain_axis = plots.acceptance_per_round(chain, lang).layout.yaxis.title.text
    assert tree_axis == tr("chart.accepted_of_depth", lang) and chain_axis == tr("chart.accepted_of_k", lang)
    assert max(len(tree_axis), len(chain_axis)) <= 20
