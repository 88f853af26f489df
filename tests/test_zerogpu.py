"""ZeroGPU wiring, on this CPU with the real `spaces` package installed: the handlers go through `spaces.GPU`, a
call through the decorator gives exactly what the undecorated handler gives, and a generator still streams.

What cannot run here: spaces' ZeroGPU worker path itself. It needs a CUDA build of torch (spaces.zero.torch reads
torch.version.cuda on import) and the Space's device API; it is spaces' code, not ours."""

from __future__ import annotations

import inspect
import os
import threading

import pytest

spaces = pytest.importorskip("spaces")  # in requirements.txt; a missing package skips instead of erroring

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


def test_on_zerogpu_a_pair_that_cannot_load_outside_a_gpu_call_is_refused_in_one_sentence(monkeypatch):
    """On ZeroGPU a load in one of gradio's threads, outside a GPU call, meets spaces' guard on CUDA's start, a
    RuntimeError (read in spaces 0.51; the guard itself needs a CUDA build and a Space, so it is raised here by
    hand). The visitor once got gradio's bare 'Error' and a selector on the pair that failed; now the sentence says
    why, and the selector goes back to the loaded pair. Elsewhere such an error is not the visitor's to read."""
    from specdemo.app import validation

    quiet = {"progress": lambda *a, **k: None}
    state = handlers.change_pair("shakespeare", "", "", "en", **quiet)["pair_state"]

    def guarded(key):
        raise RuntimeError("CUDA must not be initialized in the main process on a ZeroGPU Space")

    monkeypatch.setattr(validation, "load_pair", guarded)
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    for lang, words in (("en", "can only run the pair it loaded at start-up"), ("zh-CN", "只能运行启动时加载的模型对")):
        out = handlers.change_pair("smollm2-135m", "", "", lang, loaded=state, **quiet)
        assert words in out["pair_status"] and out["pair"]["value"] == "shakespeare", out
    monkeypatch.setenv("SPACES_ZERO_GPU", "false")
    with pytest.raises(RuntimeError, match="must not be initialized"):
        validation.get_pair(("smollm2-135m",))
