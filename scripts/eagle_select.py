"""`train_eagle.py select`: choose among a run's exported heads by alpha in the loop on the SELECTION prompts (none
trained on, none in the bench), with the speed-up a cost model predicts at each confidence stop."""

from __future__ import annotations

from pathlib import Path

import torch

K_SELECT = 4  # select's K: the floors' (issue 13)
VERIFY_SLOPE, HEAD_C = 0.02, 0.055  # select's cost model, in target steps: per verified draft, per head step


def select(args) -> None:
    """Alpha in the loop (K = 4; greedy at T = 0, the default) of each head folder on the SELECTION prompts, none of
    them trained on nor in the bench: the numbers to choose a run's export by, so the bench's prompts are never
    chosen on. At T > 0 it prints the mean sum min(p, q) too. With --stop-below it measures the head at each of
    those confidence stops (instead of its own), and prints the speed-up a cost model predicts: tokens over
    sum of (1 + VERIFY_SLOPE k + HEAD_C s) per round, where s = k + 1 head steps when the stop ended the round early
    (the step that said stop), else k; the constants are the bench's at step 11,000."""
    from dataclasses import replace

    from evaluate_pair import alpha_on

    from specdemo import load_pair
    from specdemo.bench.prompts import SELECTION
    from specdemo.models.eagle import attach_head

    torch.set_num_threads(args.threads)
    pair = load_pair("smollm2-135m")
    for folder in args.heads:
        attach_head(pair, Path(folder))
        if pair.head is None:
            raise SystemExit(f"{folder}: {pair.head_error}")
        step = pair.head.cfg.training.get("history", [{}])[-1].get("step")
        for stop in args.stop_below or [pair.head.cfg.stop_below]:
            pair.head.cfg = replace(pair.head.cfg, stop_below=stop)
            a = alpha_on(pair, SELECTION, args.temperature, K_SELECT, args.max_new_tokens, strategy="eagle")
            cost = a["rounds"] + VERIFY_SLOPE * a["drafted"] + HEAD_C * (a["drafted"] + a["short_rounds"])
            overlap = f", sum min(p, q) {a['alpha_overlap']:.4f}" if args.temperature > 0 else ""
            print(f"{folder} (step {step}), stop below {stop:g}, T = {args.temperature:g}: alpha "
                  f"{a['alpha_empirical']:.4f}{overlap} over {a['judged_positions']} judged positions; "
                  f"{a['tokens'] / a['rounds']:.3f} tokens and {a['drafted'] / a['drafting_rounds']:.2f} drafts a "
                  f"round; modelled speed-up {a['tokens'] / cost:.4f}; {a['tokens'] / a['wall_s']:.1f} tokens/s "
                  f"({len(SELECTION)} selection prompts x {args.max_new_tokens} tokens)", flush=True)
