"""TrainingInfo keeps every metric of a run: per iteration, validated, and those of the returned network."""

from __future__ import annotations

import pytest

from nbscale.training.info import TrainingInfo
from tests.metric_events import metric_run, value


def _info(names: tuple[str, ...]) -> TrainingInfo:
    info = TrainingInfo()
    for event in metric_run(names):
        info.record(event)
    return info


def test_info_keeps_every_metric_per_iteration_and_the_returned_networks_validation() -> None:
    info = _info(("accuracy", "fscore"))
    assert info.metric_names == ("accuracy", "fscore")
    assert info.metrics["fscore"] == pytest.approx([value(1, i, 20) for i in range(1, 21)])
    assert info.validation_metrics["fscore"][:5] == [None, None, None, None, pytest.approx(value(1, 5, 20) + 0.05)]
    assert info.final_validation == pytest.approx(
        {"loss": 1.5 / 20, "accuracy": value(0, 20, 20) + 0.05, "fscore": value(1, 20, 20) + 0.05}
    )
    assert info.training_accuracy == info.metrics["accuracy"]  # the accuracy lists stay as they were


def test_a_regression_run_has_rmse_columns_and_no_accuracy_columns_in_its_dataframe() -> None:
    frame = _info(("rmse",)).to_dataframe()
    assert "training_accuracy" not in frame.columns and "validation_accuracy" not in frame.columns
    assert frame["training_rmse"].tolist() == pytest.approx([value(0, i, 20) for i in range(1, 21)])
    assert frame["validation_rmse"].notna().sum() == 4


def test_events_without_metric_dicts_give_accuracy_as_before() -> None:
    from nbscale.training.events import IterationDone, TrainingStarted

    info = TrainingInfo()
    info.record(TrainingStarted(1, 2, 8, "cpu", 0.0))
    info.record(IterationDone(1, 1, 0.1, 0.9, 0.5, 0.01, 8, 0.8, 0.6))
    assert info.metrics == {"accuracy": [0.5]} and info.final_validation == {"loss": 0.8, "accuracy": 0.6}
