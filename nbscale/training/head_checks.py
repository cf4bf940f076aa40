"""The network's head checked against the loss and the data before training, where a mismatch would otherwise
train silently wrong or fail deep inside torch.

- Class labels against the network's outputs, with a class loss (cross-entropy): MATLAB's trainNetwork refuses a
  network whose output count is not the class count; so does `train`, with an OptionsError that names both counts,
  the classes without images and the fix. The output count is read from an obvious last nn.Linear, else from one
  forward pass on the first sample; the label range is read without reading the inputs where the dataset allows
  (tensors, datastores, torchvision's `targets`).
- What the network would apply a second time: a last layer nn.Softmax or nn.LogSoftmax (MATLAB's softmaxLayer,
  ported as it is) under a loss that applies its own (cross-entropy), or nn.Sigmoid under binary cross-entropy on
  logits, is an OptionsError naming the layer and the fix. The last layer is the one whose output the network
  returns, found by running the network on the first sample (any architecture), else the last of a trailing
  nn.Sequential.
- A network that normalizes its inputs (models.pretrained(..., normalize=True), the default) given inputs that look
  normalized already (the first samples' per-channel means all within NORMALIZED_MEAN of 0, with negative values:
  images scaled to [0, 1] have none): one warning naming normalize=False.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, Subset, TensorDataset

from nbscale.errors import OptionsError
from nbscale.models.normalization import Normalize
from nbscale.training.checks import outputs_for_one
from nbscale.training.losses import binary_cross_entropy
from nbscale.user_warnings import warn_user

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


NORMALIZED_MEAN = 1.0  # per-channel means within this of 0 (with negative values) look normalized already
SAMPLES_READ = 8  # the first samples whose per-channel means are read

_SOFTMAX = (nn.Softmax, nn.LogSoftmax)


def check_last_layer(model: nn.Module, loss_fn: object, first_input: object) -> None:
    """OptionsError when the network's last layer applies what `loss_fn` applies itself (module docstring)."""
    if isinstance(loss_fn, nn.CrossEntropyLoss) or loss_fn is F.cross_entropy:
        kinds: tuple[type[nn.Module], ...] = _SOFTMAX
        loss, applies = "cross-entropy", "softmax"
    elif isinstance(loss_fn, nn.BCEWithLogitsLoss) or loss_fn in (
        F.binary_cross_entropy_with_logits,
        binary_cross_entropy,
    ):
        kinds, loss, applies = (nn.Sigmoid,), "binary cross-entropy on logits", "sigmoid"
    else:
        return
    layer = last_layer(model, kinds, first_input)
    if layer is None:
        return
    name = next(name for name, module in model.named_modules() if module is layer)
    raise OptionsError(
        f"The network's last layer{f' {name!r}' if name else ''} is nn.{layer!r}, but the loss ({loss}) applies "
        f"its own {applies}, so training would apply it twice: {_fix(layer)}"
    )


def _fix(layer: nn.Module) -> str:
    if isinstance(layer, nn.LogSoftmax):
        return "remove that layer, or keep it and pass loss_fn=nn.NLLLoss(), which takes log-probabilities."
    if isinstance(layer, nn.Sigmoid):
        return "remove that layer, or keep it and pass loss_fn=nn.BCELoss(), which takes probabilities."
    return "remove that layer (nbscale.classify returns probabilities anyway)."


def last_layer(model: nn.Module, kinds: tuple[type[nn.Module], ...], first_input: object) -> nn.Module | None:
    """The layer of `kinds` whose output the network returns, or None."""
    module: nn.Module = model
    while isinstance(module, nn.Sequential) and len(module):
        module = module[-1]
    if isinstance(module, kinds):
        return module
    if first_input is None:
        return None
    returned: list[tuple[nn.Module, object]] = []  # references held: an output's id is never reused meanwhile
    handles = [
        layer.register_forward_hook(lambda layer, args, output: returned.append((layer, output)))
        for layer in model.modules()
        if isinstance(layer, kinds)
    ]
    if not handles:
        return None
    try:
        outputs = outputs_for_one(model, first_input)
    except Exception:  # the loop's first step says why the network does not run
        return None
    finally:
        for handle in handles:
            handle.remove()
    return next((layer for layer, output in returned if output is outputs), None)


def warn_if_normalized_twice(model: nn.Module, dataset: Dataset[Any], first_item: Any) -> None:
    """One warning when a normalizing network is given inputs that look normalized already (module docstring)."""
    layer = next((module for module in model.modules() if isinstance(module, Normalize)), None)
    if layer is None or first_item is None:
        return
    inputs = _first_inputs(dataset, first_item, layer.mean.numel())
    if inputs is None or not bool((inputs < 0).any()):
        return
    means = inputs.transpose(0, 1).reshape(inputs.shape[1], -1).mean(dim=1)
    if bool((means.abs() <= NORMALIZED_MEAN).all()):
        shown = ", ".join(f"{float(mean):.2f}" for mean in means)
        warn_user(
            f"train_data already looks normalized (its first samples' per-channel means are {shown}, with negative "
            "values), and the network normalizes its inputs too (models.pretrained(..., normalize=True), the "
            "default), so they would be normalized twice: build the network with models.pretrained(..., "
            "normalize=False), or give images scaled to [0, 1] (drop your transforms.Normalize).",
            UserWarning,
        )


def _first_inputs(dataset: Dataset[Any], first_item: Any, channels: int) -> torch.Tensor | None:
    """The first samples' inputs as one float batch (samples x channels x ...), or None where they are not images
    with the normalization's channel count."""
    items = [first_item]
    with torch.random.fork_rng(devices=[]):  # reading augmented items draws numbers: the run's stream stays
        for index in range(1, min(SAMPLES_READ, len(dataset))):  # type: ignore[arg-type]  # as_dataset checked it
            items.append(dataset[index])
    try:
        inputs = torch.stack([torch.as_tensor(item[0]) for item in items]).float()
    except (TypeError, ValueError, RuntimeError, IndexError):
        return None
    return inputs if inputs.ndim >= 3 and inputs.shape[1] == channels else None
