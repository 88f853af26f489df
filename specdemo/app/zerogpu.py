"""ZeroGPU: on a Hugging Face Space with ZeroGPU hardware, the handlers' model work runs inside `@spaces.GPU`.

Owns the one decorator (`gpu`) that handlers.py and experiments.py put on every handler that runs a model, and the
GPU time each call asks for. Elsewhere nothing changes: without the `spaces` package `gpu` returns the function
itself, and with it `spaces.GPU` returns the function itself too unless the Space has a ZeroGPU (`SPACES_ZERO_GPU`,
read by `spaces.config.Config.zero_gpu`; checked in spaces 0.51). It does not pick devices (models/devices.py).

On ZeroGPU, `spaces.GPU` runs each call in a worker process that holds a GPU slice (spaces may reuse an idle
one): arguments and every yielded value are pickled across, and a generator stays a generator, so the UI keeps
streaming round by round. The duration asked for is the request's time limit (Limits.time_limit_s, where the
handlers stop a run; it counts from the request's arrival, so a pair that the worker loads first is paid out of
it) plus a margin for the first CUDA kernels; the scheduler counts the time used, and a shorter request waits
less in its queue.

It also owns where a pair change loads (`pair_summary`): on ZeroGPU only a GPU call may start CUDA, so a pair that
the serving process has not loaded loads inside one (read in spaces 0.51.3; not yet tried on a Space).
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass

from specdemo.config import PRESETS
from specdemo.limits import Limits
from specdemo.models import ModelLoadError, ModelPair, hub_cache, loaded_pair, resolve, unload_pair
from specdemo.models.devices import zerogpu_space
from specdemo.models.eagle3_files import head_folder
from specdemo.models.loading import preset_unavailable
from specdemo.models.weights import prefetch

from .validation import UserError, get_pair, user_error

GPU_MARGIN_S = 30  # CUDA start-up and the start-up pair's move into the worker; the last round past the deadline
LOAD_SECONDS = 60  # GPU seconds a pair change asks for on ZeroGPU (a load inside a worker: `pair_summary`)
log = logging.getLogger("specdemo")


def on_zerogpu() -> bool:
    """True on a ZeroGPU Space: the spaces package is installed and the Space says it has a ZeroGPU
    (devices.zerogpu_space, SPACES_ZERO_GPU read as spaces.config reads it: the one reading of it)."""
    return importlib.util.find_spec("spaces") is not None and zerogpu_space()


def gpu_seconds(limits: Limits | None = None) -> int:
    """GPU seconds one request asks for: its time limit plus the margin."""
    limits = limits or Limits.from_env()
    return max(1, limits.time_limit_s) + GPU_MARGIN_S


def _duration(*args, **kwargs) -> int:
    """spaces.GPU calls this with the request's arguments; the cap is the server's, read when the request comes."""
    return gpu_seconds()


def gpu(fn: Callable, duration: int | None = None) -> Callable:
    """`fn` inside `@spaces.GPU(duration=...)` when the spaces package is importable (a no-op there without a
    ZeroGPU), behind `fetching_first`; `fn` itself when it is not. Put it outermost, so that expected errors become
    gr.Error inside the worker and cross back as messages. duration: the seconds asked for; None asks for
    gpu_seconds()."""
    try:
        import spaces
    except ImportError:
        return fn
    return fetching_first(fn, spaces.GPU(duration=duration or _duration)(fn))


PAIR_ARGS = ("pair_name", "pair")  # the page's handlers' name for the pair, and the API's


def requested_preset(signature: inspect.Signature, args, kwargs) -> str | None:
    """The preset that a handler's arguments name, or None (a custom pair, or arguments that do not bind)."""
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    name = next((bound.arguments[n] for n in PAIR_ARGS if n in bound.arguments), None)
    return name if isinstance(name, str) and name in PRESETS else None


def fetching_first(fn: Callable, decorated: Callable) -> Callable:
    """`decorated` (fn inside spaces.GPU), which on ZeroGPU first fetches the hub files of the preset that the
    call's arguments name, here in the serving process, unless it is loaded here: a run or an experiment whose
    worker loads a preset nobody has selected on the page (an API call) reads it from disk within its GPU time.
    A custom pair is not fetched ahead: the page's pair change fetched it (pair_summary), and an API call's
    download stays inside its GPU call, behind the caller's quota, so that nobody holds a run's slot on the network
    without quota. (What visitors download is bounded on disk by hub_cache's budget, whoever fetches it.)"""
    signature = inspect.signature(fn)

    def fetch(args, kwargs) -> None:
        if not on_zerogpu():
            return
        try:  # never raises: it runs outside the handlers' conversion of errors into sentences
            key = requested_preset(signature, args, kwargs)
            if key is not None and loaded_pair(key) is None:
                prefetch_pair(key)
        except Exception as err:  # noqa: BLE001 - the handler's own validation or load says why, in its sentence
            log.info("fetching a pair before its GPU call failed: %r", err)

    if inspect.isgeneratorfunction(fn):
        @functools.wraps(decorated)
        def streamed(*args, **kwargs):
            fetch(args, kwargs)
            yield from decorated(*args, **kwargs)

        return streamed

    @functools.wraps(decorated)
    def called(*args, **kwargs):
        fetch(args, kwargs)
        return decorated(*args, **kwargs)

    return called


@dataclass(frozen=True)
class PairSummary:
    """What the page shows of a loaded pair (handlers.change_pair), as plain data: it crosses from a ZeroGPU
    worker pickled, where a ModelPair, with its models on the worker's GPU, cannot."""

    desc: dict  # ModelPair.describe()
    chat: bool  # the pair's default mode
    has_chat_template: bool
    has_head: bool

    @classmethod
    def of(cls, pair: ModelPair) -> PairSummary:
        return cls(pair.describe(), pair.chat, pair.has_chat_template, pair.head is not None)


def _load_here(key) -> PairSummary | UserError:
    """In a GPU worker: load `key`, summarise it, and unload it again, since the runs' workers are others (spaces
    keeps workers per decorated function) and this one keeps living idle. A refusal comes back as a value: raised,
    it would reach the page as spaces' bare "ZeroGPU worker error" instead of its sentence (it is no gr.Error)."""
    try:
        summary = PairSummary.of(get_pair(key))
    except UserError as err:
        return err
    unload_pair(key)
    return summary


load_on_gpu = gpu(_load_here, duration=LOAD_SECONDS)


_FETCHED: set = set()  # pair keys whose files this process has fetched (each fetch asks the hub again)


def prefetch_pair(key) -> None:
    """Fetch the hub files of a pair's two models and of its published head into the hub cache, on the CPU, so
    that the load inside a GPU call reads them from disk instead of spending the call's metered seconds on the
    network; once a process. A failure is left for that load to say in its sentence."""
    if (key in _FETCHED and hub_cache.present(key)) or preset_unavailable(key) is not None:
        return  # fetched (a custom pair's files may have been deleted since: hub_cache); a refused preset
    name, draft_id, target_id = resolve(key)
    head = key[2] if isinstance(key, tuple) and len(key) > 2 else getattr(PRESETS.get(name), "eagle3_head", None)
    fetched = [prefetch(model_id) for model_id in (draft_id, target_id)]
    if head:
        try:
            head_folder(head)  # a folder as it is; a hub id fetched, refused where the hub is off or out of reach
        except ModelLoadError:
            return
    if all(fetched):
        _FETCHED.add(key)


def pair_summary(key) -> PairSummary:
    """Load the pair `key` (validation.get_pair) for a pair change, and summarise it for the page.

    On a ZeroGPU Space the serving process may not start CUDA: spaces 0.51.3 lets it place tensors on the GPU
    only in the thread that imported the app, before launch, and raises on CUDA's start in gradio's threads. So a
    pair that this process has not loaded (only the start-up pair is) loads inside a GPU call, in a worker, and
    the page gets its summary; its hub files are fetched here first. The worker is the pair change's own (spaces
    keeps workers per decorated function), so a run's worker loads the pair again on its first run there, out of
    that run's time limit. A failure is a UserError: the load's own sentence, spaces' (a visitor out of GPU quota,
    a worker that died), or one that names the scheduler's error."""
    if not on_zerogpu() or loaded_pair(key) is not None:
        return PairSummary.of(get_pair(key))
    import gradio as gr

    try:
        with hub_cache.using(key):  # kept from other visitors' tidying, however long the download takes
            prefetch_pair(key)  # a hub pair's download, here on the CPU, not out of the call's metered seconds
    except ModelLoadError as err:
        raise user_error(err) from None
    finally:
        if isinstance(key, tuple):  # a custom pair's files are the visitors' (models/hub_cache.py): used now, so
            hub_cache.claim_quietly(key)  # kept for its worker's load, and others go once past the budget
            hub_cache.tidy()
    try:
        out = load_on_gpu(key)
    except gr.Error as err:  # spaces' own: a visitor's quota spent, a worker that died
        raise UserError(str(err.message)) from None
    except Exception as err:  # noqa: BLE001 - the scheduler's (a visitor gone while queued, its API): one sentence
        log.warning("a pair change's GPU call failed: %r", err)
        raise UserError("err.gpu_call", error=type(err).__name__) from None
    if isinstance(out, UserError):
        raise out
    return out
