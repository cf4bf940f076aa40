"""nbscale.loggers: every metric of a run in a CSV file and in TensorBoard, closed however the run ends."""

from __future__ import annotations

import csv
import subprocess
import sys

import pytest

import nbscale
from nbscale.loggers import CSVLogger, LoggerFeed, TensorBoardLogger
from tests.metric_events import metric_run
from tests.training.digits import digits, tiny_net


def _scalars(log_dir) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def _two_epochs_validated_every_10(val: object, **fields: object) -> nbscale.TrainingOptions:
    """The loggers tests' training: 2 epochs of 15 iterations of 100 digits, validated every 10 iterations."""
    return nbscale.TrainingOptions(
        "sgdm", max_epochs=2, mini_batch_size=100, verbose=False, validation_data=val, validation_frequency=10, **fields
    )


def test_train_writes_every_figure_to_csv_and_tensorboard(tmp_path) -> None:
    (train_x, train_y), val = digits()
    options = _two_epochs_validated_every_10(
        val, loggers=[CSVLogger(tmp_path / "run.csv"), TensorBoardLogger(tmp_path / "tb")]
    )
    _, info = nbscale.train(tiny_net(), (train_x, train_y), options)
    rows = list(csv.DictReader((tmp_path / "run.csv").open()))
    assert [int(r["step"]) for r in rows] == info.iteration
    assert set(rows[0]) == {"step", "loss", "accuracy", "learn_rate", "val_loss", "val_accuracy"}
    assert [float(r["loss"]) for r in rows] == pytest.approx(info.training_loss)
    assert [float(r["val_loss"]) for r in rows if r["val_loss"]] == pytest.approx(
        [v for v in info.validation_loss if v is not None]
    )
    scalars = _scalars(tmp_path / "tb")
    assert set(scalars) == {"loss", "accuracy", "learn_rate", "val_loss", "val_accuracy"}
    assert [step for step, _ in scalars["loss"]] == info.iteration


def test_every_metric_of_the_events_reaches_the_loggers(tmp_path) -> None:
    feed = LoggerFeed([CSVLogger(tmp_path / "m.csv"), TensorBoardLogger(tmp_path / "tb")])
    for event in metric_run(("rmse", "mae")):
        feed(event)
    feed.close()
    rows = list(csv.DictReader((tmp_path / "m.csv").open()))
    assert list(rows[0]) == ["step", "loss", "rmse", "mae", "learn_rate", "val_loss", "val_rmse", "val_mae"]
    assert len(rows) == 20 and sum(1 for r in rows if r["val_mae"]) == 4
    assert set(_scalars(tmp_path / "tb")) == {"loss", "rmse", "mae", "learn_rate", "val_loss", "val_rmse", "val_mae"}


class Counting:
    """A logger of the user's own: any object with log and close."""

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.closed = 0

    def log(self, metrics: dict, step: int) -> None:
        self.steps.append(step)

    def close(self) -> None:
        self.closed += 1


def test_a_run_that_fails_still_logs_what_it_did_and_closes_its_loggers() -> None:
    (train_x, train_y), _ = digits()
    logger = Counting()

    def fail_at_five(info) -> bool:
        if info.iteration[-1] == 5:
            raise RuntimeError("the user's output_fn failed")
        return False

    options = nbscale.TrainingOptions(
        "sgdm", max_epochs=1, mini_batch_size=100, verbose=False, loggers=[logger], output_fn=fail_at_five
    )
    with pytest.raises(RuntimeError, match="output_fn failed"):
        nbscale.train(tiny_net(), (train_x, train_y), options)
    assert logger.steps == [1, 2, 3, 4, 5] and logger.closed == 1


@pytest.mark.slow
def test_tensorboard_missing_is_one_error_naming_the_package() -> None:
    code = (
        "import sys; sys.modules['tensorboard'] = None\n"
        "from nbscale.loggers import TensorBoardLogger\n"
        "try:\n    TensorBoardLogger('runs')\n"
        "except Exception as error:\n    print(type(error).__name__, error)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    assert (
        out.startswith("OptionsError TensorBoardLogger needs the tensorboard package")
        and "pip install tensorboard" in out
    )


# ---- written as they go: what a killed kernel leaves ---------------------------------------------------------------


def _steps_on_disk(path) -> list[int]:
    """The steps the file holds now, read as another process would (the logger still open)."""
    return [int(row["step"]) for row in csv.DictReader(path.open())] if path.exists() else []


def test_a_monitors_csv_is_on_disk_after_flush_after_a_read_and_after_a_draw(tmp_path) -> None:
    import time

    path = tmp_path / "loop.csv"
    monitor = nbscale.TrainingMonitor(metrics=["loss"], loggers=[CSVLogger(path)], min_interval=0.05)
    try:
        monitor.record(1, loss=1.0)
        monitor.flush()
        assert _steps_on_disk(path) == [1]
        monitor.record(2, loss=0.5)
        assert monitor.history["loss"] == [1.0, 0.5] and _steps_on_disk(path) == [1, 2]  # a read of the history
        monitor.record(3, loss=0.25)
        # the next read is due min_interval after the last one, later where that read was slow (a busy machine):
        # the monitor reads at most `budget` of the time
        time.sleep(max(0.0, monitor._next_read - time.perf_counter()) + 0.05)
        monitor.record(4, loss=0.125)  # a read is due: this record reads and draws
        assert _steps_on_disk(path) == [1, 2, 3, 4]
    finally:
        monitor.close()


def test_train_writes_each_epochs_rows_by_its_end_and_the_final_validation_into_the_last_row(tmp_path) -> None:
    (train_x, train_y), val = digits()
    path = tmp_path / "run.csv"
    on_disk: dict[int, list[int]] = {}

    def read_at_epoch_ends(info) -> bool:
        if info.iteration[-1] % 15 == 0:  # 1500 images in batches of 100: an epoch's last iteration
            on_disk[info.iteration[-1]] = _steps_on_disk(path)
        return False

    # validated every 10 iterations, so not at iteration 30: its validation comes with the end of training
    options = _two_epochs_validated_every_10(val, loggers=[CSVLogger(path)], output_fn=read_at_epoch_ends)
    _, info = nbscale.train(tiny_net(), (train_x, train_y), options)
    assert on_disk == {15: list(range(1, 16)), 30: list(range(1, 31))}
    rows = list(csv.DictReader(path.open()))
    assert [int(r["step"]) for r in rows] == info.iteration  # the final validation is no row of its own
    assert float(rows[-1]["val_loss"]) == pytest.approx(info.final_validation_loss)
    assert float(rows[-1]["loss"]) == pytest.approx(info.training_loss[-1])


def test_a_step_logged_again_is_one_row_and_a_rewrite_keeps_the_file_whole(tmp_path) -> None:
    path = tmp_path / "m.csv"
    logger = CSVLogger(path)
    logger.log({"loss": 1.0}, 1)
    logger.log({"loss": 0.5}, 2)
    logger.log({"val_loss": 0.7}, 2)  # a new column: the file rewritten
    logger.log({"loss": 0.25}, 3)
    logger.log({"val_loss": 0.6}, 3)  # the same columns: the last row rewritten alone
    logger.flush()
    assert path.read_text().splitlines() == ["step,loss,val_loss", "1,1.0,", "2,0.5,0.7", "3,0.25,0.6"]
    assert [p.name for p in tmp_path.iterdir()] == ["m.csv"]
    logger.close()


def test_tensorboard_scalars_are_on_disk_after_flush(tmp_path) -> None:
    logger = TensorBoardLogger(tmp_path / "tb")
    logger.log({"loss": 1.0}, 1)
    logger.log({"loss": 0.5}, 2)
    logger.flush()
    assert _scalars(tmp_path / "tb")["loss"] == [(1, 1.0), (2, 0.5)]
    logger.close()
