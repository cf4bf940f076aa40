"""The metrics a run shows and the objective it follows, chosen once in the loop's setup (nbscale.training.metrics).

A run is a regression, whose default metric is "rmse" rather than "accuracy", when its loss is a regression loss
(`loss="mse"`/`"l1"`, or an MSE, L1, smooth-L1 or Huber loss given as `loss_fn`) or when its targets are floats
and its loss is not a classification loss (cross-entropy, NLL, binary cross-entropy take float targets as class
probabilities).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from nbscale.data.batches import first_tensor
from nbscale.training.losses import is_regression_loss
from nbscale.training.metrics import MetricSet, objective, resolve_metrics
from nbscale.training.options import TrainingOptions

_REGRESSION_FUNCTIONS = (F.mse_loss, F.l1_loss, F.smooth_l1_loss, F.huber_loss)
_CLASS_LOSSES = (nn.CrossEntropyLoss, nn.NLLLoss, nn.BCELoss, nn.BCEWithLogitsLoss, nn.KLDivLoss)
_CLASS_FUNCTIONS = (F.cross_entropy, F.nll_loss, F.binary_cross_entropy, F.binary_cross_entropy_with_logits)


def is_regression(options: TrainingOptions, loss_fn: object, first_target: object) -> bool:
    """Whether the run is a regression (see the module docstring); `first_target` may be a function giving it, called
    only where the loss does not decide (reading a sample can cost a file or an S3 request)."""
    if is_regression_loss(options.loss) or is_regression_loss(loss_fn) or loss_fn in _REGRESSION_FUNCTIONS:
        return True
    if (
        options.loss in ("crossentropy", "binary-crossentropy")
        or isinstance(loss_fn, _CLASS_LOSSES)
        or loss_fn in _CLASS_FUNCTIONS
    ):
        return False
    if callable(first_target):
        first_target = first_target()
    target = first_tensor(first_target)
    return isinstance(first_target, float) or (target is not None and target.is_floating_point())


def run_metrics(options: TrainingOptions, loss_fn: object, train_data: object) -> MetricSet:
    """`options.metrics` resolved for this run (the default decided by its loss and first target)."""
    return resolve_metrics(
        options.metrics, regression=is_regression(options, loss_fn, lambda: _first_target(train_data))
    )


def _first_target(data: Any) -> object:
    """The first sample's target, or None where the data cannot say (read before training: one item)."""
    try:
        item = data[0]
    except Exception:
        return None
    return item[1] if isinstance(item, tuple | list) and len(item) >= 2 else None


def check_on_first_sample(options: TrainingOptions, loss_fn: object, model: nn.Module, first_item: object) -> None:
    """OptionsError (naming the metric and the fix) in the notebook, before any worker starts, when a metric
    the user named does not fit the network's outputs for the first sample; the loop checks its first batch too.
    Nothing is said where the network cannot run on one sample here: the loop's first step says why."""
    from nbscale.training.checks import outputs_for_one

    if options.metrics is None or not isinstance(first_item, tuple | list) or len(first_item) < 2:
        return
    try:
        outputs = outputs_for_one(model, torch.as_tensor(first_item[0]))
        targets = torch.as_tensor(first_item[1])[None]
    except Exception:
        return
    if isinstance(loss_fn, _CLASS_LOSSES[:2]) and targets.is_floating_point() and targets.ndim == 1:
        targets = targets.long()  # whole-number float labels, made class indices for cross-entropy
    metrics = resolve_metrics(options.metrics, regression=is_regression(options, loss_fn, first_item[1]))
    metrics.check(outputs, targets)


class Objective:
    """What validation_patience and output_network="best-validation" follow: the validation loss or a metric,
    minimized or maximized (`nbscale.training.metrics.objective`)."""

    def __init__(self, options: TrainingOptions, metrics: MetricSet) -> None:
        self.name, self.goal = objective(options.objective_metric, options.objective_goal, metrics)

    def score(self, loss: float, metrics: dict[str, float | None]) -> float:
        """A validation's score, lower is better; NaN where the metric has no value (never an improvement)."""
        value = loss if self.name == "loss" else metrics.get(self.name)
        if value is None or not math.isfinite(value):
            return math.nan
        return value if self.goal == "minimize" else -value


def summed_over(group: torch.distributed.ProcessGroup | None, totals: torch.Tensor) -> torch.Tensor:
    """`totals` summed over the ranks of `group` (in place; as it is without a group)."""
    if group is not None:
        torch.distributed.all_reduce(totals, group=group)
    return totals
