"""Stop, as the server sees it, by the run's token: handlers.run_started draws a token for each model run on a page
(into the page's state), and the run, Stop and run_over each read it.

- Stop marks its run's token (`stop`), and the run's loop ends after the round it is in (`Guard`). gradio's own
  cancel waits for the thread to hand over its next update, which a coalesced update holds for a second or more
  (handlers.coalesced), and on a loaded machine for many; the mark ends it within one round.
- The run's handler then waits for that cancel (`linger`) rather than end: a stream that ended by itself first
  has its `.then` run, which gives the buttons back, and a Generate clicked then lost its run's submission to the
  cancel's own end in the page (gradio clears the function's submission, whichever run it is), which ran run_over
  again, in the middle of the new run.
- The first run_over to close a token gives the buttons back (`close`); later ones change nothing. After a cancel
  gradio fires both the run's `.then` and its `.failure`.

On ZeroGPU a run's loop works in a GPU worker process that does not see the mark: there Stop is gradio's cancel
alone. The records are bounded: past RECORDS tokens, the oldest are forgotten."""

from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict

LINGER_S = 30.0  # how long a stopped run's handler waits for gradio's cancel before it ends by itself
LINGER_STEP_S = 0.05  # between its empty updates: the cancel takes effect when the thread hands one over
RECORDS = 4096  # tokens kept of each kind; a forgotten stop mark leaves gradio's cancel, a forgotten close one run_over
_stopped: OrderedDict[str, None] = OrderedDict()
_closed: OrderedDict[str, None] = OrderedDict()
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
