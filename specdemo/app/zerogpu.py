"""ZeroGPU: on a Hugging Face Space with ZeroGPU hardware, the handlers' model work runs inside `@spaces.GPU`.

Owns the one decorator (`gpu`) that handlers.py and experiments.py put on every handler that runs a model, and the
GPU time each call asks for. Elsewhere nothing changes: without the `spaces` package `gpu` returns the function
itself, and with it `spaces.GPU` returns the function itself too unless the Space has a ZeroGPU (`SPACES_ZERO_GPU`,
read by `spaces.config.Config.zero_gpu`; checked in spaces 0.51). It does not pick devices (models/devices.py).

On ZeroGPU, `spaces.GPU` runs each call in a worker process that holds a GPU slice (spaces may reuse an idle
one): arguments and every yielded value are pickled across, and a generator stays a generator, so the UI keeps
streaming round by round. The duration asked for is the request's time limit (Limits.time_limit_s, where the
handlers stop a run) plus a margin for loading a pair the worker has not seen and for the first CUDA kernels; the
scheduler counts the time used, and a shorter request waits less in its queue.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

from specdemo.limits import Limits
from specdemo.models.devices import zerogpu_space

GPU_MARGIN_S = 30  # loading a pair inside the worker, CUDA start-up, the last round past the deadline


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


def gpu(fn: Callable) -> Callable:
    """`fn` inside `@spaces.GPU(duration=...)` when the spaces package is importable (a no-op there without a
    ZeroGPU); `fn` itself when it is not. Put it outermost, so that expected errors become gr.Error inside the
    worker and cross back as messages."""
    try:
        import spaces
    except ImportError:
        return fn
    return spaces.GPU(duration=_duration)(fn)
