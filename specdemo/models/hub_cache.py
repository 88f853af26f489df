"""Room for visitors' models in the hub cache: what the page's custom pairs download is deleted again, least
recently used first, once it passes a budget.

A visitor who names a custom pair (app/validation.check_custom_ids: hub ids under the size cap) makes the server
download both models, and a head, into the hub cache. Nothing else ever deletes them, and a Space's disk is small
and ephemeral (https://huggingface.co/docs/hub/spaces-storage), so a public Space whose visitors try model after
model would fill it. Here each load of a custom pair in the app (`visitor_download`, around validation.get_pair's
load and zerogpu.prefetch_pair's fetch) records the hub repositories that it brought into the cache, with the time
of their last use, in `visitor-models.json` under specdemo's cache folder (weights.cache_root). After the load, the
least recently used of the recorded repositories are deleted while they take more than SPECDEMO_CUSTOM_CACHE_GB
(default 20) together.

Never deleted: a repository that was in the cache before a visitor's load brought it (the operator's, or another
program's), a preset's models and head, and the models of every pair that this process holds or is loading
(loading.model_ids_in_use). A pair that another process holds (a ZeroGPU worker's) keeps its weights in memory; its
next load there fetches them again. The CLI and the Python API never come here: what they download is the user's.

Owns the record and the deletion only. It reads the hub cache's documented layout (one `models--owner--name`
folder per repository) and nothing else of huggingface_hub's.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from specdemo.config import PRESETS, env_int

from .weights import cache_root, is_local

BUDGET_ENV = "SPECDEMO_CUSTOM_CACHE_GB"
DEFAULT_BUDGET_GB = 20
RECORD = "visitor-models.json"  # {hub id: the time of its last use (time.time())}
log = logging.getLogger("specdemo")


def budget_bytes() -> int:
    """SPECDEMO_CUSTOM_CACHE_GB in bytes (10^9 a GB): what the visitors' models may take on disk together."""
    gb = env_int(BUDGET_ENV, DEFAULT_BUDGET_GB)
    if gb < 0:
        raise ValueError(f"environment variable {BUDGET_ENV}={gb} must be 0 or more (gigabytes)")
    return gb * 10**9


def hub_cache_dir() -> Path:
    """The hub cache that from_pretrained and snapshot_download write to (HF_HUB_CACHE, else HF_HOME/hub)."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def repo_folder(cache: Path, repo_id: str) -> Path:
    """A model repository's folder in the hub cache (huggingface_hub's layout: models--owner--name)."""
    return cache / ("models--" + repo_id.replace("/", "--"))


def preset_ids() -> set[str]:
    """The hub ids that presets name (their models and heads): the operator's, never a visitor's."""
    return {i for p in PRESETS.values() for i in (p.draft, p.target, getattr(p, "eagle3_head", None)) if i}


def visitor_ids(key) -> list[str]:
    """The hub ids of a custom pair's key (draft, target[, head]) that could be a visitor's download: not a
    folder and not a preset's. A preset's key (a name) has none."""
    if not isinstance(key, tuple):
        return []
    presets = preset_ids()
    return [i for i in key if isinstance(i, str) and i and not is_local(i) and i not in presets]


def folder_bytes(folder: Path) -> int:
    """The bytes of the regular files under `folder` (a repository's blobs; its snapshots are links to them)."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            path = Path(root, name)
            if not path.is_symlink():
                total += path.stat().st_size
    return total


@contextmanager
def _locked_record() -> Iterator[dict]:
    """The record, read under an exclusive file lock (processes share the disk: a ZeroGPU worker is another) and
    written back atomically when the block ends without an error."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    path = root / RECORD
    with open(root / (RECORD + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            record = json.loads(path.read_text()) if path.exists() else {}
        except (OSError, ValueError):  # a damaged record forgets what it held: nothing is deleted on its word
            record = {}
        yield record
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(record, indent=1, sort_keys=True))
        os.replace(tmp, path)


def make_room(used: Iterable[str], new: Iterable[str], keep: Iterable[str], cache: Path | None = None,
              now: float | None = None) -> list[str]:
    """Record that visitors used the hub ids `used` at `now` (those in `new` are recorded for the first time: they
    were not in the cache before); then delete the least recently used recorded repositories, other than `keep`
    and `used`, while the recorded ones take more than the budget. Returns the ids deleted, oldest first."""
    cache = cache or hub_cache_dir()
    now = time.time() if now is None else now
    used, new, keep = set(used), set(new), set(keep) | set(used)
    deleted = []
    with _locked_record() as record:
        for repo_id in used:
            if repo_id in record or repo_id in new:
                record[repo_id] = now
        for repo_id in [i for i in record if not repo_folder(cache, i).exists()]:
            del record[repo_id]  # deleted by someone else, or never downloaded (a failed load's ids)
        sizes = {repo_id: folder_bytes(repo_folder(cache, repo_id)) for repo_id in record}
        total, budget = sum(sizes.values()), budget_bytes()
        for repo_id in sorted(record, key=record.get):
            if total <= budget:
                break
            if repo_id in keep:
                continue
            shutil.rmtree(repo_folder(cache, repo_id), ignore_errors=True)
            del record[repo_id]
            total -= sizes[repo_id]
            deleted.append(repo_id)
    if deleted:
        log.info("visitors' models took more than %s GB of the hub cache: deleted %s", budget // 10**9, deleted)
    return deleted


@contextmanager
def visitor_download(key) -> Iterator[None]:
    """Around the app's load or fetch of the pair `key`: the hub repositories of a custom pair that were not in the
    cache before it are recorded as the visitors'; afterwards (failed or not: a failed download leaves files too)
    the cache makes room (make_room), keeping the models of the pairs that this process holds or is loading then.
    A preset's key does nothing."""
    ids = visitor_ids(key)
    if not ids:
        yield
        return
    cache = hub_cache_dir()
    new = [i for i in ids if not repo_folder(cache, i).exists()]
    try:
        yield
    finally:
        try:
            from .loading import model_ids_in_use

            make_room(ids, new, model_ids_in_use(), cache)
        except Exception as err:  # noqa: BLE001 - a cache that cannot be tidied must not fail the visitor's load
            log.warning("the hub cache could not make room for visitors' models: %r", err)
