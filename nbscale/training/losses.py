"""The loss by name (`TrainingOptions(loss=...)`, `train(loss_fn=...)`), or the user's own function."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
from torch import nn

from nbscale.errors import OptionsError
from nbscale.suggestions import close_names
from nbscale.training.target_shapes import TargetsShaped


def binary_cross_entropy(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy on logits (one score per label); 0/1 targets of any dtype, shaped like the outputs."""
    return nn.functional.binary_cross_entropy_with_logits(outputs, targets.to(outputs.dtype).reshape(outputs.shape))


# module-level classes and functions: a loss travels to pool workers pickled
LOSSES: dict[str, Callable[[], Callable[[Any, Any], torch.Tensor]]] = {
    "crossentropy": nn.CrossEntropyLoss,
    "mse": nn.MSELoss,
    "l1": nn.L1Loss,
    "binary-crossentropy": lambda: binary_cross_entropy,
}
REGRESSION_LOSSES = ("mse", "l1")


def unknown_loss(name: str) -> str | None:
    """None for a known loss name, else the words of an error: the names, and the closest one."""
    if name in LOSSES:
        return None
    close = close_names(name.lower(), LOSSES, cutoff=0.5)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return "one of " + ", ".join(repr(n) for n in LOSSES) + f", or a function (outputs, targets) -> loss{hint}"


def resolve_loss(loss: Any) -> Callable[[Any, Any], torch.Tensor] | None:
    """The loss function of a name, a callable as it is, None as None (the caller's default: cross-entropy)."""
    if loss is None or callable(loss):
        return cast("Callable[[Any, Any], torch.Tensor] | None", loss)
    problem = unknown_loss(loss) if isinstance(loss, str) else "a loss name or a function (outputs, targets) -> loss"
    if problem is not None:
        raise OptionsError(f"loss={loss!r} is not a loss: loss must be {problem}.")
    return LOSSES[loss]()


def is_regression_loss(loss: object) -> bool:
    """True for "mse"/"l1", torch's MSELoss/L1Loss/SmoothL1Loss/HuberLoss and such a loss with its target-shape
    rule (the default metric becomes rmse)."""
    if isinstance(loss, str):
        return loss in REGRESSION_LOSSES
    return isinstance(loss, nn.MSELoss | nn.L1Loss | nn.SmoothL1Loss | nn.HuberLoss | TargetsShaped)
