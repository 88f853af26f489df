"""The draft/target pair: `ModelPair` (two models that share a tokenizer, with their public labels), the check
that the two tokenizers agree, the shared vocabulary width (logits can be wider than the tokenizer, e.g. padded
embeddings), and the bytes and text of each token (byte-level and byte-fallback pieces, decoded incrementally by
`TextStream`). It does not load models (loading.py) or run them (lm.py)."""

from __future__ import annotations

import codecs
import re
import threading
from dataclasses import dataclass, field

import torch

from specdemo.config import PRESETS
from specdemo.i18n import Msg, Translatable

from . import chat_frame
from .devices import dtype_name
from .lm import CachedLM, device_lock
from .static import StaticLM
from .weights import ModelLoadError, display_id


class StrategyUnavailable(Translatable, ValueError):
    """The pair cannot draft with the strategy asked for (no EAGLE head for it). Nothing was loaded or changed."""


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
    _chat_frame: tuple[str, str] | None = field(default=None, repr=False)  # the text around a chat message
    draft_dtype: torch.dtype | None = None  # None: the same as the target's
    head: object | None = None  # the EAGLE head that drafts from this target's features, if any (eagle.EagleHead,
    #                             eagle3.Eagle3Head)
    head_error: Msg | None = None  # why a preset's head is not there (missing, damaged, mismatched)
    decoding: str = "eager"  # how new_lm's caches run: eager, static, graphs or compiled (static.prepare)
    decoding_note: str = ""  # why, in one line: the log and the page's device line say it
    static_slots: dict = field(default_factory=dict, repr=False)  # role -> static.StaticSlot, where not eager
    window_cap: int | None = None  # a window below the context's: static caches sized to the longest request, or a
    #                                 GPU too small for the whole window

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
        window = min(context_of(self.draft.config), context_of(self.target.config))
        return window if self.window_cap is None else min(window, self.window_cap)

    def new_lm(self, role: str = "target"):
        """A fresh KV-cached view of the target or the draft model for one run: a StaticLM over the pair's static
        slot where the pair decodes statically (static.prepare), a CachedLM otherwise."""
        slot = self.static_slots.get(role)
        if slot is not None:
            return StaticLM(slot)
        return CachedLM(self.target if role == "target" else self.draft, self.vocab_size)

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
        so a typed "<|im_end|>" stays plain text and cannot close the turn early. The text around the message is
        rendered once (chat_frame.py): a template that is not a preset's in a child with a time and memory limit."""
        if self._chat_frame is None:
            self._chat_frame = chat_frame.frame(self.tokenizer, self.name in PRESETS, self.target_label)
        before, after = self._chat_frame
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
            "decoding": self.decoding,
            "decoding_note": self.decoding_note,
        } | ({"head": self.head.published_name} if getattr(self.head, "published_name", None) else {})


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
