"""A run's inputs once checked (nbscale.training.trainer.checked_inputs): its data, its options and its step."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nbscale.training.options import TrainingOptions


@dataclass(frozen=True)
class Step:
    """How an iteration gets its loss: `loss_fn(outputs, targets)` on the model's output, or, with `step_fn`, the
    user's `step_fn(model, inputs, targets) -> loss | (loss, outputs)` (`loss_fn` then chooses the metrics)."""

    loss_fn: Callable[..., Any]
    step_fn: Callable[..., Any] | None = None


@dataclass(frozen=True)
class CheckedInputs:
    """What `checked_inputs` returns: the training data as a Dataset, the options as the run takes them (a loss
    named by `loss_fn`, a DataLoader's batch size, the validation data as a Dataset), and the step."""

    data: Any  # a torch Dataset: handed through to the loop unread here
    options: TrainingOptions
    step: Step
