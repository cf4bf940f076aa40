"""The training-progress figure drawn from a real run: its loss axis fits the losses it shows."""

from __future__ import annotations

import torch
from torch import nn

import nbscale
from nbscale.ui.progress import TrainingProgress
from nbscale.ui.progress_figure import ProgressFigure
from tests.train.digits import digits

TRAIN, VAL = digits()


def _columns(info: nbscale.TrainingInfo) -> dict[str, list[float]]:
    """The columns TrainingProgress keeps, from a finished run's events replayed to it as a listener (without
    TrainingStarted it opens no display, so this runs outside a notebook)."""
    from nbscale.train.events import IterationDone, StopSignal

    progress = TrainingProgress(StopSignal())
    for row in zip(info.epoch, info.iteration, info.time, info.training_loss, info.training_accuracy,
                   info.learn_rate, info.validation_loss, info.validation_accuracy, strict=True):
        epoch, iteration, time, loss, accuracy, rate, val_loss, val_accuracy = row
        progress(IterationDone(epoch, iteration, time, loss, accuracy, rate, 0, val_loss, val_accuracy))
    return progress.columns


def test_loss_axis_fits_a_regression_whose_loss_stays_far_below_one() -> None:
    inputs = TRAIN[0]
    options = nbscale.TrainingOptions("sgdm", max_epochs=2, mini_batch_size=100, verbose=False,
                                      validation_data=(VAL[0], VAL[0][:, :2]), validation_frequency=10)
    torch.manual_seed(0)
    _, info = nbscale.train(nn.Linear(64, 2), (inputs, inputs[:, :2]), options, loss_fn=nn.MSELoss())
    assert max(info.training_loss) < 0.2 and set(info.training_accuracy) == {None}

    figure = ProgressFigure(len(info.iteration), info.iterations_per_epoch)
    empty = {key: [] for key in _columns(info)}
    figure.render(empty)  # shown empty before the first iteration, as in a notebook
    png = figure.render(_columns(info))
    assert png.startswith(b"\x89PNG")
    low, high = figure.loss_axes.get_ylim()
    assert low == 0.0 and max(info.training_loss) <= high < 2 * max(info.training_loss)
