"""A TrainingMonitor is a producer on a training event channel: each read is one MetricsRead its listeners hear,
its end a MonitorDone, and the run observers (what a %%batch job records) hear its layout, then its own events."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import torch

import nbscale
from nbscale.training.events import (
    EventChannel,
    MetricsRead,
    MonitorDone,
    MonitorStarted,
    PanelScale,
    StopSignal,
)
from nbscale.training.run_observers import add_run_observer, end_open_runs, remove_run_observer


def test_each_read_is_one_metrics_event_and_the_close_a_done_event() -> None:
    monitor = nbscale.TrainingMonitor(metrics=["loss", "val_loss"], info=["epoch"], min_interval=3600)
    heard: list[object] = []
    monitor.events.subscribe(heard.append)
    monitor.y_scale("val_loss", "log")
    for step in range(1, 6):
        monitor.record(step, loss=torch.tensor(float(step)))
    monitor.record(5, val_loss=0.5)
    monitor.update_info(epoch=2)
    monitor.progress = 50
    assert heard == [PanelScale(1, True)]  # nothing read before min_interval
    monitor.flush()
    monitor.close()
    scale, read, last_read, done = heard
    assert isinstance(read, MetricsRead) and read.flushed and read.steps == [1, 2, 3, 4, 5]
    assert read.rows() == [(1, {"loss": 1.0}), (2, {"loss": 2.0}), (3, {"loss": 3.0}), (4, {"loss": 4.0})] + [
        (5, {"loss": 5.0, "val_loss": 0.5})  # recorded in two calls: one row
    ]
    assert read.info == {"epoch": 2} and read.progress == 50.0
    assert isinstance(last_read, MetricsRead) and last_read.steps == []  # close flushes: nothing new
    assert done == MonitorDone("Done", None)
    assert monitor.history["loss"] == [1.0, 2.0, 3.0, 4.0, 5.0]


def test_the_run_observers_hear_the_monitors_own_events_after_its_layout_and_their_stop_stops_it() -> None:
    seen: list[object] = []
    stops: list[StopSignal] = []

    @contextlib.contextmanager
    def observer(channel: EventChannel, stop: StopSignal) -> Iterator[None]:
        channel.subscribe(seen.append)
        stops.append(stop)
        yield
        seen.append("left")

    add_run_observer(observer)
    try:
        monitor = nbscale.TrainingMonitor(
            metrics=["loss", "fscore"], info=["epoch"], groups={"scores": ["fscore"]}, x_label="step", min_interval=3600
        )
        for step in range(1, 4):
            monitor.record(step, loss=torch.tensor(float(step)), fscore=0.25 * step)
        monitor.update_info(epoch=3)
        monitor.flush()
        stops[0].request("Stopped from the job monitor")  # what a job's Stop button does
        assert monitor.stop
        monitor.close()
    finally:
        remove_run_observer(observer)
    started, read, last_read, done, left = seen
    assert started == MonitorStarted(
        ("loss", "fscore"), (("loss", ("loss",)), ("scores", ("fscore",))), "step", ("epoch",), started.start_time
    )
    assert abs(started.start_time - time.time()) < 60
    assert isinstance(read, MetricsRead) and read.rows() == [
        (step, {"loss": float(step), "fscore": 0.25 * step}) for step in range(1, 4)
    ]
    assert read.info == {"epoch": 3} and isinstance(last_read, MetricsRead) and last_read.steps == []
    assert done == MonitorDone("Stopped", "Stopped from the job monitor")
    assert left == "left"  # the observer is left when the monitor closes


def test_a_monitor_a_job_cell_left_open_is_closed_when_its_runs_end_so_its_record_ends() -> None:
    seen: list[object] = []

    @contextlib.contextmanager
    def observer(channel: EventChannel, stop: StopSignal) -> Iterator[None]:
        channel.subscribe(seen.append)
        yield

    add_run_observer(observer)
    try:
        monitor = nbscale.TrainingMonitor(metrics=["loss"], min_interval=3600)
        monitor.record(1, loss=0.5)
        end_open_runs()  # what the job runner does when the cell ends
        assert isinstance(seen[-1], MonitorDone) and [e.steps for e in seen if isinstance(e, MetricsRead)] == [[1]]
        end_open_runs()  # nothing left open: nothing happens
        monitor.close()
    finally:
        remove_run_observer(observer)
    assert sum(isinstance(e, MonitorDone) for e in seen) == 1


def test_a_monitor_nobody_observes_tells_no_training_events() -> None:
    monitor = nbscale.TrainingMonitor(metrics=["loss"], min_interval=3600)
    monitor.record(1, loss=1.0)
    monitor.close()
    assert len(monitor.events.listeners) == 1  # the figure's points only: no translation, no display, no logger
