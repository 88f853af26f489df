"""The recorded runs the page opens on: one finished run per preset, kept as its JSON trace in assets/recorded/.

Owns where a recording lives, the settings it is made with (the preset's page defaults on its first example prompt,
seed 0, with the baseline), making one through the page's own path (validation.validate, then runs.run_stream, as
Generate does; scripts/record_run.py calls `record`), and reading one back into events (events.Trace.from_dict),
which views.py draws like any run. Nothing is generated at page load: a Space with many visitors pays for no run
per view. A recording says that it is one: its speculative trace's settings carry `recorded` (when, on what
machine, with which versions), which the stats show beside the run's own settings.
"""

from __future__ import annotations

import dataclasses
import json
import platform
from datetime import date
from pathlib import Path

from specdemo.config import ASSETS, PRESETS
from specdemo.engine.events import Trace
from specdemo.limits import Limits
from specdemo.models.devices import cpu_bf16_kind

FOLDER = ASSETS / "recorded"
SEED = 0


def path(pair_name: str) -> Path:
    return FOLDER / f"{pair_name}.json"


def page_inputs(pair_name: str) -> dict:
    """The page's inputs that a recording of `pair_name` is made with: what the page shows before any click."""
    p = PRESETS[pair_name]
    return {"pair_name": pair_name, "draft_id": "", "target_id": "", "prompt": p.examples[0], "k": p.k,
            "temperature": p.temperature, "top_k": 0, "top_p": 1.0, "max_new_tokens": p.max_new_tokens,
            "seed": SEED, "run_baseline": True, "lenience": 1.0, "chat": None, "strategy": p.strategy, "ngram": 3}


def record(pair_name: str, limits: Limits | None = None) -> dict:
    """Run the preset's first example at its page defaults, as Generate would, and return the JSON to store."""
    import torch
    import transformers

    from . import runs
    from .validation import get_pair, validate

    # the server's time limit (on a busy machine) must not cut the recording or its baseline short
    limits = dataclasses.replace(limits or Limits.from_env(), time_limit_s=24 * 3600)
    req = validate(**page_inputs(pair_name), limits=limits)
    pair = get_pair(req.pair, req.spec.strategy)
    *_, (spec, base, _) = runs.run_stream(req, pair, limits)
    meta = {"date": date.today().isoformat(), "device": str(pair.device), "cpu": platform.machine(),
            "cpu_bf16": cpu_bf16_kind(),
            "threads": torch.get_num_threads(), "torch": torch.__version__, "transformers": transformers.__version__,
            "script": "scripts/record_run.py"}
    return {"recorded": meta, "speculative": spec.to_dict(), "baseline": base.to_dict() if base else None}


def save(payload: dict, pair_name: str) -> Path:
    out = path(pair_name)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, ensure_ascii=False, separators=(",", ":")) + "\n")
    return out


def load(pair_name: str) -> tuple[Trace, Trace | None] | None:
    """The recorded run of `pair_name` as events, or None where there is none (or it cannot be read)."""
    try:
        payload = json.loads(path(pair_name).read_text())
        spec = Trace.from_dict(payload["speculative"])
        base = Trace.from_dict(payload["baseline"]) if payload.get("baseline") else None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    spec.settings["recorded"] = payload.get("recorded") or {}
    return spec, base
