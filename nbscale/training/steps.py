"""The step of a run, in training and in validation: the network's output into the loss, or the user's step_fn.

`step_fn(model, inputs, targets) -> loss | (loss, outputs)` replaces the forward and the loss in both: training
calls it with the network nbscale trains (in DDP or compiled), validation with the plain network under eval() and
torch.no_grad(). A step_fn with a parameter named `training` gets training=True or training=False, so mixup or
dropout of its own can switch itself off in validation. The loss it returns is the training or validation loss,
and the outputs it returns feed the metrics (none without outputs).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from nbscale.data.batches import call_model, first_output
from nbscale.errors import OptionsError
from nbscale.outputs import loss_and_first_output


@dataclass(frozen=True)
class Step:
    """(net, inputs, labels) -> (loss, outputs or None) for training (`train`) and validation (`validate`)."""

    loss_fn: Callable[[Any, Any], torch.Tensor]  # the loss with its target-shape rule; unused under step_fn
    step_fn: Callable[..., Any] | None = None
    passes_training: bool = False  # step_fn has a parameter named `training`

    def train(self, net: nn.Module, inputs: object, labels: object) -> tuple[torch.Tensor, Any]:
        return self._run(net, inputs, labels, True)

    def validate(self, model: nn.Module, inputs: object, labels: object) -> tuple[torch.Tensor, Any]:
        """The validation step; the caller holds eval mode and no_grad."""
        return self._run(model, inputs, labels, False)

    def _run(self, net: nn.Module, inputs: object, labels: object, training: bool) -> tuple[torch.Tensor, Any]:
        if self.step_fn is None:
            return loss_and_first_output(self.loss_fn, call_model(net, inputs), labels)
        result = (
            self.step_fn(net, inputs, labels, training=training)
            if self.passes_training
            else self.step_fn(net, inputs, labels)
        )
        if isinstance(result, tuple) and len(result) == 2:
            outputs = first_output(result[1])
            if not isinstance(outputs, torch.Tensor):  # metrics would be computed on nothing, silently blank
                raise OptionsError(
                    f"step_fn returned (loss, {short_repr(result[1])}): the second element must be the model's "
                    "outputs (a tensor, or a tuple whose first element is one), which the metrics are computed on. "
                    "Return (loss, outputs), or the loss alone for no metrics."
                )
            return result[0], outputs
        return result, None


def short_repr(value: object) -> str:
    """`value`'s repr when short, else its type: for one-line errors."""
    text = repr(value)
    return text if len(text) <= 40 else f"a {type(value).__name__}"


def planned_step(loss_fn: Callable[[Any, Any], torch.Tensor], step_fn: Callable[..., Any] | None) -> Step:
    """The run's Step: `step_fn` where given (told `training` when it takes it), else the network and `loss_fn`."""
    return Step(loss_fn, step_fn, step_fn is not None and _takes_training(step_fn))


def _takes_training(step_fn: Callable[..., Any]) -> bool:
    try:
        parameter = inspect.signature(step_fn).parameters.get("training")
    except (TypeError, ValueError):  # a builtin or C function without a signature
        return False
    return parameter is not None and parameter.kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.KEYWORD_ONLY,
    )
