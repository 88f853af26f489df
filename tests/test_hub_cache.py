"""The hub cache keeps room for visitors' models (specdemo/models/hub_cache.py): what custom pairs download in the app
is deleted again past SPECDEMO_CUSTOM_CACHE_GB, least recently used first, and nothing else ever is.

The cache here is a real folder in huggingface_hub's layout, read by the real code. The downloads are files written
where the hub's would land (there is no hub here); sizes are sparse files, so a "gigabyte" costs no disk."""

from __future__ import annotations

import json

import huggingface_hub.constants
import pytest

from specdemo.app import validation
from specdemo.app.validation import UserError, get_pair
from specdemo.config import PRESETS
from specdemo.models import ModelLoadError
from specdemo.models import hub_cache as hc

GB = 10**9


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """An empty hub cache and specdemo cache folder for one test, with a 2 GB budget for visitors' models."""
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("SPECDEMO_CACHE", str(tmp_path / "specdemo"))
    monkeypatch.setenv(hc.BUDGET_ENV, "2")
    return cache


def plant(cache, repo_id: str, nbytes: int) -> None:
    """A repository as snapshot_download leaves it: a blob, a snapshot's link to it, and the ref."""
    folder = hc.repo_folder(cache, repo_id)
    (folder / "blobs").mkdir(parents=True)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text("abc123")
    with open(folder / "blobs" / "f00d", "wb") as f:
        f.truncate(nbytes)
    snap = folder / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "model.safetensors").symlink_to(folder / "blobs" / "f00d")


def present(cache, *ids) -> list[bool]:
    return [hc.repo_folder(cache, i).exists() for i in ids]


def load(cache, ids, nbytes=GB * 45 // 100, now=None, keep=()):
    """One visitor's load of a custom pair: what it did not find, it downloads; then the cache makes room."""
    new = [i for i in ids if not hc.repo_folder(cache, i).exists()]
    for i in new:
        plant(cache, i, nbytes)
    return hc.make_room(ids, new, keep, cache, now=now)


def test_visitors_models_past_the_budget_go_least_recently_used_first(hub):
    plant(hub, "operator/big", 5 * GB)  # in the cache before any visitor: never theirs
    assert load(hub, ["a/d", "a/t"], now=1) == []
    assert load(hub, ["b/d", "b/t"], now=2) == []
    assert load(hub, ["c/d", "c/t"], now=3) == ["a/d", "a/t"]  # 2.7 GB recorded > 2: the oldest pair goes
    assert present(hub, "a/d", "a/t", "b/d", "c/t", "operator/big") == [False, False, True, True, True]
    assert load(hub, ["b/d", "b/t"], now=4) == []  # used again, from disk: now the newest
    assert load(hub, ["e/d", "e/t"], now=5) == ["c/d", "c/t"]  # so c, not b, is the least recently used
    assert present(hub, "b/d", "b/t", "e/d", "e/t", "operator/big") == [True] * 5
    record = json.loads((hc.cache_root() / hc.RECORD).read_text())
    assert record == {"b/d": 4, "b/t": 4, "e/d": 5, "e/t": 5}


def test_models_in_use_and_those_already_there_are_kept_whatever_the_budget(hub, monkeypatch):
    monkeypatch.setenv(hc.BUDGET_ENV, "0")
    preset_target = PRESETS["smollm2"].target
    plant(hub, "mine/draft", GB)
    assert hc.visitor_ids(("mine/draft", preset_target, "new/head")) == ["mine/draft", "new/head"]
    assert load(hub, ["mine/draft", "new/head"], now=1) == []  # only new/head was downloaded
    assert load(hub, ["x/d", "x/t"], now=2, keep=["new/head"]) == []  # new/head: a pair this process holds
    assert load(hub, ["y/d", "y/t"], now=3) == ["new/head", "x/d", "x/t"]
    assert present(hub, "mine/draft", "y/d", "y/t") == [True] * 3  # budget 0: the pair just used stays


def test_a_damaged_record_forgets_rather_than_deletes(hub, monkeypatch):
    load(hub, ["a/d", "a/t"], now=1)
    (hc.cache_root() / hc.RECORD).write_text("{not json")
    monkeypatch.setenv(hc.BUDGET_ENV, "0")
    assert load(hub, ["b/d", "b/t"], now=2) == []  # a/* are no longer known to be the visitors'
    assert present(hub, "a/d", "a/t") == [True, True]


def test_the_app_records_what_a_custom_pair_downloads_even_when_its_load_fails(hub, monkeypatch):
    """validation.get_pair (every load in the app) wraps the load: a failed load's partial download is the
    visitors' too, and a preset's load touches nothing."""
    monkeypatch.setenv(hc.BUDGET_ENV, "1")
    load(hub, ["old/d", "old/t"], now=1)

    def download_then_fail(key):  # the hub's part of a load (no hub here): files land, then the load fails
        for i in key:
            if not hc.repo_folder(hub, i).exists():
                plant(hub, i, GB * 45 // 100)
        raise ModelLoadError("load.no_such_model")

    monkeypatch.setattr(validation, "load_pair", download_then_fail)
    with pytest.raises(UserError):
        get_pair(("visitor/draft", "visitor/target"))
    assert present(hub, "old/d", "old/t", "visitor/draft", "visitor/target") == [False, False, True, True]
    assert set(json.loads((hc.cache_root() / hc.RECORD).read_text())) == {"visitor/draft", "visitor/target"}

    monkeypatch.setenv(hc.BUDGET_ENV, "-1")  # a bad budget is logged, and the load still says its own sentence
    with pytest.raises(UserError):
        get_pair(("visitor/draft", "other/target"))
    assert present(hub, "other/target") == [True]


def test_a_preset_load_leaves_the_cache_and_the_record_alone(hub, monkeypatch):
    monkeypatch.setenv(hc.BUDGET_ENV, "0")
    load(hub, ["a/d", "a/t"], now=1)
    before = (hc.cache_root() / hc.RECORD).read_text()
    get_pair("shakespeare")
    assert present(hub, "a/d", "a/t") == [True, True]
    assert (hc.cache_root() / hc.RECORD).read_text() == before
