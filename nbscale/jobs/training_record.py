"""The training runs of a batch job, as files any kernel can follow: `%jobs show`, `job.show()`, the lab panel.

Inside a job, each `nbscale.train` run records its events (nbscale.training.events) to `training/<n>.jsonl` in the
job's folder, n = 1, 2, ... in the order the job's trainings start (nbscale.jobs.training_recorder writes it).
The format is data only, so a reader never unpickles anything: one strict-JSON object a line,
`{"event": "IterationDone", "epoch": 1, ...}`, the fields of the event's dataclass, a float that is not finite
written as the string "NaN", "Infinity" or "-Infinity". Lines are appended in bunches, each bunch whole lines,
so a reader that stops at the last newline never sees half an event. A line that does not decode (a field
missing or of the wrong type, an unknown event) is skipped.

`training/<n>.stop` asks training n to stop at the end of its current iteration (the monitor's Stop button,
`job.stop_training()`); the recorder polls for it. Files are 0600 in the job's 0700 folder.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import types
import typing
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from nbscale.jobs.files import FILE_MODE, private_dir
from nbscale.training.events import (
    Event,
    IterationDone,
    MetricsRead,
    MonitorDone,
    MonitorEvent,
    MonitorStarted,
    PanelScale,
    TrainingDone,
    TrainingRestarted,
    TrainingStarted,
)

FOLDER = "training"
MONITOR_STOP_REASON = "Stopped from the job monitor"
READ_CHUNK = 8 << 20  # bytes a reader takes per call: a long history is caught up in a few calls
SUMMARY_TAIL = 64 << 10  # bytes read from a record's end for its summary (the last events are there)

RecordedEvent = Event | MonitorEvent
_EVENT_TYPES: dict[str, type[RecordedEvent]] = {
    kind.__name__: kind
    for kind in (
        *(TrainingStarted, IterationDone, TrainingDone, TrainingRestarted),  # an nbscale.train run's record
        *(MonitorStarted, MetricsRead, PanelScale, MonitorDone),  # a TrainingMonitor's
    )
}
_NOT_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def record_path(job_dir: Path, training: int) -> Path:
    return job_dir / FOLDER / f"{training}.jsonl"


def stop_path(job_dir: Path, training: int) -> Path:
    return job_dir / FOLDER / f"{training}.stop"


def trainings(job_dir: Path) -> list[int]:
    """The numbers of the trainings recorded in the job's folder, in order (empty before the first starts)."""
    try:
        names = os.listdir(job_dir / FOLDER)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(int(name[:-6]) for name in names if name.endswith(".jsonl") and name[:-6].isdigit())


def request_stop(job_dir: Path, training: int) -> None:
    """Ask training `training` of the job to stop at the end of its current iteration (keeping its network)."""
    folder = private_dir(job_dir / FOLDER)
    descriptor = os.open(folder / f"{training}.stop", os.O_WRONLY | os.O_CREAT, FILE_MODE)
    os.close(descriptor)


def stop_requested(job_dir: Path, training: int) -> bool:
    return stop_path(job_dir, training).exists()


# ---- the data-only form of an event -----------------------------------------------------------------------------


def encode(event: RecordedEvent) -> bytes:
    """One line (with its newline) of strict JSON for `event`."""
    line = {"event": type(event).__name__}
    for field in fields(event):
        line[field.name] = _data(getattr(event, field.name))
    return json.dumps(line, allow_nan=False, separators=(",", ":")).encode() + b"\n"


def _data(value: object) -> Any:
    """`value` as strict JSON takes it: non-finite floats as strings, also inside a metric dict or name tuple; a
    number of another kind (numpy's) as a plain one; anything else (a monitor's info or status: a tensor, say) as
    the text its display shows."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        value = float(value)
        if not math.isfinite(value):
            return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")
        return value
    if isinstance(value, dict):
        return {str(k): _data(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_data(v) for v in value]
    return str(value)


def decode(line: bytes) -> RecordedEvent | None:
    """The event on `line`, or None when it is not one (checked field by field against the event's dataclass)."""
    try:
        data = json.loads(line)
    except ValueError:
        return None
    name = data.get("event") if isinstance(data, dict) else None
    kind = _EVENT_TYPES.get(name) if isinstance(name, str) else None  # a list or dict name is unhashable
    if kind is None:
        return None
    values: dict[str, Any] = {}
    for name, accepts in _field_types(kind).items():
        if name not in data:
            if name in _defaults(kind):
                continue
            return None
        value = _checked(data[name], accepts)
        if value is _WRONG:
            return None
        values[name] = value
    return kind(**values)


_WRONG = object()


def _checked(value: object, accepts: tuple[Any, ...]) -> object:
    """`value` as one of the `accepts` types (int, float, bool, str, None, Any: a JSON value as it is; a tuple
    or list of them, a fixed tuple, a dict of str to them, nested as the events' fields are), or _WRONG."""
    if Any in accepts:
        return value
    for kind in accepts:
        origin, args = typing.get_origin(kind), typing.get_args(kind)
        if origin in (tuple, list) and isinstance(value, list):
            if origin is list or (len(args) == 2 and args[1] is Ellipsis):
                items = [_checked(v, _alternatives(args[0])) for v in value]
            elif len(args) == len(value):
                items = [_checked(v, _alternatives(arg)) for v, arg in zip(value, args, strict=True)]
            else:
                return _WRONG
            return _WRONG if any(v is _WRONG for v in items) else origin(items)
        if origin is dict and isinstance(value, dict):
            item_types = _alternatives(args[1])
            entries = {k: _checked(v, item_types) for k, v in value.items()}
            return _WRONG if any(v is _WRONG for v in entries.values()) else entries
    if value is None:
        return None if type(None) in accepts else _WRONG
    if isinstance(value, bool):
        return value if bool in accepts else _WRONG
    if isinstance(value, int) and int in accepts:
        return value
    if float in accepts:
        if isinstance(value, int | float):
            return float(value)
        if isinstance(value, str) and value in _NOT_FINITE:
            return _NOT_FINITE[value]
    if isinstance(value, str) and str in accepts:
        return value
    return _WRONG


_TYPES_CACHE: dict[type, dict[str, tuple[type, ...]]] = {}


def _field_types(kind: type) -> dict[str, tuple[type, ...]]:
    """{field: the types it takes}: `float | None` -> (float, NoneType)."""
    if kind not in _TYPES_CACHE:
        hints = typing.get_type_hints(kind)
        _TYPES_CACHE[kind] = {field.name: _alternatives(hints[field.name]) for field in fields(kind)}
    return _TYPES_CACHE[kind]


def _alternatives(hint: object) -> tuple[Any, ...]:
    """`float | None` -> (float, NoneType); a single type -> (it,)."""
    return tuple(typing.get_args(hint)) if isinstance(hint, types.UnionType) else (hint,)


def _defaults(kind: type) -> set[str]:
    from dataclasses import MISSING

    return {field.name for field in fields(kind) if field.default is not MISSING}


# ---- reading --------------------------------------------------------------------------------------------------------


class RecordReader:
    """Reads one training's record as it grows: each `read_new()` returns the events appended since the last."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def read_new(self) -> list[RecordedEvent]:
        """The whole lines added since the last call, decoded (at most READ_CHUNK bytes: call again for more)."""
        try:
            with open(self.path, "rb") as file:
                file.seek(self.offset)
                data = file.read(READ_CHUNK)
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n")
        if end < 0:
            if len(data) == READ_CHUNK:  # no newline in a whole chunk: not a record nbscale wrote; skip it
                self.offset += len(data)
            return []
        self.offset += end + 1
        return [event for line in data[:end].split(b"\n") if (event := decode(line)) is not None]

    def read_all(self) -> list[RecordedEvent]:
        """Every event not read yet, however many calls of read_new() that takes."""
        events: list[RecordedEvent] = []
        while True:
            new = self.read_new()
            if not new:
                return events
            events += new


def monitor_history(events: list[RecordedEvent]) -> dict[str, list[Any]] | None:
    """A TrainingMonitor's record as its `history` reads: the steps under its x label, then each metric (None
    where a step did not record it); None when the record is an nbscale.train run's."""
    if not events or not isinstance(events[0], MonitorStarted):
        return None
    start = events[0]
    steps: list[Any] = []
    history: dict[str, list[Any]] = {start.x_label: steps, **{name: [] for name in start.metrics}}
    for event in events:
        if not isinstance(event, MetricsRead):
            continue
        for step, values in event.rows():
            if not steps or step != steps[-1]:
                steps.append(step)
                for name in start.metrics:
                    history[name].append(None)
            for name, value in values.items():  # a step recorded on both sides of a read is one row
                history[name][-1] = value
    return history


# ---- a summary for lists (the lab panel) ------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainingSummary:
    """Where a job's latest training stands, from its record's first and last lines."""

    training: int  # its number in the job
    trainings: int  # how many the job has started
    epoch: int | None
    max_epochs: int
    iteration: int | None
    total_iterations: int
    loss: float | None  # the last training loss
    validation_loss: float | None  # the last validation loss
    time_left_s: float | None  # estimated from the time per iteration so far; 0 once done
    done: bool
    stop_reason: str | None

    def as_dict(self) -> dict[str, Any]:
        return {field.name: getattr(self, field.name) for field in fields(self)}


def summary(job_dir: Path) -> TrainingSummary | None:
    """The latest training's state, or None when the job has recorded none (reads two small parts of the file)."""
    numbers = trainings(job_dir)
    if not numbers:
        return None
    path = record_path(job_dir, numbers[-1])
    try:
        with open(path, "rb") as file:
            first = file.readline(SUMMARY_TAIL)
            size = os.fstat(file.fileno()).st_size
            file.seek(max(0, size - SUMMARY_TAIL))
            tail = file.read(SUMMARY_TAIL)
    except FileNotFoundError:
        return None
    start = decode(first)
    if not isinstance(start, TrainingStarted):
        return None
    last: IterationDone | None = None
    done: TrainingDone | None = None
    validation_loss = None
    for line in reversed(tail[: tail.rfind(b"\n")].split(b"\n")):
        event = decode(line)
        if isinstance(event, TrainingDone) and last is None:
            done = event
        elif isinstance(event, IterationDone):
            last = last or event
            if event.validation_loss is not None:
                validation_loss = event.validation_loss
                break
    total = start.max_epochs * start.iterations_per_epoch
    time_left = None
    if done is not None:
        time_left = 0.0
    elif last is not None and last.iteration > 0:
        time_left = (total - last.iteration) * last.time_since_start / last.iteration
    return TrainingSummary(
        training=numbers[-1],
        trainings=len(numbers),
        epoch=last.epoch if last else None,
        max_epochs=start.max_epochs,
        iteration=last.iteration if last else None,
        total_iterations=total,
        loss=last.training_loss if last else None,
        validation_loss=validation_loss,
        time_left_s=time_left,
        done=done is not None,
        stop_reason=done.stop_reason if done else None,
    )
