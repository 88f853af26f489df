"""The EAGLE draft head: a one-layer model that drafts from the target's own features, and its checked files.

Owns the head's module (`EagleHead`), its KV cache (`HeadCache`), and reading and writing a head folder with the
checks that tie it to its target (`load_head`, `save_head`). It does not draft (drafters.py drives it) and does not
train (scripts/train_eagle.py).

EAGLE (Li et al. 2024, arXiv:2401.15077): the target's last hidden state f_j at position j (the "feature", which its
LM head turns into the distribution of x_{j+1}) and the embedding of the token x_{j+1} go through
fc(2H -> H) and one decoder layer, which predicts the next feature f_{j+1}. The target's own LM head, restricted to
a draft vocabulary (FR-Spec, arXiv:2502.14856), turns that prediction into q for x_{j+2}. Drafting goes on from
the head's predicted features; accepted positions are then re-read with the target's true features.

Richer features (EAGLE-3, Li et al. 2025, arXiv:2503.01840): a head with `feature_layers` also reads, at accepted
positions, the outputs of a low and a middle layer of the target. Each is RMS-normalised and a zero-initialised
`mix` (2H -> H) adds them to f_j, so a grown head starts as the head it grew from. Drafted positions have no
target layers; they read the head's predicted feature alone, as before.

Files (a folder, every file < 9.5 MB): config.json (shapes, the draft vocabulary's size, the feature layers, and
which target the head belongs to: model type, hidden size, vocabulary size and a digest of the tokenizer's
vocabulary), head.safetensors (fc, the layer, and `d2t`, the target id of every draft-vocabulary row, no id twice)
and, for a head with feature layers, layers.safetensors (their norms and `mix`). The LM-head rows are not stored:
they are the target's own, taken at load time.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from specdemo.config import TREE_DEPTH_RANGE, TREE_TOPK_RANGE
from specdemo.i18n import Msg, Translatable

from .devices import pack_weight, packed_linear, packs_bf16, pick_dtype
from .lm import device_lock

ARCHITECTURE = "specdemo-eagle"
FORMAT_VERSION = 2  # 2: a head with feature_layers; a head without them is still written as version 1
READABLE_VERSIONS = (1, 2)
CONFIG_FILE, WEIGHTS_FILE, LAYERS_FILE = "config.json", "head.safetensors", "layers.safetensors"
LAYER_WEIGHTS = ("mix.", "layer_norms.")  # stored in LAYERS_FILE: what reading the feature layers adds to a head


class HeadError(Translatable, RuntimeError):
    """A head folder is missing, damaged or belongs to another target. The message is one sentence (i18n key)."""


@dataclass(frozen=True)
class HeadConfig:
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    draft_vocab_size: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    feature_layers: tuple[int, ...] = ()  # decoder layers (0-based) whose outputs the head also reads (EAGLE-3)
    stop_below: float = 0.0  # confidence stop: draft x_t (t >= 2) only where the head's top probability >= this
    tree: dict = field(default_factory=dict)  # the draft tree's default shape: {"topk", "depth", "budget"} (ints)
    #                                             and "prune_below" (a float, tree.grow's pruning; 0 or absent: none);
    #                                             where the target runs in bf16 on a CPU, "auto_top_to_t_bf16_cpu"
    #                                             (auto children are top-k up to this T) and "sampled_bf16_cpu"
    #                                             (sizes for sampled children there): tree_drafter.tree_children,
    #                                             tree_drafter.run_tree_shape
    target: dict = field(default_factory=dict)  # model_type, hidden_size, vocab_size, vocab_sha256, name
    training: dict = field(default_factory=dict)  # the recipe and the learning curve (the card reads it)


def vocab_digest(tokenizer) -> str:
    """A digest of the tokenizer's vocabulary: the head's draft ids mean the same tokens only under this vocabulary."""
    items = sorted(tokenizer.get_vocab().items())
    return hashlib.sha256(json.dumps(items, ensure_ascii=False).encode()).hexdigest()[:16]


def target_signature(target, tokenizer, name: str = "") -> dict:
    cfg = target.config
    hidden = target.get_output_embeddings().weight.shape[1]
    return {"name": name, "model_type": cfg.model_type, "hidden_size": int(hidden),
            "vocab_size": len(tokenizer.get_vocab()), "vocab_sha256": vocab_digest(tokenizer)}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding (rotate-half form, as in Llama) of x [..., T, D] with cos/sin [T, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class HeadCache:
    """The head's keys and values, preallocated; `length` positions are valid. Rolling back is lowering `length`."""

    def __init__(self, cfg: HeadConfig, capacity: int, device, dtype):
        shape = (cfg.num_kv_heads, capacity, cfg.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.length = 0

    def crop(self, keep: int) -> None:
        assert 0 <= keep <= self.length, (keep, self.length)
        self.length = keep


class EagleHead(nn.Module):
    """fc(cat[embedding(x_{j+1}), f_j]) -> one pre-norm decoder layer (attention with RoPE, SwiGLU MLP) -> f_{j+1}."""

    def __init__(self, cfg: HeadConfig):
        super().__init__()
        self.cfg = cfg
        h, nh, nkv, hd = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.fc = nn.Linear(2 * h, h, bias=False)
        if cfg.feature_layers:
            self.layer_norms = nn.ModuleList(RMSNorm(h, cfg.rms_norm_eps) for _ in cfg.feature_layers)
            self.mix = nn.Linear(len(cfg.feature_layers) * h, h, bias=False)
        self.input_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.q_proj = nn.Linear(h, nh * hd, bias=False)
        self.k_proj = nn.Linear(h, nkv * hd, bias=False)
        self.v_proj = nn.Linear(h, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, h, bias=False)
        self.post_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.gate_proj = nn.Linear(h, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(h, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, h, bias=False)
        self.register_buffer("d2t", torch.arange(cfg.draft_vocab_size), persistent=True)
        self._rope: tuple[torch.Tensor, torch.Tensor] | None = None

    def attach(self, target, dtype: torch.dtype, device) -> EagleHead:
        """Ready the head to draft for `target`: frozen, on `device` in `dtype`, with `lm_rows` [V_draft, H], the
        target's own LM-head rows for the draft vocabulary (not stored in the head's files)."""
        self.requires_grad_(False)
        with device_lock(torch.device(device)):  # device work takes the device's turn (loading.load_pair_uncached)
            rows = target.get_output_embeddings().weight.detach()[self.d2t.to(target.device)]
            self.register_buffer("lm_rows", rows.clone(), persistent=False)
            return self.to(device=device, dtype=dtype).eval()

    def embedder(self, target) -> nn.Module:
        """The embedding the head reads tokens through: the target's own."""
        return target.get_input_embeddings()

    def fused(self) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
        """The weights drafting multiplies by, made once per dtype and device: fc, q|k|v and gate|up as one matrix
        each, o, down and the LM rows. Drafting runs one position at a time, where each call costs more than its
        arithmetic (the training path keeps the separate modules). Each comes with its oneDNN-packed copy on a CPU
        with bf16 units (devices.packs_bf16; None elsewhere)."""
        w = self.q_proj.weight
        cached = getattr(self, "_fused", None)
        if cached is None or cached["qkv"][0].dtype != w.dtype or cached["qkv"][0].device != w.device:
            plain = {"fc": self.fc.weight, "qkv": torch.cat([w, self.k_proj.weight, self.v_proj.weight]),
                     "o": self.o_proj.weight, "gu": torch.cat([self.gate_proj.weight, self.up_proj.weight]),
                     "down": self.down_proj.weight, "lm": self.lm_rows}
            pack = packs_bf16(w.device, w.dtype)
            cached = self._fused = {name: (m, pack_weight(m) if pack else None) for name, m in plain.items()}
        return cached

    def linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """x times one of the drafting weights (`fused`), packed where it is."""
        weight, packed = self.fused()[name]
        return F.linear(x, weight) if packed is None else packed_linear(x, packed, weight.shape[0])

    def logits(self, g: torch.Tensor) -> torch.Tensor:
        """Predicted features [n, H] -> the head's logits over its draft vocabulary [n, V_draft] (the target's own
        LM-head rows), in the head's dtype."""
        return self.linear(g, "lm")

    # ------------------------------------------------------------------------------------------- building blocks
    def true_feature(self, feats: torch.Tensor) -> torch.Tensor:
        """What the head reads at an accepted position: the target's outputs [..., (L+1) H] (the L feature_layers',
        then its last hidden state f) -> [..., H]: f, plus the mixed, normalised lower layers if the head has any."""
        if not self.cfg.feature_layers:
            return feats
        parts = feats.split(self.cfg.hidden_size, dim=-1)
        lower = torch.cat([norm(x) for norm, x in zip(self.layer_norms, parts[:-1])], dim=-1)
        return parts[-1] + self.mix(lower)

    def rope_tables(self, n: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin [n, head_dim] for positions 0..n-1 (grown on demand, kept in float32)."""
        if self._rope is None or self._rope[0].shape[0] < n or self._rope[0].device != torch.device(device):
            if self._rope is not None:  # a captured graph may read the old tables (head_graphs): kept, not freed
                self.__dict__.setdefault("_rope_kept", []).append(self._rope)
            size = max(n, 2048)
            hd = self.cfg.head_dim
            inv = 1.0 / (self.cfg.rope_theta ** (torch.arange(0, hd, 2, device=device).float() / hd))
            ang = torch.outer(torch.arange(size, device=device).float(), inv)
            ang = torch.cat([ang, ang], dim=-1)
            self._rope = (ang.cos(), ang.sin())
        return self._rope[0][:n], self._rope[1][:n]

    def project(self, feat: torch.Tensor, emb: torch.Tensor, positions: torch.Tensor):
        """Inputs [B, T, H] at `positions` [T] -> (x, q, k, v): the fused input and RoPE'd q [B, nh, T, hd] and
        k, v [B, nkv, T, hd]."""
        cfg = self.cfg
        x = self.fc(torch.cat([emb, feat], dim=-1))
        y = self.input_norm(x)
        b, t, _ = y.shape
        q = self.q_proj(y).view(b, t, cfg.num_heads, cfg.head_dim).transpose(1, 2)
        k = self.k_proj(y).view(b, t, cfg.num_kv_heads, cfg.head_dim).transpose(1, 2)
        v = self.v_proj(y).view(b, t, cfg.num_kv_heads, cfg.head_dim).transpose(1, 2)
        cos, sin = self.rope_tables(int(positions.max()) + 1, y.device)
        cos, sin = cos[positions].to(q.dtype), sin[positions].to(q.dtype)
        return x, rope(q, cos, sin), rope(k, cos, sin), v

    def finish(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """The residual stream after attention [B, nh, T, hd] -> the predicted feature [B, T, H]."""
        b, _, t, _ = attn.shape
        x = x + self.o_proj(attn.transpose(1, 2).reshape(b, t, -1))
        y = self.post_norm(x)
        return x + self.down_proj(F.silu(self.gate_proj(y)) * self.up_proj(y))

    def expand_kv(self, t: torch.Tensor) -> torch.Tensor:
        """Grouped-query attention: repeat each key/value head for the query heads that share it."""
        rep = self.cfg.num_heads // self.cfg.num_kv_heads
        return t if rep == 1 else t.repeat_interleave(rep, dim=-3)

    # ------------------------------------------------------------------------------------------------ forwards
    def forward(self, feat: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        """Training/teacher-forced pass over whole sequences: [B, T, H] twice -> predicted features [B, T, H]."""
        positions = torch.arange(feat.shape[1], device=feat.device)
        x, q, k, v = self.project(feat, emb, positions)
        attn = F.scaled_dot_product_attention(q, self.expand_kv(k), self.expand_kv(v), is_causal=True)
        return self.finish(x, attn)

    def step(self, feat: torch.Tensor, emb: torch.Tensor, cache: HeadCache, positions: torch.Tensor | None = None,
             mask: torch.Tensor | None = None) -> torch.Tensor:
        """Drafting: n new positions [n, H] appended to `cache` -> their predicted features [n, H]. The same
        arithmetic as `forward`, with the fused (and, on a CPU with bf16 units, packed) weights and no module calls.

        By default the new positions continue the sequence causally. A draft tree passes its nodes' RoPE
        `positions` [n] and `mask` [n, cache.length + n] (bool, True where a new position may attend)."""
        cfg = self.cfg
        n, start = feat.shape[0], cache.length
        nh, nkv, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        assert start + n <= cache.k.shape[1], "the head's cache is full"
        x = self.linear(torch.cat([emb, feat], dim=-1), "fc")  # [n, H]
        qkv = self.linear(self.input_norm(x), "qkv")
        q = qkv[:, : nh * hd].view(n, nh, hd).transpose(0, 1)
        k = qkv[:, nh * hd : (nh + nkv) * hd].view(n, nkv, hd).transpose(0, 1)
        if positions is None:
            cos, sin = self.rope_tables(start + n, x.device)
            cos, sin = cos[start:].to(x.dtype), sin[start:].to(x.dtype)
        else:  # the caller knows a bound: positions never exceed the cache's capacity
            cos, sin = self.rope_tables(cache.k.shape[1], x.device)
            cos, sin = cos[positions].to(x.dtype), sin[positions].to(x.dtype)
        cache.k[:, start : start + n] = rope(k, cos, sin)
        cache.v[:, start : start + n] = qkv[:, (nh + nkv) * hd :].view(n, nkv, hd).transpose(0, 1)
        cache.length = start + n
        if mask is None and n > 1:  # new position i sees the cache and new positions <= i
            mask = torch.ones(n, start + n, dtype=torch.bool, device=x.device).tril(diagonal=start)
        attn = F.scaled_dot_product_attention(rope(q, cos, sin), cache.k[:, : start + n], cache.v[:, : start + n],
                                              attn_mask=mask, enable_gqa=nh != nkv)
        x = x + self.linear(attn.transpose(0, 1).reshape(n, nh * hd), "o")
        gate, up = self.linear(self.post_norm(x), "gu").chunk(2, dim=-1)
        return x + self.linear(F.silu(gate) * up, "down")


# ---------------------------------------------------------------------------------------------------- files
def save_head(head: EagleHead, folder: Path) -> None:
    """Write config.json, head.safetensors (bf16 weights, int32 d2t) and, with feature layers, layers.safetensors."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    state = {name: t.detach().to(torch.bfloat16).contiguous() for name, t in head.state_dict().items()
             if name != "d2t"}
    state["d2t"] = head.d2t.to(torch.int32).contiguous()
    layers = {name: state.pop(name) for name in list(state) if name.startswith(LAYER_WEIGHTS)}
    save_file(state, str(folder / WEIGHTS_FILE), metadata={"architecture": ARCHITECTURE})
    (folder / LAYERS_FILE).unlink(missing_ok=True)
    if layers:
        save_file(layers, str(folder / LAYERS_FILE), metadata={"architecture": ARCHITECTURE})
    meta = {"architecture": ARCHITECTURE, "format_version": FORMAT_VERSION if head.cfg.feature_layers else 1}
    meta |= asdict(head.cfg)
    (folder / CONFIG_FILE).write_text(json.dumps(meta, indent=2) + "\n")


TREE_SIZES = ("topk", "depth", "budget")
SAMPLED_BF16_CPU = "sampled_bf16_cpu"  # tree sizes for sampled children where the target runs in bf16 on a CPU


SIZE_RANGES = {"topk": TREE_TOPK_RANGE, "depth": TREE_DEPTH_RANGE, "budget": (1, 256)}  # a run caps the budget


def sizes_ok(sizes) -> bool:
    """Whether `sizes` is a dict of tree sizes only, each a whole number in its range: top-k and depth in the
    ranges a run may ask for (SpecConfig), the budget in [1, 256] (a run caps it again: tree_drafter.tree_shape)."""
    return isinstance(sizes, dict) and set(sizes) <= set(TREE_SIZES) and all(
        type(v) is int and SIZE_RANGES[k][0] <= v <= SIZE_RANGES[k][1] for k, v in sizes.items())


def read_config(folder: Path) -> HeadConfig:
    try:
        meta = json.loads((folder / CONFIG_FILE).read_text())
    except FileNotFoundError as err:
        raise HeadError("err.head_missing") from err
    except (OSError, ValueError) as err:
        raise HeadError("err.head_damaged", error=type(err).__name__) from err
    if meta.get("architecture") != ARCHITECTURE or meta.get("format_version") not in READABLE_VERSIONS:
        raise HeadError("err.head_damaged", error="architecture")
    layers = meta.get("feature_layers", [])
    if not (isinstance(layers, list) and all(type(i) is int for i in layers) and layers == sorted(set(layers))
            and (meta["format_version"] > 1 or not layers)):
        raise HeadError("err.head_damaged", error="feature_layers")
    stop = meta.get("stop_below", 0.0)
    if not (type(stop) in (int, float) and 0 <= stop < 1):
        raise HeadError("err.head_damaged", error="stop_below")
    tree = meta.get("tree", {})
    floats = {"prune_below": lambda v: 0 <= v < 1, "auto_top_to_t_bf16_cpu": lambda v: 0 <= v <= 100}
    if not (isinstance(tree, dict)
            and all(type(tree.get(k, 0.0)) in (int, float) and ok(tree.get(k, 0.0)) for k, ok in floats.items())
            and sizes_ok({k: v for k, v in tree.items() if k not in (*floats, SAMPLED_BF16_CPU)})
            and sizes_ok(tree.get(SAMPLED_BF16_CPU, {}))):
        raise HeadError("err.head_damaged", error="tree")
    try:
        fields = {k: meta[k] for k in HeadConfig.__dataclass_fields__ if k in meta}
        return HeadConfig(**fields | {"feature_layers": tuple(layers)})
    except TypeError as err:
        raise HeadError("err.head_damaged", error=type(err).__name__) from err


def load_head(folder: Path, target, tokenizer, dtype: torch.dtype, device) -> EagleHead:
    """Read a head folder and check that it belongs to `target` (its tokenizer's vocabulary and its width).
    Raises HeadError (one sentence) for a missing, damaged or mismatched head."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder = Path(folder)
    cfg = read_config(folder)
    sig = target_signature(target, tokenizer)
    want = cfg.target
    for key in ("model_type", "hidden_size", "vocab_size", "vocab_sha256"):
        if want.get(key) != sig[key]:
            raise HeadError("err.head_mismatch", what=key)
    if not layers_fit(target, cfg.feature_layers):
        raise HeadError("err.head_mismatch", what="feature_layers")
    try:
        state = load_file(str(folder / WEIGHTS_FILE))
        if cfg.feature_layers:
            state |= load_file(str(folder / LAYERS_FILE))
    except FileNotFoundError as err:
        raise HeadError("err.head_missing") from err
    except (SafetensorError, OSError, ValueError) as err:
        raise HeadError("err.head_damaged", error=type(err).__name__) from err
    head = EagleHead(cfg)
    d2t = state.get("d2t")
    if d2t is None or d2t.shape != (cfg.draft_vocab_size,) or int(d2t.min()) < 0 or int(d2t.max()) >= sig["vocab_size"]:
        raise HeadError("err.head_mismatch", what="d2t")
    if (repeats := d2t.numel() - torch.unique(d2t).numel()) > 0:  # two rows for one token: q would be wrong there
        raise HeadError("err.head_d2t_repeats", n=repeats)
    state["d2t"] = d2t.long()
    try:
        head.load_state_dict({k: v.float() if k != "d2t" else v for k, v in state.items()}, strict=True)
    except RuntimeError as err:
        raise HeadError("err.head_damaged", error="shapes") from err
    return head.attach(target, dtype, device)


def new_head(target, tokenizer, d2t: torch.Tensor, name: str = "", intermediate_size: int | None = None,
             feature_layers: tuple[int, ...] = ()) -> EagleHead:
    """A fresh head for `target` that starts as the identity on the feature: fc passes f_j through, the layer's
    output projections and `mix` (the lower feature layers', if any) are zero, and for a Llama-style target the rest
    of the layer is its last layer's."""
    cfg_t = target.config
    hidden = target.get_output_embeddings().weight.shape[1]
    layer = _last_llama_layer(target)
    if layer is not None:
        attn, mlp = layer.self_attn, layer.mlp
        hd = attn.head_dim
        nh, nkv = attn.q_proj.out_features // hd, attn.k_proj.out_features // hd
        inter = mlp.gate_proj.out_features
        theta = float((getattr(cfg_t, "rope_parameters", None) or {}).get("rope_theta", 10000.0))
        eps = float(getattr(cfg_t, "rms_norm_eps", 1e-5))
    else:
        nh = getattr(cfg_t, "num_attention_heads", None) or getattr(cfg_t, "n_head", 4)
        nkv, hd, inter, theta, eps = nh, hidden // nh, intermediate_size or 2 * hidden, 10000.0, 1e-5
    if not layers_fit(target, feature_layers):
        raise ValueError(f"feature layers {feature_layers}: each must lie below the target's last layer, once")
    cfg = HeadConfig(hidden, nh, nkv, hd, inter, int(d2t.numel()), theta, eps, tuple(feature_layers),
                     target=target_signature(target, tokenizer, name))
    head = EagleHead(cfg)
    with torch.no_grad():
        if layer is not None:
            for mine, theirs in ((head.q_proj, attn.q_proj), (head.k_proj, attn.k_proj), (head.v_proj, attn.v_proj),
                                 (head.gate_proj, mlp.gate_proj), (head.up_proj, mlp.up_proj)):
                mine.weight.copy_(theirs.weight.float())
            head.input_norm.weight.copy_(layer.input_layernorm.weight.float())
            head.post_norm.weight.copy_(layer.post_attention_layernorm.weight.float())
        head.o_proj.weight.zero_()
        head.down_proj.weight.zero_()
        head.fc.weight.zero_()
        if feature_layers:
            head.mix.weight.zero_()
        head.fc.weight[:, hidden:].copy_(torch.eye(hidden))
        nn.init.normal_(head.fc.weight[:, :hidden], std=0.02 / math.sqrt(2))
    head.d2t = d2t.long()
    return head


def layers_fit(target, feature_layers: tuple[int, ...]) -> bool:
    """Whether a head may read these decoder layers of `target`: increasing, each below its last layer."""
    cfg = target.config
    n = int(getattr(cfg, "num_hidden_layers", None) or getattr(cfg, "n_layer", 0))
    return list(feature_layers) == sorted(set(feature_layers)) and all(0 <= i < n - 1 for i in feature_layers)


def _last_llama_layer(target):
    layers = getattr(getattr(target, "model", None), "layers", None)
    if layers is None:
        return None
    layer = layers[-1]
    ok = all(hasattr(layer, a) for a in ("self_attn", "mlp", "input_layernorm", "post_attention_layernorm"))
    return layer if ok and hasattr(layer.mlp, "gate_proj") else None


def attach_head(pair, folder: Path, dtype: torch.dtype | None = None) -> None:
    """Load the EAGLE head in `folder` for the pair's target, in `dtype` (None: pick_dtype's choice for a head); a
    missing, damaged or mismatched head leaves the pair without one (its other strategies work) and records why in
    one sentence."""
    try:
        pair.head = load_head(folder, pair.target, pair.tokenizer, dtype or pick_dtype(pair.device, "head"),
                              pair.device)
        pair.head_error = None
    except HeadError as err:
        pair.head, pair.head_error = None, Msg(err.key, **err.params)
