"""What the user's loss means: a loss by name (`TrainingOptions(loss=...)`, `train(loss_fn=...)`) or the user's own
function, and the target-shape rule of torch's regression losses (mse, l1, smooth L1, Huber).

torch's element-wise losses broadcast outputs and targets of different shapes: the usual head nn.Linear(h, 1)
gives outputs N x 1, and targets of shape (N,) make an N x N loss that trains nothing, with only a UserWarning.
nbscale computes the per-sample loss instead where the match is unambiguous: the same batch size and the same
per-sample shape once dimensions of size 1 are left out (N x 1 against N, N x 3 against N x 1 x 3); the targets
are then viewed in the outputs' shape, as the rmse metric squeezes them. Any other difference is an OptionsError
naming the loss and both shapes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from nbscale.errors import OptionsError
from nbscale.outputs import first_of
from nbscale.suggestions import close_names

REGRESSION_MODULES = (nn.MSELoss, nn.L1Loss, nn.SmoothL1Loss, nn.HuberLoss)
REGRESSION_FUNCTIONS = (F.mse_loss, F.l1_loss, F.smooth_l1_loss, F.huber_loss)


def is_element_wise(loss_fn: object) -> bool:
    """True for torch's regression losses (modules or functions), whose outputs and targets are paired element by
    element; a loss of the user's own is taken as it is."""
    return isinstance(loss_fn, REGRESSION_MODULES) or any(loss_fn is f for f in REGRESSION_FUNCTIONS)


def matched_targets(outputs: object, targets: object) -> Any:
    """`targets` in the shape of `outputs` where the match is unambiguous (see the module docstring), `targets` as
    they are where the shapes are equal (or either is not a tensor), else None."""
    if not isinstance(outputs, torch.Tensor) or not isinstance(targets, torch.Tensor):
        return targets
    if outputs.shape == targets.shape:
        return targets
    if (
        outputs.ndim
        and targets.ndim
        and outputs.shape[0] == targets.shape[0]
        and _squeezed(outputs) == _squeezed(targets)
    ):
        return targets.reshape(outputs.shape)
    return None


def _squeezed(batch: torch.Tensor) -> tuple[int, ...]:
    return tuple(size for size in batch.shape[1:] if size != 1)


def shape_error(name: str, outputs: torch.Tensor, targets: torch.Tensor) -> OptionsError:
    """The refusal of outputs and targets that no unambiguous view matches (shapes shown with N for the batch)."""
    return OptionsError(
        f"{name} compares outputs and targets element by element, but the network's outputs are {_shown(outputs)} "
        f"and the targets {_shown(targets)}, which torch would broadcast rather than pair: give targets of shape "
        f"{_shown(outputs)}, or change the network so that its outputs are {_shown(targets)}."
    )


def _shown(batch: torch.Tensor) -> str:
    sizes = ["N", *map(str, batch.shape[1:])] if batch.ndim else []
    return "(" + ", ".join(sizes) + ("," if len(sizes) == 1 else "") + ")"


class TargetsShaped:
    """A regression loss with the target-shape rule: targets viewed as the outputs where that is unambiguous,
    an OptionsError where not. Module-level and holding only the loss: it pickles to pool workers."""

    def __init__(self, loss_fn: Callable[[Any, Any], torch.Tensor], name: str) -> None:
        self.loss_fn, self.name = loss_fn, name

    def __call__(self, outputs: Any, targets: Any) -> torch.Tensor:
        outputs = first_of(outputs)  # torch's losses take the first of several outputs
        matched = matched_targets(outputs, targets)
        if matched is None:
            raise shape_error(self.name, outputs, targets)
        return self.loss_fn(outputs, matched)

    def __repr__(self) -> str:
        return f"TargetsShaped({self.name})"


def loss_name(loss_fn: object, option: object) -> str:
    """The loss as an error names it: the option's name (loss='mse'), else the module or function."""
    if isinstance(option, str):
        return f"loss={option!r}"
    if isinstance(loss_fn, nn.Module):
        return f"loss_fn=nn.{type(loss_fn).__name__}()"
    return f"loss_fn=F.{getattr(loss_fn, '__name__', type(loss_fn).__name__)}"


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
