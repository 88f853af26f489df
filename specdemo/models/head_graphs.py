"""The EAGLE head's chain step captured (issue 45): one head cache per pair of fixed capacity, shared by every run
the way models/static.py shares the target's (runs take turns a round at a time and swap their positions in and
out), and the one-position drafting step over it, captured once per cache bucket (static_parts.buckets_for) as a
CUDA graph, or recorded by the graphs' stand-in on a CPU (stand_in.ReplayStandIn).

A step reads the predicted feature g [1, H] and the drafted token x [1] from fixed buffers, embeds x, runs the
head's layer at the position held in a device scalar (its key and value written there in place, attention over the
bucket's first slots through a mask that hides every slot after it), and leaves the next feature and its float32
logits over the draft vocabulary in fixed outputs: the arithmetic of EagleHead.step (models/eagle.py) for one
position. engine/chain_graph.py captures the whole chain over this cache; the drafter (engine/drafters.py,
EagleDrafter) replays this step between its picks only where that graph is not available, and in a top-k 1 tree.
Only `EagleHead` itself is captured here; another head type drafts eagerly.
"""

from __future__ import annotations

import contextlib
import logging
import time
import weakref

import torch
import torch.nn.functional as F

from specdemo.config import TREE_DEPTH_RANGE, TREE_TOPK_RANGE

from .eagle import EagleHead, HeadCache, rope
from .static_parts import CAPTURED, buckets_for, pool_handle, record

log = logging.getLogger(__name__)
READ_MAX = 13  # the most accepted positions a captured read takes: K + 1 for the largest K a page offers (12)
# the head positions a draft tree writes after a run's last true one: topk a depth below the first, for the largest
# tree a page offers (a tree drafter shares the slot with the chain's)
TREE_ROOM = (TREE_DEPTH_RANGE[1] - 1) * TREE_TOPK_RANGE[1]


def step_over(head: EagleHead, feat: torch.Tensor, emb: torch.Tensor, cache: HeadCache, pos: torch.Tensor,
              length: int) -> torch.Tensor:
    """EagleHead.step for n positions [n, H] from the device position `pos` [] (a scalar) on, attending over the
    cache's first `length` slots (each row sees the slots up to its own): every shape is fixed, so it can be
    captured."""
    cfg = head.cfg
    nh, nkv, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    n = feat.shape[0]
    x = head.linear(torch.cat([emb, feat], dim=-1), "fc")  # [n, H]
    qkv = head.linear(head.input_norm(x), "qkv")
    q = qkv[:, : nh * hd].view(n, nh, hd).transpose(0, 1)
    k = qkv[:, nh * hd : (nh + nkv) * hd].view(n, nkv, hd).transpose(0, 1)
    cos, sin = head.rope_tables(cache.k.shape[1], x.device)
    at = pos.view(1) if n == 1 else pos + torch.arange(n, device=x.device)
    cos, sin = cos.index_select(0, at).to(x.dtype), sin.index_select(0, at).to(x.dtype)
    cache.k.index_copy_(1, at, rope(k, cos, sin))
    cache.v.index_copy_(1, at, qkv[:, (nh + nkv) * hd :].view(n, nkv, hd).transpose(0, 1))
    mask = torch.arange(length, device=x.device).view(1, length) <= at.view(n, 1)
    attn = F.scaled_dot_product_attention(rope(q, cos, sin), cache.k[:, :length], cache.v[:, :length],
                                          attn_mask=mask, enable_gqa=nh != nkv)
    x = x + head.linear(attn.transpose(0, 1).reshape(n, nh * hd), "o")
    gate, up = head.linear(head.post_norm(x), "gu").chunk(2, dim=-1)
    return x + head.linear(F.silu(gate) * up, "down")


def tree_step_over(head: EagleHead, feat: torch.Tensor, emb: torch.Tensor, cache: HeadCache, start: torch.Tensor,
                   offset: int, depth: int, visible: torch.Tensor, length: int) -> torch.Tensor:
    """EagleHead.step for one depth of a draft tree, with fixed shapes (so it can be captured): the m nodes [m, H]
    are written at slots start + offset .. + m - 1, where `start` [] is the run's true length (the first slot after
    its true positions), each at RoPE position start + depth - 1 (where a chain's node would sit); a node attends to
    every true position and to the drafted slots from `start` on that `visible` [m, offset + m] marks (its
    ancestors and itself), over the cache's first `length` slots."""
    cfg = head.cfg
    nh, nkv, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    m, dev = feat.shape[0], feat.device
    x = head.linear(torch.cat([emb, feat], dim=-1), "fc")
    qkv = head.linear(head.input_norm(x), "qkv")
    q = qkv[:, : nh * hd].view(m, nh, hd).transpose(0, 1)
    k = qkv[:, nh * hd : (nh + nkv) * hd].view(m, nkv, hd).transpose(0, 1)
    cos, sin = head.rope_tables(cache.k.shape[1], dev)
    at_rope = (start + depth - 1).view(1)
    cos, sin = cos.index_select(0, at_rope).to(x.dtype), sin.index_select(0, at_rope).to(x.dtype)
    at = start + offset + torch.arange(m, device=dev)
    cache.k.index_copy_(1, at, rope(k, cos, sin))
    cache.v.index_copy_(1, at, qkv[:, (nh + nkv) * hd :].view(m, nkv, hd).transpose(0, 1))
    drafted = start + torch.arange(offset + m, device=dev)  # the slots of the tree's nodes so far
    mask = (torch.arange(length, device=dev) < start).view(1, length).expand(m, length).clone()
    mask.scatter_(1, drafted.view(1, -1).expand(m, -1), visible)
    attn = F.scaled_dot_product_attention(rope(q, cos, sin), cache.k[:, :length], cache.v[:, :length],
                                          attn_mask=mask, enable_gqa=nh != nkv)
    x = x + head.linear(attn.transpose(0, 1).reshape(m, nh * hd), "o")
    gate, up = head.linear(head.post_norm(x), "gu").chunk(2, dim=-1)
    return x + head.linear(F.silu(gate) * up, "down")


class HeadSlot:
    """The head's shared cache (`cache`, of `max_len` positions) and its step captured per bucket. `view()` gives a
    run its own HeadCache over the shared tensors; `take(view)` makes the cache hold that run's positions (as
    StaticSlot.take does for a model's cache)."""

    def __init__(self, head: EagleHead, embed, max_len: int):
        max_len += TREE_ROOM  # a run's positions, and a draft tree's nodes after them
        self.head, self.embed, self.max_len = head, embed, max_len
        self.dtype, self.device = head.lm_rows.dtype, head.lm_rows.device
        self.cache = HeadCache(head.cfg, max_len, self.device, self.dtype)
        self.buckets = buckets_for(max_len)
        self.g = torch.zeros(1, head.cfg.hidden_size, dtype=self.dtype, device=self.device)
        self.x = torch.zeros(1, dtype=torch.long, device=self.device)
        self.pos = torch.zeros((), dtype=torch.long, device=self.device)
        self.graphs: dict[int, tuple[object, tuple[torch.Tensor, torch.Tensor]]] = {}
        self.reads: dict[tuple[int, int], tuple[object, torch.Tensor]] = {}  # (n, bucket) -> a read's graph
        self.reads_in: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # n -> its features' and tokens' buffers
        self.stand_in, self.pool, self.read_failed = False, None, False
        self.scratch = self.view()  # the view the captures write through (it holds no run's positions)
        self.owner: weakref.ref | None = None
        self.swaps, self.capture_s = 0, 0.0
        head.rope_tables(max_len, self.device)  # grown now: a captured step must not allocate its tables

    @property
    def nbytes(self) -> int:
        """The shared cache's bytes (the captured graphs' own pool is not counted)."""
        return sum(t.numel() * t.element_size() for t in (self.cache.k, self.cache.v))

    def view(self) -> HeadCache:
        """A run's head cache: the shared tensors, its own length (and saved positions while another run holds them)."""
        view = HeadCache.__new__(HeadCache)
        view.k, view.v, view.length = self.cache.k, self.cache.v, 0
        view.saved = None
        return view

    def _forward(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = step_over(self.head, self.g, self.embed(self.x).to(self.dtype), self.cache, self.pos, length)
        return g, self.head.logits(g).float()

    def capture(self, widths=(), stand_in: bool = False) -> float:
        """Capture the step at each bucket (CUDA), or record the stand-in (a CPU); returns the seconds. `widths` is
        ignored (a chain step is one position); it is there so that every slot captures alike."""
        assert self.device.type == "cuda" or stand_in, "CUDA graphs need a CUDA device"
        t0 = time.perf_counter()
        cuda = self.device.type == "cuda" and not stand_in
        pool = self.pool = pool_handle(cuda)
        self.stand_in = stand_in
        for b in self.buckets:
            self.graphs[b] = record(lambda b=b: self._forward(b), self.device, pool, stand_in=not cuda)
        if cuda:
            torch.cuda.synchronize(self.device)
        self.capture_s = time.perf_counter() - t0
        return self.capture_s

    def step(self, view: HeadCache, g: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The run's next position: (g [1, H], x [1]) -> (the predicted feature [1, H], its float32 logits
        [1, V_draft]), by one replay; the view's length grows by one."""
        assert view.length < self.max_len, "the head's cache is full"
        self.take(view)
        self.g.copy_(g)
        self.x.copy_(x)
        self.pos.fill_(view.length)
        b = next(b for b in self.buckets if b > view.length)
        graph, (g_out, logits) = self.graphs[b]
        with torch.profiler.record_function(CAPTURED):
            graph.replay()
        view.length += 1
        return g_out.clone(), logits.clone()

    def _read_forward(self, n: int, length: int) -> torch.Tensor:
        feats, tokens = self.reads_in[n]
        feat = self.head.true_feature(feats)
        return step_over(self.head, feat, self.embed(tokens).to(self.dtype), self.cache, self.pos, length)[-1:]

    def read(self, view: HeadCache, feats: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor | None:
        """The head's read of n accepted positions (the target's features [n, F] and their next tokens [n]) by one
        replay of a graph captured for n positions over the bucket that holds them, on first use (a round keeps
        at most K + 1 positions: n up to READ_MAX); the last position's predicted feature [1, H]. None for more
        positions (the prompt's, in round two): the caller reads them eagerly."""
        n = tokens.numel()
        if n > READ_MAX or view.length + n > self.max_len:
            return None
        b = next(b for b in self.buckets if b >= view.length + n)
        if (n, b) not in self.reads:  # once per (n, bucket): its buffers and capture are not a round's work
            if self.read_failed:
                return None
            try:
                with torch.profiler.record_function(CAPTURED) if self.stand_in else contextlib.nullcontext():
                    if n not in self.reads_in:
                        self.reads_in[n] = (torch.zeros(n, feats.shape[1], dtype=self.dtype, device=self.device),
                                            torch.zeros(n, dtype=torch.long, device=self.device))
                    self.reads[n, b] = self._capture_read(n, b)
            except Exception as err:  # noqa: BLE001 - any capture failure leaves the reads eager
                self.read_failed = True
                log.warning("the head's read could not be captured (%s: %s); reading eagerly", type(err).__name__,
                            err)
                self.take(view)  # the capture wrote through the scratch view: the run's positions come back
                return None
        self.take(view)
        buf_feats, buf_tokens = self.reads_in[n]
        buf_feats.copy_(feats)
        buf_tokens.copy_(tokens)
        self.pos.fill_(view.length)
        graph, out = self.reads[n, b]
        with torch.profiler.record_function(CAPTURED):
            graph.replay()
        view.length += n
        return out.clone()

    def _capture_read(self, n: int, b: int) -> tuple[object, torch.Tensor]:
        """One read graph (CUDA) or its stand-in: the cache's slots it writes are rewritten by each replay, and
        their owner's positions are saved first (take)."""
        self.take(self.scratch)  # the capture's own writes land after position 0 of a view that holds nothing
        self.pos.zero_()
        stand_in = self.device.type != "cuda" or self.stand_in
        return record(lambda: self._read_forward(n, b), self.device, self.pool, stand_in)

    def take(self, view: HeadCache) -> None:
        """Make the shared cache hold `view`'s positions (called before each of its uses): the owner's are saved
        into its view, and `view`'s put back if it saved any."""
        owner = self.owner() if self.owner is not None else None
        if owner is view:
            return
        if owner is not None and owner.length:
            owner.saved = (self.cache.k[:, : owner.length].clone(), self.cache.v[:, : owner.length].clone())
        if view.saved is not None:
            k, v = view.saved
            self.cache.k[:, : k.shape[1]].copy_(k)
            self.cache.v[:, : v.shape[1]].copy_(v)
            view.saved = None
        self.owner = weakref.ref(view)
        self.swaps += owner is not None
