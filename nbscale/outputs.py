"""The class scores (or predictions) in what a network's forward returns."""

from __future__ import annotations

from typing import Any

import torch


def main_output(outputs: Any) -> Any:
    """`outputs` itself, or its `.logits` where the network returns a structure holding them.

    torchvision's Inception v3 and GoogLeNet return (logits, aux_logits) named tuples in training mode, and
    Hugging Face models return a ModelOutput with `.logits`; the loss, accuracy and predictions use the logits
    (auxiliary classifiers are not trained).
    """
    if type(outputs) is torch.Tensor:  # the usual case, without getattr's failed lookup on every iteration
        return outputs
    if isinstance(outputs, tuple | list) and outputs and not hasattr(outputs, "_fields"):
        return main_output(outputs[0])  # several outputs (a plain tuple or list): the first is the main one
    logits = getattr(outputs, "logits", None)
    return logits if logits is not None else outputs
