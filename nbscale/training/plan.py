"""The run plan: every choice of a run resolved and checked once, before training (and before any pool worker
starts), that the loop, the pool path and the display read instead of the options (issue 41). It holds:

- the loss with its target-shape rule (nbscale.training.losses), and the step of training and of
  validation (nbscale.training.steps: step_fn also validates);
- the metrics and the objective with its direction (nbscale.training.run_metrics);
- the optimizer factory with its parameter groups (nbscale.training.solver.SolverRule);
- the schedule and what it is stepped with (nbscale.training.solver.ScheduleRule);
- the batching, placement, precision, compile, validation and checkpoint rules, and the listeners
  (nbscale.training.plan_rules);
- refused before training: a last layer the loss applies again; warned: inputs normalized twice
  (nbscale.training.head_checks).
A RunPlan is frozen and pickles (cloudpickle, for the user's functions) to pool workers with the model; the
live listeners (loggers, output_fn) stay in the notebook (plan_rules.Listeners).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from nbscale.training.checks import outputs_for_one
from nbscale.training.head_checks import check_last_layer, warn_if_normalized_twice
from nbscale.training.losses import TargetsShaped, is_element_wise, loss_name, matched_targets, shape_error
from nbscale.training.options import TrainingOptions
from nbscale.training.plan_rules import (
    Batching,
    CheckpointRule,
    Listeners,
    Placement,
    ValidationRule,
    batching,
    checkpoint_rule,
    listeners,
    placement,
    recorded,
    validation_rule,
)
from nbscale.training.run_metrics import MetricSet, Objective, check_on_first_sample, objective, run_metrics
from nbscale.training.solver import ScheduleRule, SolverRule, schedule_rule, solver_rule, with_plateau_input
from nbscale.training.steps import Step, planned_step


@dataclass(frozen=True)
class RunPlan:
    """What the loop reads instead of deciding: each choice of the run, resolved."""

    step: Step
    metrics: MetricSet  # the loop works on a copy of it (the class count is learnt from the first batch)
    objective: Objective
    solver: SolverRule
    schedule: ScheduleRule
    batching: Batching
    placement: Placement = Placement()
    validation: ValidationRule = ValidationRule()
    checkpoint: CheckpointRule = CheckpointRule()
    listeners: Listeners = Listeners()
    validation_data: Any = None  # a Dataset, or None: no validation
    metrics_named: bool = False  # the user named the metrics (their figures are kept even without validation)
    recorded: dict[str, Any] = dataclasses.field(default_factory=dict)  # the options as a checkpoint keeps them

    @property
    def loss_fn(self) -> Callable[[Any, Any], torch.Tensor]:
        return self.step.loss_fn

    @property
    def step_fn(self) -> Callable[..., Any] | None:
        return self.step.step_fn

    def settled(self, mini_batch_size: int | str, learn_rate: float) -> RunPlan:
        """This plan with mini_batch_size="auto" and learn_rate_scaling settled (nbscale.training.batch_fitting)."""
        return dataclasses.replace(
            self,
            batching=dataclasses.replace(self.batching, mini_batch_size=mini_batch_size, learn_rate_scaling="none"),
            solver=self.solver.with_learn_rate(learn_rate),
            recorded={
                **self.recorded,
                "mini_batch_size": mini_batch_size,
                "initial_learn_rate": learn_rate,
                "learn_rate_scaling": "none",
            },
        )


def without_listeners(plan: RunPlan) -> RunPlan:
    """The plan a worker trains by: the notebook keeps output_fn, the figure, the table and the loggers."""
    return dataclasses.replace(plan, listeners=Listeners(logger_names=plan.listeners.logger_names))


def plan_run(
    model: nn.Module,
    dataset: Dataset[Any],
    validation: Dataset[Any] | None,
    options: TrainingOptions,
    loss_fn: Callable[[Any, Any], torch.Tensor],
    step_fn: Callable[..., Any] | None,
    first_items: dict[str, Any],
    one_worker: bool = False,
) -> RunPlan:
    """The plan of a run whose inputs trainer.checked_inputs checked: `validation` is options.validation_data as
    a Dataset (or None); `first_items` are the first item of "train_data" (and of "validation_data" when given).
    `one_worker`: a train_async or sweep run, trained whole on one pool worker (worker_load and
    on_worker_failure do not apply). OptionsError for what cannot be trained as PyTorch would, or as the options
    ask."""
    # the metrics and the objective with its direction
    metrics = run_metrics(options.metrics, options.loss, loss_fn, dataset)
    if options.metrics is not None:  # the metrics named: a clear error here, not on a worker
        check_on_first_sample(metrics, loss_fn, model, first_items["train_data"])
    goal = Objective(*objective(options.objective_metric, options.objective_goal, metrics))
    # the loss with its target-shape rule, and the step of training and validation
    step = _planned_step(model, dataset, options.loss, loss_fn, step_fn, first_items)
    # the optimizer factory with its parameter groups, and the schedule with what it is stepped with
    solver = solver_rule(model, options)
    schedule = with_plateau_input(model, solver, schedule_rule(options), goal.name, goal.goal, validation is not None)
    # the plain rules: batching, placement, validation, checkpoints, listeners
    checkpoints = checkpoint_rule(options, one_worker)
    return RunPlan(
        step=step,
        metrics=metrics,
        objective=goal,
        solver=solver,
        schedule=schedule,
        batching=batching(options, one_worker),
        placement=placement(options),
        validation=validation_rule(options),
        checkpoint=checkpoints,
        listeners=listeners(options),
        validation_data=validation,
        metrics_named=options.metrics is not None,
        recorded={**recorded(options), "checkpoint_path": checkpoints.path},
    )


def _planned_step(
    model: nn.Module,
    dataset: Dataset[Any],
    loss_option: object,
    loss_fn: Callable[[Any, Any], torch.Tensor],
    step_fn: Callable[..., Any] | None,
    first_items: dict[str, Any],
) -> Step:
    """The step, its loss checked on the first items: a last layer the loss applies again is refused, an
    element-wise loss gets the target-shape rule; inputs normalized twice are warned of."""
    if step_fn is None:
        check_last_layer(model, loss_fn, first_items["train_data"][0])
        if is_element_wise(loss_fn):
            loss_fn = TargetsShaped(loss_fn, loss_name(loss_fn, loss_option))
            _check_target_shapes(model, loss_fn, first_items)
    warn_if_normalized_twice(model, dataset, first_items["train_data"])
    return planned_step(loss_fn, step_fn)


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
