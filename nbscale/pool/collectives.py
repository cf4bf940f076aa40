"""The collective helpers of spmd cells: broadcast, allreduce, gather, allgather, barrier.

Tensors go through torch.distributed collectives on the device where they live; any other picklable value
goes through the object collectives. Shapes may differ between ranks for gather/allgather.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

_REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN, "mean": dist.ReduceOp.SUM}
_PYTHON_REDUCERS: dict[str, Callable[[list[Any]], Any]] = {"sum": sum, "max": max, "min": min, "mean": lambda values: sum(values) / len(values)}


class Collectives:
    """Collectives over `group` (None: every worker); `src`/`dst` are global ranks."""

    def __init__(self, group: Any = None, size: int | None = None) -> None:
        self.group = group
        self.size = size if size is not None else dist.get_world_size()

    def _describe(self, value: Any) -> tuple:
        if isinstance(value, torch.Tensor):
            return ("tensor", tuple(value.shape), value.dtype)
        return ("object",)

    def broadcast(self, value: Any = None, src: int = 0) -> Any:
        """Rank `src`'s value on every rank (others may pass None)."""
        holder: list[Any] = [self._describe(value) if dist.get_rank() == src else None]
        dist.broadcast_object_list(holder, src=src, group=self.group)
        description = holder[0]
        if description[0] == "tensor":
            device = value.device if dist.get_rank() == src else self._device()
            tensor = value.contiguous() if dist.get_rank() == src else torch.empty(description[1], dtype=description[2], device=device)
            dist.broadcast(tensor, src=src, group=self.group)
            return tensor
        holder = [value]
        dist.broadcast_object_list(holder, src=src, group=self.group)
        return holder[0]

    def allreduce(self, value: Any, op: str = "sum") -> Any:
        """The reduction (sum, mean, max, min) of every rank's value, on every rank."""
        if op not in _REDUCE_OPS:
            raise ValueError(f"allreduce op must be one of {sorted(_REDUCE_OPS)}, not {op!r}")
        if isinstance(value, torch.Tensor):
            result = value.detach().clone()
            if op == "mean" and not result.is_floating_point():
                result = result.float()
            dist.all_reduce(result, op=_REDUCE_OPS[op], group=self.group)
            return result / self.size if op == "mean" else result
        values = self.allgather(value)
        return _PYTHON_REDUCERS[op](values)

    def gather(self, value: Any, dst: int = 0) -> list[Any] | None:
        """Every rank's value in a list on rank `dst`; None elsewhere."""
        values = self.allgather(value)
        return values if dist.get_rank() == dst else None

    def allgather(self, value: Any) -> list[Any]:
        """Every rank's value, in rank order, on every rank."""
        descriptions: list[Any] = [None] * self.size
        dist.all_gather_object(descriptions, self._describe(value), group=self.group)
        if all(d[0] == "tensor" for d in descriptions) and len({d[1:] for d in descriptions}) == 1:
            tensors = [torch.empty_like(value) for _ in range(self.size)]
            dist.all_gather(tensors, value.contiguous(), group=self.group)
            return tensors
        values: list[Any] = [None] * self.size
        dist.all_gather_object(values, value, group=self.group)
        return values

    def barrier(self) -> None:
        """Wait until every rank gets here."""
        dist.barrier(group=self.group)

    def _device(self) -> torch.device:
        from nbscale.pool.context import worker_context

        return worker_context().device

    def helpers(self) -> dict[str, Any]:
        """The names an spmd cell sees."""
        return {
            "broadcast": self.broadcast,
            "allreduce": self.allreduce,
            "gather": self.gather,
            "allgather": self.allgather,
            "barrier": self.barrier,
        }
