"""The EAGLE drafter: exact with any head (chi-square on the toy pair, with a truncated draft vocabulary), its cache
holds the target's true features after every round, and a missing, damaged or foreign head is refused in one
sentence while the other strategies keep working."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from types import SimpleNamespace

import pytest
import torch
from test_exactness import PASS_P, chi2_pvalue, drop_k, exact_joint, speculative_samples

from specdemo import SamplingConfig, SpecConfig, baseline_generate, speculative_generate
from specdemo.config import PRESETS
from specdemo.engine.drafters import EagleDrafter
from specdemo.engine.speculative import speculative_rounds
from specdemo.engine.strategy import make_drafter
from specdemo.i18n import tr
from specdemo.models import StrategyUnavailable
from specdemo.models.devices import dtype_name
from specdemo.models.eagle import LAYERS_FILE, WEIGHTS_FILE, HeadError, attach_head, load_head, new_head, save_head

GREEDY = SamplingConfig(temperature=0.0)


def random_head(pair, d2t: torch.Tensor, seed: int = 0, scale: float = 0.3, feature_layers: tuple[int, ...] = ()):
    """A head for `pair`'s target with random weights (exactness must not depend on what the head learnt)."""
    torch.manual_seed(seed)
    head = new_head(pair.target, pair.tokenizer, d2t, feature_layers=feature_layers)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn_like(p) * scale)
    return head.attach(pair.target, torch.float32, pair.device)


def eagle_drafter(pair, head, cfg):
    return lambda: EagleDrafter(head, pair.target, cfg, pair.vocab_size, pair.context_window + 1)


@torch.inference_mode()
def exact_joint3(pair, prompt_ids: list[int], cfg: SamplingConfig) -> dict:
    """P(x1, x2, x3 | prompt) under the warped target, by enumeration: the eagle drafter's first round is the
    prefill (x1 from the target alone), so its drafts are judged at x2 and x3."""
    two = exact_joint(pair, prompt_ids, cfg)
    from specdemo.engine.sampling import warp

    out = {}
    for (x1, x2), p12 in two.items():
        p3 = warp(pair.target(torch.tensor([prompt_ids + [x1, x2]])).logits[0, -1, : pair.vocab_size], cfg)
        for x3 in range(pair.vocab_size):
            if p3[x3] > 0:
                out[(x1, x2, x3)] = p12 * float(p3[x3])
    return out


# Samples per chi-square test of the head's drafts: enough to catch the planted wrong q below (a head claiming a
# uniform q) with a wide margin, over these seeds: p = 3e-61 at 1500 (1e-24 in the T = 0.7, top-k 3 setting), and
# 1e-28 already at 1000 (measured 2026-11-25; 3000 gave 1e-209). Halved from 3000 to save CI time.
EAGLE_N = 1500


@pytest.mark.parametrize("cfg,truncated,layers", [(SamplingConfig(1.0), False, ()), (SamplingConfig(1.0), True, ()),
                                                  (SamplingConfig(0.7, top_k=3), True, ()),
                                                  (SamplingConfig(1.0), True, (0,))],
                         ids=["T1-full-vocab", "T1-truncated-vocab", "T0.7-k3-truncated-vocab", "T1-feature-layer"])
def test_eagle_is_exact_on_the_toy_pair(toy_pair, cfg, truncated, layers):
    """x2 and x3 come from the head's drafts (judged by the target), and their joint with x1 follows the target.
    With a truncated draft vocabulary q is zero on 3 of the 8 tokens: the residual must produce them. A head that
    also reads a lower layer of the target (EAGLE-3 features) is exact alike."""
    d2t = torch.tensor([0, 2, 3, 5, 7]) if truncated else torch.arange(toy_pair.vocab_size)
    head = random_head(toy_pair, d2t, feature_layers=layers)
    prompt = [0, 1]
    exact = exact_joint3(toy_pair, prompt, cfg)
    n = EAGLE_N
    counts = speculative_samples(toy_pair, prompt, cfg, k=2, n=n, n_tokens=3, strategy="eagle",
                                 make_drafter=eagle_drafter(toy_pair, head, cfg))
    counts.pop("rejections")
    assert counts.pop(("k", 0)) == n  # round one is the prefill: the target reads the prompt
    outside = {1, 4, 6}
    if truncated:  # tokens the head can never propose still appear, through the residual
        assert sum(c for cell, c in counts.items() if cell[1] in outside) > 0.05 * n
    assert chi2_pvalue(drop_k(counts), exact, n) > PASS_P


class CountingDrafter(EagleDrafter):
    """Records how many tokens each head-drafted round of two or more drafts proposed."""

    ks: list[int]

    def propose(self, seq, k_max, gen):
        prop = super().propose(seq, k_max, gen)
        if prop.source == "eagle" and k_max >= 2:
            self.ks.append(prop.k)
        return prop


class ProbeDrafter(EagleDrafter):
    """Records the head's confidence where its stop ended a chain (Proposal.unsure)."""

    seen: list[float]

    def propose(self, seq, k_max, gen):
        prop = super().propose(seq, k_max, gen)
        if prop.unsure is not None:
            self.seen.append(prop.unsure[0])
        return prop


def test_the_confidence_stop_shortens_rounds_and_stays_exact(toy_pair):
    """A head with a confidence stop drafts x_t (t >= 2) only where its own top probability there is at least
    stop_below, decided before x_t is drawn and without p or r (why that keeps the output exact:
    test_exactness.test_adaptive_stop_rule_keeps_exactness). At a threshold where it stops in some rounds and not
    in others, the joint of x1..x3 still follows the target."""
    from dataclasses import replace

    cfg = SamplingConfig(1.0)
    head = random_head(toy_pair, torch.tensor([0, 2, 3, 5, 7]))
    # The threshold: the median of the head's top probability at its first stop decision, over 200 runs with seeds
    # the test does not use (a stop_below of almost 1 stops every round there and records what it saw). It depends
    # on the machine: the toy target's features, which the head reads, are bf16 on a CPU with bf16 units and
    # float32 elsewhere, and a fixed 0.775 stopped 40% of rounds on one and 99% on the other.
    head.cfg = replace(head.cfg, stop_below=1 - 1e-9)
    seen: list[float] = []

    def probe():
        drafter = ProbeDrafter(head, toy_pair.target, cfg, toy_pair.vocab_size, 64)
        drafter.seen = seen
        return drafter

    speculative_samples(toy_pair, [0, 1], cfg, k=3, n=200, n_tokens=3, seed0=10**6, strategy="eagle",
                        make_drafter=probe)
    assert len(seen) > 150  # the first round is the prefill; every eagle round stopped and recorded
    head.cfg = replace(head.cfg, stop_below=sorted(seen)[len(seen) // 2])
    ks: list[int] = []

    def make():
        drafter = CountingDrafter(head, toy_pair.target, cfg, toy_pair.vocab_size, 64)
        drafter.ks = ks
        return drafter

    n, prompt = EAGLE_N, [0, 1]
    counts = speculative_samples(toy_pair, prompt, cfg, k=3, n=n, n_tokens=3, strategy="eagle", make_drafter=make)
    counts.pop("rejections")
    assert {1, 2} <= set(ks) and 0.1 * len(ks) < ks.count(1) < 0.9 * len(ks)  # it stopped in some rounds only
    assert chi2_pvalue(drop_k(counts), exact_joint3(toy_pair, prompt, cfg), n) > PASS_P


def test_a_planted_bug_in_the_truncated_q_is_caught(toy_pair, monkeypatch):
    """If q were renormalised over the FULL vocabulary's logits but sampled on the subset (q and the draw
    disagree), the chi-square test must fail: the test above has the power to see a wrong q."""
    cfg = SamplingConfig(1.0)
    head = random_head(toy_pair, torch.tensor([0, 2, 3, 5, 7]))

    class Buggy(EagleDrafter):
        def propose(self, seq, k_max, gen):
            prop = super().propose(seq, k_max, gen)
            if prop.k:
                prop.q = torch.full_like(prop.q, 1.0 / prop.q.shape[1])  # claims uniform q: wrong ratios
            return prop

    prompt = [0, 1]
    counts = speculative_samples(toy_pair, prompt, cfg, k=2, n=EAGLE_N, n_tokens=3, strategy="eagle",
                                 make_drafter=lambda: Buggy(head, toy_pair.target, cfg, toy_pair.vocab_size, 64))
    counts.pop("rejections")
    assert chi2_pvalue(drop_k(counts), exact_joint3(toy_pair, prompt, cfg), EAGLE_N) < 1e-6


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_head_cache_holds_true_features_after_every_round(pair32, temperature):
    """After each round the head's cache covers only positions with the target's TRUE features (drafted positions
    rolled back), its keys equal a fresh teacher-forced pass over those features, and the features handed over
    for the rest equal a fresh target forward."""
    pair = pair32
    cfg = SamplingConfig(temperature)
    drafter = make_drafter(SpecConfig(k=5, strategy="eagle"), cfg, pair)
    prompt_ids = pair.encode("KING RICHARD III:\nNow is the winter")
    spec = SpecConfig(k=5, max_new_tokens=60, seed=3, top_candidates=0, strategy="eagle")
    seq, checked = list(prompt_ids), 0
    for rnd in speculative_rounds(pair, prompt_ids, cfg, spec, drafter=drafter):
        seq += [t.token_id for t in rnd.output]
        if rnd.stop_reason:
            break
        n_cached = drafter.cache.length
        pending = torch.cat(drafter.pending) if drafter.pending else torch.empty(0, pair.head.cfg.hidden_size)
        assert n_cached + pending.shape[0] == len(seq) - 1
        with torch.inference_mode():
            ids = torch.tensor([seq])
            feats = pair.target.base_model(input_ids=ids).last_hidden_state[0]
            emb = pair.target.get_input_embeddings()(ids[0])
            torch.testing.assert_close(pending, feats[n_cached : len(seq) - 1], atol=2e-4, rtol=1e-4)
            if n_cached:
                _, _, k, _ = drafter.head.project(feats[None, :n_cached], emb[None, 1 : n_cached + 1],
                                                  torch.arange(n_cached))
                torch.testing.assert_close(drafter.cache.k[:, :n_cached], k[0], atol=2e-4, rtol=1e-4)
                checked += 1
    assert checked >= 5


def test_a_head_reading_lower_layers_is_exact_and_gets_them_after_every_round(pair32):
    """A head that also reads two lower layers of the target (EAGLE-3 features): the T = 0 output equals the target's
    own, and the features handed over after every round are those layers' outputs and the last hidden state of a
    fresh target forward, side by side."""
    from conftest import PROMPTS

    layers = (1, 6)
    head = random_head(pair32, torch.arange(pair32.vocab_size), scale=0.02, feature_layers=layers)
    for prompt in PROMPTS[:3]:
        prompt_ids = pair32.encode(prompt)
        spec = SpecConfig(k=4, max_new_tokens=40, seed=0, top_candidates=0, strategy="eagle")
        drafter = EagleDrafter(head, pair32.target, GREEDY, pair32.vocab_size, pair32.context_window + 1)
        seq, checked = list(prompt_ids), 0
        for rnd in speculative_rounds(pair32, prompt_ids, GREEDY, spec, drafter=drafter):
            seq += [t.token_id for t in rnd.output]
            if rnd.stop_reason:
                break
            if drafter.pending:
                with torch.inference_mode():
                    out = pair32.target.base_model(input_ids=torch.tensor([seq]), output_hidden_states=True)
                want = torch.cat([out.hidden_states[i + 1] for i in layers] + [out.last_hidden_state], -1)[0]
                n = drafter.cache.length
                torch.testing.assert_close(torch.cat(drafter.pending), want[n : len(seq) - 1], atol=2e-4, rtol=1e-4)
                checked += 1
        assert checked >= 3
        assert seq[len(prompt_ids) :] == baseline_generate(pair32, prompt, GREEDY, max_new_tokens=40).output_ids


def test_eagle_greedy_identity_on_the_shipped_head(pair32):
    """And with a confidence stop: rounds of every length roll the head's cache back alike, and a round the stop
    ended says so in both languages."""
    from dataclasses import replace

    from conftest import PROMPTS

    from specdemo.app.render import round_caption

    own = pair32.head.cfg
    stopped = []
    try:
        for prompt in PROMPTS[:6]:
            want = baseline_generate(pair32, prompt, GREEDY, max_new_tokens=40).output_ids
            for k, stop in ((1, 0.0), (4, 0.0), (8, 0.0), (8, 0.05)):  # 0.05: about its median top probability
                pair32.head.cfg = replace(own, stop_below=stop)
                spec = SpecConfig(k=k, max_new_tokens=40, top_candidates=0, strategy="eagle")
                got = speculative_generate(pair32, prompt, GREEDY, spec)
                assert got.output_ids == want
                assert [r.source for r in got.rounds][:2] == ["prefill", "eagle"]
                if stop:  # the rounds whose budget allowed all 8 drafts; a short one says why it stopped
                    full = [r for r in got.rounds[1:] if r.prefix_len + 9 <= len(got.prompt_ids) + 40]
                    stopped += [r.k for r in full]
                    for r in full:
                        assert (r.unsure is not None) == (r.k < 8) and (r.k == 8 or r.unsure[0] < stop)
                        assert ("then stopped" in r.caption) == (r.k < 8)
                        assert ("低于 0.05" in round_caption(r, "zh-CN")) == (r.k < 8)
    finally:
        pair32.head.cfg = own
    assert 0 < sum(k < 8 for k in stopped) < len(stopped)  # the stop ended some rounds early, not all


def test_the_head_runs_in_the_dtype_picked_for_a_head_unless_a_draft_dtype_is_asked(pair, pair32):
    """Auto: bf16 where the CPU has bf16 (pick_dtype's "head" role, at any size); a draft dtype asked for (pair32
    asks float32 for both models) holds for the head as well, so a float32 pair is float32 throughout."""
    from specdemo.models.devices import cpu_has_bf16

    assert pair.head.lm_rows.dtype == (torch.bfloat16 if cpu_has_bf16() else torch.float32)
    assert pair.head.fc.weight.dtype == pair.head.lm_rows.dtype
    assert pair32.head.lm_rows.dtype == pair32.head.fc.weight.dtype == torch.float32
    for p in (pair, pair32):  # and a trace says which: its settings travel with a shared run
        trace = speculative_generate(p, "ROMEO:\n", SamplingConfig(0.0), SpecConfig(k=2, max_new_tokens=4,
                                                                                   strategy="eagle"))
        assert trace.settings["head_dtype"] == dtype_name(p.head.lm_rows.dtype)
    assert "head_dtype" not in speculative_generate(pair, "ROMEO:\n", SamplingConfig(0.0),
                                                    SpecConfig(k=2, max_new_tokens=4)).settings


def test_the_shipped_heads_load_and_every_file_is_small():
    for name in ("shakespeare", "smollm2-135m"):
        folder = PRESETS[name].eagle_head
        files = list(__import__("pathlib").Path(folder).iterdir())
        assert files, name
        for f in files:
            assert f.stat().st_size < 9.5e6, f


@pytest.fixture()
def head_copy(tmp_path):
    src = PRESETS["shakespeare"].eagle_head
    dst = tmp_path / "head"
    shutil.copytree(src, dst)
    return dst


def refusal(pair) -> str:
    with pytest.raises(StrategyUnavailable) as info:
        make_drafter(SpecConfig(strategy="eagle"), GREEDY, pair)
    return str(info.value)


@pytest.mark.parametrize("damage,key", [
    ("delete", "err.head_missing"),
    ("truncate", "err.head_damaged"),
    ("garble_config", "err.head_damaged"),
    ("other_vocab", "err.head_mismatch"),
    ("layer_beyond_target", "err.head_mismatch"),
    ("layers_in_version_1", "err.head_damaged"),
    ("layers_unordered", "err.head_damaged"),
    ("stop_above_one", "err.head_damaged"),
    ("prune_above_one", "err.head_damaged"),
    ("prune_not_a_number", "err.head_damaged"),
    ("sampled_sizes_zero", "err.head_damaged"),
    ("sampled_sizes_unknown", "err.head_damaged"),
    ("sampled_sizes_not_a_dict", "err.head_damaged"),
    ("sampled_sizes_bool", "err.head_damaged"),
    ("sizes_too_deep", "err.head_damaged"),
    ("sampled_sizes_too_wide", "err.head_damaged"),
    ("d2t_repeats", "err.head_d2t_repeats"),
])
def test_a_bad_head_is_refused_in_one_sentence_and_the_rest_works(pair32, head_copy, damage, key):
    weights = head_copy / WEIGHTS_FILE
    if damage == "delete":
        weights.unlink()
    elif damage == "truncate":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif damage == "garble_config":
        (head_copy / "config.json").write_text("{not json")
    elif damage == "layer_beyond_target":  # a head that would read a 12th layer of a 12-layer target
        meta = json.loads((head_copy / "config.json").read_text())
        (head_copy / "config.json").write_text(json.dumps(meta | {"feature_layers": [1, 11], "format_version": 2}))
    elif damage == "stop_above_one":  # a confidence stop no probability reaches
        meta = json.loads((head_copy / "config.json").read_text())
        (head_copy / "config.json").write_text(json.dumps(meta | {"stop_below": 1.5}))
    elif damage.startswith("prune_"):  # a tree pruned below a probability no node reaches, or below a word
        meta = json.loads((head_copy / "config.json").read_text())
        meta["tree"] = {"topk": 2, "prune_below": 1.5 if damage == "prune_above_one" else "low"}
        (head_copy / "config.json").write_text(json.dumps(meta))
    elif damage.startswith("sampled_sizes_"):  # a bf16 CPU's sampled tree of no nodes, or of a size it cannot read
        meta = json.loads((head_copy / "config.json").read_text())
        sizes = {"sampled_sizes_zero": {"topk": 2, "depth": 0}, "sampled_sizes_unknown": {"topk": 2, "width": 3},
                 "sampled_sizes_not_a_dict": [2, 4, 5], "sampled_sizes_bool": {"topk": True},
                 "sampled_sizes_too_wide": {"topk": 17}}[damage]
        meta["tree"] = {"topk": 2, "sampled_bf16_cpu": sizes}
        (head_copy / "config.json").write_text(json.dumps(meta))
    elif damage == "sizes_too_deep":  # deeper than a run may ask for (SpecConfig's tree_depth range)
        meta = json.loads((head_copy / "config.json").read_text())
        meta["tree"] = {"topk": 2, "depth": 17}
        (head_copy / "config.json").write_text(json.dumps(meta))
    elif damage == "d2t_repeats":  # two draft rows name one target token: its q would add up, and q be wrong
        from safetensors.torch import load_file, save_file

        state = load_file(str(weights))
        state["d2t"][1] = state["d2t"][0]
        save_file(state, str(weights), metadata={"architecture": "specdemo-eagle"})
    elif damage.startswith("layers_"):  # version 1 has no feature layers; version 2 lists them once, in order
        layers, version = ([1, 6], 1) if damage == "layers_in_version_1" else ([6, 1, 1], 2)
        meta = json.loads((head_copy / "config.json").read_text())
        (head_copy / "config.json").write_text(json.dumps(meta | {"feature_layers": layers, "format_version": version}))
    else:
        text = (head_copy / "config.json").read_text().replace('"vocab_sha256": "', '"vocab_sha256": "0')
        (head_copy / "config.json").write_text(text)
    with pytest.raises(HeadError) as info:
        load_head(head_copy, pair32.target, pair32.tokenizer, torch.float32, pair32.device)
    assert info.value.key == key
    saved = pair32.head, pair32.head_error
    try:
        attach_head(pair32, head_copy)
        assert pair32.head is None and pair32.head_error.key == key
        message = refusal(pair32)
        assert message.count(". ") <= 1 and message.endswith(".") and "Traceback" not in message
        assert "shakespeare" in message
        assert "。" in tr("err.no_head", "zh-CN", name="'shakespeare'", why=pair32.head_error)
        # the other strategies are untouched
        for strategy in ("fixed", "adaptive", "lookup"):
            out = speculative_generate(pair32, "ROMEO:\n", GREEDY, SpecConfig(k=3, max_new_tokens=8,
                                                                             strategy=strategy))
            assert len(out.output_ids) == 8
    finally:
        pair32.head, pair32.head_error = saved


def test_a_head_for_another_target_is_refused(toy_pair):
    folder = PRESETS["shakespeare"].eagle_head
    with pytest.raises(HeadError) as info:
        load_head(folder, toy_pair.target, toy_pair.tokenizer, torch.float32, toy_pair.device)
    assert info.value.key == "err.head_mismatch"
    assert toy_pair.head is None
    assert "has no EAGLE head" not in refusal(toy_pair)  # it says why: none was trained for this pair


@pytest.mark.parametrize("layers", [(), (0,)], ids=["last-layer", "feature-layer"])
def test_save_and_load_round_trip(toy_pair, tmp_path, layers):
    head = random_head(toy_pair, torch.tensor([0, 2, 3, 5, 7]), feature_layers=layers)
    save_head(head, tmp_path / "h")
    back = load_head(tmp_path / "h", toy_pair.target, toy_pair.tokenizer, torch.float32, toy_pair.device)
    assert torch.equal(back.d2t, head.d2t) and back.cfg.feature_layers == layers
    assert (tmp_path / "h" / LAYERS_FILE).exists() == bool(layers)  # the feature layers' weights: a file of their own
    x = torch.randn(1, 4, head.cfg.hidden_size)
    # stored in bf16: the round trip keeps the weights to bf16 precision
    rounded = head.to(torch.bfloat16).float()
    torch.testing.assert_close(back(x, x), rounded(x, x), atol=1e-4, rtol=1e-4)
    wide = torch.randn(1, 4, head.cfg.hidden_size * (len(layers) + 1))
    torch.testing.assert_close(back.true_feature(wide), rounded.true_feature(wide), atol=1e-4, rtol=1e-4)
    if layers:  # a head whose feature layers' file is gone is refused
        (tmp_path / "h" / LAYERS_FILE).unlink()
        with pytest.raises(HeadError) as info:
            load_head(tmp_path / "h", toy_pair.target, toy_pair.tokenizer, torch.float32, toy_pair.device)
        assert info.value.key == "err.head_missing"
    assert Counter(back.d2t.tolist()) == Counter([0, 2, 3, 5, 7])


@pytest.fixture(scope="module")
def train_eagle():
    """scripts/train_eagle.py, imported as a module (scripts/ on sys.path: its eagle_* modules import too)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import train_eagle

    return train_eagle


@pytest.mark.parametrize("layers", [(), (0,)], ids=["last-layer", "feature-layer"])
def test_training_time_test_reads_what_drafting_reads(toy_pair, train_eagle, layers, tmp_path):
    """The training script's unroll (steps 2 and 3 fed the head's own predictions) computes exactly what the
    drafter computes when it drafts three tokens from a fixed prefix: a wrong mask or shift there would train the
    head for a different model than the one that drafts. With a feature layer, the features that training reads
    (HeadFeatures) are the verify forward's, and the drafter reads them as training does."""
    from eagle_data import HeadFeatures, Teacher
    from eagle_loss import UNROLL_WEIGHTS, unrolled

    from specdemo.models import CachedLM

    head = random_head(toy_pair, torch.arange(toy_pair.vocab_size), seed=1, feature_layers=layers)
    ids = torch.randint(0, toy_pair.vocab_size, (16,), generator=torch.Generator().manual_seed(0))
    teacher = Teacher.__new__(Teacher)  # the training script's teacher on the toy target
    teacher.model = toy_pair.target
    feats = HeadFeatures(teacher, [(ids.numpy(), 1)], tmp_path / "f.pt", layers).batch([0], ids.numel())
    with torch.inference_mode():
        _, verify_feats = CachedLM(toy_pair.target, toy_pair.vocab_size).feed_features(ids, layers=layers)
        torch.testing.assert_close(verify_feats.float(), feats[0], atol=0.05, rtol=0.02)  # cached in bf16
        emb = toy_pair.target.get_input_embeddings()(ids[None]).float()
        steps = unrolled(head, feats, emb, len(UNROLL_WEIGHTS))
        assert len(steps) == 3
        for j0 in (0, 3, ids.numel() - 4):  # true features at positions 0..j0, then three drafting steps
            drafter = EagleDrafter(head, toy_pair.target, GREEDY, toy_pair.vocab_size, ids.numel())
            g = drafter.read(feats[0, : j0 + 1], ids[1 : j0 + 2])
            for s, g_train in enumerate(steps):
                # row j0 of step s+1 predicts f_{j0+s+1}; the drafter's next step reads token x_{j0+s+2}
                torch.testing.assert_close(g[0], g_train[0, j0], atol=1e-4, rtol=1e-4)
                if s + 1 < len(steps):
                    g = drafter.step(g, ids[j0 + s + 2 : j0 + s + 3])


def test_a_saved_feature_cache_is_reused_only_for_the_same_records(tmp_path, train_eagle):
    """eagle_data.FeatureCache saves the teacher's features; a resumed run reads them back bit for bit, a run with
    more records computes only the new ones, and a run over other records recomputes them (a stale cache would
    train the head on the wrong features)."""
    import numpy as np
    from eagle_data import FeatureCache, Teacher

    teacher = Teacher("shakespeare")
    rng = np.random.default_rng(0)
    records = [(rng.integers(0, 4096, n), 2) for n in (5, 9, 7)]
    path = tmp_path / "features.pt"
    first = FeatureCache(teacher, records, path=path)
    assert path.exists()
    again = FeatureCache(teacher, records, path=path)
    assert (first.computed, again.computed) == (3, 0)
    for a, b in zip(first.rows, again.rows):
        assert torch.equal(a, b)
    more = FeatureCache(teacher, records + [(rng.integers(0, 4096, 6), 2)], path=path)
    assert more.computed == 1 and all(torch.equal(a, b) for a, b in zip(first.rows, more.rows[:3]))
    assert FeatureCache(teacher, records[::-1], path=path).computed == 0  # keyed by record, not by position
    with torch.no_grad():
        fresh = teacher.features(torch.from_numpy(records[1][0])[None], torch.ones(1, 9, dtype=torch.bool))[0]
    torch.testing.assert_close(again.rows[1].float(), fresh, atol=0.05, rtol=0.02)  # stored in bf16
    other = [(r[0][::-1].copy(), 2) for r in records]
    changed = FeatureCache(teacher, other, path=path)
    assert changed.computed == 3 and not torch.equal(changed.rows[1], first.rows[1])
    # lower layers (EAGLE-3 features): the outputs of those decoder layers, and the forward stops after the last
    ran = []
    hook = teacher.model.base_model.h[3].register_forward_hook(lambda *_: ran.append(1))
    layered = FeatureCache(teacher, records, path=tmp_path / "lower.pt", layers=(0, 2))
    hook.remove()
    assert not ran
    with torch.no_grad():
        out = teacher.model.base_model(input_ids=torch.from_numpy(records[1][0])[None], output_hidden_states=True)
    want = torch.cat([out.hidden_states[1], out.hidden_states[3]], -1)[0].float()
    torch.testing.assert_close(layered.rows[1].float(), want, atol=0.05, rtol=0.02)
    assert FeatureCache(teacher, records, path=tmp_path / "lower.pt", layers=(0, 3)).computed == 3  # other layers


def test_training_resumes_from_the_committed_head_where_there_is_no_checkpoint(tmp_path, train_eagle):
    """Where a run starts: data/'s checkpoint if there is one; on a fresh clone (none) the committed head, its
    weights, draft vocabulary and step (not a new head at step 0); with --from-scratch, a new head."""
    from eagle_data import Teacher
    from eagle_loss import OVERLAP_T

    from specdemo.config import SHAKESPEARE_HEAD as exported
    from specdemo.models.eagle import new_head

    teacher = Teacher("shakespeare")
    ckpt = tmp_path / "ckpt.pt"
    ck = train_eagle.starting_checkpoint(ckpt, exported, teacher)
    assert ck["step"] > 0 and ck["opt"] is None and ck["best"] is None  # best: scored afresh on today's dev set
    head = new_head(teacher.model, teacher.tok, ck["d2t"], name="shakespeare")
    fresh = {name: t.clone() for name, t in head.state_dict().items()}
    head.load_state_dict(ck["head"])  # strict: the committed head fits a new head's shapes
    for name in ("fc.weight", "o_proj.weight"):  # trained, not the new head's identity start
        assert not torch.equal(head.state_dict()[name], fresh[name])
    assert ck["tvd"] == (0.0, OVERLAP_T)  # the Shakespeare head was trained without the TV term
    run = SimpleNamespace(batch=16, lr=1e-4, steps=10, threads=1)
    train_eagle.export_head(head, "shakespeare", ck["history"], 1.0, 5, run, phase=3, folder=tmp_path / "tvd",
                            tvd=(0.5, 0.7))
    again = train_eagle.starting_checkpoint(tmp_path / "none.pt", tmp_path / "tvd", teacher)
    assert (again["tvd"], again["phase"]) == ((0.5, 0.7), 3)  # a fresh clone resumes the run's loss and schedule
    assert train_eagle.starting_checkpoint(ckpt, exported, teacher, from_scratch=True) is None
    assert train_eagle.starting_checkpoint(ckpt, tmp_path / "no-head", teacher) is None
    torch.save({"step": 7, "opt": {}, "head": {}}, ckpt)
    assert train_eagle.starting_checkpoint(ckpt, exported, teacher)["step"] == 7  # data/'s checkpoint comes first


def test_eagle_drafts_after_a_head_timing_and_records_no_autograd_graph(pair32):
    """The bench times a head step under inference mode before any run (evaluate_smollm2.py did exactly that): the
    head's fused weights and RoPE tables, built there, must serve later runs. Drafting records no autograd graph,
    although it reads the target's embedding, whose weights require grad."""
    from specdemo.bench.timing import head_step_ms
    from specdemo.engine.strategy import make_drafter

    head = pair32.head
    head.__dict__.pop("_fused", None)
    head._rope = None
    assert head_step_ms(pair32, context=16, reps=2) > 0
    tr = speculative_generate(pair32, "ROMEO:\n", GREEDY, SpecConfig(k=3, max_new_tokens=12, strategy="eagle"))
    assert len(tr.output_ids) == 12
    drafter = make_drafter(SpecConfig(k=3, strategy="eagle"), SamplingConfig(1.0), pair32)
    spec = SpecConfig(k=3, max_new_tokens=8, strategy="eagle")
    seq = pair32.encode("ROMEO:\n")
    for rnd in speculative_rounds(pair32, seq, SamplingConfig(1.0), spec, drafter=drafter):
        seq = seq + [t.token_id for t in rnd.output]
        if rnd.source == "eagle":
            break
    proposal = drafter.propose(torch.tensor(seq), 3, torch.Generator().manual_seed(0))
    assert not proposal.q.requires_grad and proposal.q.grad_fn is None


def test_a_run_grows_feature_layers_once_and_resumes_on_its_schedule(toy_pair, train_eagle):
    """train_eagle.resume: a checkpoint without feature layers grows them (mix at zero, so the grown head computes
    what it did; fresh optimizer moments; a new phase of the lr schedule; the export bar kept); a grown run resumes
    with its moments and its phase; a head never drops or changes its layers."""
    d2t = torch.arange(toy_pair.vocab_size)

    def checkpoint(head, step, **extra):
        opt = torch.optim.AdamW(head.parameters())
        head(torch.randn(1, 3, head.cfg.hidden_size), torch.randn(1, 3, head.cfg.hidden_size)).sum().backward()
        opt.step()
        return {"head": head.state_dict(), "opt": opt.state_dict(), "step": step, "history": [{"step": step}],
                "best": 0.4, "d2t": d2t, "metric": train_eagle.METRIC} | extra

    plain = random_head(toy_pair, d2t)
    plain.requires_grad_(True)
    ck = checkpoint(plain, 50)
    grown = new_head(toy_pair.target, toy_pair.tokenizer, d2t, feature_layers=(0,))
    run = train_eagle.resume(ck, grown, torch.optim.AdamW(grown.parameters()))
    assert (run["step"], run["phase"], run["rewarm"], run["best"]) == (50, 50, None, 0.4)
    assert torch.equal(grown.fc.weight, plain.fc.weight) and not grown.mix.weight.any()
    wide = torch.randn(2, 2 * grown.cfg.hidden_size)
    assert torch.equal(grown.true_feature(wide), wide[:, grown.cfg.hidden_size :])  # the head it grew from

    again = new_head(toy_pair.target, toy_pair.tokenizer, d2t, feature_layers=(0,))
    opt = torch.optim.AdamW(again.parameters())
    run = train_eagle.resume(checkpoint(grown, 80, feature_layers=(0,), phase=50), again, opt)
    assert (run["step"], run["phase"], run["rewarm"]) == (80, 50, None) and opt.state_dict()["state"]
    with pytest.raises(SystemExit):
        train_eagle.resume(checkpoint(grown, 80, feature_layers=(0,)), new_head(toy_pair.target, toy_pair.tokenizer,
                                                                                 d2t), None)
    # a committed head (no optimizer moments) warms its lr up again from where it stands
    assert train_eagle.resume(ck | {"opt": None}, random_head(toy_pair, d2t), None)["rewarm"] == 50


def test_the_overlap_training_scores_is_the_engines_acceptance_probability(train_eagle):
    """eagle_loss.overlap (the total-variation term of the loss and the dev curve's overlap) is the chance that the
    engine accepts the head's token at T = 0.7: verify's overlap of the warped p and q, with q zero outside the draft
    vocabulary, and 1 - TV(p, q). A gradient step on 1 - overlap raises it."""
    from eagle_loss import overlap

    from specdemo.engine.sampling import verify, warp

    gen = torch.Generator().manual_seed(0)
    vocab, d2t = 40, torch.tensor([0, 3, 4, 9, 17, 18, 30, 39])
    p_logits = torch.randn(6, vocab, generator=gen)
    p_logits[:, d2t] += 2  # most of p on the draft vocabulary, as on real text
    q_sub = (p_logits[:, d2t] + torch.randn(6, d2t.numel(), generator=gen)).requires_grad_(True)
    q_full = torch.full((6, vocab), float("-inf")).index_copy(1, d2t, q_sub)
    cfg = SamplingConfig(0.7)
    p, q = warp(p_logits, cfg), warp(q_full.detach(), cfg)
    engine = verify(torch.tensor([int(d2t[0])] * 5), q[:5], p, torch.Generator().manual_seed(1)).overlap
    mine = overlap(p_logits, q_full, 0.7)
    torch.testing.assert_close(mine[:5].detach(), engine, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(mine.detach(), 1 - 0.5 * (p - q).abs().sum(-1), rtol=1e-5, atol=1e-6)
    (1 - mine).sum().backward()
    with torch.no_grad():
        stepped = torch.full((6, vocab), float("-inf")).index_copy(1, d2t, q_sub - 0.5 * q_sub.grad)
        assert overlap(p_logits, stepped, 0.7).mean() > mine.detach().mean() + 0.01
