"""The hub cache keeps room for visitors' models (specdemo/models/hub_cache.py): what custom pairs download in the app
is deleted again past SPECDEMO_CUSTOM_CACHE_GB, least recently used first, and nothing else ever is.

The cache is a real folder in huggingface_hub's layout, whose repositories huggingface_hub's own code deletes, with its
cache-wide store of shared blobs where a test needs one. The downloads are files written where the hub's would land
(there is no hub here); the sizes are sparse files, so a "gigabyte" costs no disk. One test loads a real model
from the hub cache, offline."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import huggingface_hub.constants
import pytest

from specdemo.app import validation
from specdemo.app.validation import CUSTOM, UserError, get_pair, pair_key
from specdemo.config import PRESETS
from specdemo.limits import Limits
from specdemo.models import ModelLoadError, unload_pair
from specdemo.models import hub_cache as hc
from specdemo.models.loading import model_ids_in_use

GB = 10**9
PART = GB * 45 // 100  # a model of a test's pairs: two pairs take 1.8 GB, under a 2 GB budget, and three do not
ASSETS = Path(__file__).resolve().parent.parent / "assets" / "models"


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """An empty hub cache and specdemo cache folder for one test, with a 2 GB budget for visitors' models. The
    cache is reached through a link, as one moved to a bigger disk often is (huggingface_hub resolves it)."""
    (tmp_path / "disk" / "hub").mkdir(parents=True)
    cache = tmp_path / "hub"
    cache.symlink_to(tmp_path / "disk" / "hub")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("SPECDEMO_CACHE", str(tmp_path / "specdemo"))
    monkeypatch.setenv(hc.BUDGET_ENV, "2")
    return cache


def commit_of(repo_id: str) -> str:
    return hashlib.sha1(repo_id.encode()).hexdigest()  # each repository its own revision, as on the hub


def plant(cache, repo_id: str, nbytes: int = PART, files: dict[str, Path] | None = None, xet: str | None = None):
    """A repository as a hub download leaves it: blobs, a snapshot's links to them, and the ref. `files`: real
    files to copy in (name: source), else one sparse weights file of `nbytes`. `xet`: the weights' Xet hash, their
    blob then moved into (or linked from) the cache-wide shared store, as huggingface_hub 2.4 does for Xet files."""
    folder, commit = hc.repo_folder(cache, repo_id), commit_of(repo_id)
    (folder / "blobs").mkdir(parents=True)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(commit)
    snap = folder / "snapshots" / commit
    snap.mkdir(parents=True)
    store = shared_store() if xet else None
    where = dict(xet_hash=xet, cache_dir=cache, expected_size=nbytes)
    for name, source in (files or {"model.safetensors": None}).items():
        blob = folder / "blobs" / hashlib.sha256(f"{repo_id}/{name}".encode()).hexdigest()
        if source is not None:
            shutil.copyfile(source, blob)
        elif store and store.has_shared_blob(**where):  # another repository brought the same file: a link to it
            assert store.try_link_from_shared_store(blob_path=str(blob), **where)
        else:
            with open(blob, "wb") as f:
                f.truncate(nbytes)
            if store:  # the first repository with this file: it moves into the store, the blob links to it
                assert store.publish_blob_to_shared_store(blob_path=str(blob), **where)
        (snap / name).symlink_to(os.path.relpath(blob, snap))


def shared_store():
    """huggingface_hub's store of shared blobs (2.4; a private module: a version without it skips the test)."""
    return pytest.importorskip("huggingface_hub.utils._shared_blobs")


def present(cache, *ids) -> list[bool]:
    return [hc.repo_folder(cache, i).exists() for i in ids]


def visit(cache, ids, now, keep=()):
    """One visitor's custom pair at time `now`: claimed before the hub is asked, the missing part downloaded, then
    the cache makes room."""
    hc.claim(ids, now=now)
    for i in ids:
        if not hc.repo_folder(cache, i).exists():
            plant(cache, i)
    return hc.make_room(keep, cache, now=now)


def record():
    return json.loads((hc.cache_root() / hc.RECORD).read_text())


def test_visitors_models_past_the_budget_go_least_recently_used_first(hub):
    plant(hub, "operator/big", 5 * GB)  # in the cache before any visitor: never theirs
    assert visit(hub, ["a/d", "a/t"], 1000) == []
    assert visit(hub, ["b/d", "b/t"], 2000) == []
    assert visit(hub, ["c/d", "c/t"], 3000) == ["a/d", "a/t"]  # 2.7 GB recorded > 2: the oldest pair goes
    assert present(hub, "a/d", "a/t", "b/d", "c/t", "operator/big") == [False, False, True, True, True]
    assert visit(hub, ["b/d", "b/t"], 4000) == []  # used again, from disk: now the newest
    assert visit(hub, ["e/d", "e/t"], 5000) == ["c/d", "c/t"]  # so c, not b, is the least recently used
    assert present(hub, "b/d", "b/t", "e/d", "e/t", "operator/big") == [True] * 5
    assert record() == {"b/d": 4000, "b/t": 4000, "e/d": 5000, "e/t": 5000}


def test_what_was_there_before_what_is_in_use_and_what_was_just_used_stay(hub, monkeypatch):
    monkeypatch.setenv(hc.BUDGET_ENV, "0")
    preset_target = PRESETS["smollm2"].target
    plant(hub, "mine/draft")
    plant(hub, preset_target)
    visit(hub, ["mine/draft", preset_target, "new/head"], 1000)  # only new/head is the visitors'
    assert record() == {"new/head": 1000}
    assert visit(hub, ["x/d", "x/t"], 1300) == []  # new/head was used 300 s ago: a load elsewhere may read it
    assert visit(hub, ["y/d", "y/t"], 2000, keep=["x/t"]) == ["new/head", "x/d"]  # x/t: a pair this process holds
    assert present(hub, "mine/draft", preset_target, "x/t", "y/d", "y/t") == [True] * 5


def test_a_shared_blob_goes_with_its_last_repository_and_stays_while_another_uses_it(hub, monkeypatch):
    """huggingface_hub 2.4 keeps Xet files once for the whole cache, each repository's blob a link to it: the
    links alone are the repository's files, so a deletion that removed only the folder would free nothing."""
    monkeypatch.setenv(hc.BUDGET_ENV, "0")
    _shared_blobs = shared_store()
    shared, alone = "ab" * 32, "cd" * 32
    plant(hub, "operator/model", GB, xet=shared)  # the operator's copy came first
    hc.claim(["v/copy", "v/alone"], now=1000)
    plant(hub, "v/copy", GB, xet=shared)  # a visitor's repository holding the same file
    plant(hub, "v/alone", GB, xet=alone)
    assert hc.make_room((), hub, now=5000) == ["v/alone", "v/copy"]
    assert not _shared_blobs.shared_blob_path(hub, alone).exists()  # its one user is gone: the payload too
    assert _shared_blobs.shared_blob_path(hub, shared).stat().st_size == GB  # the operator's still reads it
    assert (hc.repo_folder(hub, "operator/model") / "snapshots" / commit_of("operator/model")
            / "model.safetensors").stat().st_size == GB


def test_a_download_cut_short_counts_and_goes(hub, monkeypatch):
    """A download that died halfway leaves its partial file beside the snapshot's first files: it counts."""
    monkeypatch.setenv(hc.BUDGET_ENV, "1")
    hc.claim(["cut/short"], now=1000)
    plant(hub, "cut/short", 1000)  # its config arrived...
    with open(hc.repo_folder(hub, "cut/short") / "blobs" / "f00d.0123.incomplete", "wb") as f:
        f.truncate(5 * GB)  # ...and 5 GB of its weights, before it died
    assert hc.repo_bytes(hc.repo_folder(hub, "cut/short")) > 5 * GB
    assert visit(hub, ["a/d"], 5000) == ["cut/short"]


def test_ids_never_fetched_are_forgotten_and_presets_are_never_the_visitors(hub, monkeypatch):
    monkeypatch.setenv(hc.BUDGET_ENV, "0")
    preset = PRESETS["qwen3-8b-eagle3"].target  # not in this cache: a visitor naming it must not make it theirs
    hc.claim(["gone/d", "gone/t", preset, preset.upper()], now=1000)  # a refused pair's ids, never fetched
    assert record() == {"gone/d": 1000, "gone/t": 1000}
    hc.claim(["a/d"], now=1000 + 2 * hc.GRACE_S)
    assert record() == {"a/d": 1000 + 2 * hc.GRACE_S}
    plant(hub, preset)  # a record written before this id became a preset's: the preset stays
    (hc.cache_root() / hc.RECORD).write_text(json.dumps({preset: 1}))
    assert hc.make_room((), hub, now=10**6) == [] and present(hub, preset) == [True]


def test_a_damaged_record_forgets_rather_than_deletes(hub, monkeypatch):
    visit(hub, ["a/d", "a/t"], 1000)
    monkeypatch.setenv(hc.BUDGET_ENV, "0")
    for damaged in ("{not json", '["a/d"]', '{"a/d": "yesterday"}'):
        (hc.cache_root() / hc.RECORD).write_text(damaged)
        assert visit(hub, ["b/d", "b/t"], 5000) == []  # a/* are no longer known to be the visitors'
        assert present(hub, "a/d", "a/t") == [True, True]


def test_a_record_that_cannot_be_kept_changes_nothing_for_the_visitor(hub, monkeypatch, tmp_path):
    """specdemo's cache folder unusable (here a file): a custom pair still gets its own sentence, and a load's
    tidying only logs."""
    (tmp_path / "not-a-folder").write_text("")
    monkeypatch.setenv("SPECDEMO_CACHE", str(tmp_path / "not-a-folder"))
    with pytest.raises(UserError) as err:
        pair_key(CUSTOM, "visitor/a", "visitor/b", Limits.from_env())
    assert "visitor/a" in err.value.text("en")  # the hub miss's sentence, naming the model
    hc.tidy()


def test_a_forked_process_does_not_keep_the_record_locked(hub):
    """A ZeroGPU worker is a fork of the serving process, made while any thread may hold the record. The child must
    not hold its lock on after the parent lets go (an inherited flock would), nor inherit a held thread lock."""
    with hc._locked_record():
        pid = os.fork()
        if pid == 0:  # the child: it waits for the parent's release, then takes the record itself
            try:
                with hc._locked_record(wait_s=5):
                    pass
                time.sleep(3)  # lives on, as a worker does
                os._exit(0)
            except BaseException:
                os._exit(1)
    start = time.monotonic()
    with hc._locked_record(wait_s=2):  # the child, alive, holds nothing the parent needs
        pass
    assert time.monotonic() - start < 2
    assert os.waitpid(pid, 0)[1] == 0


def test_the_app_claims_a_custom_pair_before_its_config_and_keeps_it_while_loaded(hub, monkeypatch):
    """The path of a visitor's custom pair, for real: validation.pair_key claims the ids before it reads their
    configs (which already fetches files into their folders), the pair loads from the hub cache, and its files stay
    while this process holds the pair, then go once it does not."""
    monkeypatch.setenv(hc.BUDGET_ENV, "0")
    limits = Limits.from_env()
    ids = ("visitor/tiny-draft", "visitor/tiny-target")
    with pytest.raises(UserError):  # not on the hub (offline here): its config cannot be read...
        pair_key(CUSTOM, *ids, limits)
    assert set(record()) == set(ids)  # ...but the names were claimed first
    for repo_id, folder in zip(ids, ("shakespeare-draft", "shakespeare-target")):  # the hub's download
        plant(hub, repo_id, files={p.name: p for p in (ASSETS / folder).iterdir()})
    key = pair_key(CUSTOM, *ids, limits)
    pair = get_pair(key)
    assert pair.describe() and set(ids) <= model_ids_in_use()
    later = time.time() + 10 * hc.GRACE_S
    assert hc.make_room(model_ids_in_use(), hub, now=later) == []  # loaded here: kept past any budget
    unload_pair(key)
    assert hc.make_room(model_ids_in_use(), hub, now=later) == list(ids)
    assert present(hub, *ids) == [False, False]


def test_a_failed_load_still_makes_room_and_a_preset_load_touches_nothing(hub, monkeypatch):
    monkeypatch.setenv(hc.BUDGET_ENV, "1")
    visit(hub, ["old/d", "old/t"], time.time() - 10 * hc.GRACE_S)
    hc.claim(["visitor/draft", "visitor/target"])

    def download_then_fail(key):  # the hub's part of a load (no hub here): files land, then the load fails
        for i in key:
            plant(hub, i)
        raise ModelLoadError("load.no_such_model")

    real_load = validation.load_pair
    monkeypatch.setattr(validation, "load_pair", download_then_fail)
    with pytest.raises(UserError):
        get_pair(("visitor/draft", "visitor/target"))
    assert present(hub, "old/d", "old/t", "visitor/draft", "visitor/target") == [False, False, True, True]

    monkeypatch.setattr(validation, "load_pair", real_load)
    before = (hc.cache_root() / hc.RECORD).read_text()
    get_pair("shakespeare")
    assert (hc.cache_root() / hc.RECORD).read_text() == before
