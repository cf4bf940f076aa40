"""What the network would apply a second time, found before training.

- A network whose last layer is nn.Softmax or nn.LogSoftmax (MATLAB's softmaxLayer, ported as it is) under a loss
  that applies its own (cross-entropy), or nn.Sigmoid under binary cross-entropy on logits: an OptionsError naming
  the layer and the fix. The last layer is the one whose output the network returns, found by running the network
  on the first sample (any architecture), else the last of a trailing nn.Sequential.
- A network that normalizes its inputs (models.pretrained(..., normalize=True), the default) given inputs that look
  normalized already (the first samples' per-channel means all within NORMALIZED_MEAN of 0, with negative values:
  images scaled to [0, 1] have none): one warning naming normalize=False.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from nbscale.errors import OptionsError
from nbscale.models.normalization import Normalize
from nbscale.training.checks import outputs_for_one
from nbscale.training.losses import binary_cross_entropy
from nbscale.user_warnings import warn_user

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
