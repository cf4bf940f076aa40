"""TrainingInfo keeps every metric of a run: per iteration, validated, and those of the returned network."""

from __future__ import annotations

import copy
import pickle
import re

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


def test_the_repr_shows_only_attributes_and_shortens_the_history_lists() -> None:
    info = _info(("accuracy",))
    shown = repr(info)
    assert shown.startswith("TrainingInfo(stop_reason='Max epochs completed', iteration=[1, 2, ..., 20], ")
    names = re.findall(r"(\w+)=", shown)
    assert "training_loss" in names and "final_validation_accuracy" in names
    assert all(hasattr(info, name) for name in names), names
    assert repr(TrainingInfo()) == "TrainingInfo(stop_reason='', hardware='', images_per_second=0)"


@pytest.mark.parametrize(
    ("matlab", "meant"),
    [
        ("TrainingLoss", "training_loss"),
        ("TrainingAccuracy", "training_accuracy"),
        ("ValidationLoss", "validation_loss"),
        ("ValidationAccuracy", "validation_accuracy"),
        ("BaseLearnRate", "learn_rate"),
        ("FinalValidationLoss", "final_validation_loss"),
        ("FinalValidationAccuracy", "final_validation_accuracy"),
        ("OutputNetworkIteration", "output_network_iteration"),
        ("TrainingHistory", "history()"),
    ],
)
def test_matlabs_train_info_names_get_an_attribute_error_naming_nbscales(matlab: str, meant: str) -> None:
    with pytest.raises(AttributeError, match=re.escape(f"no attribute {matlab!r}. Did you mean {meant!r}?")):
        getattr(_info(("accuracy",)), matlab)


def test_an_info_still_copies_and_pickles_and_hasattr_is_false_for_other_names() -> None:
    info = _info(("accuracy",))
    assert pickle.loads(pickle.dumps(info)) == info and copy.deepcopy(info) == info
    assert not hasattr(info, "nonsense")
