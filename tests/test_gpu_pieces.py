"""scripts/gpu_pieces.py: a GPU call carries at most 64 MiB with the tracked tree, so a piece of model files too
large for one call is split into pieces that fit, and together they give back every file, byte for byte."""

from __future__ import annotations

import os
import tarfile

import gpu_pieces
import pytest


def test_a_piece_too_large_is_split_into_pieces_that_fit_and_give_back_every_file(tmp_path):
    source = tmp_path / "assets" / "models"
    files = {f"pair-{i // 3}/part-{i}.bin": os.urandom(1000 + 300 * i) for i in range(7)}
    for name, data in files.items():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_bytes(data)
    piece = tmp_path / ".gpu" / "d"
    piece.mkdir(parents=True)
    with tarfile.open(piece / "models.tar", "w") as tar:
        tar.add(source, arcname="assets/models")
    budget = 3 * tarfile.RECORDSIZE  # 30 KiB: room for 10 KiB of files after a tar's end

    made = gpu_pieces.split(piece / "models.tar", budget, ["e", "f", "g", "h"])

    assert made and made == ["e", "f", "g", "h"][: len(made)], made
    back = tmp_path / "staged"
    for letter in ["d", *made]:
        tar_path = tmp_path / ".gpu" / letter / "models.tar"
        assert tar_path.stat().st_size <= budget, (letter, tar_path.stat().st_size)
        with tarfile.open(tar_path) as tar:
            tar.extractall(back, filter="data")
    assert {name: (back / "assets/models" / name).read_bytes() for name in files} == files


def test_a_file_larger_than_one_call_stops_with_the_reason(tmp_path):
    piece = tmp_path / ".gpu" / "d"
    piece.mkdir(parents=True)
    (tmp_path / "big.bin").write_bytes(os.urandom(20_000))
    with tarfile.open(piece / "models.tar", "w") as tar:
        tar.add(tmp_path / "big.bin", arcname="assets/models/big.bin")
    with pytest.raises(SystemExit, match="larger than one call can carry"):
        gpu_pieces.split(piece / "models.tar", 3 * tarfile.RECORDSIZE, ["e"])
