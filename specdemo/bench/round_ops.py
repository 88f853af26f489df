"""What one speculative round dispatches outside the captured forwards, and how often it reads the device back
(issue 45's floor: at most 40 operators and one device-to-host read a round). Counted on any device: on a CPU with
the graphs' stand-in (static.ReplayStandIn, whose replays run inside a `CAPTURED` profiler range and are left out),
on a GPU with the real graphs. Used by tests/test_static.py and by `gpu_bench.sh` (through `main`).

- `outside_ops`: torch.profiler's events of one round, counting each operator called from Python (an `aten::` event
  with no `aten::` event around it), outside the `CAPTURED` ranges. On a GPU each is at least one launch or a host
  step; inside a graph they cost nothing of the host.
- `HostReads`: every Python-level read of a tensor's values on the host (.item(), .tolist(), float(), int(),
  bool(), .nonzero(), .cpu(), .numpy()), the reads that are device-to-host copies on a GPU.
- `Uploads`: every tensor specdemo's code makes from Python values other than by `devices.upload_ids`; on a GPU each
  is a copy from pageable memory, which waits for the GPU as a read does.
- `CudaSyncs`: on CUDA, every call that synchronizes the host with the GPU, from Python or C++, as
  torch.cuda.set_sync_debug_mode reports them (the reads, pageable copies, stream syncs; not a device-wide
  torch.cuda.synchronize, such as a capture's, which `round_syncs` counts from the graphs made).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import traceback
import warnings

import torch

from specdemo.models import devices, static
from specdemo.models.stand_in import OWN_CODE, from_host_values
from specdemo.models.static_parts import CAPTURED, Tally

HOST_READS = ("item", "tolist", "__float__", "__int__", "__bool__", "__index__", "nonzero", "cpu", "numpy")


class HostReads(contextlib.AbstractContextManager):
    """Counts the host reads made while it is entered (`count`), by wrapping torch.Tensor's reading methods. Reads
    made inside C++ are not seen (on a GPU torch.cuda.set_sync_debug_mode sees those)."""

    def __init__(self):
        self.count, self._saved = 0, {}

    def __enter__(self):
        for name in HOST_READS:
            original = self._saved[name] = getattr(torch.Tensor, name)

            def counted(tensor, *args, _original=original, **kwargs):
                self.count += 1
                return _original(tensor, *args, **kwargs)

            setattr(torch.Tensor, name, counted)
        return self

    def __exit__(self, *exc):
        for name, original in self._saved.items():
            setattr(torch.Tensor, name, original)
        self._saved = {}
        return False


class Uploads(torch.overrides.TorchFunctionMode):
    """Notes ('file:line') each tensor specdemo's own code makes from Python values while it is entered (`where`),
    except inside `devices.upload_ids`, whose copy on CUDA leaves from pinned memory without waiting."""

    def __init__(self):
        super().__init__()
        self.where: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if from_host_values(func, args, kwargs):
            own = [f for f in traceback.extract_stack()[:-1] if f.filename.startswith(OWN_CODE)]
            if own and own[-1].filename != os.path.abspath(devices.__file__):
                self.where.append(f"{os.path.relpath(own[-1].filename, os.path.dirname(OWN_CODE[0]))}:{own[-1].lineno}")
        return func(*args, **kwargs)


# the words of torch's warning at each synchronizing call in "warn" mode (c10/cuda: warn_or_error_on_sync). Entering
# the mode the first time in a process also warns, once, that it "does not yet detect all synchronizing operations":
# that notice is no sync, and counting it was the `fixed` drafter's "first-call sync" on the H200 (2026-11-27/28)
SYNC_REPORT = "called a synchronizing CUDA operation"


class CudaSyncs(contextlib.AbstractContextManager):
    """On CUDA, the synchronizing calls made while it is entered, by torch.cuda.set_sync_debug_mode("warn"):
    `where`, the 'file:line' of the Python line that made each, and `stacks`, each one's Python stack (innermost
    first, STACK_FRAMES deep), since that line may be inside torch or transformers. Elsewhere it counts nothing."""

    STACK_FRAMES = 8

    def __init__(self, device: torch.device):
        self.cuda, self.where, self.stacks = device.type == "cuda", [], []

    def __enter__(self):
        if self.cuda:
            self._caught = warnings.catch_warnings()
            self._caught.__enter__()
            warnings.simplefilter("always")
            warnings.showwarning = self._seen  # called at the warning, in the thread that made the sync
            torch.cuda.set_sync_debug_mode("warn")
        return self

    def _seen(self, message, category, filename, lineno, file=None, line=None) -> None:
        if SYNC_REPORT not in str(message):  # not torch's notice on the mode's first use, which says "synchronizing"
            return
        self.where.append(f"{filename}:{lineno}")
        frames = [f for f in traceback.extract_stack()[:-1] if not f.filename.endswith("warnings.py")]
        self.stacks.append(" <- ".join(f"{os.path.basename(f.filename)}:{f.lineno} {f.name}"
                                       for f in reversed(frames[-self.STACK_FRAMES:])))

    def __exit__(self, *exc):
        if self.cuda:
            torch.cuda.set_sync_debug_mode("default")
            self._caught.__exit__(*exc)
        return False


def outside_ops(events) -> int:
    """Operators called from Python in a profile's events, less those inside a CAPTURED range."""
    def outside(e) -> bool:
        parent = e.cpu_parent
        while parent is not None:
            if parent.name.startswith("aten::") or parent.name == CAPTURED:
                return False
            parent = parent.cpu_parent
        return True

    return sum(1 for e in events if e.name.startswith("aten::") and outside(e))


def round_counts(rounds, skip: int = 1) -> list[tuple[int, int, int, int]]:
    """(operators outside the captured forwards, host reads, tokens shown (Round.tokens: the kept ones and a rejected
    draft), tokens drafted) of each round of a speculative_rounds generator after the first `skip` (round one reads
    the prompt), each profiled on its own."""
    from torch.profiler import ProfilerActivity, profile

    out = []
    for i in range(10_000):
        with profile(activities=[ProfilerActivity.CPU]) as prof, HostReads() as reads:
            rnd = next(rounds, None)
        if rnd is None:
            break
        if i >= skip:
            out.append((outside_ops(prof.events()), reads.count, len(rnd.tokens), rnd.k))
    return out


def round_syncs(rounds, device: torch.device, skip: int = 1) -> list[tuple[list[str], list[str]]]:
    """(CUDA's synchronizing calls, specdemo's uploads from Python values), each as its 'file:line' list, of each
    round of a speculative_rounds generator after the first `skip`; the first list is empty off CUDA. A graph
    captured in the round counts there as a sync too: torch.cuda.graph synchronizes the whole device
    (torch.cuda.synchronize), which the sync debug mode does not report."""
    out = []
    for i in range(10_000):
        made = Tally.count
        with CudaSyncs(device) as syncs, Uploads() as uploads:
            rnd = next(rounds, None)
        if rnd is None:
            break
        if i >= skip:
            if syncs.cuda and Tally.count > made:
                syncs.where.append(f"{Tally.count - made} graph(s) captured (torch.cuda.graph synchronizes the device)")
            out.append((syncs.where, uploads.where))
    return out


def main() -> None:
    from specdemo.config import SamplingConfig, SpecConfig
    from specdemo.engine.speculative import speculative_rounds
    from specdemo.models.loading import load_pair_uncached

    ap = argparse.ArgumentParser(description="operators outside the captured forwards and host reads per round")
    ap.add_argument("--pair", default="smollm2-135m")
    ap.add_argument("--device", default=None)
    ap.add_argument("--strategies", default="eagle,tree")
    ap.add_argument("--temperatures", default="0,0.7")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--eager-head", action="store_true", help="the head's chain step eager (as before issue 45)")
    ap.add_argument("--tree", default="0,0,0", help="the tree's top-k,depth,budget (0: the run's default)")
    args = ap.parse_args()
    pair = load_pair_uncached(args.pair, device=args.device, decoding="graphs")
    if pair.device.type != "cuda":  # the graphs' stand-in (models/stand_in.py): recorded once, replayed
        static.stand_ins(pair)
    if args.eager_head:
        pair.static_slots.pop("head", None)
    print(f"{pair.name} on {pair.device}, decoding {pair.decoding}, the head's chain step "
          f"{'captured' if 'head' in pair.static_slots else 'eager'}; each run counted after a first run of the same "
          "settings (its captures), from its second round (the first reads the prompt)")
    print("| strategy | T | rounds | operators outside graphs a round (median, max) | host reads a round (max) | "
          "CUDA syncs a round (max) | uploads a round (max) | graphs captured by the first run (host s), by the "
          "counted runs |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    lines = {}
    topk, depth, budget = (int(x) for x in args.tree.split(","))
    for strategy in args.strategies.split(","):
        for t in (float(x) for x in args.temperatures.split(",")):
            spec = SpecConfig(k=4, max_new_tokens=args.tokens, strategy=strategy, top_candidates=0, tree_topk=topk,
                              tree_depth=depth, tree_budget=budget)
            ids, cfg = pair.encode("Tell me about the sea."), SamplingConfig(t)
            made, took = Tally.count, Tally.seconds
            list(speculative_rounds(pair, ids, cfg, spec))  # a first run captures every graph the run needs
            first, took, made = Tally.count - made, Tally.seconds - took, Tally.count
            counts = round_counts(speculative_rounds(pair, ids, cfg, spec))
            syncs = round_syncs(speculative_rounds(pair, ids, cfg, spec), pair.device)
            ops = [c[0] for c in counts]
            most = max(len(s) for s, _ in syncs) if pair.device.type == "cuda" else "–"
            for where in (w for pair_lists in syncs for w in pair_lists):
                lines.update(dict.fromkeys(where))
            print(f"| {strategy} | {t} | {len(counts)} | {statistics.median(ops):.0f}, {max(ops)} | "
                  f"{max(c[1] for c in counts)} | {most} | {max(len(u) for _, u in syncs)} | {first} ({took:.2f} s), "
                  f"{Tally.count - made} |")
    print("lines that synchronized or uploaded:", ", ".join(lines) or "none")


if __name__ == "__main__":
    main()
