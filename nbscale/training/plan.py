"""The run plan: a run's choices resolved once, before training (and before any pool worker starts), that the
loop reads on every rank. The seed of issue 41's plan; today it holds the PyTorch-semantics rules:

- the loss with its target-shape rule (nbscale.training.target_shapes), and the step of training and of
  validation (nbscale.training.steps: step_fn also validates);
- what ReduceLROnPlateau is stepped with (nbscale.training.plateau);
- refused before training: a last layer the loss applies again; warned: inputs normalized twice
  (nbscale.training.applied_twice).
A RunPlan is frozen and pickles (cloudpickle, for the user's functions) to pool workers with the model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from nbscale.training.applied_twice import check_last_layer, warn_if_normalized_twice
from nbscale.training.checks import outputs_for_one
from nbscale.training.metrics import objective
from nbscale.training.options import TrainingOptions
from nbscale.training.plateau import plateau_input
from nbscale.training.run_metrics import run_metrics
from nbscale.training.steps import Step, planned_step
from nbscale.training.target_shapes import TargetsShaped, is_element_wise, loss_name, matched_targets, shape_error


@dataclass(frozen=True)
class RunPlan:
    """What the loop reads instead of deciding: the step (train and validation) and the plateau's input."""

    step: Step
    plateau_input: str | None = None  # "loss" or a metric: what ReduceLROnPlateau is stepped with; None: no plateau

    @property
    def loss_fn(self) -> Callable[[Any, Any], torch.Tensor]:
        return self.step.loss_fn

    @property
    def step_fn(self) -> Callable[..., Any] | None:
        return self.step.step_fn

    def plateau_value(self, loss: float, metrics: dict[str, float | None]) -> float | None:
        """The value ReduceLROnPlateau is stepped with after a validation (None: not stepped)."""
        return loss if self.plateau_input == "loss" else metrics.get(self.plateau_input or "")


def plan_run(
    model: nn.Module,
    dataset: Dataset[Any],
    options: TrainingOptions,
    loss_fn: Callable[[Any, Any], torch.Tensor],
    step_fn: Callable[..., Any] | None,
    first_items: dict[str, Any],
) -> RunPlan:
    """The plan of a run whose inputs trainer.checked_inputs checked; `first_items` are the first item of
    "train_data" (and of "validation_data" when given). OptionsError for what cannot be trained as PyTorch would."""
    if step_fn is None:
        first_input = first_items["train_data"][0]
        check_last_layer(model, loss_fn, first_input)
        if is_element_wise(loss_fn):
            loss_fn = TargetsShaped(loss_fn, loss_name(loss_fn, options.loss))
            _check_target_shapes(model, loss_fn, first_items)
    warn_if_normalized_twice(model, dataset, first_items["train_data"])
    name, goal = objective(options.objective_metric, options.objective_goal, run_metrics(options, loss_fn, dataset))
    return RunPlan(planned_step(loss_fn, step_fn), plateau_input(model, options, name, goal))


def _check_target_shapes(model: nn.Module, loss_fn: TargetsShaped, first_items: dict[str, Any]) -> None:
    """The target-shape rule on the first sample of each data (outputs and targets as batches of one); a network
    that cannot run on it here is left to the loop's first step."""
    try:
        outputs = outputs_for_one(model, first_items["train_data"][0])
    except Exception:
        return
    if not isinstance(outputs, torch.Tensor):
        return
    for item in first_items.values():
        try:
            targets = torch.as_tensor(item[1])[None]
        except (TypeError, ValueError, RuntimeError):
            continue
        if matched_targets(outputs, targets) is None:
            raise shape_error(loss_fn.name, outputs, targets)
