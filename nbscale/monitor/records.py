"""What a TrainingMonitor was given and has not read yet: a column per metric. Numbers and CPU tensors are kept as
numbers (reading a CPU tensor waits for nothing); tensors on a GPU are kept unread and stacked in chunks, then read
in one copy to the host per device.

Why chunks: records wait seconds to be read, so they outlive Python's young garbage collections, and every object
that does is counted towards (and scanned by) the next full collection: a quarter of a second in a kernel holding
400,000 objects. Three objects a record (a row, a dict, a tensor) brought one about every other run of a fast loop;
a chunk of CHUNK tensors stacked into one leaves a few objects per chunk, and no per-record row or dict is kept.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from time import perf_counter
from typing import Any

from nbscale.errors import OptionsError

_NO_STEP = object()  # no step recorded yet: unequal to any step
KEPT = object()  # a value kept unread


class _NoTensorYet:
    """The tensor type until torch is imported."""


_tensor: type = _NoTensorYet  # torch.Tensor: record's one check for the common value, a CPU tensor
# torch.Tensor's is_cpu and item, taken from the class once: looked up on a tensor at each record, they cost a walk
# of the Tensor class' bases whenever the loop's own lookups have evicted them from Python's type cache
_is_cpu: Callable[[Any], bool] = bool
_item: Callable[[Any], Any] = float
MAX_ROWS = 65536  # records are read once this many steps are kept, wherever the next read's time is
CHUNK = 256  # tensors of one metric stacked together: one small op per CHUNK records, on their device


@dataclass
class RecordBatch:
    """Records read: the steps in order (a step recorded in consecutive calls once), and per metric the row of
    each value (an index into `steps`) and the values as numbers."""

    steps: list[Any]
    columns: dict[str, tuple[list[int], list[float]]]

    def rows(self) -> list[tuple[Any, dict[str, float]]]:
        """(step, {metric: value}) per step: what loggers, a job's record and a %%spmd rank's message take."""
        out: list[tuple[Any, dict[str, float]]] = [(step, {}) for step in self.steps]
        for name, (rows, values) in self.columns.items():
            for row, value in zip(rows, values, strict=True):
                out[row][1][name] = value
        return out


class _Column:
    """One metric's values since the last read: numbers as given, tensors in `values` until stacked into
    `chunks` (their places in `values` then hold NaN until read)."""

    __slots__ = ("chunks", "rows", "unstacked", "values")

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.values: list[Any] = []
        self.unstacked: list[int] = []  # places in `values` of tensors not yet in a chunk
        self.chunks: list[tuple[Any, list[int]]] = []  # (a 1-d tensor, the places of its values)

    def number(self, name: str, value: Any, row: int) -> Any:
        """`value` as a number, or KEPT: a tensor of a device other than the CPU is kept unread, stacked with others
        once CHUNK are kept."""
        if getattr(value, "is_cpu", False):  # a tensor of a subclass
            return value.item()
        if not hasattr(value, "detach"):
            return _number(name, value)
        tensor = value
        if tensor.requires_grad:  # a kept graph costs a fast loop ~6% (reading grad_fn instead: 2 us a call)
            tensor = tensor.detach()
        self.unstacked.append(len(self.values))
        self.values.append(tensor)
        self.rows.append(row)
        if len(self.unstacked) >= CHUNK:
            self.stack(name)
        return KEPT

    def stack(self, name: str) -> None:
        places, self.unstacked = self.unstacked, []
        try:
            self.chunks += _stacked(name, [self.values[place] for place in places], places)
        finally:  # read from the chunks, or not at all (a tensor of many values: the error says so once)
            for place in places:
                self.values[place] = float("nan")


class RecordKeeper:
    """A TrainingMonitor's `record` and the records it keeps until read (the monitor inherits both): `record` runs
    at every iteration of the user's loop, in one Python frame, a few list appends on the monitor itself.

    Between a fast loop's kernels, what costs is code the loop runs nowhere else: torch's code evicts it from the
    CPU's instruction cache at every iteration, so each such path is fetched again (callgrind, a 150k images/s loop:
    the monitor's four calls missed the instruction cache ~460 times an iteration, four calls doing nothing ~120).
    So `record` uses what the loop itself uses (list appends, dict subscripts): it walks the metrics' names, not
    `values.items()`, and reads a tensor through torch.Tensor's own `is_cpu` and `item`, not by attribute lookups
    on the tensor (with update_info's names walked too: ~300 misses an iteration). It still reads the clock at
    every record: reading it every few records instead measured no better, and a loop that slowed down (records
    a minute apart after a fast phase) would have had its reads put off by as many records.
    The monitor sets `_next_read` (a perf_counter time) and defines `_read_due` (read, draw, log)."""

    _next_read: float
    _steps: list[Any]
    _last_step: Any
    _record_columns: dict[str, _Column]

    def _keep_records_of(self, names: tuple[str, ...]) -> None:
        global _tensor, _is_cpu, _item
        torch = sys.modules.get("torch")  # a loop recording tensors has imported torch (nbscale does not need it)
        if torch is not None:
            _tensor = torch.Tensor
            _is_cpu = inspect.getattr_static(torch.Tensor, "is_cpu").__get__
            _item = torch.Tensor.item
        self._record_names = names
        self._clear_records()

    def record(self, step: object, **values: object) -> None:
        """Record metric values (numbers or one-element tensors; a GPU's are not read here) at `step` (the x value)."""
        steps = self._steps
        if step != self._last_step:  # consecutive records of one step make one row
            steps.append(step)
            self._last_step = step
        row = len(steps) - 1
        columns = self._record_columns
        try:
            for name in values:
                value = values[name]
                column = columns[name]
                if type(value) is _tensor and _is_cpu(value):
                    value = _item(value)  # a CPU tensor: nothing to wait for, read now
                elif type(value) is not float:
                    value = column.number(name, value, row)
                    if value is KEPT:  # another device's tensor: read later, in a bunch, no sync here
                        continue
                column.values.append(value)
                column.rows.append(row)
        except BaseException as error:
            self._record_failed(error, row, values)  # raises the clear error it means, if any
            raise
        if row >= MAX_ROWS or perf_counter() >= self._next_read:
            self._read_due()

    def _read_due(self) -> None:
        raise NotImplementedError

    @property
    def _records_kept(self) -> int:
        """How many steps have records not read yet."""
        return len(self._steps)

    def _record_failed(self, error: BaseException, row: int, values: Mapping[str, object]) -> None:
        """After a failed record (the values before the failure kept): no empty row left, and a clear error for an
        unknown name or a CPU tensor of several values."""
        columns = self._record_columns
        if not any(c.rows and c.rows[-1] == row for c in columns.values()):  # the step's row is empty
            self._steps.pop()
            self._last_step = self._steps[-1] if self._steps else _NO_STEP
        unknown = sorted(set(values) - set(columns))
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
        by_device: dict[Any, list[tuple[Any, _Column, list[int]]]] = {}
        for name, column in self._record_columns.items():
            if column.unstacked:
                column.stack(name)
            for tensor, places in column.chunks:
                by_device.setdefault(tensor.device, []).append((tensor, column, places))
        if by_device:
            _read(by_device)
        columns = {name: (c.rows, list(map(float, c.values))) for name, c in self._record_columns.items() if c.rows}
        batch = RecordBatch(self._steps, columns)
        self._clear_records()
        return batch

    def _clear_records(self) -> None:
        self._steps = []
        self._last_step = _NO_STEP
        self._record_columns = {name: _Column() for name in self._record_names}


def _read(by_device: dict[Any, list[tuple[Any, _Column, list[int]]]]) -> None:
    """Each chunk's numbers into its column's places: one concatenation and copy to the host per device."""
    import torch

    with torch.no_grad():
        for parts in by_device.values():
            numbers = torch.cat([tensor for tensor, _, _ in parts]).float().tolist()
            start = 0
            for _, column, places in parts:
                for place, number in zip(places, numbers[start : start + len(places)], strict=True):
                    column.values[place] = number
                start += len(places)


def _stacked(name: str, tensors: list[Any], places: list[int]) -> list[tuple[Any, list[int]]]:
    """The tensors as 1-d tensors of their values, one per device (one op in the common case: 0-d on one)."""
    import torch

    try:
        stacked = torch.stack(tensors)
        if stacked.dim() == 1:
            return [(stacked, places)]
    except RuntimeError:  # several devices or shapes
        pass
    groups: dict[Any, tuple[list[Any], list[int]]] = {}
    for tensor, place in zip(tensors, places, strict=True):
        if tensor.numel() != 1:
            raise OptionsError(_one_value(name, tensor))
        group = groups.setdefault(tensor.device, ([], []))
        group[0].append(tensor.reshape(()))
        group[1].append(place)
    return [(torch.stack(group), group_places) for group, group_places in groups.values()]


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
