"""The benchmark's timing helpers (specdemo/bench/timing.py, hf_rows.py) and its decodings (decodings.py): ids on the
model's own device, and the device synchronised before every reading of the clock, so that a GPU's queued kernels are
timed and not just their queueing. The CUDA test runs where a GPU is present; on the CPU the same code paths run with
device_sync as a no-op."""

from __future__ import annotations

import pytest
import torch

from specdemo import SamplingConfig, SpecConfig
from specdemo.bench import decodings, hf_rows, timing


def spy_sync(monkeypatch, module) -> list:
    """Records each device_sync of `module` (timing or hf_rows: each imports its own name)."""
    calls = []
    real = module.device_sync

    def sync(device):
        calls.append(torch.device(device))
        real(device)

    monkeypatch.setattr(module, "device_sync", sync)
    return calls


def test_forward_ms_syncs_around_every_timed_forward(toy_pair, monkeypatch):
    calls = spy_sync(monkeypatch, timing)
    fed = []
    real_feed = timing.CachedLM.feed

    def feed(self, ids, keep_logits=1):
        fed.append(ids.device)
        return real_feed(self, ids, keep_logits)

    monkeypatch.setattr(timing.CachedLM, "feed", feed)
    ms = timing.forward_ms(toy_pair.target, toy_pair.vocab_size, 3, context=8, reps=5)
    assert ms > 0
    assert calls == [toy_pair.target.device] * 10  # before and after each of the 5 timed forwards
    assert fed == [toy_pair.target.device] * 6  # the context, then the 5 timed forwards


def test_assisted_generate_syncs_on_the_pairs_device(toy_pair, monkeypatch):
    calls = spy_sync(monkeypatch, hf_rows)
    n, secs = hf_rows.assisted_generate(toy_pair, "a b c", SamplingConfig(temperature=0.0),
                                        SpecConfig(k=2, max_new_tokens=6), mode="constant")
    assert n == 6 and secs > 0
    assert calls == [toy_pair.device] * 2


@pytest.mark.cuda  # skipped without a CUDA device (conftest.py)
def test_forward_ms_and_assisted_generate_on_cuda():
    from specdemo.models import load_pair

    pair = load_pair("shakespeare", device="cuda")
    assert timing.forward_ms(pair.draft, pair.vocab_size, 1, reps=5) > 0
    assert timing.forward_ms(pair.target, pair.vocab_size, 5, reps=5) > 0
    n, secs = hf_rows.assisted_generate(pair, "ROMEO:\n", SamplingConfig(temperature=0.0),
                                        SpecConfig(k=4, max_new_tokens=16), mode="constant")
    assert n > 0 and secs > 0


def test_decoded_views_prepare_each_decoding_once_and_share_the_models(toy_pair):
    """bench --decoding(s): the first decoding is prepared on the pairs given, each later one on copies that share
    their models and hold static caches of their own, sized to the request; a decoding that runs as one already
    there (graphs on a CPU runs as static) is left out, and says so."""
    import copy

    own = copy.copy(toy_pair)  # the session's pair stays as it loaded
    said = []
    views = decodings.decoded_views({"float32": own}, ["eager", "static", "graphs"], 20, said.append)
    assert list(views) == ["eager", "static"]
    eager, static = views["eager"]["float32"], views["static"]["float32"]
    assert eager is own and eager.decoding == "eager" and not eager.static_slots
    assert static is not own and static.target is own.target and static.decoding == "static"
    assert {role: slot.max_len >= 20 for role, slot in static.static_slots.items()} == {"target": True, "draft": True}
    assert type(static.new_lm("target")).__name__ == "StaticLM" and type(eager.new_lm()).__name__ == "CachedLM"
    assert any("graphs" in line and "left out" in line for line in said)
    info = decodings.decoding_info(views["static"])
    assert info["decoding"] == "static" and info["capture_s"] == {"float32": 0.0}
    assert decodings.decoding_line(views["static"]).startswith("decoding static: ")


def test_forward_ms_times_a_static_cache_in_what_fits(toy_pair):
    """forward_ms through a pair's own cache (new_lm): a static cache too small for the usual 128-token prefix
    shortens the prefix instead of writing past its end."""
    import copy

    from specdemo.models import static

    view = copy.copy(toy_pair)
    static.prepare(view, "static", widths=(1, 2, 4), max_request=16)
    lm = view.new_lm("target")
    assert timing.forward_ms(view.target, view.vocab_size, 3, reps=3, lm=lm) > 0
    assert lm.length == lm.slot.max_len - 3 < 128  # the prefix that fitted (each timed forward is cropped back)
