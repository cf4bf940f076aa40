"""A run's inputs once checked (nbscale.training.trainer.checked_inputs): its data, its options and its plan."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nbscale.training.options import TrainingOptions

if TYPE_CHECKING:
    from nbscale.training.plan import RunPlan


@dataclass(frozen=True)
class CheckedInputs:
    """What `checked_inputs` returns: the training data as a Dataset, the options as the run takes them (a loss
    named by `loss_fn`, a DataLoader's batch size, the validation data as a Dataset), and the run plan (the step
    with its loss, what the schedule is stepped with)."""

    data: Any  # a torch Dataset: handed through to the loop unread here
    options: TrainingOptions
    plan: RunPlan
