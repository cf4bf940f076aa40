"""A pretrained network's input normalization carried by the network itself, as MATLAB's pretrained networks carry
theirs (their image input layer normalizes): images in [0, 1] go in, the weights' mean/std are applied first.

The normalization is a child layer named `normalize` (mean and std as buffers, kept out of the state_dict so
weights files stay torchvision's and load both ways) run by a forward pre-hook before the network's own first
layer. The network's own layer names are unchanged: `transfer`, `freeze`, learn-rate patterns such as
"layer4.*" and torchvision state_dicts all work as before. It pickles with the network (pools, jobs).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from nbscale.errors import ModelError

if TYPE_CHECKING:
    from torchvision.models import WeightsEnum

LAYER_NAME = "normalize"


class Normalize(nn.Module):
    """(x - mean) / std over the channel dimension (dimension 1) of a batch of images."""

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        super().__init__()
        self.register_buffer("mean", torch.tensor(list(mean), dtype=torch.float32).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(list(std), dtype=torch.float32).view(1, -1, 1, 1), persistent=False)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return (images - self.mean.to(images.dtype)) / self.std.to(images.dtype)

    def extra_repr(self) -> str:
        return f"mean={self.mean.flatten().tolist()}, std={self.std.flatten().tolist()}"


def normalize_inputs(network: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """The forward pre-hook: the first input normalized by the network's `normalize` layer."""
    layer: Normalize = getattr(network, LAYER_NAME)
    return (layer(args[0]), *args[1:])


def with_normalization(network: nn.Module, mean: Sequence[float], std: Sequence[float]) -> nn.Module:
    """`network` (changed in place, and returned) normalizing its input images with `mean`/`std` first."""
    if len(mean) != len(std) or not len(mean):
        raise ModelError(
            f"pretrained: normalize=(mean, std) needs one mean and one std per channel, got {len(mean)} and {len(std)}."
        )
    if any(float(s) <= 0 for s in std):
        raise ModelError(f"pretrained: normalize's std must be positive, got {list(std)}.")
    if hasattr(network, LAYER_NAME):
        raise ModelError(f"pretrained: the network already has a layer named {LAYER_NAME!r}.")
    network.add_module(LAYER_NAME, Normalize(mean, std))
    network.register_forward_pre_hook(normalize_inputs)
    return network


def weights_normalization(name: str, weights: WeightsEnum) -> tuple[list[float], list[float]] | None:
    """The mean/std of torchvision `weights` of network `name` (its DEFAULT weights' where `weights` is None, as for
    a local weights file), or None where those weights' transforms have none (detection, video...)."""
    import torchvision

    if weights is None:
        weights = torchvision.models.get_model_weights(name).DEFAULT
    transform = weights.transforms()  # builds the preprocessing object only; downloads nothing
    mean, std = getattr(transform, "mean", None), getattr(transform, "std", None)
    return (list(mean), list(std)) if mean is not None and std is not None else None
