"""The kinds of metric `TrainingOptions(metrics=...)` takes, each as a sum-reducible state (nbscale.train.metrics).

Every kind turns one batch into a 1-D float32 state whose sum over batches and ranks is the state of their union,
and reads its value from a summed state on the host. States are computed on the device without reading anything
to the host (no .item(), no branching on values): only shapes decide.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from functools import cached_property
from typing import Any

import torch

from nbscale.errors import OptionsError
from nbscale.train.batches import batch_length, first_tensor

CLASS_NAMES = ("accuracy", "precision", "recall", "fscore")  # and "top{k}-accuracy"
REGRESSION_NAMES = ("rmse", "mae")


def fail(message: str) -> OptionsError:
    """The one-line error of a metric that cannot be used (raised by the caller)."""
    return OptionsError(f"TrainingOptions.metrics: {message}")


def count(number: int, device: torch.device) -> torch.Tensor:
    """`number` as a float32 scalar on `device`, filled there (no copy from the host)."""
    return torch.full((), float(number), device=device)


def _described(tensor: Any) -> str:
    if not isinstance(tensor, torch.Tensor):
        return f"a {type(tensor).__name__}"
    return f"{str(tensor.dtype).removeprefix('torch.')} of shape {tuple(tensor.shape)}"


class Batch:
    """One batch's outputs and targets, with what several class metrics share (predictions, class counts) worked
    out once per `MetricSet.state`."""

    def __init__(self, outputs: Any, targets: Any, classes: int | None) -> None:
        self.outputs, self.targets, self.classes = outputs, targets, classes
        self.target = first_tensor(targets)  # the first target, as the outputs are the first output

    @cached_property
    def labels(self) -> torch.Tensor:
        """The class of each sample, flattened (class probabilities or one-hot targets: their largest)."""
        target = self.target
        assert target is not None
        labels = target.argmax(1) if target.is_floating_point() else target
        return labels.reshape(-1)

    @cached_property
    def predicted(self) -> torch.Tensor:
        return self.outputs.argmax(1).reshape(-1)

    @cached_property
    def class_counts(self) -> torch.Tensor:
        """Per-class true positives, false positives and false negatives, concatenated (3 x classes);
        scatter_add_, not bincount: bincount on CUDA reads the largest label to the host."""
        assert self.classes is not None
        labels, predicted = self.labels, self.predicted
        ones = torch.ones(labels.shape, dtype=torch.float32, device=labels.device)
        zeros = torch.zeros(self.classes, dtype=torch.float32, device=labels.device)
        true_positives = zeros.scatter_add(0, labels, (predicted == labels).float())
        predicted_counts = zeros.scatter_add(0, predicted, ones)
        actual_counts = zeros.scatter_add(0, labels, ones)
        return torch.cat([true_positives, predicted_counts - true_positives, actual_counts - true_positives])


def check_class_scores(name: str, batch: Batch, regression: bool) -> None:
    """OptionsError unless the batch is class scores (N x C ...) with class labels (N ...) or, outside a
    regression, class probabilities shaped like the scores."""
    outputs, target = batch.outputs, batch.target
    scores = isinstance(outputs, torch.Tensor) and outputs.ndim >= 2 and outputs.is_floating_point()
    labels_fit = scores and isinstance(target, torch.Tensor) and (
        (not target.is_floating_point() and not target.is_complex()
         and tuple(target.shape) == (outputs.shape[0], *outputs.shape[2:]))
        or (target.is_floating_point() and not regression and target.shape == outputs.shape))
    if not labels_fit:
        raise fail(
            f"{name!r} is a classification metric: it needs class scores (N x classes) and class labels (N "
            f"integers), but the outputs are {_described(outputs)} and the targets {_described(target)}. For a "
            "regression use metrics=('rmse',) or ('mae',); metrics=() computes none.")


class ClassFraction:
    """accuracy and top{k}-accuracy: [samples whose class is among the k best scores, samples]."""

    size = 2
    goal = "maximize"
    needs_classes = False

    def __init__(self, name: str, k: int = 1) -> None:
        self.name, self.k = name, k

    def check(self, batch: Batch, regression: bool) -> None:
        check_class_scores(self.name, batch, regression)
        if batch.outputs.shape[1] < self.k:
            raise fail(f"{self.name!r} needs at least {self.k} classes, but the outputs have "
                       f"{batch.outputs.shape[1]}: use a smaller k, e.g. 'accuracy'.")

    def state(self, batch: Batch) -> torch.Tensor:
        labels = batch.labels
        if self.k == 1:
            hits = (batch.predicted == labels).sum()
        else:
            best = batch.outputs.topk(self.k, 1).indices.movedim(1, -1).reshape(-1, self.k)
            hits = (best == labels[:, None]).any(1).sum()
        return torch.stack([hits.float(), count(labels.numel(), labels.device)])

    def value(self, state: Sequence[float]) -> float | None:
        hits, count = state
        return hits / count if count > 0 else None


class ErrorSum:
    """rmse and mae over every element: [sum of squared (or absolute) errors, elements]."""

    size = 2
    goal = "minimize"
    needs_classes = False

    def __init__(self, name: str) -> None:
        self.name, self.squared = name, name == "rmse"  # a pair may rename it

    def check(self, batch: Batch, regression: bool) -> None:
        outputs, target = batch.outputs, batch.target
        if (isinstance(outputs, torch.Tensor) and isinstance(target, torch.Tensor) and outputs.ndim >= 2
                and not target.is_floating_point() and target.ndim == outputs.ndim - 1 and outputs.shape[1] > 1):
            raise fail(
                f"{self.name!r} is a regression metric, but the targets are class labels ({_described(target)}) "
                f"for class scores ({_described(outputs)}): use 'accuracy', 'precision', 'recall' or 'fscore'.")
        if not (isinstance(outputs, torch.Tensor) and isinstance(target, torch.Tensor)
                and outputs.is_floating_point() and target.numel() == outputs.numel() and outputs.numel() > 0):
            raise fail(
                f"{self.name!r} compares the outputs with targets of the same size, but the outputs are "
                f"{_described(outputs)} and the targets {_described(target)}.")

    def state(self, batch: Batch) -> torch.Tensor:
        outputs = batch.outputs
        target = batch.target
        assert target is not None  # check() saw a tensor
        errors = outputs.float() - target.reshape(outputs.shape).float()
        total = errors.square().sum() if self.squared else errors.abs().sum()
        return torch.stack([total, count(errors.numel(), errors.device)])

    def value(self, state: Sequence[float]) -> float | None:
        total, count = state
        if count <= 0:
            return None
        return math.sqrt(total / count) if self.squared else total / count


class ClassAverage:
    """precision, recall and fscore, macro-averaged over the classes seen (in the labels or the predictions),
    from per-class true positives, false positives and false negatives: [tp (C), fp (C), fn (C)]."""

    goal = "maximize"
    needs_classes = True

    def __init__(self, name: str) -> None:
        self.name, self.measure = name, name  # a pair may rename it
        self.classes: int | None = None

    @property
    def size(self) -> int:
        assert self.classes is not None, "the class count comes from the first batch (MetricSet.check)"
        return 3 * self.classes

    def check(self, batch: Batch, regression: bool) -> None:
        check_class_scores(self.name, batch, regression)

    def state(self, batch: Batch) -> torch.Tensor:
        return batch.class_counts

    def value(self, state: Sequence[float]) -> float | None:
        classes = len(state) // 3
        scores = []
        for tp, fp, fn in zip(state[:classes], state[classes:2 * classes], state[2 * classes:], strict=True):
            if tp + fp + fn <= 0:
                continue  # a class neither in the labels nor predicted: left out, as sklearn and torchmetrics do
            denominator = {"precision": tp + fp, "recall": tp + fn, "fscore": 2 * tp + fp + fn}[self.measure]
            numerator = 2 * tp if self.measure == "fscore" else tp
            scores.append(numerator / denominator if denominator > 0 else 0.0)
        return sum(scores) / len(scores) if scores else None


class SampleMean:
    """A callable (outputs, targets) -> one value per sample, or the batch's mean: [sum over samples, samples]."""

    size = 2
    goal = None
    needs_classes = False

    def __init__(self, name: str, function: Callable[[Any, Any], Any]) -> None:
        self.name, self.function = name, function

    def check(self, batch: Batch, regression: bool) -> None:
        try:
            result = self.function(batch.outputs, batch.targets)
        except Exception as error:
            raise fail(f"the metric {self.name!r} failed on the first batch: {type(error).__name__}: {error}") \
                from error
        samples = _samples(batch)
        if isinstance(result, (int, float)) and not isinstance(result, bool):
            return
        ok = isinstance(result, torch.Tensor) and not result.is_complex() and (
            result.ndim == 0 or (result.shape[0] == samples and result.numel() == samples))
        if not ok:
            raise fail(
                f"the metric {self.name!r} returned {_described(result)} for a batch of {samples} samples; a "
                f"metric returns one value per sample (shape ({samples},)) or the batch's mean (a scalar "
                "tensor): reduce the other dimensions, e.g. with .mean(1).")

    def state(self, batch: Batch) -> torch.Tensor:
        result = self.function(batch.outputs, batch.targets)
        samples = _samples(batch)
        device = batch.outputs.device if isinstance(batch.outputs, torch.Tensor) else None
        result = torch.as_tensor(result, dtype=torch.float32, device=device)
        total = result * samples if result.ndim == 0 else result.float().sum()
        return torch.stack([total, count(samples, total.device)])

    def value(self, state: Sequence[float]) -> float | None:
        total, count = state
        return total / count if count > 0 else None


def _samples(batch: Batch) -> int:
    return batch_length(batch.outputs) or batch_length(batch.targets)


class TorchMetric:
    """A torchmetrics Metric whose states are all tensors reduced by a sum: a batch's state is its states after
    `update` from their defaults, flattened; a value is `compute` on a host copy holding the summed states.
    Copies are used, so the user's Metric is never changed; they never synchronise across ranks themselves
    (their update and compute are called unwrapped), since the summed state already covers every rank."""

    goal: str | None
    needs_classes = False

    def __init__(self, name: str, metric: Any) -> None:
        from torchmetrics.utilities.data import dim_zero_sum

        self.name = name
        refused = [state for state, reduce in metric._reductions.items()
                   if reduce is not dim_zero_sum or not isinstance(metric._defaults[state], torch.Tensor)]
        if refused or not metric._defaults:
            what = f"keeps state {refused[0]!r} that is not a sum" if refused else "has no states"
            raise fail(
                f"the torchmetrics metric {name!r} ({type(metric).__name__}) {what} (e.g. a list of every "
                "prediction), so it cannot be summed over batches and ranks. Use a version with summable states "
                "(e.g. thresholds=200 for AUROC and average-precision metrics), or a callable (outputs, targets) "
                "-> value per sample.")
        self.host = copy.deepcopy(metric).cpu()
        self.shapes = {state: default.shape for state, default in self.host._defaults.items()}
        self.dtypes = {state: default.dtype for state, default in self.host._defaults.items()}
        self.size = sum(default.numel() for default in self.host._defaults.values())
        higher = getattr(metric, "higher_is_better", None)
        self.goal = None if higher is None else "maximize" if higher else "minimize"
        self.on_device: dict[torch.device, Any] = {}  # a copy per device the states are computed on

    def _copy_on(self, device: torch.device) -> Any:
        metric = self.on_device.get(device)
        if metric is None:
            metric = self.on_device[device] = copy.deepcopy(self.host).to(device)
        return metric

    def _update(self, metric: Any, batch: Batch) -> torch.Tensor:
        for state, default in metric._defaults.items():
            setattr(metric, state, default.detach().clone())
        type(metric).update(metric, batch.outputs, batch.target)
        return torch.cat([getattr(metric, state).reshape(-1).float() for state in metric._defaults])

    def check(self, batch: Batch, regression: bool) -> None:
        metric = self._copy_on(batch.outputs.device if isinstance(batch.outputs, torch.Tensor) else
                               torch.device("cpu"))
        try:
            state = self._update(metric, batch)
            value = self.value(state.tolist(), strict=True)
        except OptionsError:
            raise
        except Exception as error:
            raise fail(f"the torchmetrics metric {self.name!r} ({type(metric).__name__}) failed on the first "
                       f"batch (outputs {_described(batch.outputs)}, targets {_described(batch.target)}): "
                       f"{type(error).__name__}: {error}") from error
        del value
        if hasattr(metric, "validate_args"):  # its input checks read tensors to the host: once is enough
            metric.validate_args = False

    def state(self, batch: Batch) -> torch.Tensor:
        return self._update(self._copy_on(batch.outputs.device), batch)

    def value(self, state: Sequence[float], strict: bool = False) -> float | None:
        metric, offset = self.host, 0
        for name, shape in self.shapes.items():
            count = math.prod(shape)
            values = torch.tensor(state[offset:offset + count], dtype=torch.float64)
            offset += count
            dtype = self.dtypes[name]
            values = values if dtype.is_floating_point else values.round()
            setattr(metric, name, values.to(dtype).reshape(shape))
        result = type(metric).compute(metric)
        if isinstance(result, torch.Tensor) and result.numel() == 1:
            number = float(result)
            return None if math.isnan(number) and not strict else number
        if strict:
            raise fail(f"the torchmetrics metric {self.name!r} ({type(metric).__name__}) computes "
                       f"{_described(result)}, not one number: ask it for one (e.g. average='macro').")
        return None
