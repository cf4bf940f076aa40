"""The training-progress figure drawn from a real run: its loss axis fits the losses it shows."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import nbscale
from nbscale.ui.progress import TrainingProgress
from nbscale.ui.progress_figure import ProgressFigure
from tests.training.digits import digits

TRAIN, VAL = digits()


def _columns(info: nbscale.TrainingInfo) -> dict[str, list[float]]:
    """The columns TrainingProgress keeps, from a finished run's events replayed to it as a listener (without
    TrainingStarted it opens no display, so this runs outside a notebook)."""
    from nbscale.training.events import IterationDone, StopSignal

    progress = TrainingProgress(StopSignal())
    for row in zip(
        info.epoch,
        info.iteration,
        info.time,
        info.training_loss,
        info.training_accuracy,
        info.learn_rate,
        info.validation_loss,
        info.validation_accuracy,
        strict=True,
    ):
        epoch, iteration, time, loss, accuracy, rate, val_loss, val_accuracy = row
        progress(IterationDone(epoch, iteration, time, loss, accuracy, rate, 0, val_loss, val_accuracy))
    return progress.columns


def test_loss_axis_fits_a_regression_whose_loss_stays_far_below_one() -> None:
    inputs = TRAIN[0]
    options = nbscale.TrainingOptions(
        "sgdm",
        max_epochs=2,
        mini_batch_size=100,
        verbose=False,
        validation_data=(VAL[0], VAL[0][:, :2]),
        validation_frequency=10,
    )
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


def _pixels_near(png: bytes, colour: str, box: tuple[float, float, float, float]) -> int:
    """How many pixels of the figure's `box` (fractions left, top, right, bottom) have about `colour`."""
    import io

    import numpy as np
    from PIL import Image

    image = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)
    height, width, _ = image.shape
    left, top, right, bottom = box
    region = image[int(top * height) : int(bottom * height), int(left * width) : int(right * width)]
    target = np.array([int(colour[i : i + 2], 16) for i in (1, 3, 5)])
    return int((np.abs(region - target).max(axis=2) <= 12).sum())


def test_the_figure_shows_raw_loss_legends_epoch_labels_and_learn_rate_drops_as_matlab_does() -> None:
    from nbscale.ui.progress_figure import _COLOURS, _DROP

    options = nbscale.TrainingOptions(
        "sgdm",
        initial_learn_rate=0.05,
        max_epochs=8,
        mini_batch_size=32,
        verbose=False,
        validation_data=VAL,
        validation_frequency=20,
        learn_rate_schedule="piecewise",
        learn_rate_drop_period=3,
        learn_rate_drop_factor=0.2,
    )
    torch.manual_seed(0)
    _, info = nbscale.train(nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10)), TRAIN, options)
    columns = _columns(info)
    per_epoch = info.iterations_per_epoch
    # the learn rate dropped after epochs 3 and 6: marked there, with the new rate
    assert columns["drop_iteration"] == [3 * per_epoch + 1, 6 * per_epoch + 1]
    assert columns["drop_rate"] == pytest.approx([0.01, 0.002])
    figure = ProgressFigure(len(info.iteration), per_epoch)
    png = figure.render(columns)
    accuracy_axes, loss_axes = figure.figure.axes[:2]
    for axes in (accuracy_axes, loss_axes):  # both panels say what each curve is
        assert [t.get_text() for t in axes.get_legend().get_texts()] == [
            "Training",
            "Training (smoothed)",
            "Validation",
        ]
    epoch_axis = next(child for child in accuracy_axes.child_axes)
    assert epoch_axis.get_xlabel() == "Epoch"
    assert [t.get_text() for t in epoch_axis.get_xticklabels()] == [str(e) for e in range(1, 9)]
    assert [t.get_text() for t in loss_axes.texts] == ["learn rate 0.01", "learn rate 0.002"]
    # the raw loss is drawn opaque in MATLAB's light orange, so it shows: many of its pixels in the loss panel
    assert _pixels_near(png, _COLOURS["loss"][0], (0.08, 0.55, 0.98, 0.9)) > 300
    assert _pixels_near(png, _DROP, (0.08, 0.1, 0.98, 0.9)) > 100
    # an update after the drops are marked draws only the curves (the background is cached again)
    figure.render(columns)
    assert figure.background is not None and figure.drops_marked == 2


def test_a_smooth_schedule_is_not_marked_and_many_epochs_get_few_labels() -> None:
    from nbscale.ui.progress_figure import is_drop

    rates = [0.1 * 0.5 * (1 + math.cos(math.pi * i / 50)) for i in range(50)]  # cosine: changes every iteration
    assert not any(is_drop(rates[max(0, i - 3) : i], rate) for i, rate in enumerate(rates))
    # a drop is confirmed when the new rate holds an iteration (piecewise), not by a fall alone
    assert is_drop([0.1, 0.1, 0.01], 0.01) and not is_drop([0.1, 0.1], 0.01)
    assert not is_drop([0.1, 0.01], 0.01) and not is_drop([0.01, 0.01, 0.1], 0.1)
    figure = ProgressFigure(5000 * 3, 3)
    figure.render(
        {
            key: []
            for key in (
                "iteration",
                "loss",
                "loss_smooth",
                "accuracy",
                "accuracy_smooth",
                "val_iteration",
                "val_loss",
                "val_accuracy",
            )
        }
    )
    labels = [t.get_text() for t in figure.figure.axes[0].child_axes[0].get_xticklabels()]
    assert 5 <= len(labels) <= 12 and labels[0] == "1"


@pytest.mark.slow
def test_a_train_cell_in_a_real_kernel_ends_with_the_matlab_style_figure(kernel) -> None:
    import base64

    from nbscale.ui.progress_figure import _COLOURS, _DROP

    assert kernel.run("""
import nbscale
from tests.training.digits import digits, tiny_net
(train_x, train_y), val = digits()
opts = nbscale.TrainingOptions("sgdm", initial_learn_rate=0.05, max_epochs=4, mini_batch_size=64, verbose=False,
                               validation_data=val, validation_frequency=10, learn_rate_schedule="piecewise",
                               learn_rate_drop_period=2, plots="training-progress")
""").ok
    result = kernel.run("net, info = nbscale.train(tiny_net(), (train_x, train_y), opts)")
    assert result.ok, result.text
    last = base64.b64decode([d["image/png"] for d in result.displays if "image/png" in d][-1])
    assert _pixels_near(last, _COLOURS["loss"][0], (0.08, 0.55, 0.98, 0.9)) > 100  # the raw loss shows
    assert _pixels_near(last, _DROP, (0.08, 0.1, 0.98, 0.9)) > 50  # the drop after epoch 2 is marked


def test_a_second_run_of_the_same_layout_reuses_the_figure_and_draws_it_as_a_new_one_would() -> None:
    from nbscale.ui.progress_figure import figure_for_run

    options = nbscale.TrainingOptions(
        "sgdm", max_epochs=2, mini_batch_size=100, verbose=False, validation_data=VAL, validation_frequency=10
    )
    runs = []
    for learn_rate in (0.5, 0.05):  # the first run's far higher losses refit its loss axis
        torch.manual_seed(0)
        _, info = nbscale.train(nn.Linear(64, 10), TRAIN, options.replace(initial_learn_rate=learn_rate))
        runs.append(_columns(info))
    empty = {key: [] for key in runs[0]}
    total, per_epoch = len(runs[0]["iteration"]), info.iterations_per_epoch

    first = figure_for_run(total, per_epoch)
    first.render(empty)
    first.render(runs[0])
    first.release()
    second = figure_for_run(total, per_epoch)
    assert second is first  # its axes, bands and labels are drawn already
    fresh = ProgressFigure(total, per_epoch)
    assert second.render(empty) == fresh.render(empty)
    assert second.render(runs[1]) == fresh.render(runs[1])
    assert figure_for_run(total + per_epoch, per_epoch) is not first  # another layout: a new figure


def test_a_figure_with_learn_rate_marks_is_not_reused() -> None:
    from nbscale.ui.progress_figure import figure_for_run

    columns = {
        key: []
        for key in (
            "iteration",
            "loss",
            "loss_smooth",
            "accuracy",
            "accuracy_smooth",
            "val_iteration",
            "val_loss",
            "val_accuracy",
        )
    }
    columns.update(
        iteration=[1, 2, 3], loss=[1.0, 0.9, 0.8], loss_smooth=[1.0, 0.9, 0.8], drop_iteration=[3], drop_rate=[0.01]
    )
    figure = figure_for_run(30, 10)
    figure.render(columns)
    figure.release()
    assert figure_for_run(30, 10) is not figure


def test_the_end_of_a_warmup_held_for_an_iteration_then_cosine_is_not_marked_as_a_drop() -> None:
    from nbscale.ui.progress_figure import is_drop

    warmup = [0.1 * (i + 1) / 10 for i in range(10)]
    rates = [*warmup, 0.1, *(0.05 * (1 + math.cos(math.pi * i / 40)) for i in range(1, 40))]  # peak held, then cosine
    assert not any(is_drop(rates[max(0, i - 3) : i], rate) for i, rate in enumerate(rates))


def _metric_columns(names: tuple[str, ...], steps: int) -> dict[str, list[float]]:
    """A run's columns as TrainingProgress keeps them, fed its IterationDone events with metric dicts."""
    from nbscale.training.events import IterationDone, StopSignal, TrainingStarted

    progress = TrainingProgress(StopSignal())
    progress.metric_names = names  # as _open sets them (without opening a display outside a notebook)
    from nbscale.ui.progress import metric_columns

    progress.columns = metric_columns(names)
    start = TrainingStarted(1, steps, 8, "cpu", 0.0, metric_names=names)
    assert start.metric_names == names
    for i in range(1, steps + 1):
        values = {name: 0.5 + 0.4 * i / steps for name in names}
        progress(
            IterationDone(
                1,
                i,
                0.01 * i,
                1.0 / i,
                None,
                0.01,
                8 * i,
                training_metrics=values,
                validation_loss=1.2 / i if i % 5 == 0 else None,
                validation_metrics=values if i % 5 == 0 else None,
            )
        )
    return progress.columns


def test_every_metric_gets_its_own_panel_with_training_and_validation_curves() -> None:
    from nbscale.ui.progress_figure import metric_panels

    names = ("accuracy", "fscore", "top5-accuracy")
    columns = _metric_columns(names, 40)
    figure = ProgressFigure(40, 10, metric_panels(names, rising=("fscore", "top5-accuracy")))
    png = figure.render(columns)
    assert png.startswith(b"\x89PNG")
    axes = figure.figure.axes[:4]
    assert [a.get_ylabel() for a in axes] == ["Accuracy (%)", "fscore", "top5-accuracy", "Loss"]
    fscore_raw = figure.panels[1][2][0][1]
    assert list(fscore_raw.get_ydata()) == columns["fscore"] and len(columns["fscore"]) == 40
    assert columns["val_fscore"] == pytest.approx([0.5 + 0.4 * i / 40 for i in (5, 10, 15, 20, 25, 30, 35, 40)])
    assert columns["accuracy"][-1] == pytest.approx(90.0)  # accuracy in percent, as MATLAB plots it
    low, high = axes[1].get_ylim()  # fitted to the F-score's values, not 0..100
    assert low <= 0.5 and 0.9 <= high < 2


def test_a_regression_run_shows_rmse_and_no_accuracy_panel() -> None:
    from nbscale.ui.progress_figure import metric_panels

    columns = _metric_columns(("rmse",), 30)
    assert "accuracy" not in columns
    figure = ProgressFigure(30, 10, metric_panels(("rmse",)))
    figure.render(columns)
    assert [a.get_ylabel() for a in figure.figure.axes[:2]] == ["rmse", "Loss"]


def test_the_loss_legend_sits_away_from_the_last_points_of_a_falling_loss() -> None:
    columns = _metric_columns(("accuracy",), 100)
    figure = ProgressFigure(100, 10)
    figure.render(columns)
    loss_axes = figure.figure.axes[1]
    legend = loss_axes.get_legend().get_window_extent()
    to_pixels = loss_axes.transData.transform
    last = [to_pixels((x, y)) for x, y in zip(columns["iteration"][-10:], columns["loss"][-10:], strict=True)]
    assert not any(legend.contains(px, py) for px, py in last)
    accuracy_axes = figure.figure.axes[0]
    legend = accuracy_axes.get_legend().get_window_extent()
    last = [
        accuracy_axes.transData.transform((x, y))
        for x, y in zip(columns["iteration"][-10:], columns["accuracy"][-10:], strict=True)
    ]
    assert not any(legend.contains(px, py) for px, py in last)


def _loss_columns(steps: int) -> dict[str, list[float]]:
    loss = [2.0 / (1 + step / 100) for step in range(1, steps + 1)]
    return {"loss": loss, "loss_smooth": loss, "loss_iteration": [float(s) for s in range(1, steps + 1)]}


def test_a_loop_of_unknown_length_ends_its_axis_past_where_progress_expects_the_end_and_keeps_it() -> None:
    from nbscale.ui.monitor_display import monitor_panels

    figure = ProgressFigure(0, 1, monitor_panels([("loss", ["loss"])]))
    figure.render({})
    figure.render(_loss_columns(800), progress=100 * 800 / 18000)
    assert figure.loss_axes.get_xlim() == (0, 20000)  # a round number past the expected 18,000
    background = figure.background
    for steps in (4000, 9000, 17999):
        figure.render(_loss_columns(steps), progress=100 * steps / 18000)
        figure.render(_loss_columns(steps))  # the last figure comes without progress (it reached 100)
    assert figure.loss_axes.get_xlim() == (0, 20000)
    assert figure.background is background  # every later update pasted the cached axes: no full redraw


def test_without_progress_the_axis_of_an_unknown_length_grows_to_round_numbers_at_least_doubling() -> None:
    from nbscale.ui.monitor_display import monitor_panels

    figure = ProgressFigure(0, 1, monitor_panels([("loss", ["loss"])]))
    ends = []
    for steps in (800, 1200, 1600, 3000, 9000):
        figure.render(_loss_columns(steps))
        ends.append(figure.loss_axes.get_xlim()[1])
    assert ends == [1000, 2000, 2000, 5000, 20000]


@pytest.mark.parametrize("total", [0, 1000], ids=["unknown length", "known length"])
def test_a_widened_iteration_axis_draws_as_a_fresh_figure_would(total) -> None:
    from nbscale.ui.monitor_display import monitor_panels

    panels = monitor_panels([("loss", ["loss"])])
    widened = ProgressFigure(total, 1, panels)
    for steps in (800, 1200, 3000):  # past the known length, too (its axis then follows the last iteration)
        widened.render(_loss_columns(steps))
    fresh = ProgressFigure(total, 1, panels)
    assert widened.render(_loss_columns(3000)) == fresh.render(_loss_columns(3000))
