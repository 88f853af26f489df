"""The static decoding path: one preallocated KV cache per model (transformers' StaticCache), forwards over it of a
few fixed widths, and on CUDA each width captured once as a CUDA graph and replayed (torch.cuda.CUDAGraph).
`StaticLM` has CachedLM's interface, so the loops never know which of the two they hold.

Why: on a GPU a one-token forward of SmolLM2-135M costs about 20 ms of host time (211 kernel launches from Python)
and the GPU idles; a replayed graph launches them all at once. docs/decisions.md ("the GPU path captures the
eager forward itself") says why this captures the eager forward with torch.cuda.CUDAGraph instead of compiling it.

How a forward runs: the new ids go into the width's input buffer (padded up to the width); a captured forward
makes their positions and float 4D mask itself from the run's length, a device scalar (and a tree's from its rows'
parents), where an eager one writes them beside the ids; the layers' write counters are set to the run's length
inside the forward. The model writes its keys and values at [length, length + width) and attends through the mask,
which never shows a slot beyond a real row's own position (a padding row's slots stay hidden, and the next
forward overwrites them). Rolling back is lowering `length`: no crop, no reallocation.

What a forward attends over: not the whole cache but its first `bucket` slots, the smallest of `buckets_for`'s
lengths (powers of two from 64, then the whole cache) that holds the forward's last slot. Each bucket is a view of
the cache's first slots (`cache_view`: the same storage, the same write counters), and on CUDA each (width, bucket)
is captured once, so a replay costs what the cache holds, not what it could hold (issue 45; docs/decisions.md,
"attention over the filled cache").
"""

from __future__ import annotations

import logging
import os
import time
import weakref
from dataclasses import dataclass, field

import torch

from .devices import MAX_TREE_NODES, upload_ids, zerogpu_space
from .eagle import EagleHead
from .head_graphs import HeadSlot
from .lm import cache_argument, float32_head, head_logits, keeps_a_window
from .row_moves import RowMoves
from .static_parts import (CAPTURED, MIN_WINDOW, ReplayStandIn, buckets_for, cache_bytes, cache_view, fitting_window,
                           kv_shape, plan_window, pool_handle, record, tree_made)

__all__ = ["CAPTURED", "MIN_WINDOW", "ReplayStandIn", "buckets_for", "cache_bytes", "cache_view", "fitting_window",
           "kv_shape", "plan_window"]

log = logging.getLogger("specdemo")

# the forward widths captured: a step, a chain's K + 1 (K <= 12 by default: 16), a tree's nodes + 1 (a GPU's default
# largest tree is 64 nodes: 65). A wider forward (a prompt) runs eagerly over the same cache.
WIDTHS = (1, 2, 4, 8, 16, 32, MAX_TREE_NODES + 1)
DRAFT_WIDTHS = (1, 2)  # a draft model's forwards: one token, or two after an all-accepted round (its prompt: eager)


@dataclass
class Captured:
    """One (width, bucket)'s graph and its static buffers: ids, parents, start and given in (the graph makes the
    positions and mask from them); hidden state (and features) out."""

    graph: object
    ids: torch.Tensor  # [1, w]
    parents: torch.Tensor  # [w] a tree forward's parent rows (tree.TreeForward.parent_rows, then a chain)
    start: torch.Tensor  # [] the length that the forward writes after
    out: tuple[torch.Tensor, torch.Tensor]
    given: torch.Tensor | None = None  # [] bool: the forward makes a tree's positions and mask from `parents`
    #                                    (static_parts.tree_made); else the causal ones from `start`, so a chain's
    #                                    forward fills only ids and start
    causal: bool = False  # the host's view of `given`: it holds False (no fill needed for the next causal forward)
    views: dict = field(default_factory=dict)  # n -> (ids, hidden, features) buffers' first n rows (forward)


@dataclass
class StaticSlot:
    """One model's static cache and its captured forwards, made once when the pair loads and shared by every run on
    it. Runs take turns a round at a time (the device lock), so one cache serves them all: the run whose tokens it
    holds is its `owner`, and a run that finds another's there first saves them into that run's own copy (`take`,
    counted in `swaps`). With one visitor nothing is copied; with two alternating, each round copies two prefixes."""

    model: torch.nn.Module
    vocab_size: int
    max_len: int
    layers: tuple[int, ...] = ()  # the decoder layers whose outputs a head reads (features), fixed at capture
    graphs: dict[tuple[int, int], Captured] = field(default_factory=dict)  # (width, bucket) -> its graph
    owner: weakref.ref | None = None  # the run whose tokens the cache holds (weak: a run that ended owns nothing)
    swaps: int = 0
    capture_s: float = 0.0

    def __post_init__(self):
        from transformers import StaticCache

        model, cfg = self.model, self.model.config
        self.base = model.base_model
        self.head32 = float32_head(model)
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.cache = StaticCache(config=cfg, max_cache_len=self.max_len)
        self.cache.early_initialization(1, *kv_shape(cfg), self.dtype, self.device)
        self.kv = [(layer.keys, layer.values) for layer in self.cache.layers]
        self.buckets = buckets_for(self.max_len)
        self.views = {b: cache_view(self.cache, b) for b in self.buckets}
        self.widths: tuple[int, ...] = ()  # the widths captured, ascending
        self.start = torch.zeros((), dtype=torch.long, device=self.device)  # an eager forward's write position
        self.counters = [layer.cumulative_length for layer in self.cache.layers]
        self.slots = torch.arange(self.max_len, device=self.device)
        # a padding row's position may pass the last one a model knows (GPT-2's learned positions): clamped there
        self.last_position = (getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
                              or self.max_len) - 1
        self.minimum = torch.finfo(self.dtype).min
        self._cache_kw = cache_argument(type(self.base).forward)
        self.run_base = self.base  # the forward that runs (and is captured): the model's own, or compiled
        self.compile_s = 0.0
        self.moves: RowMoves | None = None  # a tree round's roll-back as one replay, once the forwards are captured

    def compile(self) -> float:
        """Compile the base model's forward (torch.compile, dynamic shapes, so that every width and bucket shares a
        few compiled graphs) and run it once at widths 1 and 2, where the compiling happens; returns the seconds it
        took. Captures made after this record the compiled (fused) kernels. Raises whatever the compiler raises."""
        self.run_base = torch.compile(self.base, dynamic=True)
        t0 = time.perf_counter()
        with torch.inference_mode():
            for width in (1, 2):  # size 1 is specialised apart from the others
                positions = torch.empty(1, width, dtype=torch.long, device=self.device)
                mask = torch.empty(1, 1, width, self.buckets[0], dtype=self.dtype, device=self.device)
                self.causal(0, width, positions, mask)
                self.start.zero_()
                self._forward(torch.zeros(1, width, dtype=torch.long, device=self.device), positions, mask, self.start)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.compile_s = time.perf_counter() - t0
        return self.compile_s

    @property
    def nbytes(self) -> int:
        """The cache's bytes (the captured graphs' own pool is not counted)."""
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self.kv)

    # ------------------------------------------------------------------------------------------ the forward
    def bucket(self, end: int) -> int:
        """The cache length a forward whose last slot is end - 1 attends over (buckets_for)."""
        return next(b for b in self.buckets if b >= end)

    def causal_made(self, start: torch.Tensor, width: int, bucket: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`causal`'s positions [1, w] and mask [1, 1, w, bucket] made from the device scalar `start`, inside a
        captured forward (nothing is read or written on the host)."""
        positions = (self.slots[:width] + start).clamp_(max=self.last_position).view(1, width)
        allowed = self.slots[:bucket].view(1, -1) <= positions.view(-1, 1)
        mask = torch.zeros((), dtype=self.dtype, device=self.device).masked_fill(~allowed, self.minimum)
        return positions, mask.view(1, 1, width, bucket)

    def causal(self, start: int, width: int, positions: torch.Tensor, mask: torch.Tensor) -> None:
        """Write a causal forward's positions [1, w] and mask [1, 1, w, bucket] in place: row i sits at start + i and
        sees the slots up to its own."""
        positions.copy_((self.slots[:width] + start).clamp_(max=self.last_position).view(1, width))
        allowed = self.slots[: mask.shape[-1]].view(1, -1) <= positions.view(-1, 1)
        mask.copy_(torch.zeros((), dtype=self.dtype, device=self.device).masked_fill(~allowed, self.minimum)
                   .view(1, 1, width, -1))

    def given(self, start: int, n: int, tree: tuple[torch.Tensor, torch.Tensor], positions: torch.Tensor,
              mask: torch.Tensor) -> None:
        """A tree's mask [1, 1, n, start + n] and positions [1, n] written into a forward of width w >= n: its columns
        first, every later slot hidden; the padding rows (n..w) are causal, so that no row sees nothing."""
        width = positions.shape[1]
        if width > n:
            self.causal(start, width, positions, mask)
        tree_mask, tree_pos = tree
        mask[:, :, :n].fill_(self.minimum)
        mask[:, :, :n, : tree_mask.shape[-1]].copy_(tree_mask)
        positions[:, :n].copy_(tree_pos)

    def _forward(self, ids, positions, mask, start) -> tuple[torch.Tensor, torch.Tensor]:
        """The model over the static cache's first mask.shape[-1] slots (a bucket's view): the layers' write counters
        set to `start` (a device scalar), then one forward. Every tensor it reads is an argument or the cache, so it
        can be captured. Returns the last hidden state and the features of `layers` (the hidden state again where
        there are none)."""
        torch._foreach_copy_(self.counters, [start] * len(self.counters))
        out = self.run_base(input_ids=ids, position_ids=positions, attention_mask=mask, use_cache=True,
                        output_hidden_states=bool(self.layers), **{self._cache_kw: self.views[mask.shape[-1]]})
        hidden = out.last_hidden_state[0]
        if not self.layers:
            return hidden, hidden
        return hidden, torch.cat([out.hidden_states[i + 1][0] for i in self.layers] + [hidden], -1)

    def forward(self, ids: torch.Tensor, start: int, tree=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Hidden states [n, H] (and features) of ids [n] fed after `start` cached tokens: replayed from the
        smallest captured width that holds them, over the smallest bucket that holds its last slot, or run eagerly at
        width n over that bucket."""
        n = ids.numel()
        width = next((w for w in self.widths if w >= n and start + w <= self.max_len), None)
        if tree is not None and not hasattr(tree, "parent_rows"):  # a mask given whole: forwards it eagerly
            width = None
        if width is None:
            tree = tree.attention() if hasattr(tree, "attention") else tree
            assert start + n <= self.max_len, f"the static cache holds {self.max_len} tokens; {start + n} asked"
            positions = torch.empty(1, n, dtype=torch.long, device=self.device)
            mask = torch.empty(1, 1, n, self.bucket(start + n), dtype=self.dtype, device=self.device)
            if tree is None:
                self.causal(start, n, positions, mask)
            else:
                self.given(start, n, tree, positions, mask)
            self.start.fill_(start)  # a device scalar filled in place: no host-to-device copy, no sync
            return self._forward(ids.view(1, n), positions, mask, self.start)
        c = self.graphs[width, self.bucket(start + width)]
        views = c.views.get(n)
        if views is None:  # the first n rows of its buffers, made once (a view made per forward is an operator)
            hidden, features = c.out
            views = c.views[n] = (c.ids[0, :n], hidden[:n], None if features is hidden else features[:n])
        views[0].copy_(ids)
        if tree is None:  # the graph makes the causal positions and mask from `start`
            if not c.causal:
                c.given.fill_(False)
                c.causal = True
        else:  # the graph makes the tree's positions and mask from its rows' parents; its padding rows, a chain
            c.parents.copy_(tree.parent_rows(c.parents.shape[0]))
            if c.causal:
                c.given.fill_(True)
                c.causal = False
        c.start.fill_(start)
        c.graph.replay()
        h = views[1].clone()  # the graph's own buffers, overwritten by its next replay: the n real rows copied
        return h, h if views[2] is None else views[2].clone()

    # ------------------------------------------------------------------------------------------ capture (CUDA)
    def capture(self, widths: tuple[int, ...] = WIDTHS, stand_in: bool = False) -> float:
        """Capture the forward at each width over each bucket that holds it (CUDA); returns the seconds it took.
        Warm-up and capture write into the cache, so this runs before any run owns it. stand_in: on a CPU, record
        each as a `ReplayStandIn` instead, which keeps the graphs' contract (fixed buffers in, fixed buffers out,
        padded widths, bucketed masks) so that tests can run it without a GPU."""
        assert self.device.type == "cuda" or stand_in, "CUDA graphs need a CUDA device"
        assert self.owner is None or self.owner() is None, "capture before any run owns the cache"
        t0 = time.perf_counter()
        cuda = self.device.type == "cuda" and not stand_in
        pool = pool_handle(cuda)
        self.widths = tuple(sorted(w for w in widths if w <= self.max_len))
        for width, bucket in ((w, b) for w in self.widths for b in self.buckets if w <= b):
            ids = torch.zeros(1, width, dtype=torch.long, device=self.device)
            parents = self.slots[:width] - 1  # a chain until a tree's forward writes its rows
            start = torch.zeros((), dtype=torch.long, device=self.device)
            given = torch.zeros((), dtype=torch.bool, device=self.device)

            def forward(ids=ids, parents=parents, start=start, given=given, width=width, bucket=bucket):
                made_positions, made_mask = self.causal_made(start, width, bucket)
                tree_positions, tree_mask = tree_made(self.slots, start, parents, bucket, self.dtype,
                                                      self.last_position)
                return self._forward(ids, torch.where(given, tree_positions, made_positions),
                                     torch.where(given, tree_mask, made_mask), start)

            graph, out = record(forward, self.device, pool, stand_in=not cuda)
            self.graphs[width, bucket] = Captured(graph, ids, parents, start, out, given, causal=True)
        if cuda:
            torch.cuda.synchronize(self.device)
        self.moves = RowMoves(self, stand_in=not cuda)
        self.capture_s = time.perf_counter() - t0
        return self.capture_s

    # ------------------------------------------------------------------------------------------ turns
    def take(self, run: StaticLM) -> None:
        """Make the cache hold `run`'s tokens: the owner's prefix is saved into its own copy, and `run`'s copy (if
        it was saved before) is put back. Called under the device lock, at every forward and rollback."""
        owner = self.owner() if self.owner is not None else None
        if owner is run:
            return
        if owner is not None and owner.length:
            owner.saved = [(k[:, :, : owner.length].clone(), v[:, :, : owner.length].clone()) for k, v in self.kv]
        if run.saved is not None:
            for (k, v), (sk, sv) in zip(self.kv, run.saved):
                k[:, :, : sk.shape[2]].copy_(sk)
                v[:, :, : sv.shape[2]].copy_(sv)
            run.saved = None
        self.owner = weakref.ref(run)
        self.swaps += owner is not None


class StaticLM:
    """CachedLM's interface over a StaticSlot: one run's view of the model's static cache. `length` is a host
    int (known after every round's verdict), so rolling back moves it and nothing else."""

    def __init__(self, slot: StaticSlot):
        self.slot, self.model, self.vocab_size = slot, slot.model, slot.vocab_size
        self.head32 = slot.head32
        self.length = 0
        self.calls = 0
        self.saved: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    def reset(self) -> None:
        self.length, self.calls, self.saved = 0, 0, None

    def crop(self, keep: int) -> None:
        assert 0 <= keep <= self.length, f"cannot crop a cache of {self.length} tokens to {keep}"
        self.length = keep

    @torch.inference_mode()
    def keep_rows(self, start: int, rows: list[int]) -> None:
        """As CachedLM.keep_rows: the kept path's rows move up to sit after `start`, in place in the static cache."""
        first = next((i for i, r in enumerate(rows) if r != i), len(rows))
        if first < len(rows):
            self.slot.take(self)
            if self.slot.moves is not None and self.slot.moves.move([start + r for r in rows[first:]], start + first):
                self.length = min(self.length, start + len(rows))
                return
            src = upload_ids(rows[first:], self.slot.device) + start
            for k, v in self.slot.kv:
                for t in (k, v):
                    t[..., start + first : start + len(rows), :] = t[..., src, :]
        self.length = min(self.length, start + len(rows))

    @torch.inference_mode()
    def feed(self, ids: torch.Tensor, keep_logits: int = 1) -> torch.Tensor:
        return self.feed_features(ids, keep_logits)[0]

    @torch.inference_mode()
    def feed_features(self, ids: torch.Tensor, keep_logits: int = 1, layers: tuple[int, ...] = (),
                      tree: tuple[torch.Tensor, torch.Tensor] | None = None, want_hidden: bool = False
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """As CachedLM.feed_features (features: the last hidden state where no `layers` are asked for). `layers`
        must be those the slot was made for, or none. want_hidden: the last keep_logits hidden states instead of their
        logits (a captured verdict computes them: engine/judge_graph.py)."""
        assert ids.dim() == 1 and ids.numel() >= keep_logits >= 1, (ids.shape, keep_logits)
        assert not layers or tuple(layers) == self.slot.layers, (layers, self.slot.layers)
        self.slot.take(self)
        self.calls += 1
        hidden, features = self.slot.forward(ids, self.length, tree)
        self.length += ids.numel()
        rows = hidden[-keep_logits:] if want_hidden else head_logits(self.model, self.head32, hidden[-keep_logits:],
                                                                      self.vocab_size)
        return rows, (features if layers else hidden)


# ---------------------------------------------------------------------------------------------- the pair's choice
MODES = ("auto", "eager", "static", "graphs", "compiled")  # SPECDEMO_DECODING
CPU_MODE = "eager"  # what `auto` picks on a CPU: decided by measurement (docs/decisions.md, "a static cache on a CPU")


# the reasons choose_mode gives most often, named so that the page can say them in its language (app/views.py)
WHY_CPU = "a CPU: dynamic KV cache, eager forwards (a static cache measured no faster here)"
WHY_GRAPHS = "CUDA graphs over a static cache"
WHY_WINDOW = "sliding-window attention, whose static cache cannot roll back a round: dynamic KV cache, eager forwards"
WHY_ZEROGPU = "ZeroGPU lends the GPU one call at a time, in a worker process: no graphs to keep (docs/deploy.md)"


def choose_mode(device: torch.device, asked: str, asker: str | None = None) -> tuple[str, str]:
    """(mode, why) for a pair on `device`, given the decoding `asked` (auto by default); `asker` names where the ask
    came from in the reason (SPECDEMO_DECODING), None a caller's own argument."""
    if asked not in MODES:
        raise ValueError(f"{asker or 'decoding'} must be one of {', '.join(MODES)}, got {asked!r}")
    if device.type == "cuda" and zerogpu_space():
        return "eager", WHY_ZEROGPU
    if asked == "compiled" and device.type == "cuda":
        return "compiled", WHY_GRAPHS
    if asked == "auto":
        if device.type == "cuda":
            return "graphs", WHY_GRAPHS
        if device.type == "cpu":
            return CPU_MODE, (WHY_CPU if CPU_MODE == "eager" else "a CPU: static cache, eager forwards (graphs need CUDA)")
        return "eager", f"{device.type}: CUDA graphs need a CUDA device"
    if asked in ("graphs", "compiled") and device.type != "cuda":
        return "static", f"{device.type}: static cache, eager forwards (graphs need CUDA)"
    return asked, f"{asked}, as {asker} asks" if asker else f"{asked}, as asked"


def compiled_or_plain(slot: StaticSlot, why: str) -> tuple[StaticSlot, str, str]:
    """(slot, mode, why) for the `compiled` decoding: the slot with its forward compiled (its seconds logged), or,
    where the compiler fails, a fresh slot of plain graphs and a reason that says so."""
    try:
        took = slot.compile()
    except Exception as err:  # noqa: BLE001 - a compiler failure falls back to plain graphs, and says why
        log.warning("torch.compile of the target failed (%s: %s): plain CUDA graphs", type(err).__name__,
                    str(err)[:200])
        fresh = StaticSlot(slot.model, slot.vocab_size, slot.max_len, slot.layers)
        return fresh, "graphs", f"torch.compile failed ({type(err).__name__}): plain CUDA graphs"
    log.info("torch.compile of the target: %.1f s", took)
    return slot, "compiled", f"{why}, the target's forward compiled (torch.compile, {took:.0f} s)"


def warm(slot: StaticSlot) -> None:
    """One step through the slot as a run makes it, before any run owns it: the replay and the eager LM head on the
    current stream, and a draw, so that a run's first round pays for no lazy set-up. (It was added for `fixed`'s
    "first-call sync" on CUDA, which turned out to be torch's notice on entering the sync debug mode:
    bench/round_ops.SYNC_REPORT.)"""
    lm = StaticLM(slot)
    cdf = lm.feed(torch.zeros(1, dtype=torch.long, device=slot.device)).softmax(-1).cumsum(-1, dtype=torch.float64)
    u = torch.rand(1, 1, generator=torch.Generator(device=slot.device).manual_seed(0), device=slot.device,
                   dtype=torch.float64)
    torch.searchsorted(cdf, u)  # the draws of engine.sampling.sample
    if slot.device.type == "cuda":
        torch.cuda.synchronize(slot.device)
    slot.owner = None


def stand_ins(pair, widths: tuple[int, ...] = WIDTHS) -> None:
    """On a CPU, what `graphs` makes on CUDA, with the graphs' stand-in: a pair already prepared `static` gets its
    widths recorded (the draft model's DRAFT_WIDTHS), the warm-up step, and the head's chain step where it has an
    EagleHead. Tests and bench/round_ops.py run the graph path this way without a GPU."""
    assert pair.decoding == "static", "stand-ins are recorded over a pair prepared static"
    for role, slot in pair.static_slots.items():
        slot.capture(widths if role == "target" else tuple(w for w in widths if w in DRAFT_WIDTHS), stand_in=True)
        warm(slot)
    if type(pair.head) is EagleHead:
        pair.static_slots["head"] = HeadSlot(pair.head, pair.target.get_input_embeddings(), pair.context_window + 1)
        pair.static_slots["head"].capture(stand_in=True)


def prepare(pair, asked: str | None = None, widths: tuple[int, ...] = WIDTHS, max_request: int | None = None) -> None:
    """Decide how `pair`'s caches run and make them ready: static slots for the target and the draft model, each
    width captured on CUDA. Sets pair.decoding, pair.decoding_note and pair.static_slots (and pair.window_cap where
    memory is short or max_request is below the context window), and logs one line. A forward that will not capture
    leaves the pair eager, with the reason.
    max_request: the longest sequence a request may make (prompt + new tokens); the context window by default."""
    if asked:
        mode, why = choose_mode(pair.device, asked)
    else:
        mode, why = choose_mode(pair.device, os.environ.get("SPECDEMO_DECODING", "auto").strip() or "auto",
                                "SPECDEMO_DECODING")
    pair.static_slots, pair.window_cap = {}, None
    models = {"target": pair.target} | ({"draft": pair.draft} if pair.draft is not pair.target else {})
    if mode != "eager" and any(float32_head(m) is None for m in models.values()):
        mode, why = "eager", "a model computes its own logits (soft-capped or scaled): eager forwards"
    if mode != "eager" and any(keeps_a_window(m.config) for m in models.values()):
        mode, why = "eager", WHY_WINDOW  # its layers' write position is a host counter a rollback cannot move
    if mode != "eager":
        pad = max(*widths, MAX_TREE_NODES + 1)  # a round's rows after the window's last token: a tree's, or K + 1
        free = torch.cuda.mem_get_info(pair.device)[0] if pair.device.type == "cuda" else None
        window, pair.window_cap, short = plan_window(pair.context_window, max_request, list(models.values()), pad, free)
        if short:
            log.warning("static caches: %d MiB free on %s, so requests are capped at %d tokens (prompt + new)",
                        free >> 20, pair.device, window)
        head_layers = tuple(pair.head.cfg.feature_layers) if pair.head is not None else ()
        try:
            for role, model in models.items():
                slot = StaticSlot(model, pair.vocab_size, window + pad, head_layers if role == "target" else ())
                if mode == "compiled" and role == "target":
                    slot, mode, why = compiled_or_plain(slot, why)
                if mode in ("graphs", "compiled"):  # a draft model feeds one or two tokens a forward (its prompt:
                    #                                 eagerly)
                    slot.capture(widths if role == "target" else tuple(w for w in widths if w in DRAFT_WIDTHS))
                    warm(slot)
                pair.static_slots[role] = slot
            if mode in ("graphs", "compiled") and type(pair.head) is EagleHead:  # the head's chain step, captured
                pair.static_slots["head"] = HeadSlot(pair.head, pair.target.get_input_embeddings(), window + 1)
                pair.static_slots["head"].capture()
        except Exception as err:  # noqa: BLE001 - any failure to capture leaves the pair eager, and says why
            pair.static_slots, pair.window_cap = {}, None
            mode, why = "eager", f"capture failed ({type(err).__name__}: {str(err)[:120]}): eager forwards"
    pair.decoding, pair.decoding_note = mode, why
    spent = sum(s.capture_s for s in pair.static_slots.values())
    log.info("decoding %s on %s: %s%s", mode, pair.device, why,
             f" (captured {sum(len(s.graphs) for s in pair.static_slots.values())} graphs (widths x cache buckets) of"
             f" {len(pair.static_slots)} models in {spent:.1f} s)" if spent else "")
