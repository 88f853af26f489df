"""Record the run a preset's page opens on: its first example prompt at the preset's page defaults (temperature, K,
max new tokens, strategy; seed 0, with the target-only baseline), run as Generate runs it, stored as its JSON trace in
assets/recorded/<preset>.json. The page draws that trace without generating anything (specdemo/app/recorded.py).

Run it again after changing a preset's defaults, its first example, its models or the engine; tests/test_first_screen.py
checks that the recording matches the preset and that a live run with its settings gives the same tokens.

    .venv/bin/python scripts/record_run.py                      # every preset that has a recording, and the default
    .venv/bin/python scripts/record_run.py shakespeare smollm2-135m
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from specdemo.app import recorded  # noqa: E402
from specdemo.config import PRESETS, SHIPPED_DEFAULT  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("presets", nargs="*", help="preset names (default: shakespeare and the shipped default)")
    args = ap.parse_args()
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if load > cores:  # the recording's timings (tokens/s, speedup) are what the page shows: record on a quiet machine
        print(f"warning: load average {load:.1f} on {cores} cores; the recorded timings will be slow", flush=True)
    for name in args.presets or ["shakespeare", SHIPPED_DEFAULT]:
        if name not in PRESETS:
            raise SystemExit(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}")
        payload = recorded.record(name)
        out = recorded.save(payload, name)
        spec, base = payload["speculative"], payload["baseline"]
        m = spec["metrics"]
        speedup = m["tokens_per_s"] / base["metrics"]["tokens_per_s"] if base else float("nan")
        print(f"{out}: {m['new_tokens']} tokens in {m['rounds']} rounds, alpha {m['alpha_empirical']:.2f}, "
              f"{m['tokens_per_s']:.1f} tokens/s, {speedup:.2f}x; {spec['stop_reason']}")
        print(f"  {spec['text']!r}")


if __name__ == "__main__":
    main()
