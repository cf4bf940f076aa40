"""Metrics in real trainings (TrainingOptions.metrics, objective_metric): the events carry each metric's value,
equal to a recomputation with sklearn on the returned network's predictions, in the notebook's process, on a
pool of 2 CPU workers (states summed over the ranks, never a mean of per-rank values) and in a train_async run."""

from __future__ import annotations

import contextlib
import math
from typing import Any

import pytest
import torch
import torchmetrics
from sklearn import metrics as sk
from torch import nn

import nbscale
from nbscale.errors import OptionsError
from nbscale.pool.plumbing import submit_with_events
from nbscale.training.events import IterationDone, TrainingDone, TrainingStarted
from nbscale.training.plan import without_listeners
from nbscale.training.runs import train_run_on_worker
from nbscale.training.trainer import checked_inputs, train
from tests.training.digits import digits, tiny_net

TRAIN, VAL = digits()
CLASS_METRICS = ("accuracy", "fscore", "top5-accuracy")

pytestmark = pytest.mark.slow


def class_options(environment: str, **changes: Any) -> nbscale.TrainingOptions:
    settings: dict[str, Any] = dict(
        initial_learn_rate=0.5,
        mini_batch_size=100,
        max_epochs=2,
        validation_data=VAL,
        validation_frequency=6,
        execution_environment=environment,
        verbose=False,
        plots="none",
        metrics=(
            *CLASS_METRICS,
            ("torchmetrics_f1", torchmetrics.classification.MulticlassF1Score(num_classes=10, average="macro")),
        ),
    )
    settings.update(changes)
    return nbscale.TrainingOptions("sgdm", **settings)


def trained(
    options: nbscale.TrainingOptions, model: nn.Module | None = None, data: Any = TRAIN, loss_fn: Any = None
) -> tuple[nn.Module, list[Any]]:
    events: list[Any] = []
    net, _ = train(model if model is not None else tiny_net(), data, options, loss_fn, listeners=[events.append])
    return net, events


def iterations(events: list[Any]) -> list[IterationDone]:
    return [event for event in events if isinstance(event, IterationDone)]


def sklearns(net: nn.Module, data: tuple[torch.Tensor, torch.Tensor]) -> dict[str, float]:
    """The class metrics of `net` on `data`, as sklearn computes them from its predictions."""
    inputs, labels = data
    with torch.no_grad():
        scores = net.eval()(inputs)
    predicted = scores.argmax(1)
    return {
        "accuracy": sk.accuracy_score(labels, predicted),
        "fscore": sk.f1_score(labels, predicted, average="macro"),
        "torchmetrics_f1": sk.f1_score(labels, predicted, average="macro"),
        "top5-accuracy": sk.top_k_accuracy_score(labels, scores, k=5, labels=range(10)),
    }


# alone: beside the suite on a 2-core VM its pool's workers, unpickling torchmetrics (a 15 s import there), went
# silent past the pool's 20 s health bound in two whole runs (it passes by itself); not yet understood (issue 39)
@pytest.mark.alone
@pytest.mark.parametrize("environment", ["cpu", "parallel"])
def test_class_metrics_of_the_last_validation_equal_sklearns_on_the_returned_networks_predictions(
    environment: str,
) -> None:
    """A torchmetrics F1 over 2 ranks is the F1 of all validation predictions (summed states), as sklearn's."""
    with nbscale.Pool(2, cpu=True) if environment == "parallel" else contextlib.nullcontext():
        net, events = trained(class_options(environment))
    started = next(event for event in events if isinstance(event, TrainingStarted))
    assert started.metric_names == (*CLASS_METRICS, "torchmetrics_f1")
    assert (started.objective_metric, started.objective_goal) == ("loss", "minimize")
    done = iterations(events)
    last = done[-1]
    assert last.iteration == 2 * (1500 // 100) and last.validation_metrics is not None
    expected = sklearns(net, VAL)
    for name, value in expected.items():
        assert last.validation_metrics[name] == pytest.approx(value, abs=1e-6), name
    assert last.validation_accuracy == last.validation_metrics["accuracy"]
    for event in done:
        assert event.training_metrics is not None and set(event.training_metrics) == set(started.metric_names)
        assert event.training_accuracy == event.training_metrics["accuracy"]
        assert all(0.0 <= value <= 1.0 for value in event.training_metrics.values() if value is not None)
    assert done[-1].training_metrics["fscore"] > done[0].training_metrics["fscore"]  # it learned


def test_a_train_async_runs_events_carry_the_metrics_of_its_network() -> None:
    """The worker of a train_async run sends the same metric values to the notebook."""
    received: list[Any] = []
    model = tiny_net()
    checked = checked_inputs(model, TRAIN, class_options("cpu"), None, one_worker=True)
    plan = without_listeners(checked.plan)  # as train_async sends it: the notebook keeps the live listeners
    with nbscale.Pool(1, cpu=True) as pool:
        task = submit_with_events(
            pool, train_run_on_worker, lambda rank, events: received.extend(events), model, checked.data, plan
        )
        net, info = task.result(timeout=300)
    last = iterations(received)[-1]
    assert last.validation_metrics is not None
    for name, value in sklearns(net, VAL).items():
        assert last.validation_metrics[name] == pytest.approx(value, abs=1e-6), name


def regression_data(samples: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(samples, 4, generator=generator)
    return inputs, inputs @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])


@pytest.mark.parametrize("environment", ["cpu", "parallel"])
def test_a_regression_shows_rmse_and_no_accuracy(environment: str) -> None:
    validation = regression_data(90, 2)
    options = nbscale.TrainingOptions(
        "adam",
        mini_batch_size=64,
        max_epochs=2,
        validation_data=validation,
        validation_frequency=4,
        execution_environment=environment,
        verbose=False,
        plots="none",
    )
    torch.manual_seed(0)
    with nbscale.Pool(2, cpu=True) if environment == "parallel" else contextlib.nullcontext():
        net, events = trained(options, nn.Linear(4, 1), regression_data(512, 1), nn.MSELoss())
    assert next(event for event in events if isinstance(event, TrainingStarted)).metric_names == ("rmse",)
    for event in iterations(events):
        assert event.training_accuracy is None and event.validation_accuracy is None
        assert event.training_metrics is not None
        # the training loss is the mini-batch's mean squared error: its root is the rmse
        assert event.training_metrics["rmse"] == pytest.approx(math.sqrt(event.training_loss), rel=1e-5)
    last = iterations(events)[-1]
    with torch.no_grad():
        squared = nn.functional.mse_loss(net(validation[0]), validation[1]).item()
    assert last.validation_metrics == {"rmse": pytest.approx(math.sqrt(squared), rel=1e-5)}


def test_objective_fscore_drives_patience_and_best_validation_returns_the_best_fscore_network() -> None:
    options = class_options(
        "cpu",
        metrics=("accuracy", "fscore"),
        objective_metric="fscore",
        max_epochs=30,
        validation_frequency=3,
        validation_patience=2,
        output_network="best-validation",
        initial_learn_rate=0.9,
    )
    net, events = trained(options)
    started = next(event for event in events if isinstance(event, TrainingStarted))
    assert (started.objective_metric, started.objective_goal) == ("fscore", "maximize")
    done = next(event for event in events if isinstance(event, TrainingDone))
    assert done.stop_reason == "Met validation criterion (validation_patience=2, objective_metric='fscore')"
    validated = [event for event in iterations(events) if event.validation_metrics is not None]
    # the rule, recomputed: the run stops at the 2nd validation in a row whose fscore is not above the best so far
    best, bad = -math.inf, 0
    for event in validated:
        score = event.validation_metrics["fscore"]
        best, bad = (score, 0) if score > best else (best, bad + 1)
        if bad == 2:
            assert event is validated[-1]
    assert bad == 2
    best_event = max(validated, key=lambda event: event.validation_metrics["fscore"])
    assert done.output_network_iteration == best_event.iteration
    assert sklearns(net, VAL)["fscore"] == pytest.approx(best_event.validation_metrics["fscore"], abs=1e-6)


def test_a_metric_that_does_not_fit_the_data_is_a_clear_error_before_training_goes_on() -> None:
    with pytest.raises(OptionsError, match=r"'rmse' is a regression metric.*use 'accuracy'"):
        trained(class_options("cpu", metrics=("rmse",)))


def test_a_metric_that_does_not_fit_on_a_pool_names_the_metric_and_the_fix() -> None:
    with nbscale.Pool(2, cpu=True), pytest.raises(OptionsError, match=r"'rmse' is a regression metric"):
        trained(class_options("parallel", metrics=("rmse",)))


def test_default_metrics_that_do_not_fit_a_custom_loss_leave_their_values_blank_and_train() -> None:
    """Float targets under a custom loss make "rmse" the default; outputs it cannot compare leave it None."""

    def loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(outputs, targets[:, 0].long())

    options = nbscale.TrainingOptions(
        "sgdm", mini_batch_size=100, max_epochs=1, execution_environment="cpu", verbose=False, plots="none"
    )
    _, events = trained(options, tiny_net(), (TRAIN[0], TRAIN[1].float()[:, None]), loss)
    assert next(event for event in events if isinstance(event, TrainingStarted)).metric_names == ("rmse",)
    assert len(iterations(events)) == 15
    assert all(event.training_metrics == {"rmse": None} for event in iterations(events))
