"""The kinds of metric `TrainingOptions(metrics=...)` takes, each as a sum-reducible state
(nbscale.training.run_metrics).

Every kind turns one batch into a 1-D float32 state whose sum over batches and ranks is the state of their union,
and reads its value from a summed state on the host. States are computed on the device without reading anything
to the host (no .item(), no branching on values): only shapes decide. The named kinds compute a whole bunch of
iterations' batches at once (`Stacked`, one computation per bunch, as the loop reads); a callable and a
torchmetrics Metric (nbscale.training.torch_metric) see one batch at a time (`Batch`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import cached_property
from typing import Any

import torch

from nbscale.data.batches import batch_length, first_tensor
from nbscale.errors import OptionsError

CLASS_NAMES = ("accuracy", "precision", "recall", "fscore")  # and "top{k}-accuracy"
REGRESSION_NAMES = ("rmse", "mae")


def fail(message: str) -> OptionsError:
    """The one-line error of a metric that cannot be used (raised by the caller)."""
    return OptionsError(f"TrainingOptions.metrics: {message}")


def described(tensor: object) -> str:
    """A tensor's dtype and shape as an error message names them."""
    if not isinstance(tensor, torch.Tensor):
        return f"a {type(tensor).__name__}"
    return f"{str(tensor.dtype).removeprefix('torch.')} of shape {tuple(tensor.shape)}"


class Batch:
    """One batch's outputs and targets; `target` is the first target tensor, as the outputs are the first output."""

    def __init__(self, outputs: Any, targets: Any) -> None:
        self.outputs, self.targets = outputs, targets
        self.target = first_tensor(targets)


class Stacked:
    """The batches of several iterations, all of one shape, stacked (iterations first), with what several named
    metrics share (predictions, class counts) worked out once."""

    def __init__(self, batches: Sequence[Batch], classes: int | None) -> None:
        outputs, targets = [b.outputs for b in batches], [b.target for b in batches]
        self.outputs = outputs[0][None] if len(batches) == 1 else torch.stack(outputs)
        self.target = targets[0][None] if len(batches) == 1 else torch.stack(targets)  # type: ignore[index, arg-type]
        self.iterations, self.classes = len(batches), classes

    def counts(self, number: int) -> torch.Tensor:
        """`number` for every iteration, filled on the device (not copied from the host)."""
        return torch.full((self.iterations,), float(number), device=self.outputs.device)

    @cached_property
    def labels(self) -> torch.Tensor:
        """The class of each sample, iterations x samples (class probabilities or one-hot targets: their largest)."""
        target = self.target
        labels = target.argmax(2) if target.is_floating_point() else target
        return labels.reshape(self.iterations, -1)

    @cached_property
    def predicted(self) -> torch.Tensor:
        return self.outputs.argmax(2).reshape(self.iterations, -1)

    @cached_property
    def correct(self) -> torch.Tensor:
        return self.predicted == self.labels

    @cached_property
    def class_counts(self) -> torch.Tensor:
        """Per-class true positives, predictions and labels of each iteration (iterations x 3 classes), in one
        scatter_add (not bincount: on CUDA it reads the largest label to the host)."""
        assert self.classes is not None
        labels, classes, samples = self.labels, self.classes, self.labels.shape[1]
        index = torch.cat([labels, self.predicted + classes, labels + 2 * classes], 1)
        if self.iterations > 1:
            index = index + torch.arange(0, self.iterations * 3 * classes, 3 * classes, device=index.device)[:, None]
        counted = torch.ones(index.shape, dtype=torch.float32, device=index.device)
        counted[:, :samples] = self.correct
        counts = torch.zeros(self.iterations * 3 * classes, dtype=torch.float32, device=index.device)
        return counts.scatter_add_(0, index.reshape(-1), counted.reshape(-1)).reshape(self.iterations, -1)


def check_class_scores(name: str, batch: Batch, regression: bool) -> None:
    """OptionsError unless the batch is class scores (N x C ...) with class labels (N ...) or, outside a
    regression, class probabilities shaped like the scores."""
    outputs, target = batch.outputs, batch.target
    scores = isinstance(outputs, torch.Tensor) and outputs.ndim >= 2 and outputs.is_floating_point()
    labels_fit = (
        scores
        and isinstance(target, torch.Tensor)
        and (
            (
                not target.is_floating_point()
                and not target.is_complex()
                and tuple(target.shape) == (outputs.shape[0], *outputs.shape[2:])
            )
            or (target.is_floating_point() and not regression and target.shape == outputs.shape)
        )
    )
    if not labels_fit:
        raise fail(
            f"{name!r} is a classification metric: it needs class scores (N x classes) and class labels (N "
            f"integers), but the outputs are {described(outputs)} and the targets {described(target)}. For a "
            "regression use metrics=('rmse',) or ('mae',); metrics=() computes none."
        )


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
            raise fail(
                f"{self.name!r} needs at least {self.k} classes, but the outputs have "
                f"{batch.outputs.shape[1]}: use a smaller k, e.g. 'accuracy'."
            )

    def states(self, stacked: Stacked) -> torch.Tensor:
        labels = stacked.labels
        if self.k == 1:
            hits = stacked.correct.sum(1)
        else:
            best = stacked.outputs.topk(self.k, 2).indices.movedim(2, -1).reshape(stacked.iterations, -1, self.k)
            hits = (best == labels[:, :, None]).any(2).sum(1)
        return torch.stack([hits.float(), stacked.counts(labels.shape[1])], 1)

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
        if (
            isinstance(outputs, torch.Tensor)
            and isinstance(target, torch.Tensor)
            and outputs.ndim >= 2
            and not target.is_floating_point()
            and target.ndim == outputs.ndim - 1
            and outputs.shape[1] > 1
        ):
            raise fail(
                f"{self.name!r} is a regression metric, but the targets are class labels ({described(target)}) "
                f"for class scores ({described(outputs)}): use 'accuracy', 'precision', 'recall' or 'fscore'."
            )
        if not (
            isinstance(outputs, torch.Tensor)
            and isinstance(target, torch.Tensor)
            and outputs.is_floating_point()
            and target.numel() == outputs.numel()
            and outputs.numel() > 0
        ):
            raise fail(
                f"{self.name!r} compares the outputs with targets of the same size, but the outputs are "
                f"{described(outputs)} and the targets {described(target)}."
            )

    def states(self, stacked: Stacked) -> torch.Tensor:
        outputs = stacked.outputs
        errors = (outputs.float() - stacked.target.reshape(outputs.shape).float()).reshape(stacked.iterations, -1)
        total = errors.square().sum(1) if self.squared else errors.abs().sum(1)
        return torch.stack([total, stacked.counts(errors.shape[1])], 1)

    def value(self, state: Sequence[float]) -> float | None:
        total, count = state
        if count <= 0:
            return None
        return math.sqrt(total / count) if self.squared else total / count


class ClassAverage:
    """precision, recall and fscore, macro-averaged over the classes seen (in the labels or the predictions),
    from per-class counts: [true positives (C), predictions (C), labels (C)]."""

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

    def states(self, stacked: Stacked) -> torch.Tensor:
        return stacked.class_counts

    def value(self, state: Sequence[float]) -> float | None:
        classes = len(state) // 3
        hits, predicted, actual = state[:classes], state[classes : 2 * classes], state[2 * classes :]
        # a class neither in the labels nor predicted is left out, as sklearn and torchmetrics do
        seen = [c for c in range(classes) if predicted[c] + actual[c] > 0]
        if not seen:
            return None
        if self.measure == "fscore":  # 2 tp / (2 tp + fp + fn)
            scores = [2 * hits[c] / (predicted[c] + actual[c]) for c in seen]
        else:  # tp / (tp + fp), tp / (tp + fn); 0 where never predicted (or never a label)
            totals = predicted if self.measure == "precision" else actual
            scores = [hits[c] / totals[c] if totals[c] > 0 else 0.0 for c in seen]
        return sum(scores) / len(scores)


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
            raise fail(
                f"the metric {self.name!r} failed on the first batch: {type(error).__name__}: {error}"
            ) from error
        samples = _samples(batch)
        if isinstance(result, (int, float)) and not isinstance(result, bool):
            return
        ok = (
            isinstance(result, torch.Tensor)
            and not result.is_complex()
            and (result.ndim == 0 or (result.shape[0] == samples and result.numel() == samples))
        )
        if not ok:
            raise fail(
                f"the metric {self.name!r} returned {described(result)} for a batch of {samples} samples; a "
                f"metric returns one value per sample (shape ({samples},)) or the batch's mean (a scalar "
                "tensor): reduce the other dimensions, e.g. with .mean(1)."
            )

    def state(self, batch: Batch) -> torch.Tensor:
        try:
            result = self.function(batch.outputs, batch.targets)
        except Exception as error:  # it passed the first batch's check: say which metric, not a bare KeyError
            raise fail(
                f"the metric {self.name!r} raised {type(error).__name__}: {error} on a batch after the first. Make "
                "it handle every batch (its outputs and targets have the first batch's kinds; the last batch may "
                "be smaller), or leave it out of metrics."
            ) from error
        samples = _samples(batch)
        device = batch.outputs.device if isinstance(batch.outputs, torch.Tensor) else None
        result = torch.as_tensor(result, dtype=torch.float32, device=device)
        total = result * samples if result.ndim == 0 else result.float().sum()
        return torch.stack([total, torch.full((), float(samples), device=total.device)])

    def value(self, state: Sequence[float]) -> float | None:
        total, count = state
        return total / count if count > 0 else None


def _samples(batch: Batch) -> int:
    return batch_length(batch.outputs) or batch_length(batch.targets)
