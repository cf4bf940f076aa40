"""What a TrainingMonitor was given and has not read yet: one flat list for the whole monitor, a record as its
step, then each metric's name and value, then an end mark. Numbers and CPU tensors are kept as numbers (reading a
CPU tensor waits for nothing); tensors on a GPU are kept unread and stacked in chunks, then read in one copy to the
host per device.

Why one flat list: between a fast loop's kernels, Python code costs what it touches that the loop does not, as the
loop's own code and data evict it from the CPU's caches at every iteration (docs/architecture.md,
TrainingMonitor). Appends to one list touch one object and the end of its array; a list of steps and two lists
per metric (rows and values) touched six, and cost a 150k images/s loop ~0.3% more. The read parses the list.

Why chunks: records wait seconds to be read, so they outlive Python's young garbage collections, and every object
that does is counted towards (and scanned by) the next full collection: a quarter of a second in a kernel holding
400,000 objects. Numbers, names and steps are not tracked by the collector; a GPU's tensors are, so CHUNK of them
are stacked into one.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from time import perf_counter
from typing import Any

from nbscale.errors import OptionsError

_NO_STEP = object()  # no step read yet: unequal to any step
_END = object()  # the end of a record in the kept list
KEPT = object()  # a value kept unread: the next of its metric's chunks


class _NoTensorYet:
    """The tensor type until torch is imported."""


_tensor: type = _NoTensorYet  # torch.Tensor: record's one check for the common value, a CPU tensor
_item: Callable[[Any], Any] = float  # torch.Tensor.item, taken from the class once torch is imported
MAX_ROWS = 65536  # the most steps a read should find: the monitor reads sooner at a pace that would keep more
CHUNK = 256  # tensors of one metric stacked together: one small op per CHUNK records, on their device


@dataclass
class RecordBatch:
    """Records read: the steps in order (a step recorded in consecutive calls once), and per metric the row of
    each value (an index into `steps`) and the values as numbers."""

    steps: list[Any]
    columns: dict[str, tuple[list[int], list[float]]]


class _Unread:
    """One metric's tensors of another device than the CPU, in the order recorded: `unstacked` until CHUNK are
    kept, then stacked into `chunks` (a 1-d tensor, or NaNs for tensors that could not be stacked)."""

    __slots__ = ("chunks", "unstacked")

    def __init__(self) -> None:
        self.unstacked: list[Any] = []
        self.chunks: list[Any] = []

    def keep(self, name: str, tensor: Any) -> None:
        if tensor.requires_grad:  # a kept graph costs a fast loop ~6% (reading grad_fn instead: 2 us a call)
            tensor = tensor.detach()
        self.unstacked.append(tensor)
        if len(self.unstacked) >= CHUNK:
            self.stack(name)

    def stack(self, name: str) -> None:
        tensors, self.unstacked = self.unstacked, []
        try:
            self.chunks += _stacked(name, tensors)
        except BaseException:  # read as NaN (a tensor of many values: the error says so once)
            self.chunks.append([math.nan] * len(tensors))
            raise


class RecordKeeper:
    """A TrainingMonitor's `record` and the records it keeps until read (the monitor inherits both): `record` runs
    at every iteration of the user's loop, in one Python frame, appending to one list.

    It uses what the loop itself uses (list appends, dict subscripts) and touches as little as it can: a metric's
    CPU tensors are read with torch.Tensor's own `item` once the metric's first tensor since the last read was
    found on the CPU (`_read_now`: a GPU's tensor recorded later under that name is read all the same, with a
    sync, until the next read looks again). It reads the clock at every record: reading it every few records
    measured no better, and a loop that slowed down would have had its reads put off by as many records.
    The monitor sets `_next_read` (a perf_counter time) and defines `_read_due` (read, draw, log)."""

    _next_read: float
    _kept: list[Any]
    _read_now: dict[str, bool]
    _unread: dict[str, _Unread]

    def _keep_records_of(self, names: tuple[str, ...]) -> None:
        # the one `global` left in nbscale: record's fast path reads these as globals (its cost measured so)
        global _tensor, _item
        torch = sys.modules.get("torch")  # a loop recording tensors has imported torch (nbscale does not need it)
        if torch is not None:
            _tensor, _item = torch.Tensor, torch.Tensor.item
        self._record_names = names
        self._clear_records()

    def record(self, step: object, **values: object) -> None:
        """Record metric values (numbers or one-element tensors; a GPU's are not read here) at `step` (the x value)."""
        kept = self._kept
        kept.append(step)
        read_now = self._read_now
        try:
            for name in values:
                value = values[name]
                if read_now[name] and type(value) is _tensor:  # a KeyError: not one of the monitor's metrics
                    value = _item(value)
                elif type(value) is not float:
                    value = self._kept_value(name, value)
                kept.append(name)
                kept.append(value)
        except BaseException as error:
            self._record_failed(error, values)  # raises the clear error it means, if any
            raise
        kept.append(_END)
        if perf_counter() >= self._next_read:
            self._read_due()

    def _kept_value(self, name: str, value: Any) -> Any:
        """`value` as a number, or KEPT: a tensor of a device other than the CPU is kept unread."""
        if getattr(value, "is_cpu", False):  # a CPU tensor (a subclass's too): read now, the metric's next ones too
            if type(value) is _tensor:
                self._read_now[name] = True
            return value.item()
        if not hasattr(value, "detach"):
            return _number(name, value)
        unread = self._unread.get(name)
        if unread is None:  # not setdefault: it would build an _Unread at every record
            unread = self._unread[name] = _Unread()
        unread.keep(name, value)
        return KEPT

    def _read_due(self) -> None:
        raise NotImplementedError

    @property
    def _records_kept(self) -> int:
        """How many records (calls) are kept unread."""
        return sum(1 for entry in self._kept if entry is _END)

    def _record_failed(self, error: BaseException, values: Mapping[str, object]) -> None:
        """After a failed record (the values before the failure kept): its end marked, or its step taken back if
        it kept no value, and a clear error for an unknown name or a CPU tensor of several values."""
        kept = self._kept
        start = len(kept) - 1
        while start > 0 and kept[start - 1] is not _END:
            start -= 1
        if start == len(kept) - 1:
            kept.pop()
        else:
            kept.append(_END)
        unknown = sorted(set(values) - set(self._read_now))
        if isinstance(error, KeyError) and unknown:
            raise OptionsError(
                f"monitor.record(..., {unknown[0]}=...): {unknown[0]!r} is not one of the monitor's "
                f"metrics {list(self._record_names)}; add it to TrainingMonitor(metrics=[...])."
            ) from None
        if isinstance(error, RuntimeError):
            for name, value in values.items():
                if getattr(value, "is_cpu", False) and value.numel() != 1:  # type: ignore[attr-defined]
                    raise OptionsError(_one_value(name, value)) from None

    def _take_records(self) -> RecordBatch:
        """Every record kept, read (one copy to the host per device), and forgotten here."""
        unread = _read(self._unread)  # first: a failure leaves the records kept, the failed values as NaN
        kept = self._kept
        self._clear_records()
        return _parsed(kept, unread)

    def _clear_records(self) -> None:
        self._kept = []
        self._read_now = dict.fromkeys(self._record_names, False)
        self._unread = {}


def _parsed(kept: list[Any], unread: dict[str, Iterator[float]]) -> RecordBatch:
    """The kept list as steps and columns, consecutive records of one step as one row."""
    batch = _parsed_alike(kept) if not unread else None
    if batch is not None:
        return batch
    steps: list[Any] = []
    columns: dict[str, tuple[list[int], list[float]]] = {}
    last, row, index = _NO_STEP, -1, 0
    while index < len(kept):
        step = kept[index]
        if step != last:
            steps.append(step)
            last, row = step, row + 1
        index += 1
        while kept[index] is not _END:
            name, value = kept[index], kept[index + 1]
            rows, values = columns.setdefault(name, ([], []))
            rows.append(row)
            values.append(float(next(unread[name]) if value is KEPT else value))
            index += 2
        index += 1
    return RecordBatch(steps, columns)


def _parsed_alike(kept: list[Any]) -> RecordBatch | None:
    """The common case in a few slices: every record the same names in the same order, at a new step; else None.
    (Records of another length would put a name or an end where the first record has the other.)"""
    length = next((index + 1 for index, entry in enumerate(kept) if entry is _END), 0)
    if not length or len(kept) % length or any(end is not _END for end in kept[length - 1 :: length]):
        return None
    names = kept[1 : length - 1 : 2]
    if any(kept[1 + 2 * slot :: length].count(name) != len(kept) // length for slot, name in enumerate(names)):
        return None
    steps = kept[0::length]
    if not _all_differ(steps):
        return None
    rows = list(range(len(steps)))
    return RecordBatch(
        steps, {name: (rows.copy(), list(map(float, kept[2 + 2 * slot :: length]))) for slot, name in enumerate(names)}
    )


def _all_differ(steps: list[Any]) -> bool:
    """True when no two consecutive steps are equal."""
    if all(type(step) is int for step in steps):
        return all(a != b for a, b in zip(steps, steps[1:], strict=False))
    return all(bool(a != b) for a, b in zip(steps, steps[1:], strict=False))


def _read(unread: dict[str, _Unread]) -> dict[str, Iterator[float]]:
    """Each metric's kept tensors as numbers, in order: one concatenation and copy to the host per device."""
    if not unread:
        return {}
    import torch

    for name, tensors in unread.items():
        if tensors.unstacked:
            tensors.stack(name)
    by_device: dict[Any, list[Any]] = {}
    for tensors in unread.values():
        for chunk in tensors.chunks:
            if not isinstance(chunk, list):
                by_device.setdefault(chunk.device, []).append(chunk)
    numbers_of: dict[int, list[float]] = {}
    with torch.no_grad():
        for chunks in by_device.values():
            numbers = torch.cat(chunks).float().tolist()
            start = 0
            for chunk in chunks:
                numbers_of[id(chunk)] = numbers[start : start + len(chunk)]
                start += len(chunk)
    return {
        name: iter([n for chunk in t.chunks for n in (chunk if isinstance(chunk, list) else numbers_of[id(chunk)])])
        for name, t in unread.items()
    }


def _stacked(name: str, tensors: list[Any]) -> list[Any]:
    """The tensors as 1-d tensors of their values, one per device (one op in the common case: 0-d on one); the
    order is kept (a device's tensors among another's split the chunk)."""
    import torch

    try:
        stacked = torch.stack(tensors)
        if stacked.dim() == 1:
            return [stacked]
    except RuntimeError:  # several devices or shapes
        pass
    runs: list[tuple[Any, list[Any]]] = []
    for tensor in tensors:
        if tensor.numel() != 1:
            raise OptionsError(_one_value(name, tensor))
        if not runs or runs[-1][0] != tensor.device:
            runs.append((tensor.device, []))
        runs[-1][1].append(tensor.reshape(()))
    return [torch.stack(run) for _, run in runs]


def step_number(step: object) -> Any:
    """A step as a number (a tensor's value read)."""
    return step.item() if hasattr(step, "item") else step


def _one_value(name: str, tensor: Any) -> str:
    return (
        f"monitor.record(..., {name}=...): got a tensor of shape {tuple(tensor.shape)}; give a number or "
        f"a one-element tensor (such as loss, or loss.mean())."
    )


def _number(name: str, value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise OptionsError(f"monitor.record(..., {name}={value!r}): give a number or a one-element tensor.") from None
