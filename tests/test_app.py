"""The real Gradio server on localhost, driven through gradio_client: the /generate trace, streaming, errors,
concurrency, cancel and memory over many requests."""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import re
import time

import psutil
import pytest
import torch
from gradio_client import Client

from specdemo.app.handlers import RUN_OUTPUTS  # /generate_stream's outputs, in order

OUTPUT = ("accepted", "resampled", "bonus")


def gen(client, **kw):
    args = dict(pair="shakespeare", prompt="ROMEO:\n", k=4, temperature=0.8, top_k=0, top_p=1.0, max_new_tokens=32,
                seed=0, baseline=False, lenience=1.0)
    args.update(kw)
    return client.predict(**args, api_name="/generate")


def check_trace(trace: dict, pair) -> None:
    ids = trace["token_ids"]
    assert trace["text"] == pair.decode(ids)
    emitted = []
    for rnd in trace["rounds"]:
        labels = [t["label"] for t in rnd["tokens"]]
        n = rnd["n_accepted"]
        assert labels[:n] == ["accepted"] * min(n, len(labels))
        if not rnd["stop_reason"]:
            assert labels[n:] in (["rejected", "resampled"], ["bonus"])
        emitted += [t["token_id"] for t in rnd["tokens"] if t["label"] in OUTPUT]
    assert emitted == ids
    assert trace["metrics"]["new_tokens"] == len(ids)


def test_generate_endpoint_greedy_equals_baseline(client, pair):
    out = gen(client, temperature=0.0, baseline=True, max_new_tokens=48, prompt="HAMLET:\nTo be, or not to be")
    spec, base = out["speculative"], out["baseline"]
    check_trace(spec, pair)
    assert spec["token_ids"] == base["token_ids"] and len(spec["token_ids"]) == 48
    assert spec["text"] == base["text"] == pair.decode(base["token_ids"])
    assert spec["metrics"]["target_calls"] < 48  # speculative used fewer target forwards


def test_generate_endpoint_sampling_trace(client, pair):
    out = gen(client, temperature=1.0, top_k=40, seed=3, max_new_tokens=40)
    check_trace(out["speculative"], pair)
    assert out["baseline"] is None
    assert out["speculative"]["settings"]["top_k"] == 40
    again = gen(client, temperature=1.0, top_k=40, seed=3, max_new_tokens=40)
    assert again["speculative"]["token_ids"] == out["speculative"]["token_ids"]


@pytest.mark.parametrize("strategy", ["adaptive", "lookup", "eagle"])
def test_generate_endpoint_takes_a_strategy(client, pair, strategy):
    out = gen(client, temperature=1.0, seed=4, max_new_tokens=40, strategy=strategy,
              prompt="ROMEO:\nO, she doth teach the torches to burn bright!\nROMEO:\nO, she doth teach")
    trace = out["speculative"]
    check_trace(trace, pair)
    assert trace["settings"]["strategy"] == strategy
    sources = {r["source"] for r in trace["rounds"]}
    expected = {"adaptive": {"draft"}, "lookup": {"lookup", "fallback"}, "eagle": {"prefill", "eagle"}}[strategy]
    assert sources <= expected and (strategy != "eagle" or sources == expected)
    if strategy == "lookup":
        assert any(r["copied_from"] is not None and r["ngram"] for r in trace["rounds"])


def test_generate_endpoint_defaults_to_the_pairs_own_strategy(client, pair):
    """Without a strategy, /generate drafts as the page opens the pair: the EAGLE head's tree for smollm2-135m (its
    preset's), the draft model for shakespeare; a pair's strategy can still be asked for by name."""
    for name, prompt, want in (("shakespeare", "ROMEO:\n", "fixed"),
                               ("smollm2-135m", "What is the capital of Italy?", "tree")):
        trace = gen(client, pair=name, prompt=prompt, temperature=0.0, max_new_tokens=12)["speculative"]
        assert trace["settings"]["strategy"] == want
        assert {r["source"] for r in trace["rounds"]} <= ({"prefill", "tree"} if want == "tree" else {"draft"})
    asked = gen(client, pair="smollm2-135m", prompt="What is the capital of Italy?", max_new_tokens=8,
                strategy="lookup")["speculative"]
    assert asked["settings"]["strategy"] == "lookup"


def test_strategy_race_times_every_strategy_and_keeps_the_text_at_t0(client, pair):
    """The Strategy race tab's endpoint: target only, then fixed, adaptive, lookup, the EAGLE head's chain and its
    tree, with one table row each; at T = 0 each text must equal the target's (the table says so), or the row says
    where a bf16 near-tie parted them."""
    job = client.submit("shakespeare", "", "", "ROMEO:\nO, she doth teach the torches to burn bright!\nROMEO:\n", 3,
                        0.0, 0, 1.0, 48, 0, None, "en", False, api_name="/strategy_race")
    fig, table = job.result()[:2]
    tables = {out[1] for out in job.outputs() if isinstance(out[1], str) and out[1]}
    assert len(tables) == 6, "one new table after each run"
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line][1:]
    from specdemo import SamplingConfig, SpecConfig
    from specdemo.engine.tree_drafter import run_tree_shape

    topk, depth, budget = run_tree_shape(SpecConfig(strategy="tree"), SamplingConfig(0.0), pair)  # the head's own shape at T = 0
    names = ["target only", "fixed K = 3", "adaptive", "prompt lookup n = 3", "EAGLE head, K = 3",
             f"EAGLE tree (top-k {topk}, depth {depth}, {budget} nodes)"]
    assert [r.split("|")[1].strip() for r in rows] == names
    verdicts = [r.split("|")[-2].strip() for r in rows[1:]]
    assert all(v == "yes" or (v.startswith("no: parts at token") and v.endswith("a near-tie")) for v in verdicts), table
    assert verdicts.count("yes") >= 3, table
    drawn = json.dumps(fig)  # the plot's payload carries every run's name
    assert all(name in drawn for name in names), drawn[:300]


def test_stream_endpoint_streams_rounds(client, monkeypatch):
    """Every round handed on (UPDATE_INTERVAL_S = 0; the coalescing has tests of its own below): a warm 40-token run
    takes under a tenth of a second, and coalesced it once sent only its first and last updates (pytest -n 0)."""
    from specdemo.app import handlers

    monkeypatch.setattr(handlers, "UPDATE_INTERVAL_S", 0)  # the server runs in this process
    job = client.submit("shakespeare", "", "", "JULIET:\n", 4, 0.8, 0, 1.0, 40, 1, False, 1.0, None, "fixed", "en", False, 3,
                        0, 0, 0, api_name="/generate_stream")
    final = job.result()
    updates = job.outputs()
    assert len(updates) >= 3, "the handler should stream several updates"
    html = final[0]
    assert 'class="sd-tok sd-' in html and "JULIET:" in html
    trace = final[RUN_OUTPUTS.index("trace_json")]
    assert trace["speculative"]["text"] and trace["speculative"]["settings"]["draft"] == "shakespeare:draft"
    assert not any(isinstance(v, str) and os.path.isabs(v) for v in final)  # no server file (see page_js.DOWNLOAD_JS)


@pytest.mark.parametrize("lang,message", [("zh-CN", "提示词是空的"), ("en", "The prompt is empty")])
def test_the_pages_errors_come_in_its_language(client, lang, message):
    job = client.submit("shakespeare", "", "", "  ", 4, 0.8, 0, 1.0, 8, 0, False, 1.0, None, "fixed", lang, False, 3,
                        0, 0, 0, api_name="/generate_stream")
    with pytest.raises(Exception) as info:
        job.result()
    assert message in str(info.value) and "Traceback" not in str(info.value)


BAD_INPUTS = [
    (dict(prompt=""), "empty"),
    (dict(prompt="   \n"), "empty"),
    (dict(prompt="ROMEO " * 700), "context window|characters"),
    (dict(k=0), "K must be between"),
    (dict(k=99), "K must be between"),
    (dict(temperature=-0.5), "Temperature must be between"),
    (dict(top_p=0.0), "Top-p must be above 0"),
    (dict(top_p=1.5), "Top-p must be between"),
    (dict(top_k=-1), "Top-k must be between"),
    (dict(seed="abc"), "Seed must be a number"),
    (dict(max_new_tokens=100000), "Max new tokens must be between"),
    (dict(pair="no-such-pair"), "Unknown model pair"),
    (dict(strategy="turbo"), "Strategy must be one of fixed, adaptive, lookup, eagle"),
    (dict(pair="custom", draft="owner/draft", target="owner/target", strategy="eagle"),
     "Only the embedded pairs have an EAGLE head"),
    (dict(pair="gpt2", strategy="eagle"), "cannot draft with the EAGLE head: none was trained for it"),
    (dict(strategy="lookup", ngram=0), "Lookup n-gram size must be between 1 and 8"),
    # a tree once ran exact while the page called it lossy: its walk has no acceptance uniform to relax
    (dict(strategy="tree", lenience=0.5), "Lenience works on the chain strategies only"),
    (dict(pair="custom", draft="/no/such/model", target="/no/such/other"), "repo ids of the form owner/name"),
    (dict(pair="gpt2"), "(hub cannot be reached|not in the local cache).*The embedded pair 'shakespeare' works offline"),
    (dict(chat=True), "no chat template"),
    (dict(chat="yes"), "chat must be true, false or null|bool"),
    # /generate takes JSON as it comes: each of these once ended in a TypeError or AttributeError
    (dict(pair=["shakespeare"]), "Unknown model pair"),
    (dict(pair="custom", draft=7, target="owner/target"), "Enter both a draft and a target"),
    (dict(prompt=123), "The prompt must be text, got '123'"),
    (dict(baseline="false"), "baseline must be true, false or null"),
]


@pytest.mark.parametrize("kwargs,message", BAD_INPUTS, ids=[m for _, m in BAD_INPUTS])
def test_bad_input_gets_a_clear_message_and_the_next_request_works(client, kwargs, message):
    import re

    with pytest.raises(Exception) as info:
        gen(client, **kwargs)
    assert re.search(message, str(info.value)), str(info.value)
    assert "Traceback" not in str(info.value)
    assert gen(client, max_new_tokens=4)["speculative"]["metrics"]["new_tokens"] == 4


def test_a_refusal_on_the_page_quotes_what_was_typed_as_text():
    """gradio's toast draws its message as HTML (sanitised, so tags still render): a refusal that quotes a typed
    value escapes it for the page's handlers, and leaves it as it is in the API's JSON answer."""
    import gradio as gr

    from specdemo.app import handlers

    typed = "<b>x</b>"
    with pytest.raises(gr.Error) as page:
        list(handlers.generate_ui(typed, "", "", "ROMEO:\n", 4, 0.8, 0, 1.0, 8, 0, False, 1.0, lang="en"))
    assert "&lt;b&gt;x&lt;/b&gt;" in page.value.message and "<b>" not in page.value.message
    with pytest.raises(gr.Error) as api:
        handlers.generate_api(pair=typed)
    assert typed in api.value.message


def test_chat_switch_in_the_api(client, pair):
    """chat=None takes the pair's default (raw for the Shakespeare pair); chat=False is the same run, recorded."""
    default, raw = gen(client, max_new_tokens=8, seed=3), gen(client, max_new_tokens=8, seed=3, chat=False)
    assert default["speculative"]["settings"]["chat"] is False and raw["speculative"]["settings"]["chat"] is False
    assert default["speculative"]["token_ids"] == raw["speculative"]["token_ids"]
    assert default["speculative"]["prompt_ids"] == pair.encode("ROMEO:\n")


def test_mismatched_tokenizers_are_refused(client, toy_dirs, allow_local):
    from specdemo.config import EMBEDDED_TARGET

    with pytest.raises(Exception, match="tokenizers disagree"):
        gen(client, pair="custom", draft=str(toy_dirs[0]), target=str(EMBEDDED_TARGET))


def test_concurrent_sessions_get_their_own_results(app_url):
    settings = [dict(seed=s, temperature=t, k=k, top_p=p, max_new_tokens=24)
                for s, t, k, p in [(1, 0.8, 4, 1.0), (2, 1.0, 3, 0.9), (3, 0.0, 5, 1.0), (4, 1.2, 2, 1.0),
                                   (5, 0.7, 6, 0.8), (6, 1.0, 1, 1.0), (7, 0.5, 4, 1.0), (8, 0.9, 8, 0.95)]]
    solo_client = Client(app_url, verbose=False)
    solo = [gen(solo_client, **s)["speculative"]["token_ids"] for s in settings]

    def one(s):
        return gen(Client(app_url, verbose=False), **s)["speculative"]["token_ids"]

    with cf.ThreadPoolExecutor(8) as pool:
        together = list(pool.map(one, settings))
    assert together == solo
    assert len({tuple(t) for t in together}) == len(settings)


def test_cancel_stops_a_long_run_and_the_next_run_is_correct(client, pair):
    from specdemo.models import load_pair

    loaded = load_pair("shakespeare")
    job = client.submit("shakespeare", "", "", "ROMEO:\n", 2, 1.0, 0, 1.0, 256, 0, True, 1.0, None, "lookup", "en", False, 3,
                        0, 0, 0, api_name="/generate_stream")
    t0 = time.monotonic()
    while len(job.outputs()) < 2:
        assert time.monotonic() - t0 < 120, "the stream sent no updates"
        time.sleep(0.05)
    job.cancel()
    # A run takes the device lock for each of its rounds (runs.py) and releases it between them, so one look at the
    # lock proves nothing. Watch it for 1.5 s instead, from 0.5 s after the cancel: this run had seconds of work
    # left (up to 256 tokens, then the baseline's 256 steps), and a run that kept going would be seen holding it.
    time.sleep(0.5)
    n_after_cancel = len(job.outputs())
    busy = []
    for _ in range(300):
        busy.append(loaded.lock.locked())
        time.sleep(0.005)
    assert not any(busy), "the cancelled run kept running"
    assert len(job.outputs()) == n_after_cancel, "the cancelled run kept streaming"
    out = gen(client, temperature=0.0, max_new_tokens=24, baseline=True)
    assert out["speculative"]["token_ids"] == out["baseline"]["token_ids"]


def test_memory_is_flat_over_200_requests(client):
    proc = psutil.Process()  # the server runs in this process
    for _ in range(20):
        gen(client, max_new_tokens=8)
    before = proc.memory_info().rss
    for i in range(200):
        gen(client, max_new_tokens=8, seed=i)
    growth = proc.memory_info().rss / before - 1
    assert growth < 0.10, f"RSS grew {100 * growth:.1f}%"


def test_custom_ids_can_be_switched_off(client, monkeypatch, toy_dirs):
    monkeypatch.setenv("SPECDEMO_ALLOW_CUSTOM", "0")
    with pytest.raises(Exception, match="switched off"):
        gen(client, pair="custom", draft=str(toy_dirs[0]), target=str(toy_dirs[1]))
    monkeypatch.setenv("SPECDEMO_ALLOW_CUSTOM", "1")
    assert gen(client, max_new_tokens=3)["speculative"]["metrics"]["new_tokens"] == 3


def test_parameter_cap_refuses_big_custom_models_before_loading(client, monkeypatch, allow_local):
    from specdemo.config import EMBEDDED_DRAFT, EMBEDDED_TARGET

    monkeypatch.setenv("SPECDEMO_MAX_PARAMS_M", "5")  # the embedded target has ~13M
    with pytest.raises(Exception, match="over this server's cap"):
        gen(client, pair="custom", draft=str(EMBEDDED_DRAFT), target=str(EMBEDDED_TARGET))


def test_the_cap_counts_a_composite_config_and_every_expert(client, monkeypatch, allow_local, tmp_path):
    """The cap counts what would load: a target whose config nests its text model (Gemma 3's, a 27B) is refused
    from its config.json alone; the formula used before read it as 0 parameters and let it on to the download.
    The count is the real model's where it loads, an MoE's experts and a model's buffers are in it, and a config
    that no build can count is refused."""
    import transformers
    from transformers import Gemma3Config, GPTBigCodeConfig, LlamaConfig, Qwen3MoeConfig

    from specdemo.config import EMBEDDED_DRAFT
    from specdemo.models import estimate_parameters, load_pair
    from specdemo.models.sizing import count_parameters

    from collections import OrderedDict

    from specdemo.models import sizing

    monkeypatch.setattr(sizing, "_COUNTS", OrderedDict())  # no count kept from an earlier load: each one builds
    shakespeare = load_pair("shakespeare")
    config = shakespeare.target.config
    dtype, builds, defaults = config.dtype, [], []
    build = transformers.AutoModelForCausalLM.from_config
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_config",
                        lambda *a, **k: builds.append(a) or build(*a, **k))
    monkeypatch.setattr(torch, "set_default_dtype", lambda d: defaults.append(d))  # process-wide: other runs see it
    assert estimate_parameters(config) == sum(p.numel() for p in shakespeare.target.parameters())
    assert len(builds) == 1 and config.dtype == dtype and defaults == []  # built from a copy, default dtype kept
    assert estimate_parameters(config) == sum(p.numel() for p in shakespeare.target.parameters()) and len(builds) == 1
    moe = Qwen3MoeConfig(hidden_size=256, intermediate_size=512, moe_intermediate_size=128, num_experts=64,
                         num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, vocab_size=1000)
    assert estimate_parameters(moe) > 64 * 4 * 3 * 256 * 128  # every expert's MLP, in each of the 4 layers
    gemma = Gemma3Config(text_config={"hidden_size": 5376, "intermediate_size": 21504, "num_hidden_layers": 62,
                                      "num_attention_heads": 32, "num_key_value_heads": 16, "head_dim": 128})
    assert estimate_parameters(gemma) > 25e9
    tower = Gemma3Config(text_config={"num_hidden_layers": 1}, vision_config={"num_hidden_layers": 8000})
    assert count_parameters(tower) is None and len(builds) == 3  # not built: building it took 18 s and 677 MB
    monkeypatch.setenv("SPECDEMO_MAX_PARAMS_M", "500")
    # each config alone in a folder, refused before any weights are looked for: Gemma 3's 27B by the count; a
    # gpt_bigcode of 5 M parameters whose causal-mask buffer holds 9e8 elements (a 300 KB repository that would
    # take gigabytes); a config too large to build, which nothing can count
    for name, config, refusal in (("gemma-3-27b", gemma, "over this server's cap"),
                                  ("bigcode", GPTBigCodeConfig(n_layer=1, n_embd=64, n_head=4, n_positions=30000),
                                   "over this server's cap"),
                                  ("deep", LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=600,
                                                       num_attention_heads=2, vocab_size=64), "cannot be counted")):
        folder = tmp_path / name
        config.save_pretrained(folder)
        with pytest.raises(Exception, match=refusal):
            gen(client, pair="custom", draft=str(EMBEDDED_DRAFT), target=str(folder))


def test_local_custom_paths_load_only_when_the_operator_allows_them(client, monkeypatch, toy_dirs):
    """SPECDEMO_ALLOW_LOCAL=1 lets custom ids be folders on the server (a private deployment): the toy pair loads and
    generates, and its settings name the folders, not their paths. Unset, the same request is refused."""
    draft, target = str(toy_dirs[0]), str(toy_dirs[1])
    with pytest.raises(Exception, match="repo ids of the form owner/name"):
        gen(client, pair="custom", draft=draft, target=target, prompt="a b c", max_new_tokens=6)
    monkeypatch.setenv("SPECDEMO_ALLOW_LOCAL", "1")
    out = gen(client, pair="custom", draft=draft, target=target, prompt="a b c", max_new_tokens=6)
    settings = out["speculative"]["settings"]
    assert out["speculative"]["metrics"]["new_tokens"] == 6
    assert (settings["draft"], settings["target"]) == ("local:draft", "local:target")
    assert str(toy_dirs[0].parent) not in repr(out)
    with pytest.raises(Exception, match="no such folder") as info:
        gen(client, pair="custom", draft="/no/such/model", target="/no/such/other")
    assert "/no/such" not in str(info.value)  # named local:model, not by its path


def test_a_second_session_is_answered_while_the_race_runs_and_stop_ends_the_race(app_url):
    """Experiments take the device lock one round at a time (runs.py): while one session races the strategies on the
    SmolLM2 pair, a second session's short run on the Shakespeare pair is answered before the race ends, and a
    cancel (the page's Stop) ends the race between two rounds. Asserts the order of events, not a time."""
    from specdemo.models import load_pair

    racer = Client(app_url, verbose=False)
    race = racer.submit("smollm2-135m", "", "", "Give me three tips for a good night's sleep.", 4, 0.0, 0, 1.0, 96,
                        0, None, "en", False, api_name="/strategy_race")
    t0 = time.monotonic()
    while len(race.outputs()) < 3:  # the race has loaded its pair and is running rounds
        assert time.monotonic() - t0 < 300 and not race.done(), "the race never started"
        time.sleep(0.05)
    out = gen(Client(app_url, verbose=False), max_new_tokens=8, seed=5)
    assert out["speculative"]["metrics"]["new_tokens"] == 8
    assert not race.done(), "the second session was answered only after the whole race"
    race.cancel()
    lock = load_pair("shakespeare").lock  # one lock per device, shared by every pair on it
    t0 = time.monotonic()
    while lock.locked() and time.monotonic() - t0 < 5:
        time.sleep(0.01)
    time.sleep(0.5)
    busy = []
    for _ in range(300):  # 1.5 s: a race still running would take the device lock for its rounds
        busy.append(lock.locked())
        time.sleep(0.005)
    assert not any(busy), "the cancelled race kept running"
    assert gen(Client(app_url, verbose=False), max_new_tokens=4)["speculative"]["metrics"]["new_tokens"] == 4


def test_a_tiny_temperature_from_the_page_runs_as_greedy(client):
    """T = 1e-39 passes the page's range check; the run takes it as greedy (config.GREEDY_BELOW) instead of failing
    with a bare 'Error' (the logits divided by it overflowed to inf and softmax gave NaN)."""
    from specdemo.app.validation import validate

    req = validate("shakespeare", "", "", "ROMEO:\n", 4, 1e-39, 0, 1.0, 16, 0, False, 1.0)
    assert req.sampling.greedy
    tiny = gen(client, temperature=1e-39, max_new_tokens=16, baseline=True)
    zero = gen(client, temperature=0.0, max_new_tokens=16)
    assert tiny["speculative"]["token_ids"] == zero["speculative"]["token_ids"] == tiny["baseline"]["token_ids"]
    assert tiny["speculative"]["settings"]["temperature"] == 1e-39


# ----------------------------------------------------------------------------------------------- issue 40, items 4, 5
# The page's stream at hundreds of rounds a second: handlers.generate_ui coalesces its updates (UPDATE_INTERVAL_S),
# and every round stays in the state, the film strip and the trace that its last update carries.

QUIET = {"progress": lambda *a, **k: None}  # gr.Progress outside a gradio event
FAST_RUN = ("shakespeare", "", "", "ROMEO:\n", 4, 0.0, 0, 1.0, 256, 0, True, 1.0, None, "lookup", "en")  # /generate_stream
FILM_ROW = re.compile(r'class="sd-row[^"]*" data-round="(\d+)"')


def count_events(monkeypatch) -> dict:
    """Count what the engine produced, by phase: the events runs.run_stream yields to the handler."""
    from specdemo.app import runs

    counts, real = {"speculative": 0, "baseline": 0}, runs.run_stream

    def counting(*args, **kwargs):
        for spec, base, phase in real(*args, **kwargs):
            counts[phase] += 1
            yield spec, base, phase

    monkeypatch.setattr(runs, "run_stream", counting)
    return counts


def holds_every_round(update: dict, rounds: int, steps: int | None) -> None:
    """The update's state, film strip, round slider (and trace, where it carries one) hold all `rounds` rounds (and
    `steps` baseline steps)."""
    state = update["state"]
    assert len(state["spec"].rounds) == rounds
    assert (state["base"] is None) if steps is None else len(state["base"].steps) == steps
    assert FILM_ROW.findall(update["film"]) == [str(i) for i in range(rounds)], "a film-strip row per round"
    assert update["round_sl"]["maximum"] == max(2, rounds)
    if update.get("trace_json"):
        assert len(update["trace_json"]["speculative"]["rounds"]) == rounds
        assert len(update["trace_json"]["baseline"]["token_ids"]) == steps


def test_a_fast_run_sends_a_few_updates_and_the_last_holds_every_round(pair, monkeypatch):
    """With an interval longer than the run, Generate's stream is exactly: the first round at once, the baseline's
    first step at once (with the whole speculative run's text and film strip, whose last rounds no update showed),
    and the finished run; hundreds of rounds and steps, and every one of them in the updates' state."""
    from specdemo.app import handlers

    monkeypatch.setattr(handlers, "UPDATE_INTERVAL_S", 1e6)
    counts = count_events(monkeypatch)
    updates = list(handlers.generate_ui(*FAST_RUN))
    rounds, steps = counts["speculative"], counts["baseline"]
    assert rounds >= 50 and steps >= 100, counts
    assert len(updates) == 3, [sorted(u) for u in updates]
    first, started, last = updates
    assert len(first["state"]["spec"].rounds) == 1 and first["state"]["base"] is None
    assert FILM_ROW.findall(first["film"]) == ["0"]
    holds_every_round(started, rounds, 1)
    assert "sd-pending" in started["stats"], "the baseline's cards wait"
    holds_every_round(last, rounds, steps)
    assert "sd-pending" not in last["stats"] and last["trace_json"]


def test_the_stream_sends_at_most_one_update_an_interval_and_loses_no_round(pair, monkeypatch):
    """The real interval (about 20 updates a second): between two updates of the same phase at least
    UPDATE_INTERVAL_S passes, counted where this test receives them; only a phase's first update and the finished
    run come sooner. Not a timing threshold: the handler waits that long whatever the machine's speed (on this CPU
    rounds come by the hundred a second, and the run sends far fewer updates than it has rounds and steps)."""
    from specdemo.app import handlers

    interval = handlers.UPDATE_INTERVAL_S
    assert 0.02 <= interval <= 0.1, "about 20 updates a second"
    counts = count_events(monkeypatch)
    updates, received = [], []
    for update in handlers.generate_ui(*FAST_RUN):
        received.append(time.monotonic())
        updates.append(update)
    rounds, steps = counts["speculative"], counts["baseline"]
    phases = [u["state"]["base"] is not None for u in updates]
    assert phases[0] is False and phases[-1] is True and len(updates) <= rounds + steps + 1
    gaps = [received[i] - received[i - 1] for i in range(1, len(updates) - 1) if phases[i] == phases[i - 1]]
    assert gaps and min(gaps) >= interval, (min(gaps), interval)
    holds_every_round(updates[-1], rounds, steps)


def test_the_stream_through_the_server_is_coalesced_and_its_last_update_holds_every_round(client, monkeypatch):
    """The same through gradio (the server runs in this process): three updates reach the client for a run of
    hundreds of rounds and steps, and the last one's film strip and trace hold every round."""
    from specdemo.app import handlers

    monkeypatch.setattr(handlers, "UPDATE_INTERVAL_S", 1e6)
    counts = count_events(monkeypatch)
    job = client.submit(*FAST_RUN, False, 3, 0, 0, 0, api_name="/generate_stream")
    final = job.result(timeout=300)
    rounds = counts["speculative"]
    assert rounds >= 50 and counts["baseline"] >= 100, counts
    assert len(job.outputs()) == 3
    assert FILM_ROW.findall(final[2]) == [str(i) for i in range(rounds)]
    trace = final[RUN_OUTPUTS.index("trace_json")]
    assert len(trace["speculative"]["rounds"]) == rounds
    assert len(trace["baseline"]["token_ids"]) == counts["baseline"]


DECODING_LABEL = {"en": {"eager": "eager", "static": "static cache", "graphs": "CUDA graphs"},
                  "zh-CN": {"eager": "eager（逐步即时执行）", "static": "静态缓存", "graphs": "CUDA 图"}}
DECODING_LINE = {"en": "Decoding: **{mode}** (why: {note}).", "zh-CN": "解码方式：**{mode}**（原因：{note}）。"}
# the loader's usual reasons, as each language says them (views.DECODING_NOTE_KEY)
DECODING_WHY = {"a CPU: dynamic KV cache, eager forwards (a static cache measured no faster here)":
                {"en": "a CPU: dynamic KV cache, eager forwards (a static cache measured no faster here)",
                 "zh-CN": "CPU：动态 KV 缓存，逐步即时执行前向计算（在此测得静态缓存并不更快）"},
                "CUDA graphs over a static cache": {"en": "CUDA graphs over a static cache", "zh-CN": "静态缓存上的 CUDA 图"}}


@pytest.mark.parametrize("lang", ["en", "zh-CN"])
def test_the_pair_line_says_how_the_pair_decodes_and_why(lang):
    """The device line under the pair selector (issue 40, item 5): how the loaded pair decodes (on this CPU eager,
    from models.static.choose_mode) and the loader's one-line reason, in the page's language."""
    from specdemo.app import handlers
    from specdemo.models import load_pair

    loaded = load_pair("shakespeare")
    out = handlers.change_pair("shakespeare", "", "", lang, **QUIET)
    desc = out["pair_state"]
    assert (desc["decoding"], desc["decoding_note"]) == (loaded.decoding, loaded.decoding_note)
    assert loaded.decoding_note, "the loader says why"
    if not torch.cuda.is_available():
        assert loaded.decoding == "eager" and loaded.decoding_note.startswith("a CPU:")
    line = DECODING_LINE[lang].format(mode=DECODING_LABEL[lang][loaded.decoding],
                                      note=DECODING_WHY[loaded.decoding_note][lang])
    assert out["pair_status"].endswith("  \n" + line), out["pair_status"]  # on a line of its own
    from specdemo.app import views

    assert views.pair_info(desc, lang) == out["pair_status"]  # a language switch's redraw draws the same line
    assert set(DECODING_WHY) <= set(views.DECODING_NOTE_KEY), "the usual reasons have their translations"


def test_the_decoding_reason_reaches_the_page_escaped():
    """The reason can quote an exception (a failed capture): it reaches the pair's Markdown as text, neither HTML
    nor Markdown; a mode the page does not know is shown escaped too, and a pair state without one shows no line."""
    from specdemo.app import views

    desc = {"draft": "d", "target": "t", "draft_parameters": 1e6, "target_parameters": 2e6, "device": "cuda:0",
            "dtype": "bfloat16", "context_window": 2048}
    hostile = "capture failed (RuntimeError: <img src=x onerror=alert(1)> *x* _y_ [a](b) | c\n): eager forwards"
    for lang, mode in (("en", "CUDA graphs"), ("zh-CN", "CUDA 图")):
        line = views.pair_info(desc | {"decoding": "graphs", "decoding_note": hostile}, lang)
        assert f"**{mode}**" in line and "<img" not in line and "&lt;img src=x onerror=alert(1)&gt;" in line
        assert r"\*x\* \_y\_ \[a\](b) \| c )\: eager forwards" in line and "\n)" not in line  # `:` too: autolinks
    odd = views.pair_info(desc | {"decoding": "<b>turbo</b>", "decoding_note": ""}, "en")
    assert odd.endswith("Decoding: **&lt;b&gt;turbo&lt;/b&gt;**.")
    assert views.pair_info(desc, "en") == views.pair_info(desc | {"decoding": None}, "en")
    assert "Decoding" not in views.pair_info(desc, "en")
