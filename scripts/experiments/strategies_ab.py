"""`bench --strategies`' rows raced between two checkouts, interleaved run by run (rule and outcome: docs/decisions.md).

Two worker processes, one per checkout, each load the pair once and run one (row, prompt, seed) when asked. The
parent asks them in turn, never both at once: for every run the two checkouts go back to back, and who goes first
alternates (ABBA), so that a load that drifts over minutes falls on both sides alike. The same rows, prompts and
seeds as `bench --strategies` (fixed K = 1..8, adaptive, lookup, eagle, the head's trees, target-only), at each
temperature asked.

    python scripts/experiments/strategies_ab.py --base cff1095 --reps 3 --prompts 5 --max-new-tokens 128
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def worker(pair_name: str, temperatures: list[float], k: int, max_new_tokens: int, n_prompts: int) -> None:
    """Loads the pair from this checkout (sys.path[0] is set by the parent) and answers one run a line on stdin."""
    from specdemo.bench.decodings import decoded_views, longest_request, target_variants
    from specdemo.bench.methods import COPY_PROMPTS, bench_prompts
    from specdemo.bench.strategies import CallCounter, method_names, method_runner, tree_methods
    from specdemo.config import SamplingConfig
    from specdemo.models import load_pair
    from specdemo.models.devices import dtype_name

    pair = load_pair(pair_name)
    groups = {"general": bench_prompts(pair)[:n_prompts],
              "copy": list(COPY_PROMPTS.get(pair.name, COPY_PROMPTS["shakespeare"]))}
    request = longest_request(pair, [p for g in groups.values() for p in g], max_new_tokens)
    views = decoded_views(target_variants(pair), None, request, lambda *a: None)
    targets = next(iter(views.values()))
    runners, rows = {}, {}
    for t in temperatures:
        sampling = SamplingConfig(temperature=t)
        trees = tree_methods(pair, sampling)
        rows[t] = method_names(pair, targets, list(range(1, 9)), k, 8, False, list(trees))
        runners[t] = method_runner(targets[dtype_name(pair.dtype)], targets, sampling, k, max_new_tokens, 3, 8,
                                   CallCounter(pair.target), trees)
    print(json.dumps({"rows": {str(t): r for t, r in rows.items()},
                      "groups": {g: len(p) for g, p in groups.items()}}), flush=True)
    for line in sys.stdin:
        ask = json.loads(line)
        n, secs, calls, tr = runners[ask["t"]](ask["row"], groups[ask["group"]][ask["i"]], ask["seed"])
        print(json.dumps({"tokens": n, "seconds": secs, "calls": calls,
                          "ids": list(tr.output_ids) if tr is not None else None}), flush=True)


class Side:
    """One checkout's worker process."""

    def __init__(self, checkout: Path, args):
        env = {**os.environ, "PYTHONPATH": str(checkout)}  # before site-packages: this checkout's specdemo
        self.p = subprocess.Popen([sys.executable, __file__, "--worker", *sys.argv[1:]], cwd=checkout, env=env,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.hello = json.loads(self.p.stdout.readline())

    def ask(self, **kw) -> dict:
        self.p.stdin.write(json.dumps(kw) + "\n")
        self.p.stdin.flush()
        return json.loads(self.p.stdout.readline())


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="cff1095", help="the commit to compare against (checked out in a temp dir)")
    ap.add_argument("--pair", default="shakespeare")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--temperatures", default="0,0.7")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def worker_main() -> None:
    a = parse()
    worker(a.pair, [float(t) for t in a.temperatures.split(",")], a.k, a.max_new_tokens, a.prompts)


def main() -> None:
    a = parse()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base), a.base], check=True,
                       capture_output=True)
        try:
            race(a, {"base": base, "head": ROOT})
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], check=False)


def race(a, checkouts: dict[str, Path]) -> None:
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    sides = {name: Side(path, a) for name, path in checkouts.items()}
    hello = sides["head"].hello
    assert hello == sides["base"].hello, (hello, sides["base"].hello)
    secs = {}  # (t, row, group) -> side -> [seconds per repetition]
    pairs = {}  # (t, row, group) -> [(base seconds, head seconds) of each run, back to back]
    differ = set()
    for t_s, rows in hello["rows"].items():  # warm-up, not counted: first calls allocate and build tables
        for row in rows:
            for side in sides.values():
                side.ask(t=float(t_s), row=row, group="general", i=0, seed=0)
    unit = 0
    for rep in range(a.reps):
        for t_s, rows in hello["rows"].items():
            t = float(t_s)
            for group, n in hello["groups"].items():
                for i in range(n):
                    for row in rows:
                        order = ["base", "head"] if unit % 2 == 0 else ["head", "base"]
                        unit += 1
                        got = {s: sides[s].ask(t=t, row=row, group=group, i=i, seed=i) for s in order}
                        if got["base"]["ids"] != got["head"]["ids"] or got["base"]["calls"] != got["head"]["calls"]:
                            differ.add((t, row, group))
                        for s, g in got.items():
                            per = secs.setdefault((t, row, group), {}).setdefault(s, [0.0] * a.reps)
                            per[rep] += g["seconds"]
                        pairs.setdefault((t, row, group), []).append((got["base"]["seconds"],
                                                                      got["head"]["seconds"]))
        print(f"repetition {rep + 1}/{a.reps} done, {time.strftime('%H:%M:%S')}", flush=True)
    report(a, head, secs, pairs, differ)


def report(a, head: str, secs: dict, pairs: dict, differ: set) -> None:
    print(f"\n{a.pair}: {a.base} (base) against {head} (head), {a.reps} repetitions, {a.prompts} general prompts and"
          f" the copy prompts x {a.max_new_tokens} tokens, every run back to back in both checkouts, ABBA.")
    print("ratio = base seconds / head seconds (above 1: head faster). Per repetition: its prompts' seconds summed;"
          " median: of the ratios of the runs made back to back (a prompt, a repetition); min: each side's fastest"
          " repetition of each prompt, summed\n")
    print("| T | row | group | per repetition | median of pairs | min | same tokens |")
    print("|---:|---|---|---|---:|---:|---|")
    medians = []
    for key, by in secs.items():
        t, row, group = key
        per = [b / h for b, h in zip(by["base"], by["head"])]
        med = statistics.median(b / h for b, h in pairs[key])
        n = len(pairs[key]) // a.reps
        fastest = [min(pairs[key][i + r * n][side] for r in range(a.reps)) for side in (0, 1) for i in range(n)]
        least = sum(fastest[:n]) / sum(fastest[n:])
        medians.append(med)
        print(f"| {t} | {row} | {group} | {', '.join(f'{r:.3f}' for r in per)} | {med:.3f} | {least:.3f} | "
              f"{'no' if key in differ else 'yes'} |")
    gm = math.exp(statistics.fmean(math.log(r) for r in medians))
    print(f"\n{len(medians)} rows, by the median of pairs: geometric mean {gm:.3f}, lowest {min(medians):.3f}, "
          f"{sum(r >= 0.97 for r in medians)} at 0.97 or more")


if __name__ == "__main__":
    worker_main() if "--worker" in sys.argv else main()
