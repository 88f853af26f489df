"""Run after `bash ../shared/gpu/pack.sh`: checks that each piece in .gpu travels within one call's 64 MiB together
with the tracked tree (which every call carries), and splits a piece of model files that does not into pieces
that do, named with the next free letters. Each new piece is staged as the others are (`bash .gpu/run.sh part e`).

By 2026-11-27 the tracked tree had grown to 6.2 MB, and pack.sh's Shakespeare piece (.gpu/d, 61.2 MB) no longer
fitted beside it: 67.37 MB against 67.11. The GGUF's pieces (b, c) are not split: run.sh joins them by name.

    .venv/bin/python scripts/gpu_pieces.py        # prints each piece's size, and the pieces it made
"""

from __future__ import annotations

import io
import string
import subprocess
import sys
import tarfile
from pathlib import Path

LIMIT = 64 * 2**20  # what one call carries: the working tree and the ignored paths it names
MARGIN = 2**20  # tar headers, and files written between packing and the call


def tracked_bytes() -> int:
    """The bytes of every tracked file (pack.sh has untracked assets/models for now)."""
    names = subprocess.run(["git", "ls-files", "-z"], check=True, capture_output=True).stdout.split(b"\0")
    return sum(Path(n.decode()).stat().st_size for n in names if n and Path(n.decode()).is_file())


def size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else path.stat().st_size


def _cost(member: tarfile.TarInfo) -> int:
    """A member's bytes in a tar: its data in whole blocks, its header, and a long name's extra header."""
    return -(-member.size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE + 3 * tarfile.BLOCKSIZE


def split(tar_path: Path, budget: int, free: list[str]) -> list[str]:
    """Regroups tar_path's members, in order, into tars of at most `budget` bytes each: the first stays where
    tar_path was, the others go to <letter>/models.tar beside its folder, for the next free letters. Returns the
    letters it used."""
    room = budget - 2 * tarfile.RECORDSIZE  # a tar's end: two zero blocks, then padding to a whole record
    groups: list[list[tarfile.TarInfo]] = [[]]
    with tarfile.open(tar_path) as tar:
        members = tar.getmembers()
        if any(_cost(m) > room for m in members):
            sys.exit(f"a file in {tar_path} is larger than one call can carry beside the tree: {budget} bytes")
        used = 0
        for m in members:
            if groups[-1] and used + _cost(m) > room:
                groups.append([])
                used = 0
            groups[-1].append(m)
            used += _cost(m)
        data = {m.name: tar.extractfile(m).read() if m.isfile() else None for m in members}
    letters = [tar_path.parent.name] + free[: len(groups) - 1]
    for letter, group in zip(letters, groups, strict=True):
        out = tar_path.parent.parent / letter / "models.tar"
        out.parent.mkdir(exist_ok=True)
        with tarfile.open(out, "w") as tar:
            for m in group:
                tar.addfile(m, None if data[m.name] is None else io.BytesIO(data[m.name]))
    return letters[1:]


def main() -> None:
    root = Path(".gpu")
    if not root.is_dir():
        sys.exit("no .gpu here: run `bash ../shared/gpu/pack.sh` from the project's root first")
    loose = sum(size(f) for f in root.iterdir() if f.is_file())  # run.sh and profile.py travel with each call
    budget = LIMIT - tracked_bytes() - loose - MARGIN
    pieces = sorted(p for p in root.iterdir() if p.is_dir())
    free = [c for c in string.ascii_lowercase if not (root / c).exists()]
    for piece in pieces:
        tar = piece / "models.tar"
        if size(piece) <= budget:
            print(f"{piece}: {size(piece):,} bytes, fits ({budget:,} free beside the tree)")
        elif tar.exists() and size(piece) == size(tar):
            before = size(tar)
            made = split(tar, budget, free)
            free = free[len(made):]
            print(f"{piece}: {before:,} bytes did not fit; split into {piece}, "
                  + ", ".join(f".gpu/{c}" for c in made) + ": stage each with `bash .gpu/run.sh part X`")
            for c in [piece.name, *made]:
                print(f"  .gpu/{c}: {size(root / c):,} bytes")
        else:
            sys.exit(f"{piece}: {size(piece):,} bytes, over the {budget:,} free beside the tree, and not only a "
                     "models.tar that could be split")
    print_calls(root, budget)


def print_calls(root: Path, budget: int) -> None:
    """The calls that stage and run, one a line: a model piece small enough to travel beside .gpu/c (which every
    `run` carries) is staged in the run's own call, which saves the machine a call."""
    parts = sorted(p.name for p in root.iterdir() if p.is_dir() and p.name not in "ac")
    small = [x for x in parts if (root / x / "models.tar").exists() and size(root / "c") + size(root / x) <= budget]
    loose = " ".join(str(f) for f in sorted(root.iterdir()) if f.is_file())
    print(f"calls, each also carrying {loose}:")
    print("  bash .gpu/run.sh stage    carrying .gpu/a")
    for x in parts:
        if x not in small[:1]:
            print(f"  bash .gpu/run.sh part {x}   carrying .gpu/{x}")
    with_c = f"bash .gpu/run.sh part {small[0]} && " if small else ""
    # the GPU machine's copy of the tree may hold an assets/models folder of empty model folders, which run.sh
    # would not replace by its link to the staged models: every folder model then fails on its tokenizer
    print(f"  {with_c}rm -rf assets/models && bash .gpu/run.sh run bash scripts/gpu_bench.sh   carrying .gpu/c"
          + (f" .gpu/{small[0]}" if small else "") + "  (later runs: .gpu/c only, and the same rm first)")


if __name__ == "__main__":
    main()
