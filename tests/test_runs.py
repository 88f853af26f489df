"""The runs behind the app's buttons (specdemo/runs.py) share the device: each target forward takes the device lock
on its own, and a deadline ends a run between two forwards. Real models, the embedded pair."""

from __future__ import annotations

import time

import pytest
import torch

from specdemo import SamplingConfig, SpecConfig, runs, speculative_generate
from specdemo.ties import explain_divergence

GREEDY = SamplingConfig(temperature=0.0)


def planted_divergence(pair, at: int):
    """A T = 0 run, and the target-only text it is compared with, with the runner-up planted at token `at`."""
    trace = speculative_generate(pair, "ROMEO:\n", GREEDY, SpecConfig(k=4, max_new_tokens=at + 8, top_candidates=0))
    out = trace.output_ids
    with torch.inference_mode():
        logits = pair.target(torch.tensor([trace.prompt_ids + out[:at]])).logits[0, -1, : pair.vocab_size]
    return trace, out[:at] + [int(logits.topk(2).indices[1])] + out[at + 1:]


def test_a_divergence_is_explained_one_locked_forward_at_a_time(pair32):
    """The race's explanation of a T = 0 divergence replays a prefill, one step per token up to it, and every verify
    up to its round. It takes the device lock for one forward at a time and leaves it free in between (where
    another session's round runs, and Stop ends it), and it gives the same answer as explain_divergence."""
    at = 20
    trace, planted = planted_divergence(pair32, at)
    pos = len(trace.prompt_ids) + at
    replayed = next(j for j, r in enumerate(trace.rounds) if r.prefix_len + len(r.output) > pos) + 1
    steps = runs.explained(pair32, trace.prompt_ids, trace.rounds, planted, time.monotonic() + 600)
    pauses = 0
    while True:
        try:
            assert next(steps) is None
        except StopIteration as done:
            result = done.value
            break
        assert pair32.lock.acquire(blocking=False), "the device lock is held between two forwards"
        pair32.lock.release()
        pauses += 1
    assert pauses == (1 + at + replayed) - 1  # a pause between every two of the forwards
    assert result == explain_divergence(pair32, trace.prompt_ids, trace.rounds, planted)
    assert result.position == at


def test_an_explanation_past_the_deadline_ends_after_one_forward(pair32):
    trace, planted = planted_divergence(pair32, 12)
    late = runs.explained(pair32, trace.prompt_ids, trace.rounds, planted, time.monotonic() - 1)
    with pytest.raises(StopIteration) as done:
        next(late)
    assert done.value.value == runs.TIME_LIMIT
    assert not pair32.lock.locked()
