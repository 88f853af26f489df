"""A public Space, tried as a visitor would: no server path in any page or API answer, for every preset and for
errors; custom ids are hub repo ids, and every local path gets one identical refusal. The real server (app.py's
demo on localhost), raw HTTP and gradio_client for the API, Debian's chromium for the page."""

from __future__ import annotations

import json
import os
import sysconfig
import tempfile
from pathlib import Path

import httpx
import pytest

from specdemo.app.validation import NOT_A_REPO_ID
from specdemo.config import EMBEDDED_DRAFT, PRESETS

REPO = Path(__file__).resolve().parent.parent


def server_paths() -> list[str]:
    """Substrings that would give away this server's disk: its folders, and the usual roots of a Linux box."""
    from huggingface_hub import constants

    from specdemo.models.weights import cache_root

    found = {str(REPO), str(Path.home()), str(cache_root()), sysconfig.get_paths()["purelib"], tempfile.gettempdir(),
             constants.HF_HUB_CACHE, "site-packages", "/root", "/tmp", "/work", "/home/", "/usr/", "/var/"}
    return sorted(found, key=len, reverse=True)


def assert_no_server_path(text: str, where: str) -> None:
    for path in server_paths():
        assert path not in text, f"{where} shows the server path {path!r}: ...{text[max(0, text.find(path) - 120):][:300]}"


def call(client, **kw):
    args = dict(pair="shakespeare", prompt="ROMEO:\n", k=4, temperature=0.8, top_k=0, top_p=1.0, max_new_tokens=6,
                seed=0, baseline=True, lenience=1.0)
    args.update(kw)
    return client.predict(**args, api_name="/generate")


def answer(client, **kw) -> tuple[bool, str]:
    """(loaded, what the visitor gets back): the JSON of a run, or the error's message."""
    try:
        return True, json.dumps(call(client, **kw))
    except Exception as err:  # gradio_client raises the server's gr.Error as an AppError
        return False, str(err)


def raw_stream(app_url: str, api: str, data: list) -> str:
    """The raw server-sent events of one call, as the server sends them (gradio_client would rewrite file paths)."""
    event = httpx.post(f"{app_url}/gradio_api/call/{api}", json={"data": data}, timeout=30).json()["event_id"]
    return httpx.get(f"{app_url}/gradio_api/call/{api}/{event}", timeout=300).text


def test_every_preset_answers_without_a_server_path(client):
    loaded = {}
    for name in PRESETS:
        ok, text = answer(client, pair=name)
        assert_no_server_path(text, f"/generate with the {name} preset")
        assert "Traceback" not in text
        loaded[name] = ok
        if ok:
            settings = json.loads(text)["speculative"]["settings"]
            assert settings["pair"] == name
            assert settings["draft"] in (PRESETS[name].draft, f"{name}:draft")  # a hub id, or preset:role
            assert settings["target"] in (PRESETS[name].target, f"{name}:target")
    assert loaded["shakespeare"] and loaded["smollm2-135m"], "the offline pairs must load here"
    print({name: "loaded" if ok else "error" for name, ok in loaded.items()})


def test_page_config_and_api_info_show_no_server_path(app_url):
    for route in ("/", "/config", "/gradio_api/info"):
        assert_no_server_path(httpx.get(app_url + route, timeout=30).text, route)


def test_raw_streams_of_every_endpoint_show_no_server_path(app_url):
    """The raw answers: the UI's stream (it used to carry the trace file's cache path), the K sweep, the distribution
    check, and errors from each."""
    common = ["shakespeare", "", "", "ROMEO:\n"]
    view = ["en", False]  # the page's language and presenter switch, every UI handler's last two inputs
    stream = raw_stream(app_url, "generate_stream",
                        common + [4, 0.8, 0, 1.0, 8, 0, True, 1.0, None, "fixed"] + view + [3, 0, 0, 0])
    assert "event: complete" in stream and "speculative" in stream
    assert_no_server_path(stream, "/generate_stream")
    sweep = raw_stream(app_url, "k_sweep", common + [0.8, 0, 1.0, 8, 0, 1, 2, None] + view)
    assert "event: complete" in sweep
    assert_no_server_path(sweep, "/k_sweep")
    dist = raw_stream(app_url, "distribution_check", common + [1.0, 0, 1.0, 1.0, 100, 0, None] + view
                      + ["fixed", 4, 3, 0, 0, 0])
    assert "event: complete" in dist
    assert_no_server_path(dist, "/distribution_check")
    for data in (["custom", "/etc", "/etc", "ROMEO:\n", 4, 0.8, 0, 1.0, 8, 0, True, 1.0, None, "fixed"],
                 ["shakespeare", "", "", "Hi", 99, 0.8, 0, 1.0, 8, 0, True, 1.0, None, "fixed"],
                 ["custom", "nobody-here/no-such-model", "x/y", "Hi", 4, 0.8, 0, 1.0, 8, 0, True, 1.0, None, "fixed"]):
        for lang in ("en", "zh-CN"):  # the messages in both languages
            text = raw_stream(app_url, "generate_stream", data + [lang, False, 3, 0, 0, 0])
            assert "event: error" in text and "enough input" not in text, text[-300:]
            assert_no_server_path(text, f"/generate_stream error for {data[:3]} in {lang}")


def test_the_streamed_endpoints_name_a_bad_number_in_the_callers_language(client):
    """A null or out-of-range slider or number from an API caller (the page's own cannot send one) is refused by
    validation.py, naming the field in the caller's language. Before, gradio's own check answered a null with an
    empty error and a value out of range with an English sentence that named no field."""
    run = ["shakespeare", "", "", "ROMEO:\n", 4, 0.8, 0, 1.0, 8, 0, True, 1.0, None, "fixed"]
    cases = [
        ("/generate_stream", run[:4] + [None] + run[5:] + ["en", False, 3, 0, 0, 0], "K is missing."),
        ("/generate_stream", run[:4] + [99] + run[5:] + ["zh-CN", False, 3, 0, 0, 0], "K必须在 1 到"),
        ("/generate_stream", run[:9] + [-1] + run[10:] + ["en", False, 3, 0, 0, 0], "Seed must be between 0 and"),
        ("/k_sweep", run[:4] + [0.8, 0, 1.0, 8, 0, None, 2, None, "zh-CN", False], "请填写起始 K。"),
        ("/distribution_check", run[:4] + [1.0, 0, 1.0, 1.0, 10**9, 0, None, "en", False, "fixed", 4, 3, 0, 0, 0],
         "Samples must be between"),
    ]
    for api, data, said in cases:
        with pytest.raises(Exception) as info:
            client.predict(*data, api_name=api)
        assert said in str(info.value), (api, str(info.value))


LOCAL_IDS = ["/etc", "../x", "~/x", "C:\\x", "/no/such/folder/anywhere", "./assets/models/shakespeare-draft",
             str(EMBEDDED_DRAFT), "assets/models/shakespeare-draft", "/etc/passwd", "x", ".", "a/b/c"]


def test_local_paths_get_one_identical_refusal(client, monkeypatch):
    monkeypatch.delenv("SPECDEMO_ALLOW_LOCAL", raising=False)
    messages = set()
    for bad in LOCAL_IDS:
        for draft, target in ((bad, "openai-community/gpt2"), ("openai-community/gpt2", bad)):
            ok, text = answer(client, pair="custom", draft=draft, target=target)
            assert not ok
            messages.add(text)
    assert len(messages) == 1, messages
    (message,) = messages
    assert NOT_A_REPO_ID in message
    assert_no_server_path(message, "the refusal")
    # the other endpoints share the rule
    with pytest.raises(Exception) as info:
        client.predict("custom", "/etc", "x/y", "Hi", 0.8, 0, 1.0, 4, 0, 1, 2, api_name="/k_sweep")
    assert str(info.value) == message


@pytest.mark.skipif(Path.cwd() != REPO, reason="needs the repository root as the working directory")
def test_a_repo_id_that_names_a_local_folder_is_answered_as_a_hub_miss(client, monkeypatch):
    """`assets/models` is a valid repo id and a folder under the server's working directory; transformers would
    read the folder. The answer is word for word the one for a repo id that names nothing."""
    monkeypatch.delenv("SPECDEMO_ALLOW_LOCAL", raising=False)
    assert (REPO / "assets" / "models").is_dir() and not (REPO / "assets" / "nomodels").exists()
    _, there = answer(client, pair="custom", draft="assets/models", target="openai-community/gpt2")
    _, absent = answer(client, pair="custom", draft="assets/nomodels", target="openai-community/gpt2")
    assert "hub" in there
    assert there.replace("assets/models", "ID") == absent.replace("assets/nomodels", "ID")


@pytest.mark.skipif(Path.cwd() != REPO, reason="needs the repository root as the working directory")
def test_a_head_id_that_names_a_local_folder_is_looked_for_on_the_hub(monkeypatch):
    """The same rule for an EAGLE-3 head's id in the served app: `assets/models` was read as a local head folder, so
    the answer differed from a hub miss's (and read the folder). The CLI and the Python API still read folders."""
    from specdemo.models import eagle3_files

    monkeypatch.delenv("SPECDEMO_ALLOW_LOCAL", raising=False)
    monkeypatch.setattr(eagle3_files, "SERVED", True)
    answers = []
    for head in ("assets/models", "assets/nomodels"):
        with pytest.raises(Exception) as info:
            eagle3_files.head_folder(head)
        answers.append(str(info.value).replace(head, "ID"))
    assert answers[0] == answers[1] and "Hub" in answers[0]
    assert eagle3_files.head_folder(str(REPO / "assets/models")) == REPO / "assets/models"  # a path: the operator's
    monkeypatch.setattr(eagle3_files, "SERVED", False)
    assert eagle3_files.head_folder("assets/models") == Path("assets/models")


def test_uploads_are_refused_the_page_has_no_file_input(app_url):
    """gradio's upload route took any file and served it back for hours: a file drop. The app takes none."""
    sent = httpx.post(f"{app_url}/gradio_api/upload", files={"files": ("x.bin", b"x" * 5000)}, timeout=30)
    assert sent.status_code >= 400, sent.text[:200]


def test_repo_ids_pass_the_hub_validator_and_paths_do_not():
    from specdemo.app.validation import is_repo_id

    assert all(is_repo_id(i) for i in ("openai-community/gpt2", "HuggingFaceTB/SmolLM2-135M", "Qwen/Qwen2.5-0.5B"))
    assert not any(is_repo_id(i) for i in LOCAL_IDS + ["a//b", "a/b.git", "a--b/c", "/a/b", "a/b "])


# ------------------------------------------------------------------------------------------------ the page

STATUS = "(document.querySelector('#sd-pair-status')?.innerText || '')"



def page_text(page) -> str:
    return page.content() + page.inner_text("body")


def pick_pair(page, name: str) -> None:
    before = page.evaluate(STATUS)
    page.locator("#sd-pair input").click()
    index = [*PRESETS, "custom"].index(name)  # the dropdown lists the presets in order, then custom
    page.locator(f"li[role='option'][data-index='{index}']").click()
    page.wait_for_function(f"{STATUS} !== {json.dumps(before)} && !{STATUS}.includes('Loading')", timeout=120000)


def test_the_page_shows_no_server_path_for_any_preset_a_run_or_an_error(browser, app_url, monkeypatch):
    monkeypatch.delenv("SPECDEMO_ALLOW_LOCAL", raising=False)
    context = browser.new_context(viewport={"width": 1400, "height": 1400}, accept_downloads=True)
    page = context.new_page()
    page.goto(app_url, wait_until="load")
    # the status names the loaded pair; gradio's progress overlay ("Loaded - 100.0%") can stand there a moment before
    page.wait_for_function(f"{STATUS}.includes('Loaded') && {STATUS}.includes('shakespeare:draft')", timeout=60000)
    assert_no_server_path(page_text(page), "the page as it opens")
    # a run, and its trace downloaded from the page
    page.click("#sd-generate")
    page.wait_for_function("document.querySelector('#sd-stats').innerText.includes('done')", timeout=120000)
    assert_no_server_path(page_text(page), "the page after a run")
    page.get_by_role("tab", name="Export").click()
    assert "--json" in page.inner_text("#sd-export-note")
    with page.expect_download() as download:
        page.click("#sd-download")
    trace = json.loads(Path(download.value.path()).read_text())
    assert trace["speculative"]["settings"]["target"] == "shakespeare:target" and trace["speculative"]["text"]
    # the trace is downloaded, not drawn: as a JSON tree it added 17,000 elements and froze this page for 11 s
    assert page.evaluate("document.getElementsByTagName('*').length") < 5000  # 1,954 after this run (2026-11-25)
    # every other preset: loaded, or its error, in the pair status and the toast
    statuses = {}
    for name in [n for n in PRESETS if n != "shakespeare"]:
        pick_pair(page, name)
        statuses[name] = page.evaluate(STATUS)
        assert_no_server_path(page_text(page), f"the page with the {name} preset")
    assert any("Could not load" in s for s in statuses.values())
    # a custom local path through the form
    pick_pair(page, "custom")
    page.locator("#sd-draft-id textarea, #sd-draft-id input").first.fill("/etc")
    page.locator("#sd-target-id textarea, #sd-target-id input").first.fill("../x")
    page.click("#sd-load")
    page.wait_for_function(f"{STATUS}.includes('owner/name')", timeout=30000)
    assert_no_server_path(page_text(page), "the page after a refused local path")
    context.close()


# ------------------------------------------------------------------------------------ limits a visitor meets
def test_seeds_keep_every_digit_up_to_the_stated_maximum(client):
    from specdemo.app.validation import UserError, validate

    args = dict(pair_name="shakespeare", draft_id="", target_id="", prompt="ROMEO:\n", k=4, temperature=0.8, top_k=0,
                top_p=1.0, max_new_tokens=4, run_baseline=False, lenience=1.0)
    for seed, exact in ((2**63 - 1, 2**63 - 1), (str(2**63 - 1), 2**63 - 1), (2**53 + 1, 2**53 + 1),
                        (f" {2**53 + 1} ", 2**53 + 1), ("1e3", 1000), (7.0, 7)):
        assert validate(seed=seed, **args).spec.seed == exact, seed
    for seed, why in ((2**63, "between"), (str(2**63), "between"), ("1.5", "whole"), ("nan", "finite"),
                      ("0x10", "number"), (-1, "between")):
        with pytest.raises(UserError, match=why):
            validate(seed=seed, **args)
    top = call(client, seed=2**63 - 1, max_new_tokens=4, baseline=False)["speculative"]
    assert top["settings"]["seed"] == 2**63 - 1 and top["metrics"]["new_tokens"] == 4
    assert call(client, seed=2**53 + 1)["speculative"]["settings"]["seed"] == 2**53 + 1


def test_the_custom_model_cap_follows_the_memory(monkeypatch):
    import torch

    from specdemo.limits import Limits
    from specdemo.models import devices

    monkeypatch.delenv("SPECDEMO_MAX_PARAMS_M", raising=False)
    monkeypatch.delenv("SPECDEMO_ALLOW_CUSTOM", raising=False)
    monkeypatch.delenv("SPECDEMO_MAX_PAIRS", raising=False)
    assert devices.memory_bytes(torch.device("cpu")) > 1e9  # this machine's memory, read for real
    monkeypatch.setattr(devices, "memory_bytes", lambda device: 16_000_000_000)  # a CPU basic Space
    assert devices.default_max_params_m(torch.device("cpu")) == 500
    assert devices.default_max_params_m(torch.device("cuda")) == 1000  # 2 bytes a parameter on a GPU
    monkeypatch.setattr(devices, "default_max_params_m", lambda device=None: 500)
    limits = Limits.from_env()
    assert limits.allow_custom and limits.max_params_m == 500
    monkeypatch.setattr(devices, "default_max_params_m", lambda device=None: 60)  # a machine too small for gpt2
    assert not Limits.from_env().allow_custom
    monkeypatch.setenv("SPECDEMO_MAX_PARAMS_M", "60")  # an operator's own cap leaves custom ids on
    assert Limits.from_env().allow_custom and Limits.from_env().max_params_m == 60


def test_a_run_the_time_limit_ends_measures_no_baseline(client, monkeypatch):
    monkeypatch.setenv("SPECDEMO_TIME_LIMIT_S", "0")
    out = call(client, max_new_tokens=64, baseline=True)
    assert out["baseline"] is None and out["speculative"]["settings"]["baseline"] == "not measured"
    assert out["speculative"]["stop_reason"] == "time_limit" and out["speculative"]["metrics"]["new_tokens"] < 64
    from specdemo.app.render import stats_html
    from specdemo.engine.events import Trace

    trace = Trace("speculative", "x", [1], {"baseline": "not measured"})
    assert "speedup not measured" in stats_html(trace, None, "", "en") and "未测加速比" in stats_html(trace, None, "", "zh-CN")


def test_the_default_pair_is_the_operators_choice_and_a_typo_stops_the_start():
    import subprocess
    import sys

    code = "from specdemo.config import DEFAULT_PRESET; print(DEFAULT_PRESET)"
    env = os.environ | {"SPECDEMO_DEFAULT_PAIR": "smollm2-135m"}
    ok = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and ok.stdout.strip() == "smollm2-135m"
    env["SPECDEMO_DEFAULT_PAIR"] = "shakespear"
    bad = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "SPECDEMO_DEFAULT_PAIR='shakespear' is not a preset" in bad.stderr
