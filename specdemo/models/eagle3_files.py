"""Reading an EAGLE-3 head in vLLM's `speculators` format (or the EAGLE authors' older layout) and checking it
against its target before anything drafts: `load_eagle3`. Every refusal is one sentence (a ModelLoadError whose key
names what differs). The module itself is eagle3.py's.

The speculators format (src/speculators/models/eagle3/config.py; `save_pretrained`): config.json with
`speculators_model_type: "eagle3"`, `transformer_layer_config` (the draft layer's Llama or Qwen3 config),
`draft_vocab_size`, `eagle_aux_hidden_state_layer_ids`, `norm_before_residual`, `fc_norm` / `norm_before_fc`,
`norm_output`, `target_hidden_size`, and `speculators_config.verifier` (name_or_path, architectures); weights in
model.safetensors (or shards with an index): fc, layers.0.*, norm, lm_head, d2t (offsets: draft id i is target id
i + d2t[i]), t2d (not needed), and usually embed_tokens. save_pretrained also writes a config.py for remote code:
it is never read here, nor imported, nor downloaded.

The EAGLE authors' layout (e.g. yuhuili/EAGLE3-LLaMA3.1-Instruct-8B) is the same architecture with other names: a
Llama config with `draft_vocab_size` at its top level, `midlayer.*` for `layers.0.*`, and no verifier named (the
target's shapes are still checked; AngelSlim's heads name the architecture Eagle3LlamaForCausalLM). Its aux ids: a
top-level `eagle_aux_hidden_state_layer_ids` where the config has one, read as vLLM reads it (the input of layer k);
else `eagle_config.eagle_aux_hidden_state_layer_ids`, which SpecForge writes and trains with through SGLang, read as
SGLang's Llama and Qwen models read them: id i is the output of layer i, the input of layer i + 1, so here i + 1
(their `set_eagle3_layers_to_capture`; its DeepSeek-V2 model adds 1 only where the first id is 1, since
sgl-project/sglang#25454). SpecForge's own default, [1, L // 2 - 1, L - 4], names the same three layers as the EAGLE
code's (its qwen3-235B-A22B config: [1, 46, 90] for 94 layers); else the EAGLE code's fixed (2, L // 2, L - 3).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from specdemo.i18n import Msg

from .eagle3 import LAYER_TYPES, Eagle3Config, Eagle3Head
from .weights import ModelLoadError, display_id, hub_offline, hub_reachable, is_local

CONFIG_FILE = "config.json"
# speculators_model_type -> the name people know it by (the types that speculators 0.9 defines besides eagle3)
OTHER_TYPES = {"dflash": "DFlash", "dflash2": "DFlash-2", "mtp": "MTP", "peagle": "P-EAGLE", "dspark": "DSpark",
               "xpress": "Xpress", "eagle": "EAGLE-1", "independent": "an independent draft model"}
AUX_FIELD = "eagle_aux_hidden_state_layer_ids"
AUTHORS_ARCHS = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")  # the EAGLE authors' layout (vLLM maps both)


# ------------------------------------------------------------------------------------------------ where it is
SERVED = False  # the app sets it (ui.build_demo): there a visitor's head id names a folder only if the operator allows


def folders_allowed(source: str) -> bool:
    """Whether a head id may name a folder on this machine: always from the CLI and the Python API; in the served app
    a name like a repo id only with SPECDEMO_ALLOW_LOCAL=1, as for custom model ids (validation.check_custom_ids),
    so that one that is also a folder under the server's working directory is looked for on the hub, as if it were
    not there. (A path, absolute or starting with . or ~, reaches here from a visitor only where local ids are on.)"""
    from specdemo.limits import Limits  # here: specdemo.limits imports this package

    return not SERVED or source.startswith(("/", ".", "~")) or Limits.from_env().allow_local


def head_folder(source: str) -> Path:
    """A local folder, or a Hub id fetched into the Hub cache: config.json and the safetensors files only (never
    config.py, never a pickle)."""
    source = source.strip()
    if folders_allowed(source) and (is_local(source) or Path(source).expanduser().is_dir()):
        folder = Path(source).expanduser()
        if not folder.is_dir():
            raise ModelLoadError("err.eagle3_no_folder", head=display_id(source))
        return folder
    if hub_offline() or not hub_reachable():
        raise ModelLoadError("err.eagle3_offline", head=source)
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(source, allow_patterns=["config.json", "*.safetensors",
                                                              "model.safetensors.index.json"]))
    except Exception as err:  # a missing or gated repository, a network failure mid-download
        raise ModelLoadError("err.eagle3_fetch", head=source, error=type(err).__name__) from None


# ------------------------------------------------------------------------------------------------ config.json
def read_json(folder: Path, name: str, head: str, file: str) -> dict:
    try:
        meta = json.loads((folder / file).read_text())
    except FileNotFoundError:
        raise ModelLoadError("err.eagle3_missing", head=head, file=file) from None
    except (OSError, ValueError) as err:
        raise ModelLoadError("err.eagle3_truncated", head=head, file=file, error=type(err).__name__) from None
    if not isinstance(meta, dict):
        raise ModelLoadError("err.eagle3_truncated", head=head, file=file, error="not an object")
    return meta


def read_config(folder: Path, name: str) -> Eagle3Config:
    """The head's Eagle3Config from config.json alone, or a one-sentence refusal."""
    meta = read_json(folder, name, name, CONFIG_FILE)
    kind = meta.get("speculators_model_type")
    archs = meta.get("architectures")
    if kind is None and isinstance(archs, list) and any(a in AUTHORS_ARCHS for a in archs if isinstance(a, str)):
        ids, shift = meta.get(AUX_FIELD) or (), 0
        if not ids:  # as SGLang's Llama and Qwen read them: the output of layer i (the module docstring)
            extra = meta.get("eagle_config")
            ids, shift = (extra.get(AUX_FIELD) or () if isinstance(extra, dict) else ()), 1
        if not isinstance(ids, (list, tuple)):
            raise ModelLoadError("err.eagle3_config", head=name, what=Msg("eagle3.bad_field", error=AUX_FIELD))
        return config_from(meta, meta, tuple(ids), {}, name, shift)  # no ids: the EAGLE code's, once L is known
    if kind is None:
        raise ModelLoadError("err.eagle3_config", head=name, what=Msg("eagle3.no_type"))
    if kind != "eagle3":
        raise ModelLoadError("err.eagle3_type", head=name, kind=OTHER_TYPES.get(str(kind), repr(str(kind)[:40])))
    layer = meta.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise ModelLoadError("err.eagle3_config", head=name, what=Msg("eagle3.no_layer"))
    ids = meta.get(AUX_FIELD) or ()
    if not isinstance(ids, (list, tuple)):
        raise ModelLoadError("err.eagle3_config", head=name, what=Msg("eagle3.bad_field", error=AUX_FIELD))
    verifier = (meta.get("speculators_config") or {}).get("verifier") or {}
    return config_from(meta, layer, tuple(ids), verifier, name)


def config_from(meta: dict, layer: dict, aux_ids: tuple, verifier: dict, name: str, shift: int = 0) -> Eagle3Config:
    """The Eagle3Config of a head's config fields; `shift` is added to the file's aux ids (1 where they name
    layers' outputs), which are sorted: vLLM and SGLang hand the aux states over in layer order, whatever the file's."""
    kind = layer.get("model_type", "llama")
    if kind not in LAYER_TYPES:
        raise ModelLoadError("err.eagle3_layer", head=name, what=Msg("eagle3.layer_type", kind=str(kind)[:40]))
    if layer.get("num_hidden_layers", 1) != 1:
        raise ModelLoadError("err.eagle3_layer", head=name,
                             what=Msg("eagle3.layer_count", n=layer.get("num_hidden_layers")))
    if layer.get("hidden_act", "silu") != "silu" or layer.get("layer_types") not in (None, ["full_attention"]):
        raise ModelLoadError("err.eagle3_layer", head=name, what=Msg("eagle3.layer_kind"))
    try:
        h, nh = int(layer["hidden_size"]), int(layer["num_attention_heads"])
        rope = {k: layer[k] for k in ("rope_parameters", "rope_scaling", "rope_theta", "max_position_embeddings",
                                      "partial_rotary_factor") if layer.get(k) is not None}
        cfg = Eagle3Config(
            hidden_size=h, num_heads=nh, num_kv_heads=int(layer.get("num_key_value_heads") or nh),
            head_dim=int(layer.get("head_dim") or h // nh), intermediate_size=int(layer["intermediate_size"]),
            draft_vocab_size=int(meta.get("draft_vocab_size") or layer["vocab_size"]),
            target_hidden_size=int(meta.get("target_hidden_size") or h),
            target_vocab_size=int(layer["vocab_size"]), aux_ids=tuple(sorted(int(i) + shift for i in aux_ids)),
            aux_shift=shift, layer_type=kind,
            rms_norm_eps=float(layer.get("rms_norm_eps", 1e-6)),
            norm_before_residual=bool(meta.get("norm_before_residual", False)),
            fc_norm=bool(meta.get("fc_norm", False)), norm_before_fc=bool(meta.get("norm_before_fc", False)),
            norm_output=bool(meta.get("norm_output", False)),
            attention_bias=bool(layer.get("attention_bias", False)), mlp_bias=bool(layer.get("mlp_bias", False)),
            rope=rope, verifier=dict(verifier), name=name)
    except (KeyError, TypeError, ValueError) as err:
        raise ModelLoadError("err.eagle3_config", head=name,
                             what=Msg("eagle3.bad_field", error=str(err)[:80])) from None
    if cfg.num_heads % cfg.num_kv_heads or cfg.fc_norm and cfg.norm_before_fc:
        raise ModelLoadError("err.eagle3_config", head=name, what=Msg("eagle3.contradicts"))
    return cfg


# ------------------------------------------------------------------------------------------------ the target
def check_target(cfg: Eagle3Config, target, target_name: str) -> Eagle3Config:
    """Refuse a head made for another target: the verifier it names, the hidden size, the vocabulary, the aux
    layer ids. Returns the config with the authors' layout's fixed aux ids filled in."""
    from dataclasses import replace

    tcfg = getattr(target.config, "text_config", None) or target.config
    n_layers = int(getattr(tcfg, "num_hidden_layers", 0) or getattr(tcfg, "n_layer", 0))
    width = int(target.get_input_embeddings().weight.shape[1])
    vocab = int(target.get_input_embeddings().weight.shape[0])
    archs, want = set(getattr(tcfg, "architectures", None) or []), set(cfg.verifier.get("architectures") or [])
    named = str(cfg.verifier.get("name_or_path") or "")
    if (want and archs and not want & archs) or (named and not same_model(named, target_name)):
        raise ModelLoadError("err.eagle3_verifier", head=cfg.name, verifier=named or "/".join(sorted(want)),
                     target=target_name)
    if cfg.target_hidden_size != width:
        raise ModelLoadError("err.eagle3_hidden", head=cfg.name, head_width=cfg.target_hidden_size, target=target_name,
                     target_width=width)
    if cfg.target_vocab_size != vocab:
        raise ModelLoadError("err.eagle3_vocab", head=cfg.name, head_vocab=cfg.target_vocab_size, target=target_name,
                     target_vocab=vocab)
    if not cfg.aux_ids:
        cfg = replace(cfg, aux_ids=(2, n_layers // 2, n_layers - 3), aux_shift=0)  # the EAGLE code's fixed choice
    shift = cfg.aux_shift  # the refusals name the ids as the file does
    if any(k == n_layers for k in cfg.aux_ids):
        raise ModelLoadError("err.eagle3_aux_last", head=cfg.name, id=n_layers - shift)
    if not all(0 <= k < n_layers for k in cfg.aux_ids) or len(set(cfg.aux_ids)) != len(cfg.aux_ids):
        raise ModelLoadError("err.eagle3_aux", head=cfg.name, ids=[k - shift for k in cfg.aux_ids],
                             target=target_name, n=n_layers, last=n_layers - 1 - shift)
    return cfg


def same_model(named: str, target_name: str) -> bool:
    """Whether the verifier a head names is the target: by the last part of each name (a Hub id's repository, a
    folder's name), case apart, so a local copy of Qwen/Qwen3-8B in a folder named Qwen3-8B passes."""
    def last(s: str) -> str:
        return s.rstrip("/").replace(":", "/").split("/")[-1].lower()

    return last(named) == last(target_name)


# ------------------------------------------------------------------------------------------------ the weights
def weight_files(folder: Path, name: str) -> list[Path]:
    """model.safetensors, or the shards its index names."""
    if (folder / "model.safetensors").exists():
        return [folder / "model.safetensors"]
    if (folder / "model.safetensors.index.json").exists():
        index = read_json(folder, name, name, "model.safetensors.index.json").get("weight_map") or {}
        return [folder / f for f in sorted(set(index.values()))]
    raise ModelLoadError("err.eagle3_missing", head=name, file="model.safetensors")


def read_header(files: list[Path], name: str) -> dict[str, tuple[tuple[int, ...], str]]:
    """Each tensor's shape and dtype, from the files' headers alone (nothing is read into memory yet)."""
    from safetensors import SafetensorError, safe_open

    shapes = {}
    for f in files:
        try:
            with safe_open(str(f), "pt") as handle:
                for key in handle.keys():
                    sl = handle.get_slice(key)
                    shapes[key] = (tuple(sl.get_shape()), sl.get_dtype())
        except FileNotFoundError:
            raise ModelLoadError("err.eagle3_missing", head=name, file=f.name) from None
        except (SafetensorError, OSError, ValueError) as err:
            raise ModelLoadError("err.eagle3_truncated", head=name, file=f.name, error=type(err).__name__) from None
    return {k.replace("midlayer.", "layers.0.").removeprefix("model."): v for k, v in shapes.items()}


SAVED = {"fc.weight": "fc.weight", "norm.weight": "norm.weight", "lm_head.weight": "lm_head.weight",
         "embed_tokens.weight": "embed_tokens.weight", "layers.0.hidden_norm.weight": "hidden_norm.weight",
         "layers.0.input_layernorm.weight": "input_layernorm.weight",
         "layers.0.post_attention_layernorm.weight": "post_attention_layernorm.weight",
         "input_norm.weight": "fc_input_norm.weight"}  # the checkpoint's names -> Eagle3Head's (and below)
for _p in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"):
    for _w in ("weight", "bias"):
        SAVED[f"layers.0.self_attn.{_p}.{_w}"] = f"{_p}.{_w}"
for _p in ("gate_proj", "up_proj", "down_proj"):
    for _w in ("weight", "bias"):
        SAVED[f"layers.0.mlp.{_p}.{_w}"] = f"{_p}.{_w}"
for _i in range(8):
    SAVED[f"fc_norm.{_i}.weight"] = f"fc_norms.{_i}.weight"
DTYPE_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "BOOL": 1, "F8_E4M3": 1}


def head_bytes(shapes: dict, dtype: torch.dtype) -> int:
    """What the head takes once loaded in `dtype` (its weights; d2t in int64)."""
    size = torch.empty(0, dtype=dtype).element_size()
    total = 0
    for key, (shape, _) in shapes.items():
        if key in SAVED or key == "d2t":
            n = int(torch.tensor(shape).prod()) if shape else 1
            total += n * (8 if key == "d2t" else size)
    return total


def load_weights(head: Eagle3Head, files: list[Path], shapes: dict, vocab: int) -> None:
    """Read the tensors into `head`, each checked against the shape the config implies; d2t made absolute and
    checked to name distinct target ids."""
    from safetensors.torch import load_file

    name, cfg = head.cfg.name, head.cfg
    if "embed_tokens.weight" in shapes:
        head.embed_tokens = torch.nn.Embedding(vocab, cfg.hidden_size)
    want = {k: tuple(v.shape) for k, v in head.state_dict().items() if k != "d2t"}
    theirs = {SAVED[k]: shape for k, (shape, _) in shapes.items() if k in SAVED}
    for key, shape in want.items():
        if theirs.get(key) != shape:
            raise ModelLoadError("err.eagle3_weight", head=name, weight=key, shape=list(theirs.get(key) or ()),
                                 want=list(shape))
    state = {}
    try:
        for f in files:
            state |= load_file(str(f))
    except Exception as err:  # noqa: BLE001 - a file cut short after its header
        raise ModelLoadError("err.eagle3_truncated", head=name, file=f.name, error=type(err).__name__) from None
    state = {k.replace("midlayer.", "layers.0.").removeprefix("model."): v for k, v in state.items()}
    head.load_state_dict({SAVED[k]: v.float() for k, v in state.items() if k in SAVED}, strict=True)
    head.d2t = target_ids(state.get("d2t"), cfg, vocab)


def target_ids(d2t: torch.Tensor | None, cfg: Eagle3Config, vocab: int) -> torch.Tensor:
    """Draft id i -> target id i + d2t[i] (vLLM's compute_logits), checked: one id per row, all distinct, inside
    the target's vocabulary. Without d2t the draft vocabulary must be the target's."""
    n = cfg.draft_vocab_size
    if d2t is None:
        if n != vocab:
            raise ModelLoadError("err.eagle3_d2t", head=cfg.name, what=Msg("eagle3.d2t_missing", n=n), vocab=vocab)
        return torch.arange(n)
    if tuple(d2t.shape) != (n,) or d2t.is_floating_point():
        raise ModelLoadError("err.eagle3_d2t", head=cfg.name, what=Msg("eagle3.d2t_shape", shape=list(d2t.shape), n=n),
                             vocab=vocab)
    ids = torch.arange(n) + d2t.long()
    if int(ids.min()) < 0 or int(ids.max()) >= vocab:
        bad = int(ids.max()) if int(ids.max()) >= vocab else int(ids.min())
        raise ModelLoadError("err.eagle3_d2t", head=cfg.name, what=Msg("eagle3.d2t_range", id=bad), vocab=vocab)
    if (repeats := n - torch.unique(ids).numel()) > 0:
        raise ModelLoadError("err.eagle3_d2t", head=cfg.name, what=Msg("eagle3.d2t_repeats", n=repeats), vocab=vocab)
    return ids


# ------------------------------------------------------------------------------------------------ all of it
def load_eagle3(source: str, target, target_name: str, dtype: torch.dtype, device, budget_left: int | None = None,
                tokens: int | None = None) -> Eagle3Head:
    """The EAGLE-3 head at `source` (a folder or a Hub id), checked against `target` (named `target_name`), ready
    to draft in `dtype` on `device`. `budget_left`: the bytes the model memory cap still allows (None: no cap).
    `tokens`: the pair's vocabulary (its tokenizer's), where the target's embedding has more rows (Qwen3's pads
    151,669 tokens to 151,936): the draft ids past it are dropped (`within_vocabulary`).
    Raises ModelLoadError (one sentence) before reading any weights where the config or the headers disagree."""
    name = display_id(source.strip())
    folder = head_folder(source)
    cfg = check_target(read_config(folder, name), target, target_name)
    files = weight_files(folder, name)
    shapes = read_header(files, name)
    width = int(target.get_input_embeddings().weight.shape[1])
    if "embed_tokens.weight" not in shapes and cfg.hidden_size != width:  # it would read the target's embedding
        raise ModelLoadError("err.eagle3_embedding", head=name, head_width=cfg.hidden_size, target=target_name,
                             target_width=width)
    need = head_bytes(shapes, dtype)
    if budget_left is not None and need > budget_left:
        raise ModelLoadError("err.eagle3_memory", head=name, need=f"{need / 1e6:.1f}",
                             left=f"{max(0, budget_left) / 1e6:.1f}")
    head = Eagle3Head(cfg)
    load_weights(head, files, shapes, cfg.target_vocab_size)
    if tokens is not None:
        within_vocabulary(head, tokens)
    return head.attach(target, dtype, device)


def within_vocabulary(head: Eagle3Head, tokens: int) -> None:
    """Drop the draft ids that map past the pair's `tokens` (padding rows of the target's embedding, which its
    tokenizer never makes): the target's p has no such token, so the drafters' q must not either. The head's
    softmax then spreads over the ids left, a q of its own, which the verify keeps exact. Refused if none is left."""
    from dataclasses import replace

    keep = head.d2t < tokens
    if bool(keep.all()):
        return
    if not bool(keep.any()):
        raise ModelLoadError("err.eagle3_d2t", head=head.cfg.name, what=Msg("eagle3.d2t_range", id=int(head.d2t.min())),
                             vocab=tokens)
    rows = head.lm_head.weight[keep]
    head.lm_head = torch.nn.Linear(rows.shape[1], rows.shape[0], bias=False)
    head.lm_head.weight = torch.nn.Parameter(rows, requires_grad=False)
    head.d2t = head.d2t[keep]
    head.cfg = replace(head.cfg, draft_vocab_size=int(keep.sum()))

