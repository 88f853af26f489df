"""Make the EAGLE-3 test fixture with the real `speculators` package (issue 46): a tiny random Llama verifier, two
tiny EAGLE-3 speculators for it saved by the package's own `save_pretrained`, and the reference's draft logits for
fixed inputs, computed with the package's own modules.

Run it in a throwaway venv (speculators pins transformers below 5.16, the project uses a newer one):

    python3 -m venv /tmp/specvenv && /tmp/specvenv/bin/pip install torch==2.13.0
    /tmp/specvenv/bin/pip install speculators  # 0.9.0 made the fixture (with torch 2.14.1, transformers 5.19)
    /tmp/specvenv/bin/python scripts/make_eagle3_fixture.py tests/fixtures/eagle3

What it writes under OUT (bf16 weights, to keep the fixture small; the reference computes in float32 from those same
bf16 values):
  verifier/          config.json, model.safetensors: LlamaForCausalLM, 4 layers, hidden 16, the Shakespeare
                     tokenizer's 4,096 ids (the tokenizer itself is not copied; the tests put it beside the weights)
  head-llama/        an eagle3 speculator, Llama draft layer, norm_before_residual=True, aux ids [1, 2, 3]
  head-qwen3/        an eagle3 speculator, Qwen3 draft layer (q/k norms), fc_norm=True, aux ids [1, 2, 3]
  reference.safetensors
                     input_ids [N]; per head: aux [N, 3H] (the verifier's hidden_states[k] for each aux id k),
                     chain_logits [3, V_draft] (three greedy drafted steps), chain_picks [3] (draft ids),
                     tree_children [2] (the root's top-2 draft ids), tree_logits [2, V_draft] (each child's logits)
`save_pretrained` also writes a config.py beside config.json (remote code: a copy of the package's config class).
specdemo never reads it, and the script deletes it, so the repository holds no copy of the package's source; a test
plants a config.py of its own to show that it is never run.

The reference: the head reads pairs (f_j, x_{j+1}) at positions j + 1 (as the package trains and vLLM serves), all
N - 1 of them at once with a causal mask, through the package's own fc, norms, decoder layer (its Eagle3 first
layer), rotary embedding, final norm and lm_head; each drafted step then appends one position, reading the previous
step's pre-norm output and the embedding of the argmax draft token mapped to the target vocabulary (id + d2t[id]).
"""

from __future__ import annotations

import copy
from importlib.metadata import version
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM
from transformers.models.qwen3.configuration_qwen3 import Qwen3Config

from speculators.config import SpeculatorsConfig, VerifierConfig
from speculators.models.eagle3 import Eagle3SpeculatorConfig
from speculators.models.eagle3.core import Eagle3DraftModel
from speculators.proposals.greedy import GreedyTokenProposalConfig

VOCAB, HIDDEN, LAYERS, DRAFT_VOCAB, AUX = 4096, 16, 4, 512, [1, 2, 3]
VERIFIER_NAME = "specdemo/tiny-llama-verifier"  # the name each speculator records for its verifier
INPUT_IDS = [5, 97, 301, 12, 1024, 77, 2048, 9, 640, 33, 4000, 150]


def verifier(out: Path) -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=48, num_hidden_layers=LAYERS,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=8, max_position_embeddings=512,
                      rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=0, eos_token_id=0)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.4)
    model.to(torch.bfloat16).save_pretrained(out / "verifier")
    # read back from the saved files in float32: a model cast to bf16 and back keeps RoPE frequencies rounded to
    # bf16 (its unsaved inv_freq buffer), which a model loaded from the files does not have
    return LlamaForCausalLM.from_pretrained(out / "verifier", dtype=torch.float32).eval()


def layer_config(kind: str):
    common = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=40, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=1, head_dim=8, rms_norm_eps=1e-6,
                  max_position_embeddings=512)
    cfg = LlamaConfig(**common) if kind == "llama" else Qwen3Config(**common)
    cfg._attn_implementation = "eager"  # the reference runs on a CPU: plain float masks, no flex attention
    return cfg


def speculator(kind: str, target: LlamaForCausalLM, out: Path, seed: int) -> Eagle3DraftModel:
    torch.manual_seed(seed)
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer_config(kind), draft_vocab_size=DRAFT_VOCAB,
        norm_before_residual=kind == "llama", fc_norm=kind == "qwen3", target_hidden_size=HIDDEN,
        eagle_aux_hidden_state_layer_ids=AUX,
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3", proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path=VERIFIER_NAME, architectures=["LlamaForCausalLM"])))
    model = Eagle3DraftModel(config)
    draft_ids = torch.sort(torch.randperm(VOCAB)[:DRAFT_VOCAB]).values  # the target ids of the draft vocabulary
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[draft_ids] = True
    model.load_vocab_mappings(t2d, draft_ids - torch.arange(DRAFT_VOCAB))  # d2t: offsets, target = id + d2t[id]
    with torch.no_grad():
        model.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
        for name, p in model.named_parameters():
            if name.startswith(("embed_tokens", "verifier_")):
                continue
            if p.dim() == 1:  # norms (and any bias): around 1 and 0 resp., not flat
                p.copy_(1 + 0.2 * torch.randn_like(p) if "norm" in name else 0.1 * torch.randn_like(p))
            else:
                p.normal_(0, 0.35)
    model.to(torch.bfloat16).save_pretrained(out / f"head-{kind}")
    (out / f"head-{kind}" / "config.py").unlink(missing_ok=True)  # the package's own source: not ours to commit
    # a fresh module holding the saved bf16 values in float32 (fresh RoPE frequencies, as for the verifier)
    fresh = Eagle3DraftModel(config)
    saved = load_file(str(out / f"head-{kind}" / "model.safetensors"))
    missing, unexpected = fresh.load_state_dict({k: v.float() if v.is_floating_point() else v
                                                 for k, v in saved.items()}, strict=False)
    assert not unexpected and all(k.startswith("verifier_") for k in missing), (missing, unexpected)
    return fresh.float().eval()


def causal(n: int, past: int) -> torch.Tensor:
    mask = torch.full((n, past + n), torch.finfo(torch.float32).min)
    return mask.triu(past + 1).view(1, 1, n, past + n)


def run_layer(model: Eagle3DraftModel, hidden: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
              cache: DynamicCache) -> torch.Tensor:
    """The package's decoder layer over new positions (one sequence): pre-norm output [1, n, H]."""
    embeds = model.embed_tokens(tokens.view(1, -1))
    x = torch.cat([embeds, hidden], dim=-1)
    pos = positions.view(1, -1)
    past = cache.get_seq_length()
    return model.layers[0](x, attention_mask=causal(x.shape[1], past), position_ids=pos, past_key_values=cache,
                           use_cache=True, cache_position=torch.arange(past, past + x.shape[1]),
                           position_embeddings=model.rotary_emb(x, pos))


def draft_logits(model: Eagle3DraftModel, h: torch.Tensor) -> torch.Tensor:
    return model.lm_head(model.norm(h))


def fused_input(model: Eagle3DraftModel, aux: torch.Tensor) -> torch.Tensor:
    """The package's forward: input_norm or per-layer fc_norm where configured, then fc."""
    if model.input_norm is not None:
        aux = model.input_norm(aux)
    if model.fc_norm is not None:
        aux = torch.cat([norm(c) for norm, c in zip(model.fc_norm, aux.chunk(len(model.fc_norm), -1))], -1)
    return model.fc(aux)


@torch.no_grad()
def reference(model: Eagle3DraftModel, aux: torch.Tensor, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    n = ids.numel() - 1  # pairs (f_j, x_{j+1}), j = 0..n-1, at positions j + 1
    to_target = torch.arange(DRAFT_VOCAB) + model.d2t
    cache = DynamicCache()
    out = run_layer(model, fused_input(model, aux[:n]).unsqueeze(0), ids[1:], torch.arange(1, n + 1), cache)
    h = out[:, -1:]
    root_cache = copy.deepcopy(cache)
    logits, picks = [], []
    for step in range(3):
        row = draft_logits(model, h)[0, -1]
        logits.append(row)
        picks.append(int(row.argmax()))
        if step < 2:
            h = run_layer(model, h, to_target[picks[-1]].view(1), torch.tensor([n + 1 + step]), cache)[:, -1:]
    children = logits[0].topk(2).indices
    h_root = out[:, -1:]
    tree = []
    for c in children:
        child_cache = copy.deepcopy(root_cache)
        tree.append(draft_logits(model, run_layer(model, h_root, to_target[c].view(1), torch.tensor([n + 1]),
                                                  child_cache))[0, -1])
    return {"chain_logits": torch.stack(logits), "chain_picks": torch.tensor(picks), "tree_children": children,
            "tree_logits": torch.stack(tree)}


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    target = verifier(out)
    ids = torch.tensor(INPUT_IDS)
    with torch.no_grad():
        hs = target.model(input_ids=ids.view(1, -1), output_hidden_states=True).hidden_states
    aux = torch.cat([hs[k][0] for k in AUX], dim=-1)  # vLLM's aux id k: the input of layer k = hidden_states[k]
    tensors = {"input_ids": ids}
    for seed, kind in enumerate(("llama", "qwen3"), start=1):
        model = speculator(kind, target, out, seed)
        tensors[f"{kind}.aux"] = aux.clone()
        tensors |= {f"{kind}.{k}": v.contiguous() for k, v in reference(model, aux, ids).items()}
    save_file(tensors, str(out / "reference.safetensors"),
              metadata={"speculators": version("speculators"),
                        "transformers": __import__("transformers").__version__, "torch": torch.__version__})
    for kind in ("llama", "qwen3"):
        print(kind, "chain picks", tensors[f"{kind}.chain_picks"].tolist(), "tree children",
              tensors[f"{kind}.tree_children"].tolist())


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/eagle3"))
