"""One lock per browser session (gradio's session hash), for the handlers whose quick presses must take turns within a
session while sessions run side by side (handlers.step_round, handlers.redraw)."""

from __future__ import annotations

import threading
import weakref

import gradio as gr


class _SessionLock:
    """A lock that can be weakly referenced (a bare threading.Lock cannot)."""

    __slots__ = ("lock", "__weakref__")

    def __init__(self):
        self.lock = threading.Lock()


_SESSION_LOCKS: weakref.WeakValueDictionary[str, _SessionLock] = weakref.WeakValueDictionary()
_SESSION_LOCKS_GUARD = threading.Lock()


def session_lock(request: gr.Request | None) -> _SessionLock:
    """The lock of one browser session (gradio's session hash); it lives while a handler holds it, so the table
    never grows with the visitors a server has seen."""
    key = getattr(request, "session_hash", None) or ""
    with _SESSION_LOCKS_GUARD:
        held = _SESSION_LOCKS.get(key)
        if held is None:
            held = _SESSION_LOCKS[key] = _SessionLock()
    return held
