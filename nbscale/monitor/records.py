"""What a TrainingMonitor was given and has not read yet: a column per metric. Numbers and CPU tensors are kept as
numbers (reading a CPU tensor waits for nothing); tensors on a GPU are kept unread and stacked in chunks, then read
in one copy to the host per device.

Why chunks: records wait seconds to be read, so they outlive Python's young garbage collections, and every object
that does is counted towards (and scanned by) the next full collection: a quarter of a second in a kernel holding
400,000 objects. Three objects a record (a row, a dict, a tensor) brought one about every other run of a fast loop;
a chunk of CHUNK tensors stacked into one leaves a few objects per chunk, and no per-record row or dict is kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nbscale.errors import OptionsError

_NO_STEP = object()  # no step recorded yet: unequal to any step
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

    def keep_tensor(self, name: str, tensor: Any, row: int) -> None:
        """Keep a tensor (of a device other than the CPU) unread, stacked with others once CHUNK are kept."""
        if tensor.requires_grad:  # a kept graph costs a fast loop ~6% (reading grad_fn instead: 2 us a call)
            tensor = tensor.detach()
        self.unstacked.append(len(self.values))
        self.values.append(tensor)
        self.rows.append(row)
        if len(self.unstacked) >= CHUNK:
            self.stack(name)

    def stack(self, name: str) -> None:
        places, self.unstacked = self.unstacked, []
        try:
            self.chunks += _stacked(name, [self.values[place] for place in places], places)
        finally:  # read from the chunks, or not at all (a tensor of many values: the error says so once)
            for place in places:
                self.values[place] = float("nan")


class PendingRecords:
    """The records of a monitor not read yet, for the metrics `names`."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names
        self.steps: list[Any] = []
        self._last_step: Any = _NO_STEP
        self.columns: dict[str, _Column] = {}
        self.count = 0
        self._clear()

    def __len__(self) -> int:
        return self.count

    def add(self, step: object, values: Mapping[str, object]) -> int:
        """Keep `values` (numbers or one-element tensors, by metric) recorded at `step`; returns how many records
        are kept. A name that is not a metric, or a value that is not a number, raises with the values before it
        kept. This runs every iteration of the user's loop: one pass, nothing checked twice."""
        steps = self.steps
        if step != self._last_step:  # consecutive records of one step make one row
            steps.append(step)
            self._last_step = step
        row = len(steps) - 1
        try:
            for name, value in values.items():
                column = self.columns[name]
                if type(value) is float:
                    number = value
                elif getattr(value, "is_cpu", False):  # a CPU tensor: nothing to wait for, read now, nothing kept
                    try:
                        number = float(value.item())  # type: ignore[attr-defined]
                    except RuntimeError:  # more than one value
                        raise OptionsError(_one_value(name, value)) from None
                elif hasattr(value, "detach"):
                    column.keep_tensor(name, value, row)  # another device's: read later, in a bunch, no sync here
                    continue
                else:
                    number = _number(name, value)
                column.values.append(number)
                column.rows.append(row)
        except BaseException as error:
            if not any(c.rows and c.rows[-1] == row for c in self.columns.values()):  # the step's row is empty
                steps.pop()
                self._last_step = steps[-1] if steps else _NO_STEP
            if isinstance(error, KeyError) and values.keys() - self.columns.keys():
                self._raise_unknown(values)
            raise
        self.count += 1
        return self.count

    def _raise_unknown(self, values: Mapping[str, object]) -> None:
        unknown = sorted(set(values) - set(self.names))
        raise OptionsError(
            f"monitor.record(..., {unknown[0]}=...): {unknown[0]!r} is not one of the monitor's "
            f"metrics {list(self.names)}; add it to TrainingMonitor(metrics=[...])."
        )

    def take(self) -> RecordBatch:
        """Every record kept, read (one copy to the host per device), and forgotten here."""
        by_device: dict[Any, list[tuple[Any, _Column, list[int]]]] = {}
        for name, column in self.columns.items():
            if column.unstacked:
                column.stack(name)
            for tensor, places in column.chunks:
                by_device.setdefault(tensor.device, []).append((tensor, column, places))
        if by_device:
            _read(by_device)
        batch = RecordBatch(self.steps, {name: (c.rows, c.values) for name, c in self.columns.items() if c.rows})
        self._clear()
        return batch

    def _clear(self) -> None:
        self.steps = []
        self._last_step = _NO_STEP
        self.columns = {name: _Column() for name in self.names}
        self.count = 0


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
