"""The collective helpers of spmd cells: broadcast, allreduce, gather, allgather, barrier.

Tensors go through torch.distributed collectives on the device where they live; any other picklable value
goes pickled and sealed with the pool's key (nbscale.pool.sealed), so a peer's bytes are checked before they are
unpickled. Shapes may differ between ranks for gather/allgather, not for allreduce.

Each rank records which helper it is in and how many it has called in this request (`current_collective`), which
its heartbeat reports: ranks waiting in different collectives (allreduce on one, broadcast on another) never
return, and the kernel names them (nbscale.pool.health.collective_mismatch).
"""

from __future__ import annotations

import functools
import hashlib
import operator
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from nbscale.pool.sealed import all_gather_objects, open_sealed, pool_key, seal

_REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN, "mean": dist.ReduceOp.SUM}
# values other than tensors pairwise, so NumPy arrays reduce element by element as tensors do
_PAIRWISE: dict[str, Callable[[Any, Any], Any]] = {
    "sum": operator.add,
    "mean": operator.add,
    "max": np.maximum,
    "min": np.minimum,
}


@dataclass
class _Calls:
    count: int = 0  # collectives this worker called in the request it runs
    inside: str = ""  # the one it is in now, as "allreduce#3" (empty: none)


_calls = _Calls()


def new_request() -> None:
    """Count this worker's collectives from 1 again (each request of the worker)."""
    _calls.count, _calls.inside = 0, ""


def current_collective() -> str:
    """The collective this worker's main thread is in, as "<helper>#<its number in this request>", or ""."""
    return _calls.inside


def _recorded(helper: Callable[..., Any]) -> Callable[..., Any]:
    """Record `helper` as the collective this worker is in while it runs (not the helpers it calls itself)."""

    @functools.wraps(helper)
    def recording(*args: object, **kwargs: object) -> Any:
        if _calls.inside:  # gather through allgather: the user called gather
            return helper(*args, **kwargs)
        _calls.count += 1
        _calls.inside = f"{helper.__name__}#{_calls.count}"
        try:
            return helper(*args, **kwargs)
        finally:
            _calls.inside = ""

    return recording


# broadcast's header: kind, dtype index or pickled length, device kind, number of dimensions, the dimensions
_TENSOR, _OBJECT = 1, 2
_ON_CPU = 1
_HEADER_DIMS = 32  # a tensor with more dimensions goes pickled, as objects do
_HEADER_SIZE = 4 + _HEADER_DIMS
_DTYPES = sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str)


class Collectives:
    """Collectives among `ranks` (the cell's targets; None: every worker) over `group`; `src`/`dst` are global
    ranks, and one that is not among `ranks` is a ValueError naming them."""

    def __init__(self, group: dist.ProcessGroup | None = None, ranks: tuple[int, ...] | None = None) -> None:
        self.group = group
        self.ranks = ranks if ranks is not None else tuple(range(dist.get_world_size()))
        self.size = len(self.ranks)

    def _describe(self, value: Any) -> tuple[Any, ...]:
        if isinstance(value, torch.Tensor):
            return ("tensor", tuple(value.shape), value.dtype, value.device.type)
        return ("object",)

    def _kinds(self, value: Any) -> str:
        """What the ranks hold, told by one small collective: "same tensors" (one shape, dtype and device type
        everywhere), "objects" (no tensor anywhere) or "mixed"."""
        signature = _signature(self._describe(value))
        bounds = torch.tensor([signature, -signature], dtype=torch.int64)  # on the CPU: every group has gloo
        dist.all_reduce(bounds, op=dist.ReduceOp.MAX, group=self.group)
        highest, negated_lowest = bounds.tolist()
        if highest == -negated_lowest:
            return "same tensors" if highest else "objects"
        return "mixed"

    def _check_member(self, call: str, role: str, rank: int) -> None:
        if rank not in self.ranks:
            raise ValueError(
                f"{call}({role}={rank}): worker {rank} does not run this cell, which runs on ranks "
                f"{', '.join(map(str, self.ranks))} (--targets). Give {role}= one of them: {role} is a global rank."
            )

    @_recorded
    def broadcast(self, value: Any = None, src: int = 0) -> Any:
        """Rank `src`'s value on every rank (others may pass None).

        Two collectives: a fixed-size header (a tensor's shape, dtype and device kind, or an object's sealed
        length), then the tensor itself or the pickled bytes, sealed with the pool's key (nbscale.pool.sealed).
        """
        self._check_member("broadcast", "src", src)
        sender = dist.get_rank() == src
        header = torch.zeros(_HEADER_SIZE, dtype=torch.int64)  # on the CPU: every group has gloo
        pickled = None
        if sender:
            pickled = _write_header(header, value, src)
        dist.broadcast(header, src=src, group=self.group)
        if header[0] == _TENSOR:
            if sender:
                tensor = value.contiguous()
            else:  # a CPU tensor arrives on the CPU (gloo), a GPU tensor on each worker's own GPU (NCCL)
                device = torch.device("cpu") if header[2] == _ON_CPU else self._device()
                tensor = torch.empty(header[4 : 4 + header[3]].tolist(), dtype=_DTYPES[header[1]], device=device)
            dist.broadcast(tensor, src=src, group=self.group)
            return tensor
        data = pickled if pickled is not None else torch.empty(int(header[1]), dtype=torch.uint8)
        dist.broadcast(data, src=src, group=self.group)
        return value if sender else pickle.loads(open_sealed(pool_key(), src, data.numpy().tobytes()))

    @_recorded
    def allreduce(self, value: Any, op: str = "sum") -> Any:
        """The reduction (sum, mean, max, min) of every rank's value, on every rank.

        Tensors need the same shape and dtype on every rank, on one kind of device (a ValueError says which
        differ); NumPy arrays and numbers reduce element by element; mean of an integer tensor is a float tensor.
        """
        if op not in _REDUCE_OPS:
            raise ValueError(f"allreduce op must be one of 'sum', 'mean', 'max', 'min', not {op!r}.")
        held = self._kinds(value)
        if held == "same tensors":
            result = value.detach().clone()
            if op == "mean" and not result.is_floating_point():
                result = result.float()
            dist.all_reduce(result, op=_REDUCE_OPS[op], group=self.group)
            return result / self.size if op == "mean" else result
        if held == "mixed":
            descriptions = all_gather_objects(self._describe(value), self.group)
            raise ValueError(_mismatch(descriptions, self.ranks))
        values = all_gather_objects(value, self.group)
        try:
            return _reduce_values(values, op)
        except (TypeError, ValueError) as error:
            kinds = sorted({type(v).__name__ for v in values})
            raise TypeError(
                f"allreduce(op={op!r}) cannot combine {' and '.join(kinds)} values ({error}): it reduces tensors, "
                "NumPy arrays and numbers. Use allgather(value) for the list of every rank's value."
            ) from None

    @_recorded
    def gather(self, value: Any, dst: int = 0) -> list[Any] | None:
        """Every rank's value in a list on rank `dst`; None elsewhere."""
        self._check_member("gather", "dst", dst)
        values = self.allgather(value)
        return values if dist.get_rank() == dst else None

    @_recorded
    def allgather(self, value: Any) -> list[Any]:
        """Every rank's value, in rank order, on every rank."""
        if self._kinds(value) == "same tensors":
            tensors = [torch.empty_like(value) for _ in range(self.size)]
            dist.all_gather(tensors, value.contiguous(), group=self.group)
            return tensors
        return all_gather_objects(value, self.group)

    @_recorded
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


def _write_header(header: torch.Tensor, value: object, src: int) -> torch.Tensor | None:
    """Fill broadcast's header for `value`; returns its pickled bytes sealed by rank `src` (a uint8 tensor) unless
    it goes as a tensor."""
    if isinstance(value, torch.Tensor) and value.dim() <= _HEADER_DIMS and value.dtype in _DTYPES:
        header[:4] = torch.tensor([_TENSOR, _DTYPES.index(value.dtype), int(value.device.type == "cpu"), value.dim()])
        header[4 : 4 + value.dim()] = torch.tensor(value.shape, dtype=torch.int64)
        return None
    pickled = torch.frombuffer(bytearray(seal(pool_key(), src, pickle.dumps(value))), dtype=torch.uint8)
    header[:2] = torch.tensor([_OBJECT, pickled.numel()])
    return pickled


def _mismatch(descriptions: list[tuple[Any, ...]], ranks: tuple[int, ...]) -> str:
    """What differs between the ranks' allreduce values, each rank's shape and dtype (or kind)."""
    devices = {d[3] for d in descriptions if d[0] == "tensor"}

    def shown(description: tuple[Any, ...]) -> str:
        if description[0] != "tensor":
            return "not a tensor"
        where = f" on {description[3]}" if len(devices) > 1 else ""
        return f"shape {tuple(description[1])} {str(description[2]).removeprefix('torch.')}{where}"

    each = "; ".join(f"rank {rank}: {shown(d)}" for rank, d in zip(ranks, descriptions, strict=True))
    return f"allreduce needs a tensor of the same shape and dtype on every rank, on one kind of device ({each})."


def _signature(description: tuple[Any, ...]) -> int:
    """0 for a value that is not a tensor; else a number (>= 1) standing for its description (shape, dtype and
    device type), the same in every process."""
    if description[0] != "tensor":
        return 0
    return int.from_bytes(hashlib.blake2b(repr(description).encode(), digest_size=7).digest(), "big") + 1


def _reduce_values(values: list[Any], op: str) -> object:
    """Every rank's value (not tensors) reduced by `op`; Python numbers stay Python numbers."""
    if op in ("max", "min") and all(isinstance(v, (int, float)) for v in values):
        return max(values) if op == "max" else min(values)
    reduced = functools.reduce(_PAIRWISE[op], values)
    return reduced / len(values) if op == "mean" else reduced
