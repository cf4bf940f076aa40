"""Training metrics (MATLAB's trainingOptions Metrics) as states that sum.

The run plan resolves a run's metrics into a `MetricSet` (nbscale.training.run_metrics); the loop asks it for
each batch's `state` (a 1-D float32 tensor on the outputs' device, computed without reading anything to the host), sums
states over the iterations of a bunch or a validation and over the ranks (one all_reduce), and reads the
`values` once. A sum of states is the state of all the batches together, so a metric over 2 ranks is the
metric of all their predictions, never a mean of per-rank values. The metric kinds live in
nbscale.training.metric_kinds and nbscale.training.torch_metric.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from nbscale.training.metric_kinds import (
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
