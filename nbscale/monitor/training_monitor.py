"""`nbscale.TrainingMonitor`: nbscale.train's live figure, info panel and Stop for a user's own loop (MATLAB's
trainingProgressMonitor: recordMetrics, updateInfo, Progress, Stop, groupSubPlot).

The monitor is a producer on a training event channel (nbscale.training.events): `record` only keeps what it is
given (records.py): numbers, and CPU tensors read at once (nothing to wait for); a GPU's tensors stay on their
device and are read in one bunch (one host sync per device) at most every `min_interval` seconds. A read adds the
rows to the history and publishes them as one `MetricsRead` event; `y_scale` publishes a `PanelScale`, `close` a
`MonitorDone`. Who listens (the display, the loggers, a job's record, a %%spmd rank's forwarding) is attached from
above by listeners.py, from where the monitor runs; so a fast loop pays for a few list appends.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from time import perf_counter
from typing import TYPE_CHECKING, Any

from nbscale.errors import OptionsError
from nbscale.monitor.layout import checked_groups, checked_loggers, checked_names, checked_reduce, panels_of
from nbscale.monitor.records import MAX_ROWS, RecordBatch, RecordKeeper, step_number
from nbscale.training.events import EventChannel, MetricsRead, MonitorDone, PanelScale, StopSignal
from nbscale.ui.figure_columns import HISTORY_ROWS, thin_history
from nbscale.ui.live_clock import INFO_INTERVAL_S

if TYPE_CHECKING:
    from nbscale.monitor.listeners import Listeners


class TrainingMonitor(RecordKeeper):
    """A live monitor for your own training loop: see docs/training.md, "Your own loop".

    `stop` is True once the Stop button, the kernel interrupt or (in %%spmd) the notebook's Stop asked the loop to
    end; `progress` is the loop's progress in percent (0..100), shown as a bar above the info panel at the next
    read. Both are plain attributes, as the loop reads or sets them every iteration. `events` is the channel the
    monitor publishes its reads on (nbscale.training.events.MetricsRead)."""

    interrupt_stops = True  # in the notebook, the kernel interrupt sets `stop` (a second one raises)

    def __init__(
        self,
        metrics: Sequence[str],
        info: Sequence[str] = (),
        x_label: str = "iteration",
        groups: Mapping[str, Sequence[str]] | None = None,
        reduce: str = "first",
        loggers: Sequence[Any] = (),
        min_interval: float = 0.5,
        budget: float = 0.001,
    ) -> None:
        self.metrics = checked_names("metrics", metrics, required=True)
        self.info_names = checked_names("info", info)
        self._info_known = frozenset(self.info_names)
        self.x_label = str(x_label)
        self.groups = checked_groups(groups or {}, self.metrics)
        self.reduce = checked_reduce(reduce)
        self.loggers = checked_loggers(loggers)
        self.min_interval, self.budget = min_interval, budget
        self._history: dict[str, list[Any]] = {self.x_label: [], **{name: [] for name in self.metrics}}
        self.info: dict[str, Any] = {}
        self._info_checked = 0  # len(info) when its names were last checked
        self.progress: Any = None  # read as a number at each read: a bad value is one clear error there
        self.status: Any = None  # MATLAB's monitor.Status: shown in the info panel (as text) at the next read
        self.stop = False
        self._stop = StopSignal()
        self._stop.on_request.append(self._stopped)
        self._keep_records_of(self.metrics)
        self._closed = False
        self.events = EventChannel()
        self._listeners = self._attach_listeners()
        self._last_read = time.perf_counter()
        self._next_read = self._last_read + min_interval  # the empty figure is drawn: no draw for 1 point

    # ---- the loop's side -----------------------------------------------------------------------------------------

    # `record` (records.py) keeps what it is given and calls _read_due when a read is due

    def _read_due(self) -> None:
        self._flush(perf_counter())

    def update_info(self, **values: object) -> None:
        """Show `values` in the info panel (names given as TrainingMonitor(info=[...]))."""
        info = self.info
        for name in values:  # not info.update(values): code the loop runs nowhere else costs most (records.py)
            info[name] = values[name]
        if len(info) != self._info_checked:  # a name not seen before: checked once, not at every call
            self._check_info(values)

    def _check_info(self, values: Mapping[str, object]) -> None:
        unknown = sorted(set(self.info) - self._info_known)
        for name in unknown:
            del self.info[name]
        self._info_checked = len(self.info)
        if unknown:
            name = next((name for name in unknown if name in values), unknown[0])
            raise OptionsError(
                f"monitor.update_info({name}=...): {name!r} is not one of the monitor's "
                f"info fields {list(self.info_names)}; add it to TrainingMonitor(info=[...])."
            )

    @property
    def stop_reason(self) -> str | None:
        return self._stop.reason

    @property
    def stop_signal(self) -> StopSignal:
        """What the Stop button, the kernel interrupt and a job's Stop request (nbscale.training.events)."""
        return self._stop

    def request_stop(self, reason: str = "Stopped by request") -> None:
        """What the Stop button does: `monitor.stop` becomes True."""
        self._stop.request(reason)

    def _stopped(self) -> None:
        self.stop = True

    def _percent(self) -> float | None:
        """`progress` as a number (read at a read, not when set: the loop sets it every iteration)."""
        if self.progress is None:
            return None
        try:
            return float(self.progress)
        except (TypeError, ValueError):
            raise OptionsError(
                f"monitor.progress = {self.progress!r}: give a number, the percent of the loop done (0 to 100)."
            ) from None

    def y_scale(self, name: str, scale: str) -> None:
        """The y scale of the panel that shows `name` (a metric or a group): "log" or "linear"."""
        if scale not in ("log", "linear"):
            raise OptionsError(f"monitor.y_scale({name!r}, {scale!r}): the scale is 'log' or 'linear'.")
        panels = self.panels
        panel = next((i for i, (title, members) in enumerate(panels) if name == title or name in members), None)
        if panel is None:
            titles = [title for title, _ in panels]
            raise OptionsError(f"monitor.y_scale({name!r}, ...): no panel shows {name!r}; the panels are {titles}.")
        self.events.publish(PanelScale(panel, scale == "log"))

    @property
    def panels(self) -> list[tuple[str, list[str]]]:
        """(title, metrics) per subplot of the figure: each group where its first metric comes, each other metric
        alone."""
        return panels_of(self.metrics, self.groups)

    @property
    def history(self) -> dict[str, list[Any]]:
        """Every recorded step as columns: the x values under `x_label`, then each metric (None where a step did
        not record it); past 100,000 steps, thinned to every second one (nbscale.ui.figure_columns.thin_history).
        Reading it reads what was recorded since the last read."""
        if self._kept:
            self.flush()
        return self._history

    def to_dataframe(self) -> Any:
        """The history as a pandas DataFrame: one row per step, one column per metric (NaN where not recorded)."""
        import pandas as pd

        self.flush()
        return pd.DataFrame(self._history)

    def flush(self) -> None:
        """Read what is recorded and not yet read, and publish it: drawn, logged, the loggers' files written (done
        by itself every `min_interval`)."""
        self._flush(time.perf_counter(), flushed=True)

    def close(self) -> None:
        """The last read published, then MonitorDone: the last figure drawn, the loggers closed, the Stop button
        removed (done at the cell's end)."""
        if self._closed:
            return
        try:
            self.flush()
        finally:
            self._closed = True
            try:
                self.events.publish(MonitorDone("Stopped" if self._stop.requested else "Done", self._stop.reason))
            finally:
                self._listeners.close()

    def __enter__(self) -> TrainingMonitor:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _attach_listeners(self) -> Listeners:
        from nbscale.monitor.listeners import attach_listeners

        return attach_listeners(self)

    # ---- inside --------------------------------------------------------------------------------------------------

    def _flush(self, now: float, flushed: bool = False) -> None:
        """Read what is kept (if anything, or if `flushed`) and publish it as one MetricsRead."""
        if not self._kept:
            if flushed:
                self.events.publish(MetricsRead([], {}, dict(self.info), self._percent(), self.status, True))
            return
        batch = self._take_records()
        steps = self._add(batch)
        self.events.publish(MetricsRead(steps, batch.columns, dict(self.info), self._percent(), self.status, flushed))
        self._next_read = time.perf_counter() + self._read_interval(now, len(steps))

    def _read_interval(self, now: float, steps: int) -> float:
        """Seconds to the next read: at least `min_interval`, reads at most `budget` of the time but at least every
        INFO_INTERVAL_S (the info panel is never a second behind; the figure has its own clock, in the display),
        and at the last read's pace no more than MAX_ROWS steps kept (records, not reads, check nothing else)."""
        interval = max(self.min_interval, min(INFO_INTERVAL_S, (time.perf_counter() - now) / self.budget))
        since, self._last_read = now - self._last_read, now
        if since > 0 and steps * interval > MAX_ROWS * since:
            interval = max(self.min_interval, MAX_ROWS * since / steps)
        return interval

    def _add(self, batch: RecordBatch) -> list[Any]:
        """The batch's rows added to the history; its steps as numbers (a tensor's read)."""
        h = self._history
        steps, new_steps = h[self.x_label], batch.steps
        first_row = len(steps)
        if steps and new_steps and steps[-1] == new_steps[0]:  # a step recorded on both sides of a read: one row
            first_row -= 1
            new_steps = new_steps[1:]
        steps.extend(new_steps)
        for name in self.metrics:
            h[name].extend([None] * len(new_steps))
        every_step = list(range(len(batch.steps)))
        for name, (rows, values) in batch.columns.items():
            history = h[name]
            if rows == every_step:  # one value at every step (the common case): in one go
                history[first_row : first_row + len(values)] = values
            else:
                for row, value in zip(rows, values, strict=True):
                    history[first_row + row] = value
        if len(steps) > HISTORY_ROWS:
            thin_history(h)  # every metric's row with its step
        return batch.steps if set(map(type, batch.steps)) <= {int, float} else list(map(step_number, batch.steps))
