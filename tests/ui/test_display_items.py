"""Issue 42's display items, as figure tests: a monitor's validation series drawn as points, and no empty Accuracy
panel for a step_fn that returns its loss alone (the listener fed the events a real training sends; outside a
notebook it shows nothing, and its figure is read as built). An early Stop's axis: tests/ui/test_live_display.py."""

from __future__ import annotations

import torch

import nbscale
from nbscale.training.events import IterationDone, StopSignal, TrainingStarted
from nbscale.ui.monitor_display import monitor_panels
from nbscale.ui.progress import TrainingProgress
from nbscale.ui.progress_figure import ProgressFigure
from tests.training.digits import digits, tiny_net


def _iteration(i: int, accuracy: float | None) -> IterationDone:
    return IterationDone(1, i, 0.01 * i, 1.0 / i, accuracy, 0.01, 8 * i, training_metrics={"accuracy": accuracy})


def test_a_monitors_validation_series_is_drawn_as_its_recorded_points_not_smoothed() -> None:
    panels = monitor_panels([("Loss", ["loss", "val_loss"]), ("ValidationAccuracy", ["ValidationAccuracy"])])
    assert [[s.kind for s in p.series] for p in panels] == [["train", "validation"], ["validation"]]
    figure = ProgressFigure(0, 1, panels)
    steps = list(range(1, 101))
    validation_steps = [10, 50, 100]
    columns = {
        "loss": [1.0 / s for s in steps],
        "loss_smooth": [1.0 / s for s in steps],
        "loss_iteration": steps,
        "val_loss": [0.89, 0.5, 0.8],
        "val_loss_iteration": validation_steps,
        "ValidationAccuracy": [0.5, 0.7, 0.89],
        "ValidationAccuracy_iteration": validation_steps,
    }
    figure.render(columns)
    _, dots, smoothed = figure.panels[0][2][1]
    assert smoothed is None and dots.get_marker() == "o"
    assert list(dots.get_xdata()) == validation_steps and list(dots.get_ydata()) == [0.89, 0.5, 0.8]
    assert list(figure.panels[1][2][0][1].get_ydata())[-1] == 0.89  # the value recorded, not 0.80 smoothed


def test_a_step_fn_returning_its_loss_alone_gets_no_accuracy_panel() -> None:
    (train_x, train_y), _ = digits()

    def step_fn(model: torch.nn.Module, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(model(inputs), labels)

    options = nbscale.TrainingOptions("sgdm", max_epochs=1, mini_batch_size=500, verbose=False)
    _, info = nbscale.train(tiny_net(), (train_x, train_y), options, step_fn=step_fn)
    assert info.training_accuracy[0] is None  # what the run's first event carries

    progress = TrainingProgress(StopSignal())
    progress(TrainingStarted(1, 3, 500, "cpu", 0.0, metric_names=info.metric_names))
    assert progress._figure is not None and len(progress._figure.panels) == len(info.metric_names) + 1
    progress(_iteration(1, info.training_accuracy[0]))
    assert progress._figure is not None
    assert [axes.get_ylabel() for axes, *_ in progress._figure.panels] == ["Loss"]


def test_a_run_with_accuracy_keeps_its_accuracy_panel() -> None:
    progress = TrainingProgress(StopSignal())
    progress(TrainingStarted(1, 3, 500, "cpu", 0.0))
    progress(_iteration(1, 0.5))
    assert progress._figure is not None
    assert [axes.get_ylabel() for axes, *_ in progress._figure.panels] == ["Accuracy (%)", "Loss"]


def test_a_monitors_y_labels_and_small_ticks_are_not_cut_at_the_left_edge() -> None:
    panels = monitor_panels([("ValidationAccuracy", ["ValidationAccuracy"]), ("learn_rate", ["learn_rate"])])
    figure = ProgressFigure(0, 1, panels, x_label="Iteration")
    steps = list(range(1, 201))
    columns = {
        "ValidationAccuracy": [0.5 + s / 1000 for s in steps[::20]],
        "ValidationAccuracy_iteration": steps[::20],
        "learn_rate": [0.000123 * (1 + s / 200) for s in steps],
        "learn_rate_smooth": [0.000123 * (1 + s / 200) for s in steps],
        "learn_rate_iteration": steps,
    }
    figure.render(columns)
    renderer = figure.canvas.get_renderer()
    for axes, *_ in figure.panels:
        assert axes.yaxis.get_tightbbox(renderer).x0 >= 0, axes.get_ylabel()


def test_the_legends_sit_beside_the_panels_off_every_curve() -> None:
    panels = monitor_panels([("loss", ["loss", "val_loss"])])
    figure = ProgressFigure(0, 1, panels)
    steps = list(range(1, 101))
    figure.render({"loss": [1.0] * 100, "loss_smooth": [1.0] * 100, "loss_iteration": steps})
    for axes, *_ in figure.panels:
        assert axes.get_legend().get_window_extent().x0 > axes.get_window_extent().x1
        assert axes.get_legend().get_window_extent().x1 <= figure.figure.bbox.width
