"""ZeroGPU wiring, on this CPU with the real `spaces` package installed: the handlers go through `spaces.GPU`, a
call through the decorator gives exactly what the undecorated handler gives, and a generator still streams.

What cannot run here: spaces' ZeroGPU worker path itself. It needs a CUDA build of torch (spaces.zero.torch reads
torch.version.cuda on import) and the Space's device API; it is spaces' code, not ours."""

from __future__ import annotations

import inspect
import os
import pickle
import shutil
import threading
import time

import pytest
import torch

spaces = pytest.importorskip("spaces")  # in requirements.txt; a missing package skips instead of erroring

from test_hub_cache import hub, plant, present  # noqa: F401 (hub: the fixture)

from specdemo.app import handlers, zerogpu
from specdemo.models import loading as models  # noqa: E402

ARGS = ("shakespeare", "", "", "ROMEO:\n", 4, 0.8, 0, 1.0, 10, 3, True, 1.0)


def test_not_on_zerogpu_here_and_the_duration_fits_the_request_cap(monkeypatch):
    assert zerogpu.on_zerogpu() is False  # SPACES_ZERO_GPU is not set on this machine
    monkeypatch.setenv("SPECDEMO_TIME_LIMIT_S", "60")
    assert zerogpu.gpu_seconds() == 60 + zerogpu.GPU_MARGIN_S
    assert zerogpu._duration(*ARGS) == zerogpu.gpu_seconds()  # spaces calls it with the request's arguments


def test_on_zerogpu_a_request_asks_for_a_minute_of_gpu_time_unless_the_operator_says_otherwise(monkeypatch):
    """spaces checks the seconds a call asks for against the visitor's GPU quota before it runs: the default
    120 s limit asked 150 s a click. On ZeroGPU it is 60 (90 s asked); SPECDEMO_TIME_LIMIT_S still decides."""
    monkeypatch.delenv("SPECDEMO_TIME_LIMIT_S", raising=False)
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    assert zerogpu.gpu_seconds() == 60 + zerogpu.GPU_MARGIN_S
    monkeypatch.setenv("SPACES_ZERO_GPU", "false")
    assert zerogpu.gpu_seconds() == 120 + zerogpu.GPU_MARGIN_S
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    monkeypatch.setenv("SPECDEMO_TIME_LIMIT_S", "100")
    assert zerogpu.gpu_seconds() == 100 + zerogpu.GPU_MARGIN_S


def test_a_call_through_spaces_gpu_equals_the_undecorated_handler():
    plain = handlers.generate_api
    decorated = zerogpu.gpu(plain)  # the real spaces.GPU(duration=...)
    assert inspect.signature(decorated) == inspect.signature(plain)  # gradio builds the API from it
    kw = dict(pair="shakespeare", prompt="JULIET:\n", k=3, temperature=0.9, top_k=0, top_p=1.0, max_new_tokens=12,
              seed=11, baseline=True, lenience=1.0)
    a, b = decorated(**kw), plain(**kw)
    assert a["speculative"]["token_ids"] == b["speculative"]["token_ids"]
    assert a["baseline"]["token_ids"] == b["baseline"]["token_ids"]
    assert a["speculative"]["text"] and a["speculative"]["settings"] == b["speculative"]["settings"]


def test_the_streaming_handler_still_streams_through_spaces_gpu(monkeypatch):
    monkeypatch.setattr(handlers, "UPDATE_INTERVAL_S", 0)  # an update per round: the two calls' updates pair up
    plain = handlers.generate_ui
    decorated = zerogpu.gpu(plain)
    assert inspect.isgeneratorfunction(decorated), "gradio streams only from a generator function"
    through = list(decorated(*ARGS))
    direct = list(plain(*ARGS))
    assert len(through) >= 3 and len(through) == len(direct)
    assert [u.get("tokens") for u in through] == [u.get("tokens") for u in direct]  # the token HTML in every update
    assert through[-1]["trace_json"]["speculative"]["token_ids"] == direct[-1]["trace_json"]["speculative"]["token_ids"]


def test_bad_input_crosses_the_decorator_as_a_message():
    import gradio as gr

    with pytest.raises(gr.Error, match="empty"):
        zerogpu.gpu(handlers.generate_api)(prompt="  ")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_worker_gets_unheld_model_locks(pair):
    """spaces forks its GPU workers from the serving process; a lock another thread held at that moment must not
    stay held in the child."""
    held, release = threading.Event(), threading.Event()

    def hold():
        with models._CACHE_LOCK, pair.lock:
            held.set()
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    held.wait(10)
    pid = os.fork()
    if pid == 0:  # the child: both locks must be free at once
        ok = models._CACHE_LOCK.acquire(timeout=2) and pair.lock.acquire(timeout=2)
        os._exit(0 if ok else 1)
    release.set()
    t.join()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def in_a_worker(fn):
    """spaces' ZeroGPU call as far as it runs here: `fn` runs in a process forked from this one, and its result
    (or what it raised) comes back pickled, as spaces 0.51.3's worker sends it."""

    def call(*args):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the worker
            os.close(read)
            try:
                torch.set_num_threads(1)  # no OpenMP pool of the parent's in a forked child
                data = pickle.dumps(("ok", fn(*args), os.getpid()))
            except BaseException as err:  # noqa: BLE001 (all of it goes back to the caller)
                data = pickle.dumps(("raised", err, os.getpid()))
            with os.fdopen(write, "wb") as f:
                f.write(data)
            os._exit(0)
        os.close(write)
        with os.fdopen(read, "rb") as f:
            kind, value, worker = pickle.loads(f.read())
        os.waitpid(pid, 0)
        calls.append(worker)
        if kind == "raised":
            raise value
        return value

    calls = []
    call.calls = calls
    return call


@pytest.fixture
def zerogpu_space(monkeypatch):
    """A ZeroGPU Space as the serving process meets it: a load here meets spaces' guard on CUDA's start (raised by
    hand: the guard needs a CUDA build of torch and a Space), a load in a worker works, and this process has no
    pair loaded (its LRU is emptied for the test). Yields the worker call and the loads that met the guard."""
    from specdemo.app import validation

    here, real_load, guarded = os.getpid(), validation.load_pair, []

    def load(key):
        if os.getpid() == here and models.loaded_pair(key) is None:  # a cached pair touches no device
            guarded.append(key)
            raise RuntimeError(GUARD)
        return real_load(key)

    monkeypatch.setattr(validation, "load_pair", load)
    monkeypatch.setattr(models, "_CACHE", type(models._CACHE)())
    monkeypatch.setattr(models, "_RESIDENT", {})
    monkeypatch.setattr(zerogpu, "on_zerogpu", lambda: True)
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    worker = in_a_worker(zerogpu._load_here)
    monkeypatch.setattr(zerogpu, "load_on_gpu", worker)
    yield worker, guarded


GUARD = ("Low-level CUDA init (`torch._C._cuda_init`) reached. This means ZeroGPU's PyTorch CUDA emulation mode did "
         "not intercept a CUDA operation in your code.")  # spaces 0.51.3, zero/torch/patching.py
QUIET = {"progress": lambda *a, **k: None}
LOADED = {"chosen": {"pair": "smollm2-135m"}}  # the page's loaded pair, which a failed change goes back to


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_on_zerogpu_a_pair_change_loads_in_a_gpu_worker_and_the_serving_process_loads_nothing(zerogpu_space):
    """Before, the serving process loaded the pair itself, met spaces' guard, and the page could only refuse every
    pair but the start-up one. Now the load runs inside a GPU call: the page shows the pair as loaded there."""
    worker, guarded = zerogpu_space
    out = handlers.change_pair("shakespeare", "", "", "en", loaded=LOADED, **QUIET)
    assert len(worker.calls) == 1 and worker.calls[0] != os.getpid()
    assert guarded == [] and models.loaded_pair("shakespeare") is None  # loaded in the worker only
    assert out["pair_state"]["name"] == "shakespeare" and out["pair_state"]["chosen"] == {"pair": "shakespeare"}
    assert "`shakespeare:target` (13.3M)" in out["pair_status"] and "value" not in out["pair"], out  # no going back
    assert out["chat"]["interactive"] is False  # the summary's fields reached the page: no chat template here


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_on_zerogpu_a_refusal_in_the_worker_reaches_the_page_in_its_language(zerogpu_space):
    """A load refused in the worker (here: a preset that needs a GPU's memory, refused on this CPU) comes back as
    its sentence, in the visitor's language, not as spaces' bare 'ZeroGPU worker error'."""
    said = {}
    for lang in ("en", "zh-CN"):
        out = handlers.change_pair("qwen3-8b-eagle3", "", "", lang, loaded=LOADED, **QUIET)
        assert out["pair"]["value"] == "smollm2-135m"  # the selector goes back to the loaded pair
        said[lang] = out["pair_status"]
    assert "qwen3-8b-eagle3" in said["en"] and said["zh-CN"] != said["en"]  # translated: the key crossed pickled
    assert zerogpu_space[1] == [] and len(zerogpu_space[0].calls) == 2


def test_on_zerogpu_spaces_own_refusal_is_said_and_the_selector_goes_back(zerogpu_space, monkeypatch):
    """spaces raises gr.Error in the serving process when a visitor's GPU quota is spent or a worker dies."""
    import gradio as gr

    def spent(key):
        raise gr.Error("You have exceeded your GPU quota (60s requested vs. 12s left).")

    monkeypatch.setattr(zerogpu, "load_on_gpu", spent)
    out = handlers.change_pair("shakespeare", "", "", "en", loaded=LOADED, **QUIET)
    assert "exceeded your GPU quota" in out["pair_status"] and out["pair"]["value"] == "smollm2-135m"


def test_on_zerogpu_a_pair_loaded_here_needs_no_gpu_call(zerogpu_space):
    """The start-up pair is loaded in the serving process (spaces moves it into every worker): a change back to it
    asks for no GPU time."""
    models.load_pair("shakespeare")  # as app.py loads it at start-up (the fixture's guard is on the page's loads)
    out = handlers.change_pair("shakespeare", "", "", "en", loaded=LOADED, **QUIET)
    assert out["pair_state"]["name"] == "shakespeare" and zerogpu_space[0].calls == [] and zerogpu_space[1] == []


@pytest.fixture
def hub_recorded(monkeypatch):
    """A hub that the fetches reach, recorded instead of made (there is no hub here): yields the fetches."""
    import huggingface_hub

    from specdemo.models import eagle3_files, weights

    events = []
    monkeypatch.setattr(zerogpu, "_FETCHED", set())
    for module in (weights, eagle3_files):  # a Space reaches the hub, which conftest.py switches off here
        monkeypatch.setattr(module, "hub_offline", lambda: False)
    for module in (weights, eagle3_files):
        monkeypatch.setattr(module, "hub_reachable", lambda: True)
    monkeypatch.setattr(zerogpu, "preset_unavailable", lambda key: None)  # a ZeroGPU slice holds an 8B pair
    monkeypatch.setattr(huggingface_hub, "snapshot_download",
                        lambda repo, **kw: events.append(("fetch", repo, os.getpid())) or "/nowhere")
    yield events


QWEN = ("Qwen/Qwen3-0.6B", "Qwen/Qwen3-8B", "RedHatAI/Qwen3-8B-speculator.eagle3")


def test_on_zerogpu_a_custom_pairs_fetch_makes_room_and_is_made_again_once_deleted(zerogpu_space, hub_recorded, hub,
                                                                                    monkeypatch):
    """A custom pair's files, fetched here before its GPU call, make room in the hub cache as a load in the app does
    (models/hub_cache.py): past the budget an older visitor's pair goes, while a pair being fetched stays. A pair
    whose files went is fetched again on its next change, though this process fetched it before (else its worker
    would download inside its call)."""
    import huggingface_hub

    from specdemo.models import hub_cache

    monkeypatch.setenv(hub_cache.BUDGET_ENV, "0")  # every visitor's repository goes, unless kept
    hub_cache.claim(["old/draft", "old/target"], now=1)
    for repo in ("old/draft", "old/target"):
        plant(hub, repo)
    fetched, landed = [], []

    def download(repo, **kw):  # the hub's download: the files land in its cache, and it takes long
        fetched.append(repo)
        plant(hub, repo)
        landed.append(repo)
        hub_cache.make_room((), hub, now=time.time() + 10 * hub_cache.GRACE_S)  # another visitor's tidying, later
        assert all(present(hub, *landed))  # the pair being fetched stays, though its claim is long past
        return "/nowhere"

    monkeypatch.setattr(huggingface_hub, "snapshot_download", download)
    monkeypatch.setattr(zerogpu, "load_on_gpu", lambda key: zerogpu.UserError("err.gpu_call", error="stopped here"))
    key = ("visitor/draft", "visitor/target")
    hub_cache.claim(key)  # as validation.pair_key does, before the configs
    with pytest.raises(zerogpu.UserError):
        zerogpu.pair_summary(key)
    assert present(hub, "old/draft", "old/target", *key) == [False, False, True, True]
    for repo in key:  # deleted since, to make room for other visitors' pairs
        shutil.rmtree(hub_cache.repo_folder(hub, repo))
    landed.clear()
    with pytest.raises(zerogpu.UserError):
        zerogpu.pair_summary(key)
    assert fetched == [*key, *key] and present(hub, *key) == [True, True]


def test_on_zerogpu_a_hub_pair_is_fetched_here_before_its_gpu_call(zerogpu_space, hub_recorded, monkeypatch):
    """A hub pair's download (16 GB for an 8B preset) runs in the serving process, on the CPU: the GPU call's
    metered seconds only load it from disk. There is no hub here, so the fetch is recorded, not made."""
    here = os.getpid()
    monkeypatch.setattr(zerogpu, "load_on_gpu", lambda key: hub_recorded.append(("gpu", key)) or
                        zerogpu.UserError("err.gpu_call", error="stopped here"))
    out = handlers.change_pair("qwen3-8b-eagle3", "", "", "en", loaded=LOADED, **QUIET)
    assert hub_recorded == [*(("fetch", repo, here) for repo in QWEN), ("gpu", "qwen3-8b-eagle3")]
    assert "stopped here" in out["pair_status"]


def test_on_zerogpu_a_run_fetches_a_hub_pair_nobody_selected_before_its_gpu_call(hub_recorded, monkeypatch):
    """A /generate call (or a page's run) naming a pair that this process has not loaded fetched nothing before its
    GPU call, so the worker's load downloaded it inside the call's metered seconds. Now the handlers' decorator
    fetches it first; here the worker's load (in this process: spaces.GPU is a no-op off ZeroGPU) then refuses
    the 8B pair on this CPU, after the fetch."""
    import gradio as gr

    monkeypatch.setattr(zerogpu, "on_zerogpu", lambda: True)
    with pytest.raises(gr.Error, match="qwen3-8b-eagle3"):  # the page's Generate: a generator, streamed
        list(handlers.generate_ui("qwen3-8b-eagle3", "", "", "Hi", 4, 0.6, 0, 1.0, 8, 0, False, 1.0))
    assert hub_recorded == [("fetch", repo, os.getpid()) for repo in QWEN]
    hub_recorded.clear()
    monkeypatch.setattr(zerogpu, "_FETCHED", set())
    with pytest.raises(gr.Error, match="qwen3-8b-eagle3"):
        handlers.generate_api(pair="qwen3-8b-eagle3", prompt="Hi")
    with pytest.raises(gr.Error, match="qwen3-8b-eagle3"):  # fetched once a process: each fetch asks the hub
        handlers.generate_api(pair="qwen3-8b-eagle3", prompt="Hi again")
    assert hub_recorded == [("fetch", repo, os.getpid()) for repo in QWEN]
    monkeypatch.setattr(zerogpu, "_FETCHED", set())
    monkeypatch.setattr(zerogpu, "on_zerogpu", lambda: False)  # elsewhere the load fetches, as it always did
    with pytest.raises(gr.Error):
        handlers.generate_api(pair="qwen3-8b-eagle3", prompt="Hi")
    assert len(hub_recorded) == 3


def test_on_zerogpu_a_fetch_before_the_gpu_call_never_raises_and_a_hub_out_of_reach_is_tried_again(
        hub_recorded, monkeypatch):
    """The fetch runs outside the handlers' conversion of errors into sentences: /generate's JSON as it comes (a
    list for a pair) must still get validate's sentence. And a pair whose hub was out of reach is not marked
    fetched, so that the next call tries again instead of downloading inside its GPU call."""
    import gradio as gr

    from specdemo.models import eagle3_files, weights

    monkeypatch.setattr(zerogpu, "on_zerogpu", lambda: True)
    with pytest.raises(gr.Error, match="Unknown model pair"):
        handlers.generate_api(pair=["shakespeare"], prompt="Hi")
    for reachable in (False, True):
        for module in (weights, eagle3_files):
            monkeypatch.setattr(module, "hub_reachable", lambda: reachable)
        zerogpu.prefetch_pair("qwen3-8b-eagle3")
        if not reachable:
            assert zerogpu._FETCHED == set() and hub_recorded == []
    assert zerogpu._FETCHED == {"qwen3-8b-eagle3"} and len(hub_recorded) == 3


def test_the_gpu_worker_gives_the_pair_s_memory_back_after_summarising_it(monkeypatch):
    """The pair change's worker is not the runs' (spaces keeps workers per decorated function) and lives on idle:
    it unloads what it loaded."""
    monkeypatch.setattr(models, "_CACHE", type(models._CACHE)())
    monkeypatch.setattr(models, "_RESIDENT", {})
    summary = zerogpu._load_here("shakespeare")
    assert summary.desc["name"] == "shakespeare" and summary.has_head and not summary.has_chat_template
    assert models.loaded_pair("shakespeare") is None and models._RESIDENT == {}


def test_on_zerogpu_a_failed_gpu_call_is_one_sentence_and_the_selector_goes_back(zerogpu_space, monkeypatch):
    """spaces' scheduler can fail with other errors than gr.Error (a visitor gone while queued, its API's)."""
    def failed(key):
        raise RuntimeError("schedule: 502")

    monkeypatch.setattr(zerogpu, "load_on_gpu", failed)
    for lang, words in (("en", "could not run the call that loads this pair (RuntimeError)"),
                        ("zh-CN", "无法运行加载该模型对的调用（RuntimeError）")):
        out = handlers.change_pair("shakespeare", "", "", lang, loaded=LOADED, **QUIET)
        assert words in out["pair_status"] and out["pair"]["value"] == "smollm2-135m"


def test_a_load_that_still_meets_the_guard_is_refused_in_one_sentence(zerogpu_space, monkeypatch):
    """The fallback: a load in the serving process that reaches spaces' guard (which pair_summary now avoids) gives
    one sentence, not gradio's bare 'Error'. Elsewhere such an error is not the visitor's to read."""
    from specdemo.app import validation

    for lang, words in (("en", "could not load the pair outside a GPU call"), ("zh-CN", "无法在 GPU 调用之外加载")):
        with pytest.raises(validation.UserError) as err:
            validation.get_pair("shakespeare")
        assert words in err.value.text(lang)
    monkeypatch.setenv("SPACES_ZERO_GPU", "false")
    with pytest.raises(RuntimeError, match="_cuda_init"):
        validation.get_pair("shakespeare")


def test_a_load_that_runs_out_of_gpu_memory_says_so(monkeypatch):
    """Before, any RuntimeError naming CUDA was taken for spaces' guard on ZeroGPU, an out-of-memory one too."""
    from specdemo.app import validation

    def out_of_memory(key):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(validation, "load_pair", out_of_memory)
    for zero in ("true", "false"):
        monkeypatch.setenv("SPACES_ZERO_GPU", zero)
        with pytest.raises(validation.UserError) as err:
            validation.get_pair("shakespeare")
        assert err.value.key == "err.oom"
