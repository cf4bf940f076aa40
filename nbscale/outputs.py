"""The class scores (or predictions) in what a network's forward returns."""

from __future__ import annotations

from typing import Any

import torch


def main_output(outputs: object) -> Any:
    """`outputs` itself, or its `.logits` where the network returns a structure holding them.

    torchvision's Inception v3 and GoogLeNet return (logits, aux_logits) named tuples in training mode, and
    Hugging Face models return a ModelOutput with `.logits`; the loss, accuracy and predictions use the logits
    (auxiliary classifiers are not trained).
    """
    if type(outputs) is torch.Tensor:  # the usual case, without getattr's failed lookup on every iteration
        return outputs
    logits = getattr(outputs, "logits", None)
    return logits if logits is not None else outputs


def first_of(outputs: object) -> Any:
    """The first of several outputs (a plain tuple or list, nested), else `outputs` itself."""
    while isinstance(outputs, tuple | list) and outputs:
        outputs = outputs[0]
    return outputs


def loss_and_first_output(loss_fn: Any, outputs: Any, targets: Any) -> tuple[Any, Any]:
    """(the loss, the output metrics and predictions use) of what a network's forward returned.

    Several outputs (a plain tuple or list): metrics use the first; torch's loss modules and nbscale's named
    losses take the first too, while a loss function of the user's own gets them all, as it was written for them.
    """
    outputs = main_output(outputs)
    first = first_of(outputs)
    takes_all = (
        first is not outputs
        and not isinstance(loss_fn, torch.nn.modules.loss._Loss)
        and getattr(loss_fn, "__module__", "") != "nbscale.training.losses"
    )
    return loss_fn(outputs if takes_all else first, targets), first
