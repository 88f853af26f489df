"""Each way an EAGLE-3 head can be wrong for its target, or damaged, is refused in one sentence that says what
differs, before the head drafts, and leaves the pair as it was (issue 46, item 2). The CLI says the same sentence
and runs the fixture head's trees."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_eagle3 import FIXTURE, ROOT, pair3, reference, verifier  # noqa: F401  (fixtures from test_eagle3)

from specdemo import load_pair
from specdemo.models import ModelLoadError
from specdemo.models.eagle3_files import load_eagle3
from specdemo.models.loading import attach_eagle3


def bad_copy(tmp_path: Path, config=None, weights=None, name: str = "bad-head") -> Path:
    """A copy of the fixture's Llama head, its config.json and weights changed by the given functions."""
    folder = tmp_path / name
    shutil.copytree(FIXTURE / "head-llama", folder)
    if config is not None:
        meta = json.loads((folder / "config.json").read_text())
        config(meta)
        (folder / "config.json").write_text(json.dumps(meta))
    if weights is not None:
        state = load_file(str(folder / "model.safetensors"))
        weights(state)
        save_file(state, str(folder / "model.safetensors"))
    return folder


def refusal(pair, folder: Path) -> str:
    """The sentence attaching `folder` to the pair gives; the pair keeps the head it had."""
    before = pair.head
    with pytest.raises(ModelLoadError) as err:
        attach_eagle3(pair, str(folder), torch.float32)
    assert pair.head is before and pair.head_error is None
    text = str(err.value)
    assert text.endswith(".") and "\n" not in text and "Traceback" not in text
    assert text.count(". ") == 0, text  # one sentence
    assert err.value.text("zh-CN") != text  # and it has its Chinese
    return text


def set_in(path: tuple, value):
    def change(meta):
        d = meta
        for k in path[:-1]:
            d = d[k]
        d[path[-1]] = value
    return change


def authors(ids: list[int] | int | None = None, where: str = "eagle_config", arch: str = "LlamaForCausalLMEagle3"):
    """The fixture's config rewritten in the EAGLE authors' layout (a Llama config, draft_vocab_size at its top),
    naming the aux ids `where` (eagle_config: SpecForge's numbering; top: vLLM's; none: no ids)."""
    def change(meta):
        layer = meta.pop("transformer_layer_config")
        aux = meta.pop("eagle_aux_hidden_state_layer_ids")
        for key in ("speculators_model_type", "speculators_config", "speculators_version", "auto_map"):
            meta.pop(key, None)
        meta.update(layer, architectures=[arch])
        if where == "eagle_config":
            meta["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": aux if ids is None else ids}
        elif where == "top":
            meta["eagle_aux_hidden_state_layer_ids"] = aux if ids is None else ids
    return change


CASES = {
    "verifier": (dict(config=set_in(("speculators_config", "verifier", "name_or_path"), "Qwen/Qwen3-8B")),
                 "The EAGLE-3 head local:bad-head was trained for Qwen/Qwen3-8B, not for the target "
                 "local:tiny-llama-verifier."),
    "verifier-architecture": (dict(config=set_in(("speculators_config", "verifier", "architectures"),
                                                 ["Qwen3ForCausalLM"])),
                              "The EAGLE-3 head local:bad-head was trained for specdemo/tiny-llama-verifier, not for "
                              "the target local:tiny-llama-verifier."),
    "hidden": (dict(config=set_in(("target_hidden_size",), 32)),
               "The EAGLE-3 head local:bad-head reads hidden states 32 wide, but the target "
               "local:tiny-llama-verifier's are 16 wide."),
    "vocab": (dict(config=set_in(("transformer_layer_config", "vocab_size"), 5000)),
              "The EAGLE-3 head local:bad-head maps into a vocabulary of 5000 tokens, but the target "
              "local:tiny-llama-verifier has 4096."),
    "d2t-range": (dict(weights=lambda s: s["d2t"].__setitem__(511, 4096 - 511)),
                  "The EAGLE-3 head local:bad-head's d2t map sends a draft id to 4096, but the target's vocabulary has "
                  "4096 tokens, each named once."),
    "d2t-repeats": (dict(weights=lambda s: s["d2t"].__setitem__(1, s["d2t"][0] - 1)),
                    "The EAGLE-3 head local:bad-head's d2t map sends 1 draft ids to a target id already taken, but the "
                    "target's vocabulary has 4096 tokens, each named once."),
    "aux-range": (dict(config=set_in(("eagle_aux_hidden_state_layer_ids",), [1, 2, 9])),
                  "The EAGLE-3 head local:bad-head reads the target's layers [1, 2, 9], but local:tiny-llama-verifier "
                  "has 4 layers, so its ids run from 0 to 3, each once."),
    "aux-last": (dict(config=set_in(("eagle_aux_hidden_state_layer_ids",), [1, 2, 4])),
                 "The EAGLE-3 head local:bad-head reads layer id 4, the target's last state before its final norm, "
                 "which specdemo does not capture yet."),
    # SpecForge's ids name the output of layer i (the input of layer i + 1); its refusals name them as the file does
    "aux-last-specforge": (dict(config=authors([1, 2, 3])),
                           "The EAGLE-3 head local:bad-head reads layer id 3, the target's last state before its "
                           "final norm, which specdemo does not capture yet."),
    "aux-range-specforge": (dict(config=authors([1, 2, 7])),
                            "The EAGLE-3 head local:bad-head reads the target's layers [1, 2, 7], but "
                            "local:tiny-llama-verifier has 4 layers, so its ids run from 0 to 2, each once."),
    "aux-not-a-list": (dict(config=authors(7, "top")),
                       "The head local:bad-head is not a speculators EAGLE-3 checkpoint: a field is missing or "
                       "malformed (eagle_aux_hidden_state_layer_ids)."),
    "no-embedding-width": (dict(config=set_in(("transformer_layer_config", "hidden_size"), 32),
                                weights=lambda s: s.pop("embed_tokens.weight")),
                           "The EAGLE-3 head local:bad-head has no embedding of its own and is 32 wide, so it cannot "
                           "read the target local:tiny-llama-verifier's embedding, which is 16 wide."),
    "dflash": (dict(config=set_in(("speculators_model_type",), "dflash")),
               "The head local:bad-head is a speculator of type DFlash, which is not supported yet: specdemo reads "
               "EAGLE-3 heads only."),
    "mtp": (dict(config=set_in(("speculators_model_type",), "mtp")),
            "The head local:bad-head is a speculator of type MTP, which is not supported yet: specdemo reads "
            "EAGLE-3 heads only."),
    "peagle": (dict(config=set_in(("speculators_model_type",), "peagle")),
               "The head local:bad-head is a speculator of type P-EAGLE, which is not supported yet: specdemo reads "
               "EAGLE-3 heads only."),
    "two-layers": (dict(config=set_in(("transformer_layer_config", "num_hidden_layers"), 2)),
                   "The EAGLE-3 head local:bad-head has 2 layers, which is not supported yet: specdemo computes one "
                   "Llama or Qwen3 draft layer."),
    "weight-shape": (dict(weights=lambda s: s.__setitem__("lm_head.weight", s["lm_head.weight"][:500].clone())),
                     "The EAGLE-3 head local:bad-head's weight lm_head.weight has shape [500, 16], where its config "
                     "implies [512, 16]."),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_mismatch_is_refused_in_its_sentence(pair3, tmp_path, case):
    changes, sentence = CASES[case]
    assert refusal(pair3, bad_copy(tmp_path, **changes)) == sentence


@pytest.mark.parametrize("arch,where,ids", [("LlamaForCausalLMEagle3", "top", [1, 2, 3]),
                                             ("Eagle3LlamaForCausalLM", "top", [1, 2, 3]),
                                             ("LlamaForCausalLMEagle3", "top", [3, 1, 2]),
                                             ("LlamaForCausalLMEagle3", "eagle_config", [0, 1, 2]),
                                             ("Eagle3LlamaForCausalLM", "eagle_config", [2, 0, 1])])
def test_the_eagle_authors_layout_reads_as_the_same_head(pair3, tmp_path, reference, arch, where, ids):
    """The fixture's head rewritten in the EAGLE authors' layout (a Llama config with draft_vocab_size at its top,
    midlayer.* for layers.0.*), under both architecture names vLLM maps to it, with top-level aux ids (vLLM's
    numbering: the inputs of layers 1, 2, 3) or SpecForge's eagle_config ids (the outputs of layers 0, 1, 2, as
    SGLang reads them), in any order: it reads the layers it was trained on and gives the same first logits."""
    from test_eagle3 import TOL, target_features

    from specdemo.config import SamplingConfig
    from specdemo.engine.drafters import EagleDrafter

    folder = bad_copy(tmp_path, config=authors(ids, where, arch), weights=lambda s: s.update(
        {k.replace("layers.0.", "midlayer."): s.pop(k) for k in [k for k in s if k.startswith("layers.0.")]}))
    head = load_eagle3(str(folder), pair3.target, "anything", torch.float32, pair3.device)
    assert head.cfg.aux_ids == (1, 2, 3)
    tokens = reference["input_ids"]
    drafter = EagleDrafter(head, pair3.target, SamplingConfig(0.0), pair3.vocab_size, 64)
    with torch.inference_mode():
        root = head.logits(drafter.read(target_features(pair3, head, tokens)[:-1], tokens[1:]))[0]
    assert (root - reference["llama.chain_logits"][0]).abs().max() < TOL


@pytest.mark.parametrize("where,ids,read", [("eagle_config", [1, 46, 90], (2, 47, 91)),
                                            ("eagle_config", [90, 1, 46], (2, 47, 91)),
                                            ("top", [1, 46, 90], (1, 46, 90))])
def test_the_authors_aux_ids_are_read_as_the_engine_that_trained_them_reads_them(tmp_path, where, ids, read):
    """SpecForge writes eagle_config ids and captures them through SGLang, whose Llama and Qwen models read id i as
    the output of layer i (the input of layer i + 1): SpecForge's default for a 94-layer Qwen3-235B-A22B, [1, 46, 90],
    names the EAGLE code's (2, 47, 91). A top-level list is vLLM's numbering, read as it is."""
    from specdemo.models.eagle3_files import read_config

    folder = bad_copy(tmp_path, config=authors(ids, where))
    assert read_config(folder, "local:bad-head").aux_ids == read


def test_draft_ids_past_the_tokenizer_are_dropped(pair3):
    """A target whose embedding has rows its tokenizer never makes (Qwen3 pads 151,669 tokens to 151,936): a head
    that maps draft ids there keeps only the others, and drafts at T > 0 over the pair's vocabulary (its q filled
    at those ids crashed before), with q summing to 1 there."""
    from test_eagle3 import target_features

    from specdemo.config import SamplingConfig
    from specdemo.engine.drafters import EagleDrafter

    name = "specdemo/tiny-llama-verifier"
    full = load_eagle3(str(FIXTURE / "head-llama"), pair3.target, name, torch.float32, pair3.device)
    tokens = int(full.d2t.sort().values[400])  # as if the tokenizer stopped there: 112 draft ids map past it
    head = load_eagle3(str(FIXTURE / "head-llama"), pair3.target, name, torch.float32, pair3.device, tokens=tokens)
    assert head.d2t.numel() == head.lm_rows.shape[0] == head.cfg.draft_vocab_size == 400
    assert int(head.d2t.max()) < tokens and set(head.d2t.tolist()) < set(full.d2t.tolist())
    ids = torch.tensor(pair3.encode("ROMEO:\nJULIET:\n"))
    drafter = EagleDrafter(head, pair3.target, SamplingConfig(1.0), tokens, 64)
    drafter.pending = [target_features(pair3, head, ids)[:-1]]
    proposal = drafter.propose(ids, 3, torch.Generator().manual_seed(0))
    assert proposal.q.shape == (3, tokens) and torch.allclose(proposal.q.sum(-1), torch.ones(3))
    assert int(proposal.tokens.max()) < tokens


def test_missing_and_truncated_files_are_refused(pair3, tmp_path):
    folder = bad_copy(tmp_path)
    (folder / "model.safetensors").unlink()
    assert refusal(pair3, folder) == ("The EAGLE-3 head local:bad-head has no model.safetensors: give a folder or "
                                      "Hub id of a speculators checkpoint.")
    folder = bad_copy(tmp_path, name="cut-head")
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    assert refusal(pair3, folder).startswith("The EAGLE-3 head local:cut-head has a truncated or damaged "
                                             "model.safetensors (")
    (folder / "config.json").write_text((FIXTURE / "head-llama" / "config.json").read_text()[:300])
    assert refusal(pair3, folder) == ("The EAGLE-3 head local:cut-head has a truncated or damaged config.json "
                                      "(JSONDecodeError).")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert refusal(pair3, empty) == ("The EAGLE-3 head local:empty has no config.json: give a folder or Hub id of a "
                                     "speculators checkpoint.")


def test_the_config_py_that_save_pretrained_writes_is_never_run(pair3, tmp_path):
    """A planted config.py that would leave a mark if imported or run: the head loads and no mark appears."""
    folder = bad_copy(tmp_path, name="planted")
    mark = tmp_path / "ran"
    (folder / "config.py").write_text(f"open({str(mark)!r}, 'w').write('ran')\n")
    head = load_eagle3(str(folder), pair3.target, "specdemo/tiny-llama-verifier", torch.float32, pair3.device)
    assert head.cfg.name == "local:planted" and not mark.exists()


def test_a_head_over_the_memory_cap_is_refused(pair3):
    with pytest.raises(ModelLoadError) as err:
        load_eagle3(str(FIXTURE / "head-llama"), pair3.target, "specdemo/tiny-llama-verifier", torch.float32,
                    pair3.device, budget_left=100_000)
    assert str(err.value) == ("The EAGLE-3 head local:head-llama needs 0.3 MB, more than the 0.1 MB that the model "
                              "memory cap leaves beside its pair.")


def test_the_model_memory_cap_counts_the_head_beside_its_pair(pair3, monkeypatch):
    """SPECDEMO_MODEL_MEMORY_MB = 1: the pair (two float32 copies of the verifier and its head) leaves less than
    the 0.3 MB another head needs, so attaching one is refused and the pair keeps its head."""
    monkeypatch.setenv("SPECDEMO_MODEL_MEMORY_MB", "1")
    assert refusal(pair3, FIXTURE / "head-qwen3").startswith(
        "The EAGLE-3 head local:head-qwen3 needs 0.3 MB, more than the ")


def cli(*args: str) -> subprocess.CompletedProcess:
    env = os.environ | {"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "specdemo", "generate", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=300)


def test_the_cli_drafts_trees_with_a_head_folder_and_names_it(verifier):
    out = cli("--draft", str(verifier), "--target", str(verifier), "--head", str(FIXTURE / "head-llama"),
              "--strategy", "tree", "--temperature", "0", "--max-new-tokens", "8", "--prompt", "ROMEO:", "--json")
    assert out.returncode == 0, out.stderr
    trace = json.loads(out.stdout)
    assert trace["settings"]["head"] == "local:head-llama" and trace["settings"]["strategy"] == "tree"
    trees = [r for r in trace["rounds"] if r["tree"]]
    assert trees and all(len(r["tree"]) == r["k"] > 0 for r in trees)  # its trees, every node drawn
    assert all(r["head"] == "local:head-llama" and r["caption"].startswith("EAGLE-3 head local:head-llama: the head "
                                                                            "drafted a tree of") for r in trees)
    text = cli("--draft", str(verifier), "--target", str(verifier), "--head", str(FIXTURE / "head-llama"),
               "--strategy", "tree", "--temperature", "0", "--max-new-tokens", "8", "--prompt", "ROMEO:")
    assert "[tree with EAGLE-3 head local:head-llama: 8 tokens in" in text.stdout


def test_the_cli_refuses_a_head_for_another_target_in_one_line(verifier, tmp_path):
    folder = bad_copy(tmp_path, config=set_in(("target_hidden_size",), 32))
    out = cli("--draft", str(verifier), "--target", str(verifier), "--head", str(folder), "--strategy", "eagle",
              "--prompt", "ROMEO:")
    assert out.returncode == 2 and out.stdout == ""
    lines = [line for line in out.stderr.splitlines() if line.strip() and "Loading weights" not in line]
    assert lines == ["error: The EAGLE-3 head local:bad-head reads hidden states 32 wide, but the target "
                     "local:tiny-llama-verifier's are 16 wide."]  # one line, no traceback


@pytest.mark.parametrize("name", ["qwen3-8b-eagle3", "llama3.1-8b-eagle3"])
def test_the_gpu_presets_are_listed_with_why_they_cannot_load_on_a_cpu(name):
    """On this CPU the 8B presets are listed in the pair selector with the reason, and a load (API, CLI, page) is
    refused with it in one sentence before anything is read or downloaded."""
    from specdemo.app import views
    from specdemo.config import PRESETS

    assert PRESETS[name].eagle3_head.startswith("RedHatAI/") and PRESETS[name].needs_gpu_gb == 24
    assert views.pair_choice(name).endswith("(unavailable: it needs a CUDA GPU with 24 GB, and this server runs on "
                                            "cpu)")
    assert not views.pair_choice("shakespeare").endswith(")")  # the embedded pairs' lines as before
    with pytest.raises(ModelLoadError) as err:
        load_pair(name, device="cpu")
    assert str(err.value) == (f"The '{name}' pair cannot load here: it needs a CUDA GPU with 24 GB, and this server "
                              "runs on cpu.")
    assert "需要" in err.value.text("zh-CN")


def test_a_hub_id_without_the_hub_is_refused_before_any_download(pair3):
    """HF_HUB_OFFLINE=1 (conftest): a head named by Hub id cannot be fetched, and the sentence says so."""
    assert os.environ.get("HF_HUB_OFFLINE") == "1"
    assert refusal(pair3, Path("RedHatAI/Qwen3-8B-speculator.eagle3")) == (
        "The EAGLE-3 head RedHatAI/Qwen3-8B-speculator.eagle3 is not a folder here, and the Hub cannot be reached to "
        "fetch it.")
