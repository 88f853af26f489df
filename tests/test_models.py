"""The embedded pair and the loading path: offline, shared tokenizer, Space-sized files, clear refusals."""

from __future__ import annotations

import json
import os

import pytest
import torch

from specdemo.config import EMBEDDED_DRAFT, EMBEDDED_TARGET
from specdemo.models import ModelLoadError, check_tokenizers, load_pair


def test_embedded_pair_loads_offline_with_plain_transformers():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert os.environ["HF_HUB_OFFLINE"] == "1"
    tok_d, tok_t = AutoTokenizer.from_pretrained(EMBEDDED_DRAFT), AutoTokenizer.from_pretrained(EMBEDDED_TARGET)
    assert tok_d.get_vocab() == tok_t.get_vocab() and len(tok_t) == 4096
    assert tok_t.eos_token_id == tok_t.bos_token_id == 0
    target = AutoModelForCausalLM.from_pretrained(EMBEDDED_TARGET).eval()
    draft = AutoModelForCausalLM.from_pretrained(EMBEDDED_DRAFT).eval()
    n_t = sum(p.numel() for p in target.parameters())
    n_d = sum(p.numel() for p in draft.parameters())
    assert 10e6 <= n_t <= 15e6 and n_d < 1.5e6
    ids = tok_t("ROMEO:\n", return_tensors="pt").input_ids
    with torch.inference_mode():
        out = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=40,
                              pad_token_id=0)
    text = tok_t.decode(out[0, ids.shape[1]:])
    assert len(out[0]) > ids.shape[1] and text.strip()
    assert "\n" in text  # verse comes in lines


@pytest.mark.parametrize("folder", [EMBEDDED_DRAFT, EMBEDDED_TARGET])
def test_weight_files_fit_a_space_without_lfs(folder):
    files = list(folder.glob("*.safetensors"))
    assert files and all(f.stat().st_size < 9.5e6 for f in files)
    assert json.loads((folder / "config.json").read_text())["model_type"] == "gpt2"


def test_pair_metadata(pair):
    d = pair.describe()
    assert d["vocab_size"] == 4096 and d["context_window"] == 512 and d["device"] == "cpu"
    assert pair.token_text(pair.encode("ROMEO")[0]) in "ROMEO"


def test_tokenizer_mismatch_is_refused(toy_dirs):
    from transformers import AutoTokenizer

    with pytest.raises(ModelLoadError, match="tokenizers disagree"):
        check_tokenizers(AutoTokenizer.from_pretrained(toy_dirs[0]), AutoTokenizer.from_pretrained(EMBEDDED_TARGET))
    with pytest.raises(ModelLoadError, match="tokenizers disagree"):
        load_pair((str(toy_dirs[0]), str(EMBEDDED_TARGET)))


@pytest.mark.parametrize("pair_arg,message", [
    ("gpt2", "openai-community/gpt2.*offline.*'shakespeare'"),
    (("nobody/no-such-model-xyz", str(EMBEDDED_TARGET)), "nobody/no-such-model-xyz.*'shakespeare'"),
    ("no-such-preset", "Unknown preset"),
])
def test_unfetchable_models_fail_with_a_message_naming_them(pair_arg, message):
    with pytest.raises(ModelLoadError, match=message):
        load_pair(pair_arg)


def test_a_slow_load_never_stalls_sessions_on_cached_pairs(monkeypatch):
    """A custom pair being downloaded holds no lock that a cached pair needs: load_pair holds the cache's lock only
    to look up and to insert, and a second request for the pair being loaded waits for that one load."""
    import threading

    from specdemo import models

    cached = models.load_pair("shakespeare")
    started, release, calls = threading.Event(), threading.Event(), []

    def slow_download(pair, *args, **kwargs):
        calls.append(pair)
        started.set()
        release.wait(30)
        raise models.ModelLoadError("err.both_needed")

    monkeypatch.setattr(models, "load_pair_uncached", slow_download)
    errors = []

    def visitor():
        try:
            models.load_pair(("someone/draft", "someone/target"))
        except models.ModelLoadError as err:
            errors.append(err)

    slow = [threading.Thread(target=visitor) for _ in range(2)]
    for t in slow:
        t.start()
    assert started.wait(10)
    assert models.load_pair("shakespeare") is cached  # answered while the download is still under way
    assert all(t.is_alive() for t in slow)
    release.set()
    for t in slow:
        t.join(10)
    assert len(errors) == 2 and len(calls) == 2  # the failed load was not cached: the second visitor tried again
