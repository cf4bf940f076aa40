"""What a ReduceLROnPlateau scheduler is stepped with: objective_metric's validation value when one is set, else
the validation loss; its `mode` must agree with that value's direction (objective_goal), checked before training.

A scheduler steps after each validation (on a pool every rank steps with the same, summed, value); a validation
where the metric has no value does not step it.
"""

from __future__ import annotations

import torch
from torch import nn

from nbscale.errors import OptionsError
from nbscale.training.optimizer import make_optimizer
from nbscale.training.options import TrainingOptions
from nbscale.training.schedules import CustomSchedule, make_schedule


def plateau_input(model: nn.Module, options: TrainingOptions, objective: str, goal: str) -> str | None:
    """The name of what the run's ReduceLROnPlateau is stepped with ("loss" or the objective metric), None for any
    other schedule. OptionsError when its mode contradicts `goal` or no validation data will step it."""
    if isinstance(options.learn_rate_schedule, str):
        return None
    schedule = make_schedule(options, make_optimizer(model, options), 1)  # on a trial optimizer, thrown away
    if not isinstance(schedule, CustomSchedule) or not isinstance(
        schedule.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau
    ):
        return None
    mode, wanted = schedule.scheduler.mode, "min" if goal == "minimize" else "max"
    stepped = "the validation loss" if objective == "loss" else f"objective_metric={objective!r}"
    if mode != wanted:
        raise OptionsError(
            f"learn_rate_schedule returned ReduceLROnPlateau(mode={mode!r}), which nbscale steps with {stepped}, "
            f"better {'low' if goal == 'minimize' else 'high'}: make it ReduceLROnPlateau(optimizer, "
            f"mode={wanted!r}, ...), or set objective_metric to the metric it should follow."
        )
    if options.validation_data is None:
        raise OptionsError(
            "learn_rate_schedule returned ReduceLROnPlateau, which nbscale steps after each validation, but there "
            "is no validation_data: give validation_data, or choose a schedule that steps by iteration or epoch."
        )
    return objective
