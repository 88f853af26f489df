"""The static path's parts that models/static.py and models/head_graphs.py share: the cache lengths a forward
attends over (`buckets_for`) and a bucket's view of a cache (`cache_view`); the bytes a cache takes (`cache_bytes`)
and the window the caches get where device memory is short (`fitting_window`, `plan_window`); the capture of a
CUDA graph (`cuda_graph`), or of its stand-in on a CPU (models/stand_in.py), by `record`. No model forwards here."""

from __future__ import annotations

import copy
import time

import torch

from .stand_in import CAPTURED, ReplayStandIn, StandInPool  # noqa: F401 - CAPTURED: the graph modules import it

MIN_BUCKET = 64  # the shortest cache length a forward attends over
MIN_WINDOW = 512  # a GPU too small for the largest request's static caches shrinks them, down to this window


def cuda_graph(forward, device: torch.device, pool, warmups: int = 2) -> tuple[torch.cuda.CUDAGraph, object]:
    """`forward`'s CUDA graph and what its captured run returned (the graph's output buffers): `warmups` runs on a
    side stream first (lazy allocations and library handles must happen before capture), then the capture into the
    memory pool `pool` (None: a pool of its own); `record` calls it."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream), torch.inference_mode():
        for _ in range(warmups):
            forward()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool), torch.inference_mode():
        out = forward()
    return graph, out


def buckets_for(max_len: int, smallest: int = MIN_BUCKET) -> tuple[int, ...]:
    """The cache lengths a forward may attend over: the powers of two from `smallest` below `max_len`, then `max_len`
    (a power b with max_len - b < b / 8 is left out: it would cost what the whole cache costs). A forward whose
    last slot is s attends over the smallest that holds s + 1: at most twice what the cache holds."""
    out, b = [], smallest
    while b < max_len:
        if max_len - b >= b // 8:
            out.append(b)
        b *= 2
    return (*out, max_len)


def cache_view(cache, length: int):
    """A StaticCache whose layers are the first `length` slots of `cache`'s: the same storage and the same write
    counters, so a forward through it writes where one through `cache` would, and attends over `length` slots."""
    if length == cache.layers[0].max_cache_len:
        return cache
    view = copy.copy(cache)
    view.layers = []
    for layer in cache.layers:
        part = copy.copy(layer)  # device, heads, head sizes, is_initialized and the counter tensor, shared
        part.max_cache_len = length
        part.keys, part.values = layer.keys[:, :, :length], layer.values[:, :, :length]
        view.layers.append(part)
    return view


def kv_shape(cfg) -> tuple[int, int]:
    """(key/value heads, head dimension) of a model's attention, from its config (GQA where it names its KV heads)."""
    heads = cfg.num_attention_heads
    return getattr(cfg, "num_key_value_heads", None) or heads, getattr(cfg, "head_dim", None) or cfg.hidden_size // heads


def cache_bytes(model, max_len: int) -> int:
    """Bytes of one static cache of `max_len` tokens for `model` (keys and values, every layer)."""
    kv_heads, head_dim = kv_shape(model.config)
    return (2 * model.config.num_hidden_layers * kv_heads * head_dim * max_len
            * next(model.parameters()).element_size())


def fitting_window(models: list, window: int, pad: int, free: int) -> int:
    """The longest request window, halving from `window` but not below MIN_WINDOW, whose static caches (every
    model's, `pad` slots wider) take at most half of the `free` bytes."""
    while window > MIN_WINDOW and sum(cache_bytes(m, window + pad) for m in models) > free // 2:
        window = max(MIN_WINDOW, window // 2)
    return window


def plan_window(context_window: int, max_request: int | None, models: list, pad: int, free: int | None
                ) -> tuple[int, int | None, bool]:
    """(window, cap, short): the static caches' window (tokens, `pad` slots to add) for requests of at most
    `max_request` tokens (the context window by default), given `free` device bytes (None: not counted, a CPU);
    the cap a shortened window puts on requests (None: none); and whether memory shortened the window below what
    was asked (only then is there something to warn of: a bench's short max_request is no shortage)."""
    asked = min(context_window, max_request or context_window)
    window = asked if free is None else fitting_window(models, asked, pad, free)
    return window, (window if window < context_window else None), window < asked


def tree_made(slots: torch.Tensor, start: torch.Tensor, parent_row: torch.Tensor, bucket: int, dtype: torch.dtype,
              last_position: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A tree forward's positions [1, w] and mask [1, 1, w, bucket] made inside a captured forward from the device
    scalar `start` and each fed row's parent among the fed rows, parent_row [w] (-1: none; tree.TreeForward): a row
    sees the cache before `start`, itself and its ancestors, and sits at start + its number of ancestors. A causal
    forward is the chain of parents -1, 0, 1, ...; a tree's rows are the fixed tokens' chain, then its nodes."""
    w = parent_row.shape[0]
    idx = slots[:w]
    reach = (parent_row.view(w, 1) == idx.view(1, w)) | (idx.view(w, 1) == idx.view(1, w))  # parent or itself
    for _ in range(max(0, (w - 1).bit_length())):  # paths of up to 2^t steps after t squarings: w - 1 suffice
        reach = reach | ((reach.float() @ reach.float()) > 0)
    positions = (start + reach.sum(1) - 1).clamp_(max=last_position).view(1, w)
    allowed = (slots[:bucket] < start).view(1, bucket).expand(w, bucket).clone()
    allowed.scatter_(1, (start + idx).view(1, w).expand(w, w), reach)
    mask = torch.zeros((), dtype=dtype, device=slots.device).masked_fill(~allowed, torch.finfo(dtype).min)
    return positions, mask.view(1, 1, w, bucket)


class Tally:
    """The graphs `record` has made in this process (a failed capture is not counted) and the host seconds they took
    (bench/round_ops.py prints them per run: a setting's first run captures, later ones should not)."""
    count, seconds = 0, 0.0


def pool_handle(cuda: bool):
    """A memory pool for graphs that share one: CUDA's (torch.cuda.graph_pool_handle), or its stand-in's."""
    return torch.cuda.graph_pool_handle() if cuda else StandInPool()


def shared_pool(owner, name: str, cuda: bool):
    """The pool that `owner`'s graphs of one kind share (its attribute `name`), made on first use (pool_handle)."""
    pool = owner.__dict__.get(name)
    if pool is None or isinstance(pool, StandInPool) == cuda:
        pool = pool_handle(cuda)
        setattr(owner, name, pool)
    return pool


def record(forward, device: torch.device, pool, stand_in: bool, warmups: int = 2) -> tuple[object, object]:
    """(graph, output buffers): `forward` captured as a CUDA graph (cuda_graph) or, with stand_in, recorded as its
    CPU stand-in (ReplayStandIn), into the shared `pool` (pool_handle; None: a pool of its own). Every captured
    part of specdemo is made by this."""
    t0 = time.perf_counter()
    if stand_in:
        graph = ReplayStandIn(forward, warmups, pool if isinstance(pool, StandInPool) else None)
        made = graph, graph.out
    else:
        made = cuda_graph(forward, device, pool, warmups)
    Tally.count += 1
    Tally.seconds += time.perf_counter() - t0
    return made
