"""The benchmark's timing helpers (specdemo/bench/methods.py): ids on the model's own device, and the device synchronised
before every reading of the clock, so that a GPU's queued kernels are timed and not just their queueing. The CUDA
test runs where a GPU is present; on the CPU the same code paths run with device_sync as a no-op."""

from __future__ import annotations

import pytest
import torch

from specdemo import SamplingConfig, SpecConfig
from specdemo.bench import methods as bench


def spy_sync(monkeypatch) -> list:
    calls = []
    real = bench.device_sync

    def sync(device):
        calls.append(torch.device(device))
        real(device)

    monkeypatch.setattr(bench, "device_sync", sync)
    return calls


def test_forward_ms_syncs_around_every_timed_forward(toy_pair, monkeypatch):
    calls = spy_sync(monkeypatch)
    fed = []
    real_feed = bench.CachedLM.feed

    def feed(self, ids, keep_logits=1):
        fed.append(ids.device)
        return real_feed(self, ids, keep_logits)

    monkeypatch.setattr(bench.CachedLM, "feed", feed)
    ms = bench.forward_ms(toy_pair.target, toy_pair.vocab_size, 3, context=8, reps=5)
    assert ms > 0
    assert calls == [toy_pair.target.device] * 10  # before and after each of the 5 timed forwards
    assert fed == [toy_pair.target.device] * 6  # the context, then the 5 timed forwards


def test_assisted_generate_syncs_on_the_pairs_device(toy_pair, monkeypatch):
    calls = spy_sync(monkeypatch)
    n, secs = bench.assisted_generate(toy_pair, "a b c", SamplingConfig(temperature=0.0),
                                      SpecConfig(k=2, max_new_tokens=6), mode="constant")
    assert n == 6 and secs > 0
    assert calls == [toy_pair.device] * 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_forward_ms_and_assisted_generate_on_cuda():
    from specdemo.models import load_pair

    pair = load_pair("shakespeare", device="cuda")
    assert bench.forward_ms(pair.draft, pair.vocab_size, 1, reps=5) > 0
    assert bench.forward_ms(pair.target, pair.vocab_size, 5, reps=5) > 0
    n, secs = bench.assisted_generate(pair, "ROMEO:\n", SamplingConfig(temperature=0.0),
                                      SpecConfig(k=4, max_new_tokens=16), mode="constant")
    assert n > 0 and secs > 0
