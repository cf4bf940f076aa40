"""TrainingOptions(loggers=[...]): CSV and TensorBoard files with every metric of a real run, closed at its end."""

from __future__ import annotations

import csv
import subprocess
import sys

import pytest
import torch

import nbscale
from nbscale.errors import OptionsError


def _data(n: int = 128) -> torch.utils.data.TensorDataset:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=generator)
    return torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long())


def test_a_run_writes_every_metric_to_csv_and_tensorboard(tmp_path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    csv_logger = nbscale.loggers.CSVLogger(tmp_path / "run.csv")
    board = nbscale.loggers.TensorBoardLogger(tmp_path / "tb")
    opts = nbscale.TrainingOptions("sgdm", max_epochs=2, mini_batch_size=32, verbose=False, validation_data=_data(64),
                                   validation_frequency=2, loggers=[csv_logger, board])
    _, info = nbscale.train(torch.nn.Linear(8, 2), _data(), opts)
    rows = list(csv.DictReader(open(tmp_path / "run.csv")))
    assert [int(row["step"]) for row in rows] == info.iteration
    assert {"training_loss", "learn_rate", "training_accuracy", "validation_loss", "validation_accuracy"} <= set(rows[0])
    assert float(rows[-1]["training_loss"]) == pytest.approx(info.training_loss[-1])
    assert float(rows[1]["validation_loss"]) == pytest.approx(info.validation_loss[1])
    assert board._writer is None and csv_logger._file is None  # closed at the end of the run
    events = EventAccumulator(str(tmp_path / "tb")).Reload()
    assert {"training_loss", "validation_loss", "training_accuracy"} <= set(events.Tags()["scalars"])
    assert len(events.Scalars("training_loss")) == len(info.iteration)


def test_loggers_are_closed_when_the_run_fails(tmp_path) -> None:
    logger = nbscale.loggers.CSVLogger(tmp_path / "failed.csv")
    opts = nbscale.TrainingOptions(max_epochs=1, mini_batch_size=32, verbose=False, loggers=[logger])

    def failing(outputs, labels):
        raise RuntimeError("loss failed")

    with pytest.raises(Exception, match="loss failed"):
        nbscale.train(torch.nn.Linear(8, 2), _data(), opts, loss_fn=failing)
    assert logger._file is None


def test_a_logger_without_log_and_close_is_refused_naming_the_option() -> None:
    with pytest.raises(OptionsError, match="loggers"):
        nbscale.TrainingOptions(loggers=[object()])


def test_tensorboard_missing_is_one_clear_error_naming_the_package() -> None:
    code = ("import sys; sys.modules['torch.utils.tensorboard'] = None\n"
            "import nbscale\n"
            "try:\n    nbscale.loggers.TensorBoardLogger('runs')\n"
            "except nbscale.OptionsError as error:\n    print('REFUSED', error)\n")
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "REFUSED TensorBoardLogger needs the tensorboard package: pip install tensorboard" in shown.stdout, shown
