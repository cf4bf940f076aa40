"""The metrics a run shows and the objective it follows (MATLAB's Metrics and ObjectiveMetricName), resolved once
in the run plan: `resolve_metrics(options.metrics, regression=...)` gives the MetricSet whose states the loop sums,
`objective` the direction validation_patience and best-validation follow.

A run is a regression, whose default metric is "rmse" rather than "accuracy", when its loss is a regression loss
(`loss="mse"`/`"l1"`, or an MSE, L1, smooth-L1 or Huber loss given as `loss_fn`) or when its targets are floats
and its loss is not a classification loss (cross-entropy, NLL, binary cross-entropy take float targets as class
probabilities).

Metrics are states that sum: the loop asks the MetricSet for each batch's `state` (a 1-D float32 tensor on the
outputs' device, computed without reading anything to the host), sums states over the iterations of a bunch or a
validation and over the ranks (one all_reduce), and reads the `values` once. A sum of states is the state of all
the batches together, so a metric over 2 ranks is the metric of all their predictions, never a mean of per-rank
values. The metric kinds live in nbscale.training.metric_kinds and nbscale.training.torch_metric.
"""

from __future__ import annotations

import copy
import math
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from nbscale.data.batches import first_tensor
from nbscale.errors import OptionsError
from nbscale.suggestions import did_you_mean
from nbscale.training.losses import is_regression_loss
from nbscale.training.metric_kinds import (
    CLASS_NAMES,
    REGRESSION_NAMES,
    Batch,
    ClassAverage,
    ClassFraction,
    ErrorSum,
    SampleMean,
    Stacked,
    fail,
)
from nbscale.training.torch_metric import TorchMetric

Kind = ClassFraction | ErrorSum | ClassAverage | SampleMean | TorchMetric
PER_BATCH = (SampleMean, TorchMetric)  # the kinds that see one batch at a time; the named ones stack a bunch


class MetricSet:
    """The resolved metrics of a run: their names (display order) and a state vector of `size` floats.

    The class count of precision/recall/fscore comes from the first batch (`check`, or the first `state`), so
    `size` is known from then on (at once when no such metric is asked for).
    """

    def __init__(self, metrics: Sequence[Kind], regression: bool) -> None:
        self.metrics, self.regression = tuple(metrics), regression
        self.names: tuple[str, ...] = tuple(metric.name for metric in self.metrics)
        self.classes: int | None = None
        self._needs_classes = any(metric.needs_classes for metric in self.metrics)
        self._stacks = any(not isinstance(metric, PER_BATCH) for metric in self.metrics)

    @property
    def size(self) -> int:
        return sum(metric.size for metric in self.metrics)

    def __repr__(self) -> str:
        return f"MetricSet({', '.join(self.names)})"

    def _set_classes(self, outputs: Any) -> None:
        if isinstance(outputs, torch.Tensor) and outputs.ndim >= 2:
            self.classes = int(outputs.shape[1])
            for metric in self.metrics:
                if isinstance(metric, ClassAverage):
                    metric.classes = self.classes

    def check(self, outputs: object, targets: object) -> None:
        """OptionsError (one line naming the metric and the fix) when a metric does not fit the first batch:
        a callable returning more than a value per sample, a regression metric on class labels, a
        classification metric on a regression's outputs, a torchmetrics Metric that fails on them."""
        if self.classes is None and self._needs_classes:
            self._set_classes(outputs)
        with torch.no_grad():
            batch = Batch(outputs, targets)
            for metric in self.metrics:
                metric.check(batch, self.regression)

    def state(self, outputs: object, targets: object) -> torch.Tensor:
        """This batch's state: a 1-D float32 tensor of `size` on the outputs' device, summable over batches and
        ranks. Nothing is read to the host."""
        return self.states([(outputs, targets)])[0]

    def states(self, batches: Sequence[tuple[Any, Any]]) -> torch.Tensor:
        """The states of several iterations' (outputs, targets), iterations x `size`: what stacking their `state`s
        gives, in one computation for the named metrics where the batches share their shapes (the loop reads a
        bunch of iterations at once, and many small computations would cost more than the one)."""
        if not batches:
            raise ValueError("MetricSet.states needs at least one (outputs, targets)")
        with torch.no_grad():
            group = [Batch(outputs, targets) for outputs, targets in batches]
            if self.classes is None and self._needs_classes:
                self._set_classes(group[0].outputs)
            if not self.metrics:
                device = group[0].outputs.device if isinstance(group[0].outputs, torch.Tensor) else None
                return torch.zeros(len(group), 0, device=device)
            if _same_shapes(group):
                return self._states(group)
            return torch.cat([self._states([batch]) for batch in group])

    def _states(self, group: list[Batch]) -> torch.Tensor:
        stacked = Stacked(group, self.classes) if self._stacks else None
        if stacked is not None and self.classes is not None and stacked.outputs.shape[2] != self.classes:
            raise fail(f"the outputs have {stacked.outputs.shape[2]} classes, but the first batch had {self.classes}.")
        columns = []
        for metric in self.metrics:
            if isinstance(metric, PER_BATCH):
                columns.append(torch.stack([metric.state(batch) for batch in group]))
            else:
                assert stacked is not None  # made when any metric stacks
                columns.append(metric.states(stacked))
        return torch.cat(columns, 1) if len(columns) > 1 else columns[0]

    def values(self, state: torch.Tensor | Sequence[float]) -> dict[str, float | None]:
        """Each metric's value from a (summed) state, read to the host once; None where no sample counted."""
        numbers = state.tolist() if isinstance(state, torch.Tensor) else [float(number) for number in state]
        values: dict[str, float | None] = {}
        offset = 0
        for metric in self.metrics:
            values[metric.name] = metric.value(numbers[offset : offset + metric.size])
            offset += metric.size
        return values

    def goal(self, name: str) -> str | None:
        """ "minimize"/"maximize" for a metric whose direction is known, else None."""
        return next(metric.goal for metric in self.metrics if metric.name == name)


def _same_shapes(group: list[Batch]) -> bool:
    """Whether the batches stack: every output and first target a tensor of the first batch's shape and type."""
    first = group[0]
    if not (isinstance(first.outputs, torch.Tensor) and isinstance(first.target, torch.Tensor)):
        return len(group) == 1
    return all(
        isinstance(b.outputs, torch.Tensor)
        and isinstance(b.target, torch.Tensor)
        and b.outputs.shape == first.outputs.shape
        and b.outputs.dtype == first.outputs.dtype
        and b.target.shape == first.target.shape
        and b.target.dtype == first.target.dtype
        for b in group[1:]
    )


def summed_over(group: torch.distributed.ProcessGroup | None, totals: torch.Tensor) -> torch.Tensor:
    """`totals` summed over the ranks of `group` (in place; as it is without a group)."""
    if group is not None:
        torch.distributed.all_reduce(totals, group=group)
    return totals


NAMES = ("accuracy", "top5-accuracy", "rmse", "mae", "precision", "recall", "fscore")
GOALS = ("minimize", "maximize")
_TOP_K = re.compile(r"top(\d+)-accuracy")
# names PyTorch, sklearn and MATLAB users write for ours: only suggested, never taken
_ALIASES = {
    "acc": "accuracy",
    "top1-accuracy": "accuracy",
    "f1": "fscore",
    "f1score": "fscore",
    "f1_score": "fscore",
    "f1-score": "fscore",
    "f-score": "fscore",
    "mse": "rmse",
    "l1": "mae",
    "top5": "top5-accuracy",
    "top-5-accuracy": "top5-accuracy",
    "top5_accuracy": "top5-accuracy",
    "top_5_accuracy": "top5-accuracy",
}

_REGRESSION_FUNCTIONS = (F.mse_loss, F.l1_loss, F.smooth_l1_loss, F.huber_loss)
_CLASS_LOSSES = (nn.CrossEntropyLoss, nn.NLLLoss, nn.BCELoss, nn.BCEWithLogitsLoss, nn.KLDivLoss)
_CLASS_FUNCTIONS = (F.cross_entropy, F.nll_loss, F.binary_cross_entropy, F.binary_cross_entropy_with_logits)


def is_regression(loss_option: object, loss_fn: object, first_target: object) -> bool:
    """Whether the run is a regression (see the module docstring), by `loss_option` (TrainingOptions.loss), the
    loss function and the first target; `first_target` may be a function giving it, called
    only where the loss does not decide (reading a sample can cost a file or an S3 request)."""
    if is_regression_loss(loss_option) or is_regression_loss(loss_fn) or loss_fn in _REGRESSION_FUNCTIONS:
        return True
    if (
        loss_option in ("crossentropy", "binary-crossentropy")
        or isinstance(loss_fn, _CLASS_LOSSES)
        or loss_fn in _CLASS_FUNCTIONS
    ):
        return False
    if callable(first_target):
        first_target = first_target()
    target = first_tensor(first_target)
    return isinstance(first_target, float) or (target is not None and target.is_floating_point())


def run_metrics(metrics: object, loss_option: object, loss_fn: object, train_data: object) -> MetricSet:
    """TrainingOptions.metrics resolved for this run (the default decided by its loss and first target)."""
    regression = is_regression(loss_option, loss_fn, lambda: _first_target(train_data))
    return resolve_metrics(metrics, regression=regression)


def _first_target(data: Any) -> object:
    """The first sample's target, or None where the data cannot say (read before training: one item)."""
    try:
        item = data[0]
    except Exception:
        return None
    return item[1] if isinstance(item, tuple | list) and len(item) >= 2 else None


def check_on_first_sample(metrics: MetricSet, loss_fn: object, model: nn.Module, first_item: object) -> None:
    """OptionsError (naming the metric and the fix) in the notebook, before any worker starts, when a metric
    the user named does not fit the network's outputs for the first sample; the loop checks its first batch too.
    Nothing is said where the network cannot run on one sample here: the loop's first step says why."""
    from nbscale.training.checks import outputs_for_one

    if not isinstance(first_item, tuple | list) or len(first_item) < 2:
        return
    try:
        outputs = outputs_for_one(model, torch.as_tensor(first_item[0]))
        targets = torch.as_tensor(first_item[1])[None]
    except Exception:
        return
    if isinstance(loss_fn, _CLASS_LOSSES[:2]) and targets.is_floating_point() and targets.ndim == 1:
        targets = targets.long()  # whole-number float labels, made class indices for cross-entropy
    copy.deepcopy(metrics).check(outputs, targets)  # a copy: the plan's metrics learn no class count here


@dataclass(frozen=True)
class Objective:
    """What validation_patience and output_network="best-validation" follow: the validation loss or a metric,
    minimized or maximized (resolved once by `objective`)."""

    name: str = "loss"
    goal: str = "minimize"

    def score(self, loss: float, metrics: dict[str, float | None]) -> float:
        """A validation's score, lower is better; NaN where the metric has no value (never an improvement)."""
        value = loss if self.name == "loss" else metrics.get(self.name)
        if value is None or not math.isfinite(value):
            return math.nan
        return value if self.goal == "minimize" else -value


def resolve_metrics(metrics: object, *, regression: bool) -> MetricSet:
    """`TrainingOptions.metrics` as a MetricSet; None gives ("accuracy",), or ("rmse",) under a regression.

    Items: a name ("accuracy", "top{k}-accuracy", "rmse", "mae", "precision", "recall", "fscore", in any case),
    a torchmetrics Metric (or MetricCollection: its metrics by key), a callable (outputs, targets) -> value per
    sample (named by its __name__), or a (name, metric) pair; one metric alone counts as a sequence of one.
    Raises OptionsError for an unknown name (with "did you mean"), a duplicate name, or anything else.
    """
    if metrics is None:
        metrics = ("rmse",) if regression else ("accuracy",)
    elif (
        isinstance(metrics, str)
        or _is_metric_object(metrics)
        or (callable(metrics) and not isinstance(metrics, Sequence))
    ):
        metrics = (metrics,)
    elif not isinstance(metrics, Sequence) or isinstance(metrics, bytes):
        raise OptionsError(
            f"TrainingOptions.metrics={type(metrics).__name__} is not allowed: metrics must be "
            "None or a sequence of metrics, e.g. ('accuracy', 'fscore')."
        )
    kinds = [_kind(metric, name) for item in metrics for name, metric in _expanded(item)]
    names = [kind.name for kind in kinds]
    for name in names:
        if names.count(name) > 1:
            raise fail(
                f"two metrics are named {name!r}: name one differently with a (name, metric) pair, "
                f"e.g. ('{name}2', ...)."
            )
    return MetricSet(kinds, regression)


def _expanded(item: object) -> list[tuple[str | None, Any]]:
    """A torchmetrics MetricCollection as its metrics, named by its keys; anything else as itself."""
    torchmetrics = sys.modules.get("torchmetrics")
    if torchmetrics is not None and isinstance(item, torchmetrics.MetricCollection):
        return list(item.items(keep_base=False))
    return [(None, item)]


def _kind(item: object, name: str | None = None) -> Kind:
    """The metric `item` stands for, named `name` (a pair's name) or by itself."""
    if name is None and isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
        if not item[0]:
            raise fail(f"the pair {item!r} needs a name: a non-empty string first.")
        return _kind(item[1], item[0])
    if isinstance(item, str):
        kind: Kind = _named(item)
        kind.name = name or kind.name
        return _not_loss(kind)
    if _is_metric_object(item):
        return _not_loss(TorchMetric(name or type(item).__name__, item))
    if callable(item) and not isinstance(item, type):
        name = name or getattr(item, "__name__", None)
        if not isinstance(name, str) or not name or name.startswith("<"):  # "<lambda>", "<genexpr>"
            raise fail(
                f"the callable {item!r} has no name to show it by: give it one with a pair, "
                "e.g. metrics=('accuracy', ('error', my_function))."
            )
        return _not_loss(SampleMean(name, item))
    raise fail(
        f"{item!r} is not a metric: give a name ({', '.join(repr(name) for name in NAMES)}), a torchmetrics "
        "Metric, a callable (outputs, targets) -> value per sample, or a (name, metric) pair."
    )


def _named(text: str) -> Kind:
    name = text.strip().lower()
    if name in CLASS_NAMES[1:]:
        return ClassAverage(name)
    if name in REGRESSION_NAMES:
        return ErrorSum(name)
    if name == "accuracy":
        return ClassFraction(name)
    top = _TOP_K.fullmatch(name)
    if top and int(top.group(1)) >= 1:
        return ClassFraction(name, int(top.group(1)))
    hint = did_you_mean(name, NAMES, meant=_ALIASES)
    raise fail(
        f"there is no metric named {text!r}.{hint} The names are: {', '.join(NAMES)} (any "
        "top{k}-accuracy); a torchmetrics Metric or a callable (outputs, targets) -> value per sample "
        "gives any other."
    )


def _not_loss(kind: Kind) -> Kind:
    if kind.name == "loss":
        raise fail(
            "'loss' is the training loss's name (always shown): name the metric differently with a (name, metric) pair."
        )
    return kind


def _is_metric_object(value: object) -> bool:
    """A torchmetrics Metric (torchmetrics is imported only by whoever made one)."""
    torchmetrics = sys.modules.get("torchmetrics")
    return torchmetrics is not None and isinstance(value, torchmetrics.Metric)


def objective(objective_metric: str, objective_goal: str, metrics: MetricSet) -> tuple[str, str]:
    """(name, "minimize" | "maximize") that validation_patience and output_network="best-validation" follow.

    "loss" (the validation loss) is minimized; the named metrics have known directions (rmse and mae minimize,
    the accuracies, precision, recall and fscore maximize), a torchmetrics Metric its higher_is_better; any
    other metric needs objective_goal. Raises OptionsError for a name not among the metrics, an unknown goal,
    or a goal against a known direction.
    """
    if objective_goal not in ("auto", *GOALS):
        raise OptionsError(
            f"TrainingOptions.objective_goal={objective_goal!r} is not allowed: objective_goal "
            "must be one of 'auto', 'minimize', 'maximize'."
        )
    if objective_metric == "loss":
        known: str | None = "minimize"
    elif objective_metric in metrics.names:
        known = metrics.goal(objective_metric)
    else:
        listed = ", ".join(repr(name) for name in metrics.names) or "none"
        hint = did_you_mean(objective_metric, ("loss", *metrics.names))
        raise OptionsError(
            f"TrainingOptions.objective_metric={objective_metric!r} is not among the metrics ({listed}).{hint} "
            f"Use 'loss' (the validation loss) or add it: metrics=(..., {objective_metric!r})."
        )
    if known is None:
        if objective_goal == "auto":
            raise OptionsError(
                f"TrainingOptions.objective_goal: nbscale cannot tell whether {objective_metric!r} is better high "
                "or low: set objective_goal='maximize' or 'minimize'."
            )
        return objective_metric, objective_goal
    if objective_goal not in ("auto", known):
        raise OptionsError(
            f"TrainingOptions.objective_goal={objective_goal!r} contradicts objective_metric={objective_metric!r}, "
            f"which is better {'low' if known == 'minimize' else 'high'}: leave objective_goal='auto'."
        )
    return objective_metric, known
