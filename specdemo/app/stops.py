"""Stop, as the server sees it, by the run's token: handlers.run_started draws a token for each model run on a page,
which the run reads from the session's state, and Stop and run_over from a hidden field of the page (ui.py).

- Stop marks its run's token (`stop`), and the run's loop ends after the round it is in (`Guard`). gradio's own
  cancel waits for the thread to hand over its next update, which a coalesced update holds for a second or more
  (handlers.coalesced), and on a loaded machine for many; the mark ends it within one round.
- The run's handler then waits for that cancel (`linger`) rather than end by itself, and the buttons come back
  only once the page has finished the cancel. gradio's page finishes a cancel by clearing the function's
  submission, whichever run it now is, and firing the run's `.failure` and `.then` listeners; the server's cancel
  sends the run's completion ahead of that, which fires `.then` alone. A Generate clicked in between would lose its
  run to that clearing, and a run_over fired then would read the new run's token. So the `.then` of a stopped run
  changes nothing (`awaits_cancel`), its `.failure` gives the buttons back, and only the first run_over of a token
  does anything (`close`).
- A run whose stream ended by itself (`ended`: ui.py marks it in the serving process, on ZeroGPU too) gives the
  buttons back from its `.then` as before. Where Stop came as it ended, the page may have found the run still
  going and be cancelling it: then the `.then` waits CANCEL_GRACE_S, so that the cancel's `.failure` goes first.

On ZeroGPU a run's loop works in a GPU worker process that does not see the mark: there Stop is gradio's cancel
alone. The records are bounded: past RECORDS tokens, the oldest are forgotten."""

from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict

LINGER_S = 15.0  # how long a stopped run's handler waits for gradio's cancel before it ends by itself
CANCEL_GRACE_S = 0.5  # how long the `.then` of a run that Stop reached as it ended leaves to the page's cancel
LINGER_STEP_S = 0.05  # between its empty updates: the cancel takes effect when the thread hands one over
RECORDS = 4096  # tokens kept of each kind; a forgotten stop mark leaves gradio's cancel, a forgotten close one run_over
_stopped: OrderedDict[str, None] = OrderedDict()
_closed: OrderedDict[str, None] = OrderedDict()
_ended: OrderedDict[str, None] = OrderedDict()
_guard = threading.Lock()
_END = object()


def new_token() -> str:
    return secrets.token_hex(8)


def _mark(marks: OrderedDict, token: str) -> bool:
    """Record `token`; False if it was recorded already."""
    with _guard:
        if token in marks:
            return False
        marks[token] = None
        while len(marks) > RECORDS:
            marks.popitem(last=False)
        return True


def stop(token: str) -> None:
    if token:
        _mark(_stopped, token)


def stopped(token: str) -> bool:
    return bool(token) and token in _stopped


def ended(token: str) -> None:
    """The run's stream ended by itself (its last update sent, or `linger` out of time), not by a cancel."""
    if token:
        _mark(_ended, token)


def awaits_cancel(token: str) -> bool:
    """Stop marked the run and its stream did not end by itself: gradio's cancel ends it, and the run_over of the
    run's `.failure`, which the page fires once it has finished the cancel, gives the buttons back."""
    return stopped(token) and token not in _ended


def then_may_act(token: str) -> bool:
    """Whether the run_over of a run's `.then` may give the buttons back: not while gradio's cancel ends a stopped
    run, and where Stop came as the run ended, only after CANCEL_GRACE_S (the page's cancel goes first)."""
    if awaits_cancel(token):
        return False
    if stopped(token):
        time.sleep(CANCEL_GRACE_S)
    return True


def close(token: str) -> bool:
    """True for the first run_over of the run `token` (and for a call without a token, such as a test's)."""
    return not token or _mark(_closed, token)


class Guard:
    """Ends a run's event stream before the next event once Stop has marked the run (`cut` then says so), and
    closes the stream, so that the run's engine generator ends at once rather than when it is collected."""

    def __init__(self, token: str):
        self.token, self.cut = token, False

    def __call__(self, events):
        try:
            while not stopped(self.token):
                event = next(events, _END)
                if event is _END:
                    return
                yield event
            self.cut = True
        finally:
            close_events = getattr(events, "close", None)
            if close_events is not None:
                close_events()


def linger():
    """After Stop ended a run's loop (`Guard.cut`): updates that change nothing, one every LINGER_STEP_S, until
    gradio's cancel, which Stop's click sends along, closes the stream (or LINGER_S, should none come)."""
    end = time.monotonic() + LINGER_S
    while time.monotonic() < end:
        yield {}
        time.sleep(LINGER_STEP_S)
