"""Using a trained network (MATLAB's classify, predict, activations) on a dataset or tensor; confusion charts of
what it predicts are nbscale.confusion's.

`data` is a torch Dataset yielding (input, label) or input, a DataLoader, an (inputs, labels) pair (tensors, numpy
arrays, labels also a list), a tensor or numpy array of inputs, or one C x H x W image (H x W for one channel) for
a network whose first layer is a 2-D convolution. The network runs in eval mode without gradients on the device
its parameters are on, in batches, and is put back in the mode it was in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from nbscale.confusion import ConfusionChart, confusion_chart
from nbscale.data.batches import call_model, first_output, first_tensor, to_device
from nbscale.data.loading import tensor_of
from nbscale.errors import ModelError, NbscaleError
from nbscale.models.learn_rates import layers_near
from nbscale.training.batch_fitting import out_of_memory
from nbscale.training.checks import misfit_error

# confusion_chart and ConfusionChart are nbscale.confusion's, kept importable from here
__all__ = ["predict", "classify", "accuracy", "activations", "class_names", "confusion_chart", "ConfusionChart"]

Data = Dataset[Any] | torch.Tensor | tuple[torch.Tensor, torch.Tensor]


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
        raise NbscaleError(
            f"data as an (inputs, labels) pair needs one label per input: {len(inputs)} inputs but "
            f"labels of shape {tuple(labels.shape)}."
        )
    return inputs, labels


def _batches(data: Data, batch_size: int) -> Iterator[tuple[Any, Any]]:
    """(inputs, labels or None) in order, `batch_size` at a time."""
    if isinstance(data, np.ndarray):
        data = tensor_of(data)
    if isinstance(data, DataLoader):  # batches as the loader makes them
        for batch in data:
            yield _split_batch(batch)
        return
    if isinstance(data, torch.Tensor):
        for start in range(0, len(data), batch_size):
            yield data[start : start + batch_size], None
        return
    pair = _labelled_pair(data)
    if pair is not None:
        inputs, labels = pair
        for start in range(0, len(inputs), batch_size):
            yield inputs[start : start + batch_size], labels[start : start + batch_size]
        return
    if isinstance(data, tuple) or not (hasattr(data, "__getitem__") and hasattr(data, "__len__")):
        what = f"a tuple of {len(data)} items" if isinstance(data, tuple) else type(data).__name__
        raise NbscaleError(
            f"data must be a torch Dataset, a tensor, or an (inputs, labels) pair of tensors, not {what}."
        )
    for batch in DataLoader(data, batch_size=batch_size, shuffle=False):
        yield _split_batch(batch)


def _split_batch(batch: object) -> tuple[Any, Any]:
    """(inputs, labels or None) of a DataLoader's batch: a tensor, or a list of inputs and labels (inputs may be
    nested: a tuple/list or dict of tensors; labels a tensor, or a tuple/dict of them)."""
    if isinstance(batch, list | tuple) and len(batch) >= 2:
        labels = batch[1]
        if not isinstance(labels, torch.Tensor | tuple | list | dict):
            labels = torch.as_tensor(labels)
        return batch[0], labels
    return (batch[0] if isinstance(batch, list | tuple) else batch), None


def _one_image_as_batch(net: nn.Module, data: object) -> Any:
    """A single C x H x W image (tensor or array), or H x W for a network taking one channel, as a batch of one,
    for a network whose first layer is a 2-D convolution (MATLAB's classify(net, I)); any other data as it is."""
    if not isinstance(data, torch.Tensor | np.ndarray) or data.ndim not in (2, 3):
        return data
    first = next((m for m in net.modules() if isinstance(m, nn.Conv1d | nn.Conv2d | nn.Conv3d | nn.Linear)), None)
    if not isinstance(first, nn.Conv2d) or (data.ndim == 2 and first.in_channels != 1):
        return data
    image = tensor_of(data)
    return image[None] if image.ndim == 3 else image[None, None]


def _run(net: nn.Module, data: Data, batch_size: int, each: Callable[[torch.Tensor, Any], None], what: str) -> None:
    """Run `net` over `data` in batches, calling `each(outputs, labels or None)` for every batch; a first batch
    that fails (not for lack of memory) is reported as the network not fitting the data. `what` (the caller's
    name) names errors: a net that is no network, data that is text or has no items."""
    if not isinstance(net, nn.Module):
        raise ModelError(
            f"{what}: the network {_shown(net)} is a {type(net).__name__}, not a torch nn.Module: pass "
            f"the network first, then the data ({what}(net, data))."
        )
    if isinstance(data, str | bytes):
        raise NbscaleError(
            f"{what}: the data {_shown(data)} is text: give a torch Dataset, a tensor or an (inputs, "
            "labels) pair; for image files, ImageDatastore(folder) reads them."
        )
    device, was_training = _device_of(net), net.training
    data = _one_image_as_batch(net, data)
    net.eval()
    first = True  # a failure of the first batch is the network not fitting the data; a later one is the network's
    try:
        with torch.inference_mode():
            for inputs, labels in _batches(data, batch_size):
                try:
                    outputs = call_model(net, to_device(inputs, device))
                except Exception as error:
                    if first and not out_of_memory(error):
                        raise misfit_error(error, inputs, what="The first batch") from error
                    raise
                first = False
                each(_output_tensor(outputs), labels)
    finally:
        net.train(was_training)
    if first:
        raise NbscaleError(
            f"{what}: the data has no items (length 0), so there is nothing to {what}: check how it "
            "was made (an empty folder, a split or subset that kept nothing)."
        )


def _shown(value: Any) -> str:
    """`value`'s repr, cut to one short line for a message."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _output_tensor(outputs: object) -> torch.Tensor:
    """The output predictions use: the logits, or the first of several outputs (a tuple or list)."""
    first = first_output(outputs)
    if not isinstance(first, torch.Tensor):
        raise ModelError(
            f"The network returned a {type(first).__name__}, not a tensor of outputs: make its forward "
            "return a tensor (or a tuple whose first item is the tensor to predict from)."
        )
    return first


def predict(net: nn.Module, data: Data, batch_size: int = 256) -> torch.Tensor:
    """The network's raw outputs for every item, concatenated (on the CPU)."""
    outputs: list[torch.Tensor] = []
    _run(net, data, batch_size, lambda out, _: outputs.append(out.float().cpu()), "predict")
    return torch.cat(outputs)


def class_names(data: object) -> list[str]:
    """The class names a dataset carries (`classes`), or [] when it has none."""
    return list(getattr(data, "classes", None) or [])


def classify(net: nn.Module, data: Data, batch_size: int = 256) -> tuple[np.ndarray[Any, Any], torch.Tensor]:
    """(labels, scores): the predicted class of each item, as a numpy array, and the softmax scores (an N x classes
    tensor).

    labels are class names (a str array) when `data` has `classes`, else class indices (int64); as an array they
    compare elementwise with `==`: `(labels == val_ds.labels).mean()` is the accuracy.
    """
    outputs: list[torch.Tensor] = []
    _run(net, data, batch_size, lambda out, _: outputs.append(out.float().cpu()), "classify")
    scores = torch.softmax(torch.cat(outputs), dim=1)
    indices = scores.argmax(dim=1)
    names = class_names(data)
    if names:
        return np.array([names[i] if i < len(names) else str(i) for i in indices.tolist()], dtype=str), scores
    return indices.numpy(), scores


def accuracy(net: nn.Module, data: Data, batch_size: int = 256) -> float:
    """The fraction of items whose predicted class is their label, in [0, 1]."""
    correct, total = 0, 0

    def count(outputs: torch.Tensor, labels: object) -> None:
        nonlocal correct, total
        labels = first_tensor(labels)  # several targets: the first is the class label
        if labels is None or (labels < 0).any():
            raise NbscaleError(
                "accuracy needs labelled data: a Dataset yielding (input, label) or an "
                "(inputs, labels) pair of tensors."
            )
        correct += int((outputs.argmax(dim=1).cpu() == labels.cpu()).sum())
        total += len(labels)

    _run(net, data, batch_size, count, "accuracy")
    return correct / total


def activations(net: nn.Module, data: Data, layer: str = "layer4", batch_size: int = 256) -> torch.Tensor:
    """The output of the module named `layer` (as in `net.named_modules()`) for every item, concatenated."""
    modules = dict(net.named_modules())
    if not isinstance(layer, str) or layer not in modules:
        raise ModelError(
            f"activations: the network has no layer {layer!r}.{layers_near(net, str(layer))}. Name "
            "a layer as net.named_modules() does ('layer4', 'layer4.0.conv1')."
        )
    captured: list[torch.Tensor] = []

    def hook(_module: nn.Module, _inputs: Any, output: Any) -> None:
        output = output[0] if isinstance(output, tuple | list) else output
        captured.append(output.detach().float().cpu())

    handle = modules[layer].register_forward_hook(hook)
    try:
        _run(net, data, batch_size, lambda _out, _labels: None, "activations")
    finally:
        handle.remove()
    return torch.cat(captured)
