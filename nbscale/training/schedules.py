"""Learn-rate schedules: the learn rate as a pure function of the (0-based) iteration.

A pure function keeps resume exact: a run resumed at iteration k sees the same rates as one never stopped.
- "none": the initial rate throughout.
- "piecewise": multiplied by learn_rate_drop_factor every learn_rate_drop_period epochs (MATLAB's rule).
- "cosine": half a cosine from the initial rate down to 0 over all iterations.
- "warmup-cosine": a linear ramp over the first epoch (at most half the run), then the cosine.
Or the user's own torch scheduler (`learn_rate_schedule=lambda optimizer: ...`), whose state checkpoints keep.
A ReduceLROnPlateau is stepped after each validation with objective_metric's value when one is set, else with the
validation loss; its `mode` must agree with that value's direction (objective_goal), checked before training (on a
pool every rank steps with the same, summed, value; a validation where the metric has no value does not step it).
The plan holds a ScheduleRule; the loop sees either schedule through the same calls (`ScheduleRule.make`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from nbscale.errors import OptionsError
from nbscale.training.optimizer import SolverRule
from nbscale.training.options import TrainingOptions


@dataclass(frozen=True)
class ScheduleRule:
    """The run's schedule as the plan holds it: a named rule or the user's factory, and what it is stepped with
    (`plateau_input`: "loss" or the objective metric for ReduceLROnPlateau: with_plateau_input)."""

    kind: str | Callable[[torch.optim.Optimizer], Any]  # a name, or learn_rate_schedule=lambda optimizer: ...
    max_epochs: int
    drop_period: int = 10
    drop_factor: float = 0.1
    step: str = "iteration"  # learn_rate_schedule_step: when a user's scheduler steps
    plateau_input: str | None = None

    def rate(self, base: float, iterations_per_epoch: int) -> Callable[[int], float]:
        """`rate(iteration)` of a named schedule from `base`; `iteration` counts from 0 over the whole run."""
        total = iterations_per_epoch * self.max_epochs
        if self.kind == "none":
            return lambda iteration: base
        if self.kind == "piecewise":
            period, factor = self.drop_period, self.drop_factor
            return lambda iteration: base * factor ** ((iteration // iterations_per_epoch) // period)
        warmup = min(iterations_per_epoch, total // 2) if self.kind == "warmup-cosine" else 0

        def rate(iteration: int) -> float:
            if iteration < warmup:
                return base * (iteration + 1) / warmup
            progress = (iteration - warmup) / max(1, total - warmup)
            return base * 0.5 * (1.0 + math.cos(math.pi * progress))

        return rate

    def make(self, optimizer: torch.optim.Optimizer, iterations_per_epoch: int, base: float, custom: bool) -> Schedule:
        """The schedule over `optimizer` (a SolverRule's, at learn rate `base`; `custom`: a solver factory's)."""
        factory = self.kind
        if isinstance(factory, str):
            scale = 1.0 if not custom else base_rate(optimizer) / base
            return NamedSchedule(self.rate(base, iterations_per_epoch), optimizer, scale)
        how = (
            "learn_rate_schedule must be a function of the optimizer alone returning a torch scheduler, e.g. "
            "learn_rate_schedule=lambda optimizer: torch.optim.lr_scheduler.StepLR(optimizer, step_size=5)"
        )
        try:
            scheduler = factory(optimizer)
        except TypeError as error:  # a scheduler class given itself, or a factory taking other arguments
            raise OptionsError(
                f"learn_rate_schedule={_name(factory)} failed on the optimizer ({error}): {how}."
            ) from None
        if not isinstance(scheduler, torch.optim.lr_scheduler.LRScheduler | torch.optim.lr_scheduler.ReduceLROnPlateau):
            raise OptionsError(
                f"learn_rate_schedule={_name(factory)} returned {type(scheduler).__name__}, not a torch "
                f"scheduler: {how}."
            )
        if scheduler.optimizer is not optimizer:
            raise OptionsError(
                f"learn_rate_schedule={_name(factory)} returned a scheduler of another optimizer: {how}."
            )
        return CustomSchedule(scheduler, self.step)

    def plateau_value(self, loss: float, metrics: dict[str, float | None]) -> float | None:
        """The value ReduceLROnPlateau is stepped with after a validation (None: not stepped)."""
        return loss if self.plateau_input == "loss" else metrics.get(self.plateau_input or "")


def schedule_rule(options: TrainingOptions) -> ScheduleRule:
    """The ScheduleRule of `options` (what a ReduceLROnPlateau is stepped with is set by with_plateau_input)."""
    return ScheduleRule(
        options.learn_rate_schedule,
        int(options.max_epochs),
        int(options.learn_rate_drop_period),
        float(options.learn_rate_drop_factor),
        options.learn_rate_schedule_step,
    )


def learn_rate_schedule(options: TrainingOptions, iterations_per_epoch: int) -> Callable[[int], float]:
    """`rate(iteration)` for these options (a named schedule); `iteration` counts from 0 over the whole run."""
    return schedule_rule(options).rate(float(options.initial_learn_rate), iterations_per_epoch)


class NamedSchedule:
    """A named schedule (ScheduleRule.rate) setting the optimizer's groups each iteration it changes, each
    group at the rate times its lr_factor; `scale` maps initial_learn_rate to a custom solver's own rate."""

    def __init__(self, rate: Callable[[int], float], optimizer: torch.optim.Optimizer, scale: float = 1.0) -> None:
        self.rate, self.optimizer, self.scale, self.current = rate, optimizer, scale, math.nan

    def before_iteration(self, iteration: int) -> float:
        """The base learn rate of `iteration` (1-based), set on the optimizer's groups."""
        rate = self.rate(iteration - 1) * self.scale
        if rate != self.current:
            self.current = rate
            for group in self.optimizer.param_groups:
                group["lr"] = rate * group.get("lr_factor", 1.0)
        return rate

    def after_iteration(self) -> None:
        pass

    def after_epoch(self) -> None:
        pass

    def after_validation(self, value: float | None) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {}  # a pure function of the iteration: nothing to keep

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class CustomSchedule:
    """The user's torch scheduler (`learn_rate_schedule=lambda optimizer: ...`), stepped after each iteration or
    epoch (learn_rate_schedule_step), or, for ReduceLROnPlateau, after each validation with the objective metric's
    value or the validation loss (with_plateau_input)."""

    def __init__(self, scheduler: Any, step: str) -> None:
        self.scheduler = scheduler
        self.optimizer = scheduler.optimizer
        plateau = isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
        self.each = "validation" if plateau else step

    def before_iteration(self, iteration: int) -> float:
        group = self.optimizer.param_groups[0]
        return float(group["lr"]) / float(group.get("lr_factor", 1.0))

    def after_iteration(self) -> None:
        if self.each == "iteration":
            self.scheduler.step()

    def after_epoch(self) -> None:
        if self.each == "epoch":
            self.scheduler.step()

    def after_validation(self, value: float | None) -> None:
        """ReduceLROnPlateau's step with `value` (the run plan's: with_plateau_input); None: no step."""
        if self.each == "validation" and value is not None:
            self.scheduler.step(value)

    def state_dict(self) -> dict[str, Any]:
        return dict(self.scheduler.state_dict())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            self.scheduler.load_state_dict(state)


Schedule = NamedSchedule | CustomSchedule


def with_plateau_input(
    model: nn.Module, solver: SolverRule, schedule: ScheduleRule, objective: str, goal: str, validates: bool
) -> ScheduleRule:
    """`schedule` with what its ReduceLROnPlateau is stepped with ("loss" or the objective metric); `schedule`
    itself for any other. The user's factory is tried here once, on a trial optimizer thrown away, so a bad
    factory fails before training. OptionsError when its mode contradicts `goal` or no validation data
    (`validates` False) will step it."""
    if isinstance(schedule.kind, str) and not solver.custom:
        return schedule
    trial = schedule.make(solver.make(model), 1, solver.learn_rate, solver.custom)  # its state is made lazily
    if not isinstance(trial, CustomSchedule) or not isinstance(
        trial.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau
    ):
        return schedule
    mode, wanted = trial.scheduler.mode, "min" if goal == "minimize" else "max"
    stepped = "the validation loss" if objective == "loss" else f"objective_metric={objective!r}"
    if mode != wanted:
        raise OptionsError(
            f"learn_rate_schedule returned ReduceLROnPlateau(mode={mode!r}), which nbscale steps with {stepped}, "
            f"better {'low' if goal == 'minimize' else 'high'}: make it ReduceLROnPlateau(optimizer, "
            f"mode={wanted!r}, ...), or set objective_metric to the metric it should follow."
        )
    if not validates:
        raise OptionsError(
            "learn_rate_schedule returned ReduceLROnPlateau, which nbscale steps after each validation, but there "
            "is no validation_data: give validation_data, or choose a schedule that steps by iteration or epoch."
        )
    return dataclasses.replace(schedule, plateau_input=objective)


def base_rate(optimizer: torch.optim.Optimizer) -> float:
    """The base learn rate of an optimizer a SolverRule made: its first group's rate over its lr_factor."""
    group = optimizer.param_groups[0]
    return float(group["lr"]) / float(group.get("lr_factor", 1.0))


def _name(factory: object) -> str:
    return getattr(factory, "__name__", type(factory).__name__)
