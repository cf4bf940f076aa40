"""Using a trained network (MATLAB's classify, predict, activations, confusionchart) on a dataset or tensor.

`data` is a torch Dataset yielding (input, label) or input, a DataLoader, an (inputs, labels) pair (tensors, numpy
arrays, labels also a list), a tensor or numpy array of inputs, or one C x H x W image (H x W for one channel) for
a network whose first layer is a 2-D convolution. The network runs in eval mode without gradients on the device its parameters are on, in batches,
and is put back in the mode it was in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from nbscale.errors import ModelError, NbscaleError
from nbscale.models.learn_rates import layers_near
from nbscale.outputs import main_output
from nbscale.train.batch_fitting import out_of_memory
from nbscale.train.checks import misfit_error
from nbscale.train.loading import tensor_of

Data = Dataset | torch.Tensor | tuple[torch.Tensor, torch.Tensor]


def _device_of(net: nn.Module) -> torch.device:
    parameter = next(net.parameters(), None)
    return parameter.device if parameter is not None else torch.device("cpu")


def _labelled_pair(data: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(inputs, labels) when `data` is such a pair: inputs a tensor or array, labels one value per input."""
    if not (isinstance(data, tuple | list) and len(data) == 2 and isinstance(data[0], torch.Tensor | np.ndarray)):
        return None
    label_column = isinstance(data[1], torch.Tensor | np.ndarray) and data[1].ndim == 2 and data[1].shape[1] == 1
    if isinstance(data[1], torch.Tensor | np.ndarray) and data[1].ndim > 1 and not label_column:
        return None  # two inputs (e.g. a list of two images), not inputs and labels
    try:
        inputs, labels = tensor_of(data[0]), tensor_of(data[1])
    except (TypeError, ValueError, RuntimeError):
        return None
    if label_column:  # N x 1, as numpy and pandas often give labels
        labels = labels[:, 0]
    if labels.ndim != 1 or len(labels) != len(inputs):
        raise NbscaleError(f"data as an (inputs, labels) pair needs one label per input: {len(inputs)} inputs but "
                           f"labels of shape {tuple(labels.shape)}.")
    return inputs, labels


def _batches(data: Data, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor | None]]:
    """(inputs, labels or None) in order, `batch_size` at a time."""
    if isinstance(data, np.ndarray):
        data = tensor_of(data)
    if isinstance(data, DataLoader):  # batches as the loader makes them
        for batch in data:
            yield _split_batch(batch)
        return
    if isinstance(data, torch.Tensor):
        for start in range(0, len(data), batch_size):
            yield data[start:start + batch_size], None
        return
    pair = _labelled_pair(data)
    if pair is not None:
        inputs, labels = pair
        for start in range(0, len(inputs), batch_size):
            yield inputs[start:start + batch_size], labels[start:start + batch_size]
        return
    if isinstance(data, tuple) or not (hasattr(data, "__getitem__") and hasattr(data, "__len__")):
        what = f"a tuple of {len(data)} items" if isinstance(data, tuple) else type(data).__name__
        raise NbscaleError(f"data must be a torch Dataset, a tensor, or an (inputs, labels) pair of tensors, "
                           f"not {what}.")
    for batch in DataLoader(data, batch_size=batch_size, shuffle=False):
        yield _split_batch(batch)


def _split_batch(batch: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(inputs, labels or None) of a DataLoader's batch: a tensor, or a list of inputs and labels."""
    if isinstance(batch, list | tuple) and len(batch) >= 2:
        return batch[0], torch.as_tensor(batch[1])
    return (batch[0] if isinstance(batch, list | tuple) else batch), None


def _one_image_as_batch(net: nn.Module, data: Any) -> Any:
    """A single C x H x W image (tensor or array), or H x W for a network taking one channel, as a batch of one,
    for a network whose first layer is a 2-D convolution (MATLAB's classify(net, I)); any other data as it is."""
    if not isinstance(data, torch.Tensor | np.ndarray) or data.ndim not in (2, 3):
        return data
    first = next((m for m in net.modules() if isinstance(m, nn.Conv1d | nn.Conv2d | nn.Conv3d | nn.Linear)), None)
    if not isinstance(first, nn.Conv2d) or (data.ndim == 2 and first.in_channels != 1):
        return data
    image = tensor_of(data)
    return image[None] if image.ndim == 3 else image[None, None]


def _run(net: nn.Module, data: Data, batch_size: int,
         each: Callable[[torch.Tensor, torch.Tensor | None], None]) -> None:
    device, was_training = _device_of(net), net.training
    data = _one_image_as_batch(net, data)
    net.eval()
    first = True  # a failure of the first batch is the network not fitting the data; a later one is the network's
    try:
        with torch.inference_mode():
            for inputs, labels in _batches(data, batch_size):
                try:
                    outputs = net(inputs.to(device))
                except Exception as error:
                    if first and not out_of_memory(error):
                        raise misfit_error(error, inputs, what="The first batch") from error
                    raise
                first = False
                each(main_output(outputs), labels)
    finally:
        net.train(was_training)


def predict(net: nn.Module, data: Data, batch_size: int = 256) -> torch.Tensor:
    """The network's raw outputs for every item, concatenated (on the CPU)."""
    outputs: list[torch.Tensor] = []
    _run(net, data, batch_size, lambda out, _: outputs.append(out.float().cpu()))
    return torch.cat(outputs) if outputs else torch.empty(0)


def class_names(data: Any) -> list[str]:
    """The class names a dataset carries (`classes`), or [] when it has none."""
    return list(getattr(data, "classes", None) or [])


def classify(net: nn.Module, data: Data, batch_size: int = 256) -> tuple[list[str] | torch.Tensor, torch.Tensor]:
    """(labels, scores): the predicted class of each item and the softmax scores (N x classes).

    labels are class names when `data` has `classes`, else a tensor of class indices.
    """
    scores = torch.softmax(predict(net, data, batch_size), dim=1)
    indices = scores.argmax(dim=1)
    names = class_names(data)
    if names:
        return [names[i] if i < len(names) else str(i) for i in indices.tolist()], scores
    return indices, scores


def accuracy(net: nn.Module, data: Data, batch_size: int = 256) -> float:
    """The fraction of items whose predicted class is their label, in [0, 1]."""
    correct, total = 0, 0

    def count(outputs: torch.Tensor, labels: torch.Tensor | None) -> None:
        nonlocal correct, total
        if labels is None or (labels < 0).any():
            raise NbscaleError("accuracy needs labelled data: a Dataset yielding (input, label) or an "
                               "(inputs, labels) pair of tensors.")
        correct += int((outputs.argmax(dim=1).cpu() == labels.cpu()).sum())
        total += len(labels)

    _run(net, data, batch_size, count)
    return correct / total if total else float("nan")


def activations(net: nn.Module, data: Data, layer: str = "layer4", batch_size: int = 256) -> torch.Tensor:
    """The output of the module named `layer` (as in `net.named_modules()`) for every item, concatenated."""
    modules = dict(net.named_modules())
    if not isinstance(layer, str) or layer not in modules:
        raise ModelError(f"activations: the network has no layer {layer!r}.{layers_near(net, str(layer))}. Name "
                         "a layer as net.named_modules() does ('layer4', 'layer4.0.conv1').")
    captured: list[torch.Tensor] = []

    def hook(_module: nn.Module, _inputs: Any, output: Any) -> None:
        output = output[0] if isinstance(output, tuple | list) else output
        captured.append(output.detach().float().cpu())

    handle = modules[layer].register_forward_hook(hook)
    try:
        _run(net, data, batch_size, lambda _out, _labels: None)
    finally:
        handle.remove()
    return torch.cat(captured) if captured else torch.empty(0)


class ConfusionChart:
    """A confusion matrix (rows: true class, columns: predicted); shows as a figure, or as text without matplotlib."""

    def __init__(self, matrix: torch.Tensor, classes: Sequence[str]) -> None:
        self.matrix, self.classes = matrix, list(classes)

    def __repr__(self) -> str:
        largest = int(self.matrix.max()) if self.matrix.numel() else 0
        width = max([len(c) for c in self.classes] + [len(str(largest)), 4])
        header = " " * (width + 2) + " ".join(c.rjust(width) for c in self.classes)
        rows = [f"{name.rjust(width)} |" + " ".join(str(int(v)).rjust(width) for v in row)
                for name, row in zip(self.classes, self.matrix.tolist(), strict=True)]
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
                axes.text(j, i, str(int(value)), ha="center", va="center",
                          color="white" if value > threshold else "black")
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
    return values


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
        both = [true_labels, pred_labels]
        if isinstance(true_labels, torch.Tensor) and isinstance(pred_labels, torch.Tensor):
            largest = max((int(labels.max()) for labels in (true_labels, pred_labels) if labels.numel()), default=-1)
            classes = [str(i) for i in range(largest + 1)]
        else:
            values = {v for labels in both for v in (labels.tolist() if isinstance(labels, torch.Tensor) else labels)}
            if len({isinstance(v, str) for v in values}) > 1:
                raise NbscaleError("confusion_chart: the labels mix class names and class indices; pass classes= (for "
                                   "example ds.classes) to say which name each index stands for, or use names for "
                                   "both.")
            classes = sorted(values) if all(isinstance(v, str) for v in values) else \
                [str(i) for i in range(max(int(v) for v in values) + 1)] if values else []
    names = [str(c) for c in classes]
    known = set(names)
    unknown = {v for labels in (true_labels, pred_labels) if not isinstance(labels, torch.Tensor)
               for v in labels if isinstance(v, str) and v not in known}
    if unknown:
        raise NbscaleError(f"confusion_chart: labels {sorted(unknown)} are not among classes {names}.")
    true_indices, pred_indices = _as_indices(true_labels, names), _as_indices(pred_labels, names)
    count = len(names)
    for indices in (true_indices, pred_indices):
        if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= count):
            raise NbscaleError(f"confusion_chart: label index {int(indices.max()) if int(indices.max()) >= count else int(indices.min())} "
                               f"is outside the {count} classes {names[:10]}: pass classes= with every class.")
    # one pass over the labels in C: the cell (t, p) is entry t * count + p
    matrix = torch.bincount(true_indices * count + pred_indices, minlength=count * count).reshape(count, count)
    return ConfusionChart(matrix, names)
