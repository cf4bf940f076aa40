"""nbscale.sweep with a user's own PyTorch pieces on a real CPU pool of 2: step_fn, a DataLoader's batch_size,
and metrics=(...) that the results table, the ranking and the comparison figure follow."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import nbscale
from nbscale.errors import OptionsError
from nbscale.training.run_table import run_row
from nbscale.ui.sweep_display import SweepDisplay
from tests.training.digits import digits, tiny_net

pytestmark = pytest.mark.slow

(TRAIN_X, TRAIN_Y), (VAL_X, VAL_Y) = digits()


def shifted_step(model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A step_fn that trains every image towards the next class: only a run that used it predicts (label + 1)."""
    outputs = model(inputs)
    return nn.functional.cross_entropy(outputs, (labels + 1) % 10), outputs


def test_every_run_of_a_sweep_trains_with_the_users_step_fn(pool) -> None:
    options = nbscale.TrainingOptions("sgdm", max_epochs=3, verbose=False)
    result = nbscale.sweep(
        tiny_net, (TRAIN_X, TRAIN_Y), options, {"initial_learn_rate": [0.2, 0.4]}, pool=pool, step_fn=shifted_step
    )
    assert [run.state for run in result.runs] == ["done", "done"], [run.error for run in result.runs]
    for net in result.nets:
        predicted = net(VAL_X).argmax(1)
        assert (predicted == (VAL_Y + 1) % 10).float().mean() > 0.6  # what step_fn taught
        assert (predicted == VAL_Y).float().mean() < 0.2


def test_a_sweep_ranks_by_a_maximized_objective_metric_and_shows_each_metric(pool) -> None:
    options = nbscale.TrainingOptions(
        "sgdm",
        max_epochs=1,
        metrics=("accuracy", "fscore"),
        objective_metric="fscore",
        validation_frequency=5,
        verbose=False,
    )
    result = nbscale.sweep(
        tiny_net, (TRAIN_X, TRAIN_Y), options, {"initial_learn_rate": [0.002, 0.3]}, pool=pool, val_data=(VAL_X, VAL_Y)
    )
    assert [run.state for run in result.runs] == ["done", "done"], [run.error for run in result.runs]
    scores = [run.info.final_validation["fscore"] for run in result.ranked()]
    assert scores[0] > scores[1]  # the higher F-score first (the learn rates are far apart)
    assert result.best is result.ranked()[0]
    row = run_row(result.best)
    assert row["validation fscore"] == f"{scores[0]:.4f}" and row["training fscore"]
    assert row["validation loss"] == f"{result.best.info.final_validation_loss:.4f}"
    assert row["validation accuracy"].endswith("%")
    display = SweepDisplay(result.runs)
    assert [axes.get_ylabel() for axes in display.figure().axes] == ["Accuracy (%)", "fscore\n(objective)", "Loss"]
    fscore_axes = display.figure().axes[1]
    assert len(fscore_axes.lines) == 4  # each run: its training curve and its validation points
    assert display.png().startswith(b"\x89PNG")


def regression_data(items: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(items, 64, generator=generator)
    return inputs, inputs[:, :10] * 0.5 + 0.1


def test_a_regression_sweep_ranks_by_a_minimized_objective_and_plots_no_accuracy(pool) -> None:
    options = nbscale.TrainingOptions(
        "adam",
        loss="mse",
        max_epochs=2,
        metrics=("rmse", "mae"),
        objective_metric="mae",
        validation_frequency=5,
        verbose=False,
        validation_data=regression_data(200, 1),
    )
    result = nbscale.sweep(tiny_net, regression_data(1000, 0), options, {"initial_learn_rate": [1e-5, 1e-2]}, pool=pool)
    assert [run.state for run in result.runs] == ["done", "done"], [run.error for run in result.runs]
    errors = [run.info.final_validation["mae"] for run in result.ranked()]
    assert errors[0] < errors[1]  # the lower error first
    row = run_row(result.ranked()[0])
    assert "validation accuracy" not in row and row["validation mae"] == f"{errors[0]:.4f}" and row["training rmse"]
    labels = [axes.get_ylabel() for axes in SweepDisplay(result.runs).figure().axes]
    assert labels == ["rmse", "mae\n(objective)", "Loss"]


def test_a_sweep_trains_in_a_dataloaders_batch_size_and_checks_it_against_every_runs_before_any_starts(pool) -> None:
    loader = DataLoader(TensorDataset(TRAIN_X, TRAIN_Y), batch_size=50, shuffle=True)
    options = nbscale.TrainingOptions("sgdm", max_epochs=1, verbose=False)
    result = nbscale.sweep(tiny_net, loader, options, {"initial_learn_rate": [0.05, 0.1]}, pool=pool)
    assert [run.options.mini_batch_size for run in result.runs] == [50, 50]
    assert [run.info.mini_batch_size for run in result.runs] == [50, 50]
    assert [run.info.iteration[-1] for run in result.runs] == [1500 // 50] * 2
    with pytest.raises(
        OptionsError,
        match=r"DataLoader with batch_size=50, but TrainingOptions has "
        r"mini_batch_size=64",
    ):
        nbscale.sweep(tiny_net, loader, options, {"mini_batch_size": [50, 64]}, pool=pool)
    assert not pool.busy  # refused before any run was sent
