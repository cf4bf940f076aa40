"""`nbscale.TrainingMonitor`: nbscale.train's live figure, info panel and Stop for a user's own loop (MATLAB's
trainingProgressMonitor: recordMetrics, updateInfo, Progress, Stop, groupSubPlot).

`record` only keeps what it is given (records.py): numbers, and CPU tensors read at once (nothing to wait for); a
GPU's tensors stay on their device and are read in one bunch (one host sync per device) at most every
`min_interval` seconds, when the figure is drawn (the sinks below say where), so a fast loop pays for a few list
appends.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter
from typing import TYPE_CHECKING, Any

from nbscale.errors import OptionsError
from nbscale.loggers import close_loggers, log_rows
from nbscale.monitor.records import HISTORY_ROWS, MAX_ROWS, RecordBatch, RecordKeeper, step_number, thin_history
from nbscale.training.events import StopSignal
from nbscale.ui.live_clock import INFO_INTERVAL_S
from nbscale.ui.progress_figure import extend_smoothed

if TYPE_CHECKING:
    from nbscale.pool.pool import Pool

_REDUCES = ("first", "mean")
_PARAMETERS = {"metrics": ("self", "step"), "info": ("self",)}  # names record's or update_info's own parameters take


class TrainingMonitor(RecordKeeper):
    """A live monitor for your own training loop: see docs/training.md, "Your own loop".

    `stop` is True once the Stop button, the kernel interrupt or (in %%spmd) the notebook's Stop asked the loop to
    end; `progress` is the loop's progress in percent (0..100), shown as a bar above the info panel at the next
    draw. Both are plain attributes, as the loop reads or sets them every iteration."""

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
        self.metrics = _names("metrics", metrics, required=True)
        self.info_names = _names("info", info)
        self._info_known = frozenset(self.info_names)
        self.x_label = str(x_label)
        self.groups = _groups(groups or {}, self.metrics)
        if reduce not in _REDUCES:
            raise OptionsError(
                f"TrainingMonitor(reduce={reduce!r}): give 'first' (rank 0's values) or 'mean' (the "
                "mean over the ranks of a %%spmd cell)."
            )
        self.reduce = reduce
        self.loggers = _checked_loggers(loggers)
        self.min_interval, self.budget = min_interval, budget
        self._history: dict[str, list[Any]] = {self.x_label: [], **{name: [] for name in self.metrics}}
        self.info: dict[str, Any] = {}
        self._info_checked = 0  # len(info) when its names were last checked
        self.progress: Any = None  # read as a number when drawn: a bad value is one clear error there
        self.status: Any = None  # MATLAB's monitor.Status: shown in the info panel (as text) at the next read
        self.stop = False
        self._stop = StopSignal()
        self._stop.on_request.append(self._stopped)
        self._keep_records_of(self.metrics)
        self._columns: dict[str, list[float]] = {}
        for name in self.metrics:
            self._columns.update({name: [], f"{name}_smooth": [], f"{name}_iteration": []})
        self._closed = False
        self._sink = self._new_sink()
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

    def request_stop(self, reason: str = "Stopped by request") -> None:
        """What the Stop button does: `monitor.stop` becomes True."""
        self._stop.request(reason)

    def _stopped(self) -> None:
        self.stop = True

    def _percent(self) -> float | None:
        """`progress` as a number (read when drawn, not when set: the loop sets it every iteration)."""
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
        titles = [title for title, _ in self._panels]
        panel = next((i for i, (title, members) in enumerate(self._panels) if name == title or name in members), None)
        if panel is None:
            raise OptionsError(f"monitor.y_scale({name!r}, ...): no panel shows {name!r}; the panels are {titles}.")
        self._sink.set_log(panel, scale == "log")

    @property
    def history(self) -> dict[str, list[Any]]:
        """Every recorded step as columns: the x values under `x_label`, then each metric (None where a step did
        not record it); past 100,000 steps, thinned to every second one (records.thin_history). Reading it reads
        what was recorded since the last draw."""
        if self._kept:
            self.flush()
        return self._history

    def to_dataframe(self) -> Any:
        """The history as a pandas DataFrame: one row per step, one column per metric (NaN where not recorded)."""
        import pandas as pd

        self.flush()
        return pd.DataFrame(self._history)

    def flush(self) -> None:
        """Read what is recorded and not yet read, draw it and log it, the loggers' files written (done by itself
        every `min_interval`)."""
        self._flush(time.perf_counter(), force=True)

    def close(self) -> None:
        """The last figure drawn, the loggers closed, the Stop button removed (done at the cell's end)."""
        if self._closed:
            return
        self.flush()
        self._closed = True
        self._sink.close("Stopped" if self._stop.requested else "Done")
        close_loggers(self.loggers)

    def __enter__(self) -> TrainingMonitor:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _new_sink(self) -> Sink:
        return sink_for(self)

    # ---- inside --------------------------------------------------------------------------------------------------

    @property
    def _panels(self) -> list[tuple[str, list[str]]]:
        """(title, metrics) per subplot: each group where its first metric comes, each other metric alone."""
        panels: list[tuple[str, list[str]]] = []
        placed: set[str] = set()
        for name in self.metrics:
            if name in placed:
                continue
            group = next(((title, members) for title, members in self.groups.items() if name in members), None)
            title, members = group if group is not None else (name, [name])
            panels.append((title, list(members)))
            placed.update(members)
        return panels

    def _flush(self, now: float, force: bool = False) -> None:
        if not self._kept:
            if force:
                self._sink.draw(self, figure=True)
            return
        batch = self._sink.reduce(self._take_records())
        self._add(batch)
        if self.loggers:  # at each read, not each record: a killed kernel loses one read's rows
            log_rows(self.loggers, [(dict(values), step_number(step)) for step, values in batch.rows()])
        self._sink.draw(self, figure=force)
        self._next_read = time.perf_counter() + self._read_interval(now, len(batch.steps))

    def _read_interval(self, now: float, steps: int) -> float:
        """Seconds to the next read: at least `min_interval`, reads at most `budget` of the time but at least every
        INFO_INTERVAL_S (the info panel is never a second behind; the figure has its own clock, in the display),
        and at the last read's pace no more than MAX_ROWS steps kept (records, not reads, check nothing else)."""
        interval = max(self.min_interval, min(INFO_INTERVAL_S, (time.perf_counter() - now) / self.budget))
        since, self._last_read = now - self._last_read, now
        if since > 0 and steps * interval > MAX_ROWS * since:
            interval = max(self.min_interval, MAX_ROWS * since / steps)
        return interval

    def _add(self, batch: RecordBatch) -> None:
        h, c = self._history, self._columns
        steps, new_steps = h[self.x_label], batch.steps
        first_row = len(steps)
        if steps and new_steps and steps[-1] == new_steps[0]:  # a step recorded on both sides of a read: one row
            first_row -= 1
            new_steps = new_steps[1:]
        steps.extend(new_steps)
        for name in self.metrics:
            h[name].extend([None] * len(new_steps))
        numbers = batch.steps if set(map(type, batch.steps)) <= {int, float} else list(map(step_number, batch.steps))
        for name, (rows, values) in batch.columns.items():
            history = h[name]
            if rows == list(range(len(numbers))):  # one value at every step (the common case): in one go
                history[first_row : first_row + len(values)] = values
                c[f"{name}_iteration"].extend(numbers)
            else:
                for row, value in zip(rows, values, strict=True):
                    history[first_row + row] = value
                c[f"{name}_iteration"].extend([numbers[row] for row in rows])
            c[name].extend(values)
            extend_smoothed(c[f"{name}_smooth"], values)
        if len(steps) > HISTORY_ROWS or any(len(column) > HISTORY_ROWS for column in c.values()):
            thin_history(h)  # every metric's row with its step
            thin_history(c)  # the figure's points, each metric's own


def _names(what: str, names: Any, required: bool = False) -> tuple[str, ...]:
    if isinstance(names, str):
        names = [names]
    try:
        out = tuple(names)
    except TypeError:
        out = ()
    if (
        (required and not out)
        or not all(isinstance(n, str) and n.isidentifier() for n in out)
        or len(set(out)) < len(out)
    ):
        raise OptionsError(
            f"TrainingMonitor({what}={names!r}): give a list of distinct names usable as keywords, "
            f"such as {what}=['loss', 'val_loss']" + (" (at least one)." if required else ".")
        )
    taken = [n for n in out if n in _PARAMETERS[what]]
    if taken:
        call = "record(step, ...)" if what == "metrics" else "update_info(...)"
        raise OptionsError(
            f"TrainingMonitor({what}=[..., {taken[0]!r}, ...]): {taken[0]!r} is a parameter of monitor.{call}, so "
            f"it cannot be given as a keyword there; name it otherwise, such as {taken[0]!r} + '_value'."
        )
    return out


def _groups(groups: Mapping[str, Sequence[str]], metrics: tuple[str, ...]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    seen: set[str] = set()
    for title, members in groups.items():
        members = [members] if isinstance(members, str) else list(members)
        bad = [m for m in members if m not in metrics or m in seen]
        if bad or not members:
            raise OptionsError(
                f"TrainingMonitor(groups={{{title!r}: {members!r}}}): each group lists metrics of "
                f"metrics={list(metrics)}, each metric in one group at most."
            )
        seen.update(members)
        out[str(title)] = members
    return out


def _checked_loggers(loggers: Iterable[Any]) -> list[Any]:
    from nbscale.training.options import _loggers

    problem = _loggers(loggers)
    if problem is not None:
        raise OptionsError(f"TrainingMonitor(loggers=...): give {problem}.")
    return list(loggers or ())


# ---- where the monitor shows --------------------------------------------------------------------------------------


class Sink:
    """Nowhere to draw (a script, a worker without a notebook): the history and the loggers only."""

    def reduce(self, batch: RecordBatch) -> RecordBatch:
        return batch

    def draw(self, monitor: TrainingMonitor, figure: bool = False) -> None:
        """After a read: the info panel, and the figure when `figure` (a flush) or its clock says so."""

    def set_log(self, panel: int, log: bool) -> None:
        pass

    def close(self, state: str) -> None:
        pass


class NotebookSink(Sink):
    """The live display in this notebook; the kernel interrupt sets `stop` (a second one raises at once), and
    the cell's end draws the last figure and closes the monitor."""

    def __init__(self, monitor: TrainingMonitor) -> None:
        from IPython import get_ipython

        from nbscale.ui.monitor_display import MonitorDisplay

        self.display = MonitorDisplay(monitor._stop, monitor._panels, monitor.x_label, budget=monitor.budget)
        self.monitor = monitor
        self.shell = get_ipython()
        self.shell.events.register("post_run_cell", self._on_cell_end)
        self.previous_handler: Any = None
        self.pid = os.getpid()
        if monitor.interrupt_stops and threading.current_thread() is threading.main_thread():
            self.previous_handler = signal.signal(signal.SIGINT, self._on_interrupt)

    def _on_interrupt(self, signum: int, frame: object) -> None:
        if os.getpid() != self.pid:  # a forked DataLoader process inherits the handler
            return
        if self.monitor._stop.requested:
            raise KeyboardInterrupt
        self.monitor._stop.request("Stopped by the kernel interrupt")

    def draw(self, monitor: TrainingMonitor, figure: bool = False) -> None:
        state = "Stopping" if monitor._stop.requested else "Running"
        self.display.draw(monitor._columns, monitor.info, monitor._percent(), state, figure, monitor.status)

    def set_log(self, panel: int, log: bool) -> None:
        self.display.set_log(panel, log)

    def _on_cell_end(self, _result: object = None) -> None:
        self.monitor.close()

    def close(self, state: str) -> None:
        with contextlib.suppress(ValueError):
            self.shell.events.unregister("post_run_cell", self._on_cell_end)
        if self.previous_handler is not None:
            signal.signal(signal.SIGINT, self.previous_handler)
            self.previous_handler = None
        reason = self.monitor._stop.reason
        try:  # a progress that is not a number raises here: the Stop button is removed all the same
            self.display.draw(
                self.monitor._columns,
                self.monitor.info,
                self.monitor._percent(),
                f"{state}: {reason}" if reason else state,
                status=self.monitor.status,
            )
        finally:
            self.display.close()


class JobSink(Sink):
    """Inside a %%batch job: the records go to the job's training record as nbscale.train's events do (the loss as
    the loss, every other metric by name), so `%jobs show ID` follows the loop and its Stop sets `stop`."""

    def __init__(self, monitor: TrainingMonitor, job_dir: str) -> None:
        from nbscale.jobs.training_recorder import TrainingRecorder
        from nbscale.training.events import TrainingStarted

        self.monitor = monitor
        self.recorder = TrainingRecorder(Path(job_dir), monitor._stop)
        self.names = tuple(name for name in monitor.metrics if name != "loss")
        self.start = time.time()
        self.recorder(
            TrainingStarted(1, 0, 0, "your own loop (nbscale.TrainingMonitor)", self.start, metric_names=self.names)
        )
        atexit.register(monitor.close)  # the job's process ends: the record gets its end

    def reduce(self, batch: RecordBatch) -> RecordBatch:
        from nbscale.training.events import IterationDone

        for step, values in batch.rows():
            self.recorder(
                IterationDone(
                    int(self.monitor.info.get("epoch", 1)) if isinstance(self.monitor.info.get("epoch", 1), int) else 1,
                    int(step_number(step)),
                    time.time() - self.start,
                    values.get("loss", float("nan")),
                    None,
                    float(self.monitor.info.get("learn_rate", 0.0) or 0.0),
                    0,
                    training_metrics={name: values[name] for name in self.names if name in values},
                )
            )
        return batch

    def close(self, state: str) -> None:
        from nbscale.training.events import TrainingDone

        steps = self.monitor._history[self.monitor.x_label]
        last = int(step_number(steps[-1])) if steps else 0
        self.recorder(TrainingDone(self.monitor._stop.reason or state, 1, last, time.time() - self.start, last, 0.0))
        self.recorder.close()


# ---- a %%spmd cell: each rank's monitor sends its records, the notebook shows them as one --------------------

_created_on_this_worker = 0  # the n-th monitor of a worker: the same on every rank, which run the same cell


@dataclass
class MonitorRecords:
    """What a rank of a %%spmd cell sends the notebook: its monitor's layout, new rows, info and progress."""

    key: int
    panels: list[tuple[str, list[str]]]
    x_label: str
    metrics: tuple[str, ...]
    reduce: str
    world_size: int
    rows: list[tuple[Any, dict[str, float]]]
    info: dict[str, Any]
    progress: float | None
    log_panels: dict[int, bool]
    done: bool = False
    status: Any = None

    def show_in_notebook(self, pool: Pool, rank: int) -> None:
        """Run in the notebook as the event arrives (nbscale.pool.spmd.shown_in_notebook)."""
        view = views.get(self.key)
        if view is None or view.closed:
            view = views[self.key] = NotebookView(self, pool)
        view.add(self, rank)


class RankSink(Sink):
    """A %%spmd rank: rank 0 (every rank with reduce="mean") sends its rows to the notebook's one display,
    whose Stop (pool.request_stop) reaches every rank."""

    def __init__(self, monitor: TrainingMonitor) -> None:
        from nbscale.pool.context import worker_context

        global _created_on_this_worker
        _created_on_this_worker += 1
        self.key = _created_on_this_worker
        self.context = worker_context()
        self.monitor = monitor
        self.sends = self.context.rank == 0 or monitor.reduce == "mean"
        self.rows: list[tuple[Any, dict[str, float]]] = []
        self.log_panels: dict[int, bool] = {}
        self.context.at_cell_end.append(monitor.close)
        self.context.on_stop.append(self._on_stop)
        if self.context.stop_requested:  # asked before this monitor was made
            self._on_stop()

    def _on_stop(self) -> None:
        self.monitor.request_stop("Stopped from the notebook")

    def reduce(self, batch: RecordBatch) -> RecordBatch:
        self.rows.extend(batch.rows())
        return batch

    def draw(self, monitor: TrainingMonitor, figure: bool = False) -> None:
        self._send(done=False)

    def set_log(self, panel: int, log: bool) -> None:
        self.log_panels[panel] = log

    def close(self, state: str) -> None:
        with contextlib.suppress(ValueError):
            self.context.on_stop.remove(self._on_stop)
        self._send(done=True)

    def _send(self, done: bool) -> None:
        if not self.sends:
            return
        m = self.monitor
        rows, self.rows = self.rows, []
        self.context.emit(
            MonitorRecords(
                self.key,
                m._panels,
                m.x_label,
                m.metrics,
                m.reduce,
                self.context.world_size,
                [(step_number(s), v) for s, v in rows],
                dict(m.info),
                m._percent(),
                dict(self.log_panels),
                done,
                m.status,
            )
        )


class NotebookView(TrainingMonitor):
    """The notebook's monitor for a %%spmd cell's ranks: rank 0's rows, or with reduce="mean" each step's mean
    once every rank sent it; its Stop asks every rank to stop (pool.request_stop)."""

    interrupt_stops = False  # the pool's own interrupt handling stops the ranks

    def __init__(self, first: MonitorRecords, pool: Pool) -> None:
        groups = {title: members for title, members in first.panels if [title] != members}
        super().__init__(first.metrics, x_label=first.x_label, groups=groups)
        self.world_size = first.world_size
        self.waiting: dict[tuple[Any, str], list[float]] = {}
        self.done_ranks: set[int] = set()
        self._stop.on_request.append(pool.request_stop)
        self.info_names = ()

    @property
    def closed(self) -> bool:
        return self._closed

    def _read_due(self) -> None:
        """Nothing in the middle of a rank's message: `add` reads and draws once all its rows are kept."""

    def add(self, records: MonitorRecords, rank: int) -> None:
        for panel, log in records.log_panels.items():
            self._sink.set_log(panel, log)
        self.info, self.progress = records.info if rank == 0 else self.info, records.progress
        if rank == 0:
            self.status = records.status
        for step, values in records.rows:
            if records.reduce == "mean":
                values = self._means(step, values)
            if values:
                self.record(step, **values)
        if records.done:
            self.done_ranks.add(rank)
        if records.done and (records.reduce != "mean" or len(self.done_ranks) == self.world_size):
            self.close()
        else:
            self._flush(time.perf_counter(), force=not records.rows)

    def _means(self, step: object, values: dict[str, float]) -> dict[str, float]:
        means = {}
        for name, value in values.items():
            seen = self.waiting.setdefault((step, name), [])
            seen.append(value)
            if len(seen) == self.world_size:
                means[name] = sum(seen) / len(seen)
                del self.waiting[(step, name)]
        return means


views: dict[int, NotebookView] = {}


def sink_for(monitor: TrainingMonitor) -> Sink:
    """Where `monitor` shows, from where it runs."""
    from nbscale.notebook import in_notebook
    from nbscale.pool.context import in_worker

    if in_worker():
        return RankSink(monitor)
    job_dir = os.environ.get("NBSCALE_JOB_DIR")
    if job_dir:
        return JobSink(monitor, job_dir)
    if in_notebook():
        return NotebookSink(monitor)
    return Sink()
