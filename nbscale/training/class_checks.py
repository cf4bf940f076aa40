"""Class labels against the network's outputs, checked before training with a class loss (cross-entropy).

MATLAB's trainNetwork refuses a network whose output count is not the class count; so does `train`, with an
OptionsError that names both counts, the classes without images and the fix. The output count is read from an
obvious last nn.Linear, else from one forward pass on the first sample; the label range is read without reading
the inputs where the dataset allows (tensors, datastores, torchvision's `targets`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, Subset, TensorDataset

from nbscale.errors import OptionsError
from nbscale.training.checks import outputs_for_one

# layers that keep the number of scores: skipped when looking for a network's last layer
_SIZE_KEEPING = (
    nn.Identity,
    nn.Dropout,
    nn.Dropout1d,
    nn.Dropout2d,
    nn.Dropout3d,
    nn.AlphaDropout,
    nn.Softmax,
    nn.LogSoftmax,
    nn.ReLU,
    nn.LeakyReLU,
    nn.ELU,
    nn.GELU,
    nn.SiLU,
    nn.Sigmoid,
    nn.Tanh,
    nn.Hardtanh,
)


def is_class_loss(loss_fn: object) -> bool:
    """True for the losses that take class indices (the default cross-entropy, CrossEntropyLoss, NLLLoss)."""
    return loss_fn is None or isinstance(loss_fn, nn.CrossEntropyLoss | nn.NLLLoss)


def network_outputs(model: nn.Module, sample: object) -> tuple[int, str] | None:
    """(the number of class scores `model` gives, how that was found), or None when it cannot be told.

    Where the network ends in an obvious last layer (an nn.Sequential, nested or not, whose last layer, after
    activations, dropout and softmax, is an nn.Linear) that layer's out_features is read. Otherwise the network
    runs once on `sample` (one input, without the batch dimension) in eval mode without gradients, on the
    device of its parameters, and the size of its output along dimension 1 is the count; the modes of its
    layers and the caller's random number stream are left as they were. A forward pass that fails gives None:
    training then reports the error with its own context.
    """
    last = _last_layer(model)
    if isinstance(last, nn.Linear):
        return (
            last.out_features,
            f"its last layer is Linear(in_features={last.in_features}, out_features={last.out_features})",
        )
    try:
        outputs = outputs_for_one(model, sample)
    except Exception:  # the training loop reports a network that cannot run on the data, with its context
        return None
    if not isinstance(outputs, torch.Tensor) or outputs.ndim < 2:
        return None
    return int(outputs.shape[1]), f"its output for one sample has shape {tuple(outputs.shape)}"


def _last_layer(model: nn.Module) -> nn.Module | None:
    module: nn.Module = model
    while isinstance(module, nn.Sequential):
        layers = [layer for layer in module if not isinstance(layer, _SIZE_KEEPING)]
        if not layers:
            return None
        module = layers[-1]
    return module


def label_range(dataset: Dataset[Any], first_item: Any, ignore_index: int = -100) -> tuple[int, int] | None:
    """(smallest, largest) label index of `dataset`, read without reading its inputs, or None when unknown.

    Known for a TensorDataset of (inputs, labels), a datastore (`classes` and `labels` by name), a torchvision
    dataset (`targets`) and a torch Subset of one of them; other datasets give their first item's label.
    Labels equal to `ignore_index` (cross-entropy skips them) are left out.
    """
    indices = _label_indices(dataset)
    if indices is None:
        try:
            indices = torch.as_tensor(first_item[1])[None] if first_item is not None else None
        except (TypeError, ValueError, RuntimeError):
            return None
    if indices is None or indices.ndim != 1 or indices.is_floating_point() or indices.is_complex():
        return None
    indices = indices[indices != ignore_index]
    if indices.numel() == 0:
        return None
    return int(indices.min()), int(indices.max())


def _label_indices(dataset: Any) -> torch.Tensor | None:
    if isinstance(dataset, TensorDataset):
        return dataset.tensors[1] if len(dataset.tensors) == 2 else None
    if isinstance(dataset, Subset):
        inner = _label_indices(dataset.dataset)
        return inner[torch.as_tensor(list(dataset.indices), dtype=torch.long)] if inner is not None else None
    names, classes = getattr(dataset, "labels", None), getattr(dataset, "classes", None)
    if isinstance(names, list) and classes:
        position = {name: i for i, name in enumerate(classes)}
        return torch.tensor([position.get(name, -1) for name in names], dtype=torch.long)
    targets = getattr(dataset, "targets", None)
    if isinstance(targets, torch.Tensor | list) and len(targets) == len(dataset):
        try:
            return torch.as_tensor(targets)
        except (TypeError, ValueError, RuntimeError):
            return None
    return None


def check_classes(
    model: nn.Module, first_item: Any, data: list[tuple[str, Dataset[Any], Any]], ignore_index: int = -100
) -> None:
    """The labels of every dataset in `data` ((name, dataset, first item) triples) must be class indices the
    network has outputs for, and datasets that name their classes must name the same ones (MATLAB checks the
    class count against the output size too). OptionsError naming both counts and the fix. Labels equal to the
    loss's `ignore_index` are allowed."""
    found = network_outputs(model, first_item[0])
    named = [(what, list(getattr(dataset, "classes", None) or [])) for what, dataset, _ in data]
    named = [(what, classes) for what, classes in named if classes]
    if len(named) > 1 and any(classes != named[0][1] for _, classes in named[1:]):
        (first, first_classes), (other, other_classes) = (
            named[0],
            next((w, c) for w, c in named[1:] if c != named[0][1]),
        )
        raise OptionsError(
            f"{first} and {other} have different classes ({_names(first_classes)} and "
            f"{_names(other_classes)}), so the same label index means different classes: give both "
            "the same classes (split them from one datastore; drop unused classes from both or from "
            "neither)."
        )
    for what, dataset, item in data:
        labels = label_range(dataset, item, ignore_index)
        if labels is not None and labels[0] < 0:
            raise OptionsError(
                f"{what} has label {labels[0]}, but cross-entropy takes class indices 0, 1, ...: "
                "give labelled data (an ImageDatastore with label_source='foldernames'), or pass "
                "loss_fn= for other targets."
            )
        if found is None:
            continue
        outputs, how = found
        classes = list(getattr(dataset, "classes", None) or [])
        too_large = labels is not None and labels[1] >= outputs
        if not too_large and (not classes or len(classes) == outputs):
            continue
        raise OptionsError(_class_mismatch(what, dataset, classes, labels, outputs, how))


def _class_mismatch(
    what: str, dataset: object, classes: list[str], labels: tuple[int, int] | None, outputs: int, how: str
) -> str:
    largest = f"label indices up to {labels[1]}" if labels is not None else "its labels"
    needed = len(classes) if classes else (labels[1] + 1 if labels is not None else outputs)
    if classes:
        counts = dataset.count_each_label() if hasattr(dataset, "count_each_label") else {}
        unused = [name for name, count in counts.items() if count == 0]
        described = f"{what} has {len(classes)} classes ({_names(classes)}; {largest})"
        if unused:
            described += f", {len(unused)} of them without images ({_names(unused)})"
    else:
        unused, described = [], f"{what} has {largest}, so at least {needed} classes"
    fixes = [f"build the network with {needed} outputs (a pretrained one: nbscale.models.transfer(model, {needed}))"]
    if unused:
        fixes.insert(
            0,
            "drop the classes without images with ds.remove_unused_classes() or "
            "ds.subset(..., drop_unused_classes=True), in the validation data too",
        )
    return (
        f"{described}, but the network has {outputs} outputs ({how}). MATLAB's trainNetwork requires the same: "
        f"{'; or '.join(fixes)}."
    )


def _names(classes: list[str]) -> str:
    shown = ", ".join(map(str, classes[:10]))
    return f"[{shown}{', ...' if len(classes) > 10 else ''}]"
