"""One lock per browser session (gradio's session hash), for the handlers whose quick presses must take turns within a
session while sessions run side by side (handlers.step_round, handlers.redraw), and a bound on redraws (redraw_turn)."""

from __future__ import annotations

import threading
from contextlib import contextmanager

import gradio as gr

_LOCKS: dict[str, list] = {}  # session hash: [its lock, how many handlers hold or wait for it]
_GUARD = threading.Lock()


@contextmanager
def session_turn(request: gr.Request | None):
    """Hold the session's lock (gradio's session hash) for the block. The lock lives while a handler holds or waits
    for it, so the table never grows with the visitors a server has seen. (An earlier table of weak references lost
    each lock as soon as it was looked up, so no two handlers ever took turns.)"""
    key = getattr(request, "session_hash", None) or ""
    with _GUARD:
        entry = _LOCKS.setdefault(key, [threading.Lock(), 0])
        entry[1] += 1
    try:
        with entry[0]:
            yield
    finally:
        with _GUARD:
            entry[1] -= 1
            if not entry[1]:
                del _LOCKS[key]


REDRAWS = threading.BoundedSemaphore(2)  # redraws under way at once, over all sessions


@contextmanager
def redraw_turn(request: gr.Request | None):
    """session_turn, and one of REDRAWS' places: a redraw answers in its own HTTP reply (queue=False), outside the
    queue's concurrency limits, and a caller of its endpoint (hidden from the API's docs, still callable) with a new
    session per call took 16 threads of CPU: another visitor's 32-token run went from 0.2 s to 8 s."""
    with REDRAWS, session_turn(request):
        yield
