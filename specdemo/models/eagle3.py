"""EAGLE-3 heads as published in vLLM's `speculators` format: the head's module (`Eagle3Head`) and its settings
(`Eagle3Config`). Reading a checkpoint and checking it against a target is eagle3_files.py's; drafting is the same
drafters' (engine/drafters.py, engine/tree_drafter.py), which call this head as they call our own (eagle.py).

EAGLE-3 (Li et al. 2025, arXiv:2503.01840), as the `speculators` package trains it (src/speculators/models/eagle3/:
core.py, model_definitions.py) and vLLM serves it (vllm/model_executor/models/llama_eagle3.py):
- at a fixed position j the head reads the target's hidden states at three "aux" layer ids k (vLLM appends
  `hidden_states + residual` just before running layer k, which is transformers' `hidden_states[k]`), each
  RMS-normalised first where the config says `fc_norm` (or all together with `norm_before_fc`), and fuses them with
  fc (3 H_target -> H);
- one decoder layer (Llama, or Qwen3 with its per-head q/k norms) whose attention reads
  cat[input_layernorm(embedding of x_{j+1}), hidden_norm(fused)] (2H wide); its residual stream starts from the fused
  state, or from hidden_norm of it where `norm_before_residual`; the MLP is the layer's own (post_attention_layernorm,
  SwiGLU);
- its output (the pre-norm residual stream) is what the next drafted position reads instead of the fused target
  state; `norm` then `lm_head` turn it into logits over the draft vocabulary, and `d2t` sends draft id i to target
  id i + d2t[i] (vLLM's compute_logits);
- the pair (f_j, x_{j+1}) sits at RoPE position j + 1 (the package trains with positions 1..n; vLLM gives the draft
  the positions of the tokens it reads). RoPE depends only on differences, so the shift changes nothing but
  rounding; it is kept to compute what they compute.
The embedding is the head's own `embed_tokens` where the checkpoint has one (the package saves it), else the target's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from .eagle import HeadCache, RMSNorm, rope
from .lm import device_lock

LAYER_TYPES = ("llama", "qwen3")  # the draft layers this head computes (speculators' model_definitions.py)


@dataclass(frozen=True)
class Eagle3Config:
    """What an EAGLE-3 head computes, read from a speculators config.json (eagle3_files.read_config)."""

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    draft_vocab_size: int
    target_hidden_size: int
    target_vocab_size: int
    aux_ids: tuple[int, ...]  # the target's layer ids it reads (vLLM's numbering: the input of layer k), in order
    aux_shift: int = 0  # what was added to the file's aux ids (1 for SpecForge's numbering: eagle3_files.py)
    layer_type: str = "llama"
    rms_norm_eps: float = 1e-6
    norm_before_residual: bool = False
    fc_norm: bool = False  # each aux state RMS-normalised before fc
    norm_before_fc: bool = False  # the three aux states RMS-normalised together before fc
    norm_output: bool = False  # drafted positions read the normalised output (Eagle 3.1), else the pre-norm one
    attention_bias: bool = False
    mlp_bias: bool = False
    rope: dict = field(default_factory=dict)  # the layer config's rope fields, for transformers' rotary classes
    verifier: dict = field(default_factory=dict)  # name_or_path and architectures, as the checkpoint names them
    name: str = ""  # the head's public name (a Hub id, or local:<folder>)
    stop_below: float = 0.0  # the drafters' confidence stop: none for a published head
    tree: dict = field(default_factory=dict)  # no tree shape of its own: the drafters' default

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """The target layers the loop hands over (0-based outputs, lm.feed_features' `hidden_states[i + 1]`):
        aux id k is hidden_states[k], so layer k - 1 (-1: the embeddings' output, hidden_states[0])."""
        return tuple(k - 1 for k in self.aux_ids)


class Eagle3Head(nn.Module):
    """fc over the target's aux states -> one decoder layer reading [embedding, state] -> norm -> lm_head."""

    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        self.cfg = cfg
        h, th, n_aux, eps = cfg.hidden_size, cfg.target_hidden_size, len(cfg.aux_ids), cfg.rms_norm_eps
        nh, nkv, hd, bias = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.attention_bias
        if cfg.fc_norm:
            self.fc_norms = nn.ModuleList(RMSNorm(th, eps) for _ in range(n_aux))
        if cfg.norm_before_fc:
            self.fc_input_norm = RMSNorm(n_aux * th, eps)
        self.fc = nn.Linear(n_aux * th, h, bias=False)
        self.input_layernorm, self.hidden_norm = RMSNorm(h, eps), RMSNorm(h, eps)
        self.q_proj = nn.Linear(2 * h, nh * hd, bias=bias)
        self.k_proj = nn.Linear(2 * h, nkv * hd, bias=bias)
        self.v_proj = nn.Linear(2 * h, nkv * hd, bias=bias)
        self.o_proj = nn.Linear(nh * hd, h, bias=bias)
        if cfg.layer_type == "qwen3":
            self.q_norm, self.k_norm = RMSNorm(hd, eps), RMSNorm(hd, eps)
        self.post_attention_layernorm = RMSNorm(h, eps)
        self.gate_proj = nn.Linear(h, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.up_proj = nn.Linear(h, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, h, bias=cfg.mlp_bias)
        self.norm = RMSNorm(h, eps)
        self.lm_head = nn.Linear(h, cfg.draft_vocab_size, bias=False)
        self.embed_tokens: nn.Embedding | None = None  # the head's own, where the checkpoint has one
        self.register_buffer("d2t", torch.arange(cfg.draft_vocab_size), persistent=False)  # target ids, absolute
        self._rope: tuple[torch.Tensor, torch.Tensor] | None = None

    # ------------------------------------------------------------------------------------------- the drafters' API
    def attach(self, target, dtype: torch.dtype, device) -> Eagle3Head:
        """Ready the head to draft: frozen, on `device` in `dtype`. It keeps no reference to `target` (a module held
        here would be cast with the head); the drafters hand it the target's embedding where it has none."""
        self.requires_grad_(False)
        with device_lock(torch.device(device)):  # device work takes the device's turn (loading.load_pair_uncached)
            return self.to(device=device, dtype=dtype).eval()

    @property
    def lm_rows(self) -> torch.Tensor:
        """Its own lm_head [V_draft, H]: the drafters read the head's dtype and device from it, as from our heads'."""
        return self.lm_head.weight

    @property
    def published_name(self) -> str:
        """The head's public name (a Hub id, or local:<folder>): captions and the trace name the head by it."""
        return self.cfg.name

    def embedder(self, target) -> nn.Module:
        """The embedding the head reads tokens through: its own where it has one, else the target's."""
        return self.embed_tokens if self.embed_tokens is not None else target.get_input_embeddings()

    def true_feature(self, feats: torch.Tensor) -> torch.Tensor:
        """The target's features at fixed positions [n, (A + 1) H_t] (the A aux states, then the last hidden state,
        which EAGLE-3 does not read) -> the fused state [n, H]."""
        cfg = self.cfg
        aux = feats[..., : len(cfg.aux_ids) * cfg.target_hidden_size]
        if cfg.fc_norm:
            parts = aux.split(cfg.target_hidden_size, dim=-1)
            aux = torch.cat([norm(x) for norm, x in zip(self.fc_norms, parts)], dim=-1)
        if cfg.norm_before_fc:
            aux = self.fc_input_norm(aux)
        return self.fc(aux)

    def logits(self, g: torch.Tensor) -> torch.Tensor:
        """The head's outputs [n, H] -> logits over its draft vocabulary [n, V_draft]."""
        return self.lm_head(g if self.cfg.norm_output else self.norm(g))

    def rope_tables(self, n: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin [n, head_dim] for positions 0..n-1, from transformers' rotary embedding for the layer's config
        (so Llama 3's scaled frequencies, YaRN and the rest are computed as the layer's own model does), float32."""
        if self._rope is None or self._rope[0].shape[0] < n or self._rope[0].device != torch.device(device):
            size = max(n, 2048)
            rotary = rotary_for(self.cfg).to(device)
            probe = torch.zeros(1, size, 1, device=device, dtype=torch.float32)
            cos, sin = rotary(probe, torch.arange(size, device=device).view(1, -1))
            self._rope = (cos[0].float(), sin[0].float())
        return self._rope[0][:n], self._rope[1][:n]

    def step(self, feat: torch.Tensor, emb: torch.Tensor, cache: HeadCache, positions: torch.Tensor | None = None,
             mask: torch.Tensor | None = None) -> torch.Tensor:
        """n new head positions (state [n, H], embedding [n, H]) appended to `cache` -> the states drafted positions
        read next [n, H]: the layer's pre-norm output (normalised where `norm_output`). Positions continue the
        cache causally by default; a tree passes its nodes' `positions` [n] and `mask` [n, cache.length + n]
        (bool, True where a new position may attend), as for eagle.EagleHead.step."""
        cfg = self.cfg
        n, start = feat.shape[0], cache.length
        nh, nkv, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        assert start + n <= cache.k.shape[1], "the head's cache is full"
        normed = self.hidden_norm(feat)
        residual = normed if cfg.norm_before_residual else feat
        x = torch.cat([self.input_layernorm(emb), normed], dim=-1)
        q = self.q_proj(x).view(n, nh, hd)
        k = self.k_proj(x).view(n, nkv, hd)
        if cfg.layer_type == "qwen3":
            q, k = self.q_norm(q), self.k_norm(k)
        pos = torch.arange(start, start + n, device=x.device) if positions is None else positions
        cos, sin = self.rope_tables(cache.k.shape[1] + 2, x.device)
        cos, sin = cos[pos + 1].to(x.dtype), sin[pos + 1].to(x.dtype)  # the pair (f_j, x_{j+1}) sits at j + 1
        cache.k[:, start : start + n] = rope(k.transpose(0, 1), cos, sin)
        cache.v[:, start : start + n] = self.v_proj(x).view(n, nkv, hd).transpose(0, 1)
        cache.length = start + n
        if mask is None and n > 1:  # new position i sees the cache and the new positions <= i
            mask = torch.ones(n, start + n, dtype=torch.bool, device=x.device).tril(diagonal=start)
        attn = F.scaled_dot_product_attention(rope(q.transpose(0, 1), cos, sin), cache.k[:, : start + n],
                                              cache.v[:, : start + n], attn_mask=mask, enable_gqa=nh != nkv)
        h = residual + self.o_proj(attn.transpose(0, 1).reshape(n, nh * hd))
        y = self.post_attention_layernorm(h)
        h = h + self.down_proj(F.silu(self.gate_proj(y)) * self.up_proj(y))
        return self.norm(h) if cfg.norm_output else h


def rotary_for(cfg: Eagle3Config) -> torch.nn.Module:
    """transformers' rotary embedding for the head's layer config (its rope fields only; no code is loaded)."""
    from transformers import LlamaConfig, Qwen3Config
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

    config_class, rotary = ((LlamaConfig, LlamaRotaryEmbedding) if cfg.layer_type == "llama"
                            else (Qwen3Config, Qwen3RotaryEmbedding))
    config = config_class(hidden_size=cfg.hidden_size, num_attention_heads=cfg.num_heads, head_dim=cfg.head_dim,
                          num_key_value_heads=cfg.num_kv_heads, **cfg.rope)
    return rotary(config)
