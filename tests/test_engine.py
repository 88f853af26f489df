"""The speculative loop on the embedded pair: greedy identity with transformers, caches, limits, reproducibility."""

from __future__ import annotations

import copy

import pytest
import torch

from conftest import PROMPTS
from specdemo import SamplingConfig, SpecConfig, baseline_generate, speculative_generate
from specdemo.events import OUTPUT_LABELS
from specdemo.models import CachedLM
from specdemo.speculative import PromptError, speculative_rounds

GREEDY = SamplingConfig(temperature=0.0)


@torch.inference_mode()
def hf_greedy(pair, prompt: str, n: int, eos: int | None = None) -> list[int]:
    ids = torch.tensor([pair.encode(prompt)])
    out = pair.target.generate(
        ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n, min_new_tokens=0,
        eos_token_id=pair.eos_token_id if eos is None else eos, pad_token_id=pair.eos_token_id,
    )
    return out[0, ids.shape[1]:].tolist()


@pytest.mark.parametrize("k", range(1, 9))
def test_greedy_output_equals_transformers_generate(pair, k):
    """At T = 0 speculative decoding must give the target's greedy output, token for token, on 20 prompts."""
    for prompt in PROMPTS:
        reference = hf_greedy(pair, prompt, 40)
        trace = speculative_generate(pair, prompt, GREEDY, SpecConfig(k=k, max_new_tokens=40, top_candidates=0))
        assert trace.output_ids == reference, (k, prompt)


def test_greedy_baseline_equals_transformers_generate(pair):
    for prompt in PROMPTS[:5]:
        assert baseline_generate(pair, prompt, GREEDY, max_new_tokens=40).output_ids == hf_greedy(pair, prompt, 40)


@pytest.mark.parametrize("cfg", [GREEDY, SamplingConfig(0.7), SamplingConfig(1.0), SamplingConfig(1.5, top_k=50),
                                 SamplingConfig(1.0, top_p=0.9)], ids=str)
def test_draft_equal_to_target_accepts_everything(self_pair, cfg):
    trace = speculative_generate(self_pair, "ROMEO:\n", cfg, SpecConfig(k=4, max_new_tokens=80, seed=3))
    m = trace.metrics()
    assert m["acceptance_rate"] == 1.0, m
    assert all(t.label in ("accepted", "bonus") for r in trace.rounds for t in r.tokens)
    assert m["new_tokens"] == 80
    assert m["alpha_overlap"] > 0.9999


def snapshot_logits(lm: CachedLM, seq: torch.Tensor) -> torch.Tensor:
    """Logits for the next position from a COPY of lm's cache, after feeding the tokens it has not cached."""
    clone = copy.copy(lm)
    clone.cache = copy.deepcopy(lm.cache)
    return clone.feed(seq[lm.length:])[-1]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_caches_after_every_round_match_a_fresh_prefill(pair, temperature):
    prompt_ids = pair.encode("KING RICHARD III:\nNow is the winter")
    draft, target = CachedLM(pair.draft, pair.vocab_size), CachedLM(pair.target, pair.vocab_size)
    spec = SpecConfig(k=5, max_new_tokens=60, seed=7, top_candidates=0)
    seq = list(prompt_ids)
    seen = {"rejected": 0, "all_accepted": 0}
    for rnd in speculative_rounds(pair, prompt_ids, SamplingConfig(temperature), spec, draft, target):
        seq += [t.token_id for t in rnd.output]
        if rnd.stop_reason:
            break
        seen["all_accepted" if rnd.n_accepted == rnd.k else "rejected"] += 1
        full = torch.tensor(seq)
        # each cache holds a prefix of the fixed sequence: the target all but the last token
        assert target.length == len(seq) - 1
        assert draft.length <= len(seq) - 1
        with torch.inference_mode():
            fresh_t = pair.target(full.view(1, -1)).logits[0, -1, : pair.vocab_size]
            fresh_d = pair.draft(full.view(1, -1)).logits[0, -1, : pair.vocab_size]
        torch.testing.assert_close(snapshot_logits(target, full), fresh_t, atol=2e-4, rtol=1e-4)
        torch.testing.assert_close(snapshot_logits(draft, full), fresh_d, atol=2e-4, rtol=1e-4)
    assert seen["rejected"] > 0 and seen["all_accepted"] > 0, seen


def test_same_seed_same_output_and_different_seed_differs(pair):
    cfg, prompt = SamplingConfig(1.0), "JULIET:\n"
    a = speculative_generate(pair, prompt, cfg, SpecConfig(k=4, max_new_tokens=48, seed=11))
    b = speculative_generate(pair, prompt, cfg, SpecConfig(k=4, max_new_tokens=48, seed=11))
    c = speculative_generate(pair, prompt, cfg, SpecConfig(k=4, max_new_tokens=48, seed=12))
    assert a.output_ids == b.output_ids
    assert [r.n_accepted for r in a.rounds] == [r.n_accepted for r in b.rounds]
    assert a.output_ids != c.output_ids


@pytest.mark.parametrize("k,max_new", [(1, 1), (4, 1), (4, 2), (4, 5), (4, 33), (8, 9), (8, 50)])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_stops_exactly_at_max_new_tokens(pair, k, max_new, temperature):
    spec = SpecConfig(k=k, max_new_tokens=max_new)
    trace = speculative_generate(pair, "BRUTUS:\n", SamplingConfig(temperature), spec)
    assert len(trace.output_ids) == max_new
    assert trace.stop_reason == "max_new_tokens"
    assert all(r.k <= k for r in trace.rounds)


def test_stops_at_eos_inside_an_accepted_run(pair):
    """Make a frequent token the EOS: the run must end right after its first occurrence, as transformers does."""
    prompt = "ROMEO:\n"
    reference = hf_greedy(pair, prompt, 60)
    eos = reference[12]
    eos_pair = copy.copy(pair)
    eos_pair.tokenizer = copy.deepcopy(pair.tokenizer)
    eos_pair.tokenizer.eos_token = pair.tokenizer.convert_ids_to_tokens(eos)
    assert eos_pair.eos_token_id == eos
    expected = reference[: reference.index(eos) + 1]
    assert expected == hf_greedy(pair, prompt, 60, eos=eos)
    for k in (1, 3, 8):
        trace = speculative_generate(eos_pair, prompt, GREEDY, SpecConfig(k=k, max_new_tokens=60))
        assert trace.output_ids == expected and trace.stop_reason == "eos"
        base = baseline_generate(eos_pair, prompt, GREEDY, max_new_tokens=60)
        assert base.output_ids == expected and base.stop_reason == "eos"


def test_round_events_are_consistent(pair):
    trace = speculative_generate(pair, "MACBETH:\n", SamplingConfig(0.9), SpecConfig(k=4, max_new_tokens=64, seed=5))
    assert trace.text == pair.decode(trace.output_ids)
    emitted = 0
    for r in trace.rounds:
        labels = [t.label for t in r.tokens]
        assert labels[: r.n_accepted] == ["accepted"] * min(r.n_accepted, len(labels))
        if r.n_accepted < r.k and not r.stop_reason:
            assert labels[r.n_accepted:] == ["rejected", "resampled"]
            rej = r.tokens[r.n_accepted]
            assert rej.r >= rej.accept_prob  # the test failed
        elif not r.stop_reason:
            assert labels[-1] == "bonus"
        for d in r.drafts:
            assert d.accept_prob == pytest.approx(min(1.0, d.p / d.q), rel=1e-5)
            assert 0 <= d.overlap <= 1 + 1e-6
            if d.accepted:
                assert d.r < d.accept_prob
        assert r.prefix_len == len(trace.prompt_ids) + emitted
        emitted += len(r.output)
        assert r.draft_ms >= 0 and r.verify_ms > 0
    assert emitted == len(trace.output_ids) == 64
    assert all(t.label in OUTPUT_LABELS for r in trace.rounds for t in r.output)


def test_lenience_marks_the_run_lossy_and_accepts_more(pair):
    exact = speculative_generate(pair, "ROMEO:\n", SamplingConfig(1.0), SpecConfig(k=4, max_new_tokens=96, seed=1))
    lenient = speculative_generate(pair, "ROMEO:\n", SamplingConfig(1.0),
                                   SpecConfig(k=4, max_new_tokens=96, seed=1, lenience=0.3))
    assert not exact.metrics()["lossy"] and not any(r.lossy for r in exact.rounds)
    assert lenient.metrics()["lossy"] and all(r.lossy for r in lenient.rounds)
    assert lenient.metrics()["acceptance_rate"] > exact.metrics()["acceptance_rate"]


def test_bad_prompts_raise_clear_errors(pair):
    with pytest.raises(PromptError, match="empty"):
        speculative_generate(pair, "   ", GREEDY, SpecConfig())
    with pytest.raises(PromptError, match="context window"):
        speculative_generate(pair, "ROMEO " * 600, GREEDY, SpecConfig(max_new_tokens=10))
