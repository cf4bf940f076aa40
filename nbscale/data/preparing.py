"""Reading a dataset into memory before training: who reads which items, and progress while they are read.

On a pool every rank trains on rows taken from the whole training set (each global mini-batch comes from the
epoch's shuffled order, so over the epochs a rank may need any item), so every rank must hold every item. They
do not each read it all: `Readers` gives each rank one contiguous block of the items to read and decode, then
the ranks exchange the decoded tensors over their torch.distributed group (gloo between CPU workers, NCCL
between GPUs, where the tensors already are), so each file is read once in all and every rank holds the whole
set. `Progress` counts the items read and reports at most every REPORT_EVERY_S seconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

REPORT_EVERY_S = 0.25
GATHER_CHUNK_BYTES = 32 << 20  # bytes each rank sends per collective: bounds the collective's own buffers


@dataclass(frozen=True)
class Readers:
    """The ranks that read one dataset together: this rank is `position` of `count`, in `group`; tensors they
    exchange go through `device` (a CUDA device for NCCL, the CPU for gloo)."""

    position: int
    count: int
    group: torch.distributed.ProcessGroup | None  # a torch.distributed group
    device: torch.device

    def block_size(self, items: int) -> int:
        return -(-items // self.count)

    def block(self, items: int) -> range:
        """The items this rank reads: a contiguous block, the last one shorter (or empty)."""
        size = self.block_size(items)
        return range(min(items, self.position * size), min(items, (self.position + 1) * size))

    def exchange(self, value: object) -> list[Any]:
        """Every rank's `value` (small and picklable), in rank order, on every rank (sealed with the pool's key: a
        pool worker's peers' pickles are checked before they are unpickled)."""
        from nbscale.pool.sealed import all_gather_objects

        return all_gather_objects(value, self.group)

    def gather_rows(self, rows: torch.Tensor, counts: list[int], chunk_bytes: int = GATHER_CHUNK_BYTES) -> torch.Tensor:
        """Every rank's `rows` (rank r has counts[r] of them, each of the same shape and dtype everywhere) as one
        tensor on `device`, in rank order.

        Sent as bytes (gloo does not take every dtype), in chunks of at most `chunk_bytes` per rank, straight into
        the result: where every block but the last is full, the result is a view, not a copy.
        """
        import torch.distributed as dist

        most = max(counts)
        shape, dtype = rows.shape[1:], rows.dtype
        gathered = torch.empty((most * self.count, *shape), dtype=dtype, device=self.device)
        mine = torch.zeros((most, *shape), dtype=dtype, device=self.device)
        mine[: len(rows)] = rows.to(self.device)
        send, receive = _bytes_of(mine), _bytes_of(gathered)
        block = send.numel()
        for start in range(0, block, chunk_bytes):
            end = min(block, start + chunk_bytes)
            outputs = [receive[rank * block + start : rank * block + end] for rank in range(self.count)]
            dist.all_gather(outputs, send[start:end], group=self.group)
        del mine, send
        if all(count == most for count in counts[:-1]):
            return gathered[: sum(counts)]
        kept = torch.cat([torch.arange(rank * most, rank * most + count) for rank, count in enumerate(counts)])
        return gathered.index_select(0, kept.to(self.device))


def _bytes_of(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's memory as a flat uint8 tensor (a view)."""
    flat = tensor.reshape(-1)
    return flat if flat.dtype == torch.uint8 else flat.view(torch.uint8)


class Progress:
    """Counts the items read: `start(total)`, then `add(count)` as they come in. Calls `report(done, total)` at
    the start, then at most every `every` seconds, and when the last item is in; called from the thread that
    reads (or that collects what threads read)."""

    def __init__(self, report: Callable[[int, int], None] | None = None, every: float = REPORT_EVERY_S) -> None:
        self.report, self.every = report, every
        self.done = self.total = 0
        self.last = -float("inf")

    def start(self, total: int) -> None:
        self.done, self.total, self.last = 0, total, -float("inf")
        self.add(0)

    def add(self, count: int) -> None:
        self.done += count
        now = time.perf_counter()
        if self.report is not None and (now - self.last >= self.every or self.done >= self.total):
            self.last = now
            self.report(self.done, self.total)
