"""A job's training record: the data-only file the job monitor and the lab panel read, and its stop request."""

from __future__ import annotations

import json
import math
import os
import stat
import time
from pathlib import Path

import pytest

import nbscale.jobs as jobs
from nbscale.errors import JobError
from nbscale.jobs import training_record
from nbscale.jobs.training_recorder import TrainingRecorder, recorded_for_job_monitor
from nbscale.training.events import (
    EventChannel,
    IterationDone,
    MetricsRead,
    MonitorDone,
    MonitorStarted,
    PanelScale,
    StopSignal,
    TrainingDone,
    TrainingRestarted,
    TrainingStarted,
)

STARTED = TrainingStarted(max_epochs=2, iterations_per_epoch=5, mini_batch_size=32, hardware="CPU", start_time=1.0e9)


def iteration(i: int, loss: float = 1.0, validation: float | None = None) -> IterationDone:
    return IterationDone(
        epoch=1 + (i - 1) // 5,
        iteration=i,
        time_since_start=0.5 * i,
        training_loss=loss,
        training_accuracy=0.5,
        learn_rate=0.01,
        images=32 * i,
        validation_loss=validation,
        validation_accuracy=None if validation is None else 0.75,
    )


def test_events_round_trip_as_strict_json_lines_with_non_finite_losses_kept() -> None:
    events = [
        STARTED,
        iteration(1, loss=math.nan),
        iteration(2, loss=math.inf, validation=-math.inf),
        TrainingDone("Max epochs completed", 2, 10, 5.0, 10, 64.0),
        TrainingRestarted(5, 7, "restart 1 after iteration 7: worker 1 died; resumed from the checkpoint of epoch 1"),
    ]
    lines = [training_record.encode(event) for event in events]
    for line in lines:
        assert line.endswith(b"\n") and line.count(b"\n") == 1
        json.loads(line, parse_constant=lambda name: pytest.fail(f"{name} is not strict JSON"))
    decoded = [training_record.decode(line) for line in lines]
    assert decoded[0] == STARTED and decoded[3] == events[3] and decoded[4] == events[4]  # the monitor marks restarts
    assert math.isnan(decoded[1].training_loss) and decoded[2].training_loss == math.inf
    assert decoded[2].validation_loss == -math.inf and decoded[2].validation_accuracy == 0.75


def test_a_monitors_events_round_trip_with_its_info_as_the_display_shows_it_and_give_its_history() -> None:
    import numpy as np
    import torch

    started = MonitorStarted(("loss", "val_loss"), (("loss", ("loss", "val_loss")),), "step", ("epoch", "lr"), 1e9)
    first = MetricsRead(
        [1, 2], {"loss": ([0, 1], [math.nan, 0.5])}, {"epoch": np.int64(1), "lr": torch.tensor(0.1)}, None, "warm"
    )
    second = MetricsRead([2, 3], {"val_loss": ([0], [0.75]), "loss": ([1], [0.25])}, {"epoch": 2}, 50.0, None, True)
    events = [started, first, second, PanelScale(0, True), MonitorDone("Stopped", "Stopped from the job monitor")]
    lines = [training_record.encode(event) for event in events]
    for line in lines:
        json.loads(line, parse_constant=lambda name: pytest.fail(f"{name} is not strict JSON"))
    decoded = [training_record.decode(line) for line in lines]
    assert decoded[0] == started and decoded[2] == second and decoded[3:] == events[3:]
    assert decoded[4].end_time == events[4].end_time  # not compared by ==: the elapsed time a job's display shows
    assert decoded[1].steps == [1, 2] and math.isnan(decoded[1].columns["loss"][1][0])
    assert decoded[1].info == {"epoch": 1, "lr": "tensor(0.1000)"} and decoded[1].status == "warm"  # as displayed
    # the record's history, as monitor.history reads: step 2, recorded on both sides of a read, is one row
    assert training_record.monitor_history(decoded)["step"] == [1, 2, 3]
    history = training_record.monitor_history(decoded)
    assert history["loss"][1:] == [0.5, 0.25] and math.isnan(history["loss"][0])
    assert history["val_loss"] == [None, 0.75, None]
    assert training_record.monitor_history([STARTED]) is None  # an nbscale.train run's record


@pytest.mark.parametrize(
    "line",
    [
        b'{"event": "MetricsRead", "steps": [1], "columns": {"loss": [[0], [1.0], [2]]}, "info": {}, '
        b'"progress": null}',  # a column is (rows, values)
        b'{"event": "MonitorStarted", "metrics": ["loss"], "panels": [["loss", "loss"]], "x_label": "step", '
        b'"info_names": [], "start_time": 1}',  # a panel's metrics are a list
        b'{"event": "PanelScale", "panel": 0, "log": "yes"}',
        b'{"event": "IterationDone", "epoch": "1"}',  # a field missing, another of the wrong type
        b'{"event": "TrainingDone", "stop_reason": 3, "epoch": 1, "iteration": 1, "time_since_start": 1, '
        b'"output_network_iteration": 1, "images_per_second": 1}',
        b'{"event": "TrainingStarted", "max_epochs": true, "iterations_per_epoch": 1, "mini_batch_size": 1, '
        b'"hardware": "x", "start_time": 1}',
        b'{"event": "os.system", "command": "rm -rf /"}',
        b'["IterationDone"]',
        b'{"event": ["IterationDone"]}',
        b"not json",
        b'{"event": "IterationDone", "epoch": 1',
    ],
)
def test_a_line_that_is_not_an_event_is_skipped(line: bytes) -> None:
    assert training_record.decode(line) is None


def test_a_reader_takes_whole_lines_only_and_then_what_was_appended(tmp_path: Path) -> None:
    path = tmp_path / "1.jsonl"
    whole = training_record.encode(STARTED) + training_record.encode(iteration(1))
    half = training_record.encode(iteration(2))
    path.write_bytes(whole + half[:20])
    reader = training_record.RecordReader(path)
    assert reader.read_new() == [STARTED, iteration(1)]
    assert reader.read_new() == []
    with open(path, "ab") as file:
        file.write(half[20:] + b"garbage line\n" + training_record.encode(iteration(3)))
    assert reader.read_all() == [iteration(2), iteration(3)]


def test_the_recorder_writes_a_private_record_in_bunches_and_turns_the_stop_file_into_a_stop(tmp_path) -> None:
    stop = StopSignal()
    recorder = TrainingRecorder(tmp_path, stop)
    try:
        path = training_record.record_path(tmp_path, 1)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(tmp_path / "training").st_mode) == 0o700
        for event in (STARTED, *(iteration(i) for i in range(1, 6))):
            recorder(event)
        assert path.read_bytes() == b""  # queued: the training loop never waits on the file
        deadline = time.monotonic() + 5
        while path.stat().st_size == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert training_record.RecordReader(path).read_all() == [STARTED, *(iteration(i) for i in range(1, 6))]
        assert not stop.requested
        training_record.request_stop(tmp_path, 1)
        deadline = time.monotonic() + 5
        while not stop.requested and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stop.reason == "Stopped from the job monitor"
        recorder(iteration(6))
    finally:
        recorder.close()
    assert training_record.RecordReader(path).read_all()[-1] == iteration(6)  # the rest is written on close


def test_outside_a_job_nothing_is_recorded_and_inside_each_training_gets_its_own_number(tmp_path, monkeypatch):
    channel = EventChannel()
    monkeypatch.delenv("NBSCALE_JOB_DIR", raising=False)
    with recorded_for_job_monitor(channel, StopSignal()):
        assert channel.listeners == []
    monkeypatch.setenv("NBSCALE_JOB_DIR", str(tmp_path))
    for _ in range(2):
        with recorded_for_job_monitor(channel, StopSignal()):
            channel.publish([STARTED, iteration(1)])
    assert training_record.trainings(tmp_path) == [1, 2]
    assert training_record.RecordReader(training_record.record_path(tmp_path, 2)).read_all() == [STARTED, iteration(1)]


def test_the_summary_gives_epoch_iteration_loss_and_time_left_from_the_records_ends(tmp_path) -> None:
    assert training_record.summary(tmp_path) is None
    folder = tmp_path / "training"
    folder.mkdir()
    events = [STARTED, iteration(1, validation=2.0), *(iteration(i, loss=1.0 / i) for i in range(2, 5))]
    (folder / "1.jsonl").write_bytes(b"".join(map(training_record.encode, events)) + b'{"event": "Itera')
    found = training_record.summary(tmp_path)
    assert found is not None
    assert (found.training, found.trainings, found.epoch, found.max_epochs) == (1, 1, 1, 2)
    assert (found.iteration, found.total_iterations, found.loss) == (4, 10, 0.25)
    assert found.validation_loss == 2.0 and not found.done
    assert found.time_left_s == pytest.approx((10 - 4) * 0.5)
    with open(folder / "1.jsonl", "ab") as file:
        file.write(b"\n" + training_record.encode(TrainingDone("Stopped from the job monitor", 1, 4, 2.0, 4, 64.0)))
    done = training_record.summary(tmp_path)
    assert done is not None and done.done and done.time_left_s == 0.0
    assert done.stop_reason == "Stopped from the job monitor" and done.iteration == 4


TRAIN_CELL = """
import time, nbscale
from tests.training.digits import digits, tiny_net
(x, y), val = digits()
opts = nbscale.TrainingOptions("sgdm", max_epochs=EPOCHS, mini_batch_size=32, verbose=False,
                               output_fn=lambda info: time.sleep(0.02))
net, info = nbscale.train(tiny_net(), (x, y), opts)
"""


def wait_for_iterations(job: jobs.Job, count: int, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and job.state in ("queued", "running"):
        if job.trainings and len(job.training_info().iteration) >= count:
            return
        time.sleep(0.1)
    raise AssertionError(f"job {job.id} ({job.state}) did not record {count} iterations:\n{job.log()}")


@pytest.mark.slow
def test_stop_training_stops_a_jobs_training_at_an_iteration_end_and_the_job_keeps_its_network() -> None:
    job = jobs.submit(TRAIN_CELL.replace("EPOCHS", "50"), name="stop me", cwd=Path(__file__).parents[2])
    wait_for_iterations(job, 5)
    running = jobs.list_jobs()[-1]["training"]
    assert running["training"] == 1 and running["total_iterations"] == 50 * 46 and running["time_left_s"] > 0
    assert job.stop_training() is True
    assert job.wait(60), job.log()
    assert job.state == "finished", job.log()
    info = job.result("info")
    assert info.stop_reason == "Stopped from the job monitor"
    assert 5 <= info.iteration[-1] < 50 * 46
    assert type(job.result("net")).__name__ == "Sequential"
    recorded = job.training_info()
    assert recorded.iteration == info.iteration and recorded.stop_reason == info.stop_reason
    assert jobs.list_jobs()[-1]["training"] is None  # only running jobs carry a summary
    assert job.stop_training() is False  # it has ended


@pytest.mark.slow
def test_a_training_on_the_jobs_own_pool_is_recorded_and_stops_from_the_monitor() -> None:
    cell = TRAIN_CELL.replace("EPOCHS", "200").replace(
        "verbose=False,", "verbose=False, execution_environment='parallel',"
    )
    job = jobs.submit(cell, pool=2, cwd=Path(__file__).parents[2])
    wait_for_iterations(job, 20)
    assert job.stop_training()
    assert job.wait(60), job.log()
    info = job.result("info")
    assert info.stop_reason == "Stopped from the job monitor" and info.hardware.startswith("2 workers")
    assert job.training_info().iteration == info.iteration


def test_training_numbers_are_checked_with_a_clear_error() -> None:
    job = jobs.submit("x = 1", name="no training")
    assert job.wait(60)
    with pytest.raises(JobError, match="has recorded no training yet: only nbscale.train runs inside a job"):
        job.training_info()
    with pytest.raises(JobError, match=r"training= takes a training's number \(1, 2, \.\.\."):
        job.training_info(True)
    with pytest.raises(JobError, match="job.show\\(\\) draws in a notebook"):
        job.show()


def test_metric_fields_survive_the_record_with_non_finite_values_and_missing_metrics() -> None:
    import math

    from nbscale.jobs.training_record import decode, encode
    from nbscale.training.events import IterationDone
    from tests.metric_events import metric_run

    events = [
        *metric_run(("rmse", "fscore")),
        IterationDone(1, 21, 2.1, 1.0, None, 0.1, 8, training_metrics={"rmse": math.inf, "fscore": None}),
    ]
    back = [decode(encode(event)) for event in events]
    assert back == events
    assert back[0].metric_names == ("rmse", "fscore") and back[-1].training_metrics == {
        "rmse": math.inf,
        "fscore": None,
    }


def test_a_stopped_runs_record_ends_with_the_reason_its_info_gives(tmp_path: Path) -> None:
    """A run stopped from the job monitor whose end event says "Stopped on request" (a pool's workers know no
    more) is recorded with the reason info.stop_reason gives: shown again later, it reads as it did live."""
    stop = StopSignal()
    recorder = TrainingRecorder(tmp_path, stop)
    try:
        recorder(STARTED)
        recorder(iteration(1))
        stop.request(training_record.MONITOR_STOP_REASON)
        recorder(TrainingDone("Stopped on request", 1, 1, 0.1, 1, 320.0))
    finally:
        recorder.close()
    done = training_record.RecordReader(training_record.record_path(tmp_path, 1)).read_all()[-1]
    assert isinstance(done, TrainingDone) and done.stop_reason == "Stopped from the job monitor"
