"""The KV-cached forward that both decoding loops use: `CachedLM`, a causal LM plus its DynamicCache, fed new
tokens and cropped on rejection, with its logits computed in float32; and one lock per device, so that runs take
turns a round at a time. It does not sample, and it does not load models (loading.py)."""

from __future__ import annotations

import functools
import inspect
import os
import threading

import torch

from .devices import pack_weight, packed_linear, upload_ids


@functools.lru_cache(maxsize=None)
def cache_argument(forward) -> str:
    """The name under which a model's `forward` takes its KV cache: `cache` where transformers has renamed it (5.24
    warns that `past_key_values` goes in 5.40), `past_key_values` in the 5.x releases before the rename."""
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def keeps_a_window(config) -> bool:
    """Whether transformers caches some of this model's layers as a sliding window only (Gemma 3, Mistral v0.1):
    such a layer cannot be cropped once past its window, and a round's rollback crops."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicSlidingWindowLayer

    return any(isinstance(layer, DynamicSlidingWindowLayer) for layer in DynamicCache(config=config).layers)


class CachedLM:
    """A causal LM with its KV cache. `length` is how many tokens the cache holds; they are always a prefix of the
    sequence fixed so far, so rolling back is a crop to a shorter prefix.

    Logits come out in float32, computed from the last hidden state (see `float32_head`): logits rounded to bf16
    (8 bits of mantissa) tie exactly at a few positions in a hundred, and a (K+1)-token verify and a one-token step
    can break such a tie differently. A model whose head does more than one
    matrix product (logit soft-capping or scaling) keeps its own forward, upcast afterwards."""

    def __init__(self, model, vocab_size: int):
        from transformers import DynamicCache

        self.model = model
        self.vocab_size = vocab_size
        # a model with window layers gets a cache that keeps every layer's whole history: its own mask still limits
        # those layers to their window, so each forward computes what it did (tests/test_models.py), at the memory
        # of the tokens outside the window
        full = keeps_a_window(model.config)
        self._new_cache = (lambda: DynamicCache()) if full else (lambda: DynamicCache(config=model.config))
        self.cache = self._new_cache()
        self.calls = 0
        self.head32 = float32_head(model)

    @property
    def length(self) -> int:
        return self.cache.get_seq_length()

    def reset(self) -> None:
        self.cache = self._new_cache()
        self.calls = 0

    def crop(self, keep: int) -> None:
        """Keep the first `keep` cached tokens (transformers 5: `DynamicCache.crop` takes a negative count)."""
        drop = self.length - keep
        assert drop >= 0, f"cannot crop a cache of {self.length} tokens to {keep}"
        if drop:
            self.cache.crop(-drop)

    @torch.inference_mode()
    def feed(self, ids: torch.Tensor, keep_logits: int = 1) -> torch.Tensor:
        """Append ids [n] to the cache and return the float32 logits of the last `keep_logits` positions,
        [keep_logits, V], cut to the shared vocabulary."""
        return self.feed_features(ids, keep_logits)[0]

    @torch.inference_mode()
    def keep_rows(self, start: int, rows: list[int]) -> None:
        """After a tree forward: keep cached positions [0, start) and then the positions start + rows (the kept
        path, in order), on every layer; everything after is dropped. Positions already in place are not moved."""
        first = next((i for i, r in enumerate(rows) if r != i), len(rows))  # rows[:first] sit where they belong
        if first < len(rows):
            src = upload_ids(rows[first:], self.cache.layers[0].keys.device) + start  # one copy for every layer
            for layer in self.cache.layers:
                for t in (layer.keys, layer.values):
                    t[..., start + first : start + len(rows), :] = t[..., src, :]
        self.crop(min(self.length, start + len(rows)))

    @torch.inference_mode()
    def feed_features(self, ids: torch.Tensor, keep_logits: int = 1, layers: tuple[int, ...] = (),
                      tree: tuple[torch.Tensor, torch.Tensor] | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """As `feed`, and also the features an EAGLE head reads at all n fed positions: the outputs of decoder
        `layers` (0-based) and then the last hidden state, side by side, [n, (len(layers) + 1) H]; None for a model
        that keeps its own forward. `tree`: (float 4D attention mask, position ids) for a draft tree's forward
        (tree.tree_attention), or what makes them (tree.TreeForward); None for a causal one."""
        assert ids.dim() == 1 and ids.numel() >= keep_logits >= 1, (ids.shape, keep_logits)
        self.calls += 1
        tree = tree.attention() if hasattr(tree, "attention") else tree  # (a tree.TreeForward: its whole mask)
        extra = {} if tree is None else {"attention_mask": tree[0], "position_ids": tree[1]}
        if self.head32 is None:
            out = self.model(input_ids=ids.view(1, -1), use_cache=True, logits_to_keep=keep_logits,
                             **{cache_argument(type(self.model).forward): self.cache}, **extra)
            return out.logits[0, -keep_logits:, : self.vocab_size].float(), None
        base = self.model.base_model
        out = base(input_ids=ids.view(1, -1), use_cache=True, output_hidden_states=bool(layers),
                   **{cache_argument(type(base).forward): self.cache}, **extra)
        hidden = out.last_hidden_state[0]
        features = torch.cat([out.hidden_states[i + 1][0] for i in layers] + [hidden], -1) if layers else hidden
        return head_logits(self.model, self.head32, hidden[-keep_logits:], self.vocab_size), features


def head_logits(model, head32: tuple[torch.Tensor, torch.Tensor | None], h: torch.Tensor, vocab_size: int
                ) -> torch.Tensor:
    """Float32 logits [n, vocab_size] of last hidden states h [n, H] through the model's plain linear head (see
    float32_head): a float32 head multiplies in float32; a bf16 one multiplies in bf16 (packed where the head is)
    and then recomputes the REFINE_TOP best logits of each row exactly in float32."""
    weight, bias = head32
    if weight.dtype == torch.float32:
        logits = torch.nn.functional.linear(h.float(), weight, bias)
    else:
        head = model.get_output_embeddings()
        packed = isinstance(head, PackedLinear)
        logits = (head(h) if packed else torch.nn.functional.linear(h, weight, bias)).float()
        top = logits.topk(REFINE_TOP, dim=-1).indices  # [n, m]
        exact = torch.einsum("kh,kmh->km", h.float(), weight[top].float())
        if bias is not None:
            exact = exact + bias[top].float()
        logits.scatter_(1, top, exact)
    return logits[:, :vocab_size]


REFINE_TOP = 8  # logits recomputed in float32 per position: where argmax ties live, far beyond bf16 rounding


def float32_head(model) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """(weight, bias) of the model's LM head, for logits computed from the base model's last hidden state; None
    where the head is not a plain linear map of it (soft-capped or scaled logits).

    A float32 copy of a bf16 head would cost a second read of the largest matrix every step (SmolLM2: 113 MB, about
    6 ms of a 40 ms step here), so a bf16 model keeps its own weight: the product runs in bf16, and the REFINE_TOP
    best logits of each position are recomputed in float32 from their rows. Exact ties among the top logits,
    which bf16's 8-bit mantissa makes common, are gone; the order of everything below the top 8 cannot change an
    argmax."""
    cached = getattr(model, "_specdemo_head32", False)
    if cached is not False:
        return cached
    cfg, head = model.config, model.get_output_embeddings()
    plain = isinstance(head, torch.nn.Linear) and getattr(model, "base_model", model) is not model and not any(
        getattr(cfg, a, None) not in (None, 1.0) for a in ("final_logit_softcapping", "logit_scale", "logits_scaling"))
    result = None
    if plain:
        result = (head.weight.detach(), None if head.bias is None else head.bias.detach())
    model._specdemo_head32 = result
    return result


_DEVICE_LOCKS: dict[str, threading.Lock] = {}
_DEVICE_LOCKS_GUARD = threading.Lock()


def device_lock(device: torch.device | str) -> threading.Lock:
    """One lock per device: work from every session and every loaded pair on one device takes turns, a round at a
    time, instead of trampling each other's kernels and memory. One device under two names ('cuda' and 'cuda:0',
    'cpu' and 'cpu:0') has one lock."""
    with _DEVICE_LOCKS_GUARD:
        return _DEVICE_LOCKS.setdefault(device_key(device), threading.Lock())


def release_cuda_cache() -> None:
    """After CUDA ran out of memory: give its cached blocks back, in the device's turn (memory released while
    another thread captures a graph would fail that capture)."""
    with device_lock(torch.device("cuda")):
        torch.cuda.empty_cache()


def device_key(device: torch.device | str) -> str:
    """A device's name with its index: 'cuda' is the current CUDA device's ('cuda:0' where CUDA has not started,
    which it then makes current), 'cpu' is 'cpu:0'."""
    device = torch.device(device)
    if device.index is not None:
        return str(device)
    started = device.type == "cuda" and torch.cuda.is_initialized()
    return f"{device.type}:{torch.cuda.current_device() if started else 0}"


def _fresh_device_locks_after_fork() -> None:
    """In a forked child (a ZeroGPU worker is one) a device lock that another thread held at the fork would stay
    held forever: every ModelPair asks for its device's lock afresh (ModelPair.lock)."""
    global _DEVICE_LOCKS_GUARD
    _DEVICE_LOCKS_GUARD = threading.Lock()
    _DEVICE_LOCKS.clear()


os.register_at_fork(after_in_child=_fresh_device_locks_after_fork)


class PackedLinear(torch.nn.Linear):
    """An inference-only nn.Linear whose bf16 weight is also held packed in oneDNN's blocked layout (made once by
    `pack_linears`), so that a CPU with bf16 units does not lay it out again at every call (devices.packs_bf16). Its
    parameters, state dict and results stay those of the plain layer; where the weight has left the CPU or bf16,
    or a gradient is wanted, it computes as the plain layer does."""

    packed: torch.Tensor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if w.dtype != torch.bfloat16 or w.device.type != "cpu" or x.dtype != w.dtype or (
                torch.is_grad_enabled() and (w.requires_grad or x.requires_grad)):
            return torch.nn.functional.linear(x, w, self.bias)
        return packed_linear(x, self.packed, self.out_features, self.bias)


def pack_linears(model: torch.nn.Module) -> int:
    """Pack every plain bf16 nn.Linear of `model` in place (PackedLinear); returns how many. The packed copies take
    as many bytes again as those weights (pair_bytes counts them)."""
    n = 0
    for module in model.modules():
        if type(module) is torch.nn.Linear and module.weight.dtype == torch.bfloat16:
            module.packed = pack_weight(module.weight)
            module.__class__ = PackedLinear
            n += 1
    return n
