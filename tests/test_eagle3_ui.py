"""A published EAGLE-3 head on the page (issue 46), in headless Chromium: the custom pair's form takes the fixture's
verifier and its head (folders, as SPECDEMO_ALLOW_LOCAL=1 allows), the pair line names the head, the strategy
selector offers the tree, and Generate draws the head's trees with captions that name it. A head made for another
target is refused in one sentence, and the page keeps its pair and its strategy."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from conftest import CHROMIUM
from test_browser import DONE, TREE_OPEN, open_page, open_settings, set_held, set_prompt, wait_caption
from test_eagle3 import FIXTURE, verifier_folder

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian chromium is not installed")



def choose_custom(page, draft: str, target: str, head: str) -> None:
    page.click("#sd-pair input")
    page.get_by_role("option", name="custom: any two hub ids").click()
    page.wait_for_selector("#sd-draft-id textarea, #sd-draft-id input")
    for elem_id, value in (("sd-draft-id", draft), ("sd-target-id", target), ("sd-head-id", head)):
        page.locator(f"#{elem_id} textarea, #{elem_id} input").first.fill(value)
    page.click("#sd-load")


def test_the_page_draws_a_published_heads_trees_and_names_it(browser, app_url, allow_local, tmp_path):
    verifier = verifier_folder(tmp_path)
    context, page = open_page(browser, app_url)
    try:
        open_settings(page)
        page.locator("#sd-strategy input[value='tree']").check()  # the default pair's own head drafts trees
        choose_custom(page, str(verifier), str(verifier), str(FIXTURE / "head-llama"))
        page.wait_for_function("document.querySelector('#sd-pair-status').innerText.includes("
                               "'The EAGLE-3 head local:head-llama drafts for it')", timeout=60000)
        # the tree, set aside while the custom pair had no head, comes back once it has loaded with one
        page.wait_for_function("document.querySelector('#sd-strategy input[value=\"tree\"]')?.checked === true",
                               timeout=10000)
        set_held(page, {"sd-temperature": 0, "sd-max-new": 16})
        set_prompt(page, "ROMEO:\n")
        page.click("#sd-generate")
        page.wait_for_function(DONE, timeout=120000)
        page.wait_for_function(TREE_OPEN, timeout=60000)  # the first tree round, drawn in the inspector
        assert page.locator("#sd-reason .sd-tree svg").count() == 1
        assert page.locator("#sd-film .sd-row-tree").count() >= 2
        label = page.locator("#sd-reason .sd-tree svg").get_attribute("aria-label")
        assert label.startswith("EAGLE-3 head local:head-llama: the head drafted a tree of"), label
        page.locator("#sd-stats").click()  # focus on the page, then step: round 2 is the head's first tree
        page.keyboard.press("ArrowRight")
        page.keyboard.press("ArrowRight")
        wait_caption(page, "Round 2 of")  # the key opened the Step through tab
        assert "EAGLE-3 head local:head-llama: the head drafted a tree of" in page.inner_text("#sd-step-caption")
    finally:
        context.close()


def test_the_page_refuses_a_head_for_another_target_in_one_sentence(browser, app_url, allow_local, tmp_path):
    verifier = verifier_folder(tmp_path)
    bad = tmp_path / "wide-head"
    shutil.copytree(FIXTURE / "head-llama", bad)
    meta = json.loads((bad / "config.json").read_text())
    meta["target_hidden_size"] = 32
    (bad / "config.json").write_text(json.dumps(meta))
    context, page = open_page(browser, app_url)
    try:
        open_settings(page)
        page.locator("#sd-strategy input[value='tree']").check()
        choose_custom(page, str(verifier), str(verifier), str(bad))
        sentence = ("The EAGLE-3 head local:wide-head reads hidden states 32 wide, but the target "
                    "local:tiny-llama-verifier's are 16 wide.")
        page.wait_for_function(f"document.querySelector('#sd-pair-status').innerText.includes({sentence!r})",
                               timeout=60000)
        assert "Traceback" not in page.inner_text("body")
        # the selector goes back to the pair that is loaded (the embedded one), so Generate runs that pair
        page.wait_for_function("document.querySelector('#sd-pair input').value === 'shakespeare'")
        # and so does the tree, which the custom pair (no head of its own until it loads) had set aside
        page.wait_for_function("document.querySelector('#sd-strategy input[value=\"tree\"]')?.checked === true")
    finally:
        context.close()


def test_the_http_api_takes_a_head_for_a_custom_pair(client, allow_local, tmp_path):
    """/generate with pair="custom" and head=: the trace's tree rounds name the head; a head for another target is
    refused with its sentence."""
    verifier = str(verifier_folder(tmp_path))
    args = dict(pair="custom", draft=verifier, target=verifier, prompt="ROMEO:\n", k=3, temperature=0.0, top_k=0,
                top_p=1.0, max_new_tokens=8, seed=0, baseline=False, lenience=1.0, strategy="tree")
    out = client.predict(**args, head=str(FIXTURE / "head-llama"), api_name="/generate")
    spec = out["speculative"]
    assert spec["settings"]["head"] == "local:head-llama"
    assert [r["head"] for r in spec["rounds"] if r["tree"]] and all(
        r["caption"].startswith("EAGLE-3 head local:head-llama:") for r in spec["rounds"] if r["tree"])
    with pytest.raises(Exception) as err:
        client.predict(**args, head=str(FIXTURE / "head-llama") + "-missing", api_name="/generate")
    assert str(err.value) == ("The EAGLE-3 head local:head-llama-missing is not a folder here: give a folder or Hub "
                              "id of a speculators checkpoint.")
