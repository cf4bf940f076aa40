"""Inputs that used to end a run with a bare Python error, or silently (issue 43, item 7): each is one OptionsError
naming the thing, the iteration where it matters, and the fix."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import nbscale
from nbscale.errors import OptionsError
from tests.training.digits import digits, tiny_net


def _options(**fields: object) -> nbscale.TrainingOptions:
    return nbscale.TrainingOptions(
        "sgdm", **{"max_epochs": 1, "mini_batch_size": 100, "verbose": False, "plots": "none", **fields}
    )


def test_a_metric_that_raises_after_the_first_batch_is_named_with_its_iteration() -> None:
    (x, y), _ = digits()
    calls = []

    def fragile(outputs, targets):
        calls.append(1)
        if len(calls) > 3:
            raise KeyError("label")
        return (outputs.argmax(1) == targets).float()

    with pytest.raises(OptionsError) as raised:
        nbscale.train(tiny_net(), (x, y), _options(metrics=[fragile]))
    message = str(raised.value)
    assert message.startswith("TrainingOptions.metrics: the metric 'fragile' raised KeyError: 'label' on a batch after")
    assert "(at iteration " in message and isinstance(raised.value.__cause__, KeyError)


def test_a_step_fn_returning_none_later_names_step_fn_and_the_iteration() -> None:
    (x, y), _ = digits()
    seen = []

    def forgets_a_return(model, inputs, targets):
        seen.append(1)
        loss = F.cross_entropy(model(inputs), targets)
        if len(seen) != 5:
            return loss
        return None

    with pytest.raises(OptionsError, match=r"^step_fn returned None at iteration 5 instead of the batch's loss"):
        nbscale.train(tiny_net(), (x, y), _options(), step_fn=forgets_a_return)


def test_a_step_fn_returning_something_else_than_outputs_is_refused_not_left_with_blank_metrics() -> None:
    (x, y), _ = digits()
    with pytest.raises(OptionsError, match=r"^step_fn returned \(loss, 'out'\): the second element must be"):
        nbscale.train(tiny_net(), (x, y), _options(), step_fn=lambda m, i, t: (F.cross_entropy(m(i), t), "out"))


def test_a_nan_objective_metric_stops_the_run_saying_so_not_as_a_met_criterion() -> None:
    (x, y), val = digits()

    def undefined(outputs, targets):
        return torch.full((len(targets),), math.nan)

    options = _options(
        max_epochs=3,
        validation_data=val,
        validation_frequency=5,
        validation_patience=2,
        metrics=[undefined],
        objective_metric="undefined",
        objective_goal="maximize",
    )
    _, info = nbscale.train(tiny_net(), (x, y), options)
    assert info.stop_reason.startswith("Stopped: objective_metric='undefined' was NaN at the validation of iteration")
    assert "Met validation criterion" not in info.stop_reason


def test_a_collate_fn_returning_one_element_names_collate_fn() -> None:
    (x, y), _ = digits()
    loader = DataLoader(TensorDataset(x, y), batch_size=100, collate_fn=lambda rows: torch.stack([r[0] for r in rows]))
    with pytest.raises(OptionsError, match=r"^The DataLoader's collate_fn returned a Tensor of shape \(100, 64\)"):
        nbscale.train(tiny_net(), loader, _options())
