"""Room for visitors' models in the hub cache: what the page's custom pairs download is deleted again, least
recently used first, once it passes a budget.

A visitor who names a custom pair (app/validation.check_custom_ids: hub ids under the size cap) makes the server
download both models, and a head, into the hub cache. Nothing else ever deletes them, and a Space's disk is small
and ephemeral (https://huggingface.co/docs/hub/spaces-storage), so a public Space whose visitors try model after
model would fill it. So:

- `claim`, called at a custom pair's first contact with the hub (before its configs are read), records the ids
  whose repositories are not in the cache yet as the visitors', and marks the time of every recorded one's use, in
  `visitor-models.json` under specdemo's cache folder (weights.cache_root). A repository that was in the cache
  before a visitor named it (the operator's, another program's) is never recorded, nor is a preset's.
- `make_room`, called after a custom pair's load or fetch, deletes the least recently used recorded repositories,
  through huggingface_hub's own deletion (which also sweeps the blobs that its cache-wide store shares), while the
  recorded ones take more than SPECDEMO_CUSTOM_CACHE_GB (default 20). It never deletes a preset's repository, one
  of a pair that this process holds, is loading (loading.model_ids_in_use) or is fetching (`using`), or one used
  in the last GRACE_S seconds: a pair that another process is fetching or loading (a ZeroGPU worker's) was used
  moments before. It reads only the recorded repositories' folders, never the whole cache.

Processes share the record (a ZeroGPU worker is a forked one), so it is read and written under a POSIX record lock,
which a forked child does not inherit, beside a lock for this process's threads. The CLI and the Python API never
come here: what they download is their user's.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from specdemo.config import PRESETS, env_int

from .weights import cache_root, is_local

try:
    import fcntl
except ImportError:  # not POSIX (Windows): this process's lock alone
    fcntl = None

BUDGET_ENV = "SPECDEMO_CUSTOM_CACHE_GB"
DEFAULT_BUDGET_GB = 20
GRACE_S = 600  # a repository used this recently stays: a load or fetch elsewhere may be reading it
LOCK_WAIT_S = 10.0
RECORD = "visitor-models.json"  # {hub id: the time of its last use (time.time())}
log = logging.getLogger("specdemo")
_THREAD_LOCK = threading.Lock()


def _fresh_lock_after_fork() -> None:
    """A forked child's copies of the locks may be held by threads that do not exist there, whose fetches neither."""
    global _THREAD_LOCK, _USING_LOCK
    _THREAD_LOCK, _USING_LOCK = threading.Lock(), threading.Lock()
    _USING.clear()


os.register_at_fork(after_in_child=_fresh_lock_after_fork)


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


def visitor_ids(ids: Iterable) -> list[str]:
    """The ids among `ids` (a custom pair's key: draft, target[, head]) that could be a visitor's download: not a
    folder and not a preset's. A preset's key (a name, not a tuple) has none."""
    if not isinstance(ids, (tuple, list)):
        return []
    presets = {i.casefold() for i in preset_ids()}  # a case variant names the same folder on macOS's disks
    return [i for i in ids if isinstance(i, str) and i and not is_local(i) and i.casefold() not in presets]


def present(key) -> bool:
    """Whether every visitor's repository of a pair's key is in the hub cache (a preset's always counts as there)."""
    cache = hub_cache_dir()
    return all(repo_folder(cache, i).exists() for i in visitor_ids(key))


@contextmanager
def _locked_record(wait_s: float = LOCK_WAIT_S) -> Iterator[dict]:
    """The record, read under this process's lock and a POSIX lock on a file beside it (other processes), and
    written back atomically when the block ends without an error. TimeoutError after `wait_s` of waiting. Where the
    file system has no POSIX locks, this process's lock alone."""
    thread_lock = _THREAD_LOCK  # the one taken is the one given back, even in a child forked inside the block
    if not thread_lock.acquire(timeout=wait_s):
        raise TimeoutError("the visitors' models record is busy")
    try:
        root = cache_root()
        root.mkdir(parents=True, exist_ok=True)
        path = root / RECORD
        with open(root / (RECORD + ".lock"), "a+") as lock:
            deadline = time.monotonic() + wait_s
            while fcntl is not None:
                try:
                    fcntl.lockf(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as err:
                    if err.errno not in (errno.EACCES, errno.EAGAIN):  # no POSIX locks here (some NFS, FUSE)
                        break
                    if time.monotonic() > deadline:
                        raise TimeoutError("the visitors' models record is busy") from None
                    time.sleep(0.05)
            record = _read(path)
            yield record
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(record, indent=1, sort_keys=True))
            os.replace(tmp, path)
    finally:
        thread_lock.release()


def _read(path: Path) -> dict[str, float]:
    """The record at `path`; a damaged one (not JSON, or not {id: time}) forgets what it held: nothing is deleted
    on its word."""
    try:
        record = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError):
        return {}
    ok = isinstance(record, dict) and all(isinstance(t, (int, float)) and not isinstance(t, bool)
                                          for t in record.values())
    return record if ok else {}


_USING: dict[str, int] = {}  # ids that this process is fetching (`using`), with how many fetches
_USING_LOCK = threading.Lock()


@contextmanager
def using(ids: Iterable) -> Iterator[None]:
    """Keep the repositories of `ids` from make_room while the block runs (a fetch, however long it takes)."""
    ids = visitor_ids(list(ids))
    with _USING_LOCK:
        for i in ids:
            _USING[i] = _USING.get(i, 0) + 1
    try:
        yield
    finally:
        with _USING_LOCK:
            for i in ids:
                _USING[i] -= 1
                if not _USING[i]:
                    del _USING[i]


def _forget_absent(record: dict, cache: Path, now: float) -> None:
    """Drop the recorded ids whose repositories are not in the cache, were not used within GRACE_S and are not
    being fetched here (`using`): deleted by someone else, or never fetched (a refused pair's ids)."""
    with _USING_LOCK:
        fetching = set(_USING)
    for repo_id in [i for i, t in record.items()
                    if now - t > GRACE_S and i not in fetching and not repo_folder(cache, i).exists()]:
        del record[repo_id]


def claim(ids: Iterable, now: float | None = None) -> None:
    """At a custom pair's first contact with the hub: its ids whose repositories are not in the cache become the
    visitors' (recorded), and every recorded one is marked used `now`. Before any of its files are fetched, so a
    download that dies halfway is recorded all the same."""
    ids = visitor_ids(list(ids))
    if not ids:
        return
    cache, now = hub_cache_dir(), time.time() if now is None else now
    with _locked_record() as record:
        _forget_absent(record, cache, now)
        for repo_id in ids:
            if repo_id in record or not repo_folder(cache, repo_id).exists():
                record[repo_id] = now


def repo_bytes(folder: Path) -> int:
    """What a repository takes: its blobs, partial downloads among them, each link into huggingface_hub 2.4's
    cache-wide store of shared blobs counted at the size of the file it names (for every repository that links it)."""
    total = 0
    try:
        blobs = list((folder / "blobs").iterdir())
    except OSError:  # no blobs yet
        return 0
    for blob in blobs:
        try:
            total += blob.stat().st_size
        except OSError:  # a link to a store entry that went, a partial download renamed meanwhile
            pass
    return total


def _delete(cache: Path, repo_id: str) -> None:
    """A repository out of the cache by huggingface_hub's own deletion, which sweeps the shared blobs that only it
    linked; where that deletion predates the shared store (no cache_dir field), the folder is all there is."""
    import shutil

    from huggingface_hub import DeleteCacheStrategy

    folder = repo_folder(cache, repo_id)
    try:
        plan = DeleteCacheStrategy(expected_freed_size=0, blobs=frozenset(), refs=frozenset(),
                                   repos=frozenset({folder}), snapshots=frozenset(), cache_dir=cache)
    except TypeError:
        shutil.rmtree(folder, ignore_errors=True)
        return
    plan.execute()


def make_room(keep: Iterable[str] = (), cache: Path | None = None, now: float | None = None) -> list[str]:
    """Delete the least recently used recorded repositories while the recorded ones take more than the budget,
    keeping `keep`, the presets', those that this process is fetching (`using`) and those used within GRACE_S of
    `now`. Returns the ids deleted, oldest first."""
    cache = (cache or hub_cache_dir()).resolve()  # as huggingface_hub's deletion compares its paths
    now = time.time() if now is None else now
    with _USING_LOCK:
        keep = set(keep) | preset_ids() | set(_USING)
    deleted = []
    with _locked_record() as record:
        budget = budget_bytes()
        _forget_absent(record, cache, now)
        sizes = {i: repo_bytes(repo_folder(cache, i)) for i in record if repo_folder(cache, i).exists()}
        total = sum(sizes.values())
        for repo_id in sorted(sizes, key=lambda i: (record[i], i)):  # the oldest first, then by name
            if total <= budget:
                break
            if repo_id in keep or now - record[repo_id] <= GRACE_S:
                continue
            _delete(cache, repo_id)
            if not repo_folder(cache, repo_id).exists():
                del record[repo_id]
                total -= sizes[repo_id]
                deleted.append(repo_id)
    if deleted:
        log.info("visitors' models took more than %s GB of the hub cache: deleted %s", budget // 10**9, deleted)
    return deleted


def tidy() -> None:
    """make_room after a custom pair's load or fetch, keeping the pairs that this process holds or is loading
    (loading.model_ids_in_use); logged instead of raised: a cache that cannot be tidied must not fail the visitor's
    request."""
    from .loading import model_ids_in_use

    try:
        make_room(model_ids_in_use())
    except Exception as err:  # noqa: BLE001 - a full disk, a busy record, a bad budget: said in the log
        log.warning("the hub cache could not make room for visitors' models: %r", err)


def claim_quietly(ids: Iterable) -> None:
    """claim, logged instead of raised (check_custom_ids calls it before any config is read)."""
    try:
        claim(ids)
    except Exception as err:  # noqa: BLE001 - the visitor's request goes on; only the record misses this use
        log.warning("the visitors' models record could not be updated: %r", err)
