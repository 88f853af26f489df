"""A tree round's roll-back in the target's static cache as one replay (issue 45, item 3: the cache rolled back on
the device without a launch per layer).

After a tree round the kept path's keys and values move up to sit right after the fixed tokens
(StaticLM.keep_rows). Step by step that is an index and a copy for each layer's keys and values, about 120
operators for SmolLM2's 30 layers. Where the target's forwards are captured (CUDA, or the graphs' stand-in on a
CPU), the move of m rows is one graph per m: the rows' sources come in a buffer, their first destination in a
device scalar."""

from __future__ import annotations

import contextlib
import logging

import torch

from .devices import upload_ids
from .static_parts import CAPTURED, record, shared_pool

log = logging.getLogger(__name__)


class RowMoves:
    """The moves of one static slot's cache, one graph per number of rows moved."""

    def __init__(self, slot, stand_in: bool):
        self.slot, self.stand_in, self.failed = slot, stand_in, False
        self.graphs: dict[int, tuple[object, torch.Tensor, torch.Tensor]] = {}

    def _forward(self, src: torch.Tensor, first: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        dst = first + torch.arange(src.shape[0], device=src.device)
        for k, v in self.slot.kv:
            for t in (k, v):
                t.index_copy_(2, dst, t.index_select(2, src))  # the rows are read before any is written
        return dst, dst

    def _capture(self, m: int) -> tuple[object, torch.Tensor, torch.Tensor]:
        dev = self.slot.device
        # the capture's own moves put slots 0..m-1 onto themselves: nothing a run holds changes
        src, first = torch.arange(m, device=dev), torch.zeros((), dtype=torch.long, device=dev)
        pool = shared_pool(self.slot, "move_pool", cuda=not self.stand_in)
        graph, _ = record(lambda: self._forward(src, first), dev, pool, self.stand_in, warmups=1)
        return graph, src, first

    def move(self, src: list[int], first: int) -> bool:
        """Copy the cache's rows at slots `src` to slots first, first + 1, ... by one replay; False where no graph
        could be captured (the caller moves them step by step)."""
        m = len(src)
        if m not in self.graphs:
            if self.failed:
                return False
            try:  # once per m: on the stand-in its buffers and run count as captured work, not a round's
                with torch.profiler.record_function(CAPTURED) if self.stand_in else contextlib.nullcontext():
                    self.graphs[m] = self._capture(m)
            except Exception as err:  # noqa: BLE001 - any capture failure leaves the moves step by step
                self.failed = True
                log.warning("the cache's row moves could not be captured (%s: %s); moving them step by step",
                            type(err).__name__, err)
                return False
        graph, buf_src, buf_first = self.graphs[m]
        buf_src.copy_(upload_ids(src, buf_src.device))  # on CUDA without a sync
        buf_first.fill_(first)
        graph.replay()
        return True
