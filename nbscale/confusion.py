"""Confusion charts (MATLAB's confusionchart): counts of true against predicted classes, from labels given as
class names or indices; a chart shows as a figure in a notebook, or as text without matplotlib."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import torch

from nbscale.errors import NbscaleError


class ConfusionChart:
    """A confusion matrix (rows: true class, columns: predicted); shows as a figure, or as text without matplotlib."""

    def __init__(self, matrix: torch.Tensor, classes: Sequence[str]) -> None:
        self.matrix, self.classes = matrix, list(classes)

    def __repr__(self) -> str:
        largest = int(self.matrix.max()) if self.matrix.numel() else 0
        width = max([len(c) for c in self.classes] + [len(str(largest)), 4])
        header = " " * (width + 2) + " ".join(c.rjust(width) for c in self.classes)
        rows = [
            f"{name.rjust(width)} |" + " ".join(str(int(v)).rjust(width) for v in row)
            for name, row in zip(self.classes, self.matrix.tolist(), strict=True)
        ]
        return "\n".join(["true \\ predicted", header, *rows])

    def figure(self) -> Any:
        """A matplotlib Figure of the chart (counts in every cell)."""
        from matplotlib.figure import Figure

        size = max(3.0, 0.5 * len(self.classes) + 1.5)
        figure = Figure(figsize=(size + 1, size))
        axes = figure.subplots()
        image = axes.imshow(self.matrix.numpy(), cmap="Blues")
        ticks = range(len(self.classes))
        axes.set_xticks(ticks, self.classes, rotation=45 if max(map(len, self.classes)) > 3 else 0)
        axes.set_yticks(ticks, self.classes)
        axes.set_xlabel("Predicted class")
        axes.set_ylabel("True class")
        threshold = float(self.matrix.max()) / 2
        for (i, j), value in zip(((i, j) for i in ticks for j in ticks), self.matrix.flatten().tolist(), strict=True):
            if value:
                axes.text(
                    j, i, str(int(value)), ha="center", va="center", color="white" if value > threshold else "black"
                )
        figure.colorbar(image, ax=axes)
        figure.tight_layout()
        return figure

    def _repr_png_(self) -> bytes | None:
        try:
            figure = self.figure()
        except ImportError:
            return None
        import io

        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=80)
        return buffer.getvalue()


def _labels(values: Any) -> torch.Tensor | list[Any]:
    """Integer labels as an int64 tensor (tensors and numpy arrays are not turned into lists); names as a list."""
    if isinstance(values, np.ndarray) and values.dtype.kind in "iu":
        return torch.from_numpy(values).reshape(-1).long()
    if isinstance(values, torch.Tensor) and not values.is_floating_point() and not values.is_complex():
        return values.reshape(-1).long().cpu()
    values = values.tolist() if isinstance(values, torch.Tensor | np.ndarray) else list(values)
    if values and all(isinstance(v, int | np.integer) and not isinstance(v, bool) for v in values):
        return torch.tensor([int(v) for v in values], dtype=torch.long)
    return cast("list[Any]", values)


def _as_indices(values: torch.Tensor | list[Any], names: list[str]) -> torch.Tensor:
    if isinstance(values, torch.Tensor):
        return values
    position = {name: i for i, name in enumerate(names)}
    return torch.tensor([position[v] if isinstance(v, str) else int(v) for v in values], dtype=torch.long)


def confusion_chart(true: Any, pred: Any, classes: Sequence[str] | None = None) -> ConfusionChart:
    """A confusion chart of true vs predicted labels (names or indices); displays as a figure in a notebook."""
    true_labels, pred_labels = _labels(true), _labels(pred)
    if len(true_labels) != len(pred_labels):
        raise NbscaleError(f"confusion_chart: {len(true_labels)} true labels but {len(pred_labels)} predictions.")
    if classes is None:
        classes = _classes_of(true_labels, pred_labels)
    names = [str(c) for c in classes]
    known = set(names)
    unknown = {
        v
        for labels in (true_labels, pred_labels)
        if not isinstance(labels, torch.Tensor)
        for v in labels
        if isinstance(v, str) and v not in known
    }
    if unknown:
        raise NbscaleError(f"confusion_chart: labels {sorted(unknown)} are not among classes {names}.")
    true_indices, pred_indices = _as_indices(true_labels, names), _as_indices(pred_labels, names)
    count = len(names)
    for indices in (true_indices, pred_indices):
        if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= count):
            outside = int(indices.max()) if int(indices.max()) >= count else int(indices.min())
            raise NbscaleError(
                f"confusion_chart: label index {outside} is outside the {count} classes "
                f"{names[:10]}: pass classes= with every class."
            )
    # one pass over the labels in C: the cell (t, p) is entry t * count + p
    matrix = torch.bincount(true_indices * count + pred_indices, minlength=count * count).reshape(count, count)
    return ConfusionChart(matrix, names)


def _classes_of(true_labels: torch.Tensor | list[Any], pred_labels: torch.Tensor | list[Any]) -> list[str]:
    """The classes the labels imply when no classes= is given: the sorted names, or "0".."k" up to the largest
    index; NbscaleError when names and indices are mixed."""
    both = [true_labels, pred_labels]
    if isinstance(true_labels, torch.Tensor) and isinstance(pred_labels, torch.Tensor):
        largest = max((int(labels.max()) for labels in (true_labels, pred_labels) if labels.numel()), default=-1)
        return [str(i) for i in range(largest + 1)]
    values = {v for labels in both for v in (labels.tolist() if isinstance(labels, torch.Tensor) else labels)}
    if len({isinstance(v, str) for v in values}) > 1:
        raise NbscaleError(
            "confusion_chart: the labels mix class names and class indices; pass classes= (for "
            "example ds.classes) to say which name each index stands for, or use names for "
            "both."
        )
    if all(isinstance(v, str) for v in values):
        return sorted(values)
    return [str(i) for i in range(max(int(v) for v in values) + 1)] if values else []
