"""The solver as the run plan holds it: the optimizer (MATLAB's solverName) and its learn-rate schedule.

The optimizer is a SolverRule, resolved once before training with its parameter groups (by parameter name, so every
pool rank builds the same groups on its own copy of the network), and made into a torch optimizer where the loop
runs (`SolverRule.make`).

Learn-rate schedules give the learn rate as a pure function of the (0-based) iteration, which keeps resume exact:
a run resumed at iteration k sees the same rates as one never stopped.
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
from nbscale.training.options import TrainingOptions


@dataclass(frozen=True)
class ParameterGroup:
    """One optimizer group: its parameters by name, its learn-rate factor (nbscale.models.learn_rates) and its L2
    (None: a solver factory's own weight_decay)."""

    names: tuple[str, ...]
    lr_factor: float
    weight_decay: float | None


@dataclass(frozen=True)
class SolverRule:
    """The optimizer factory with its parameter groups, and the gradient clipping of each step."""

    solver: str | Callable[[list[dict[str, Any]]], torch.optim.Optimizer]  # a name, or the user's factory
    learn_rate: float  # initial_learn_rate (a factory's own lr is its base rate)
    groups: tuple[ParameterGroup, ...]
    momentum: float
    betas: tuple[float, float]  # gradient_decay_factor, squared_gradient_decay_factor
    epsilon: float
    gradient_threshold: float = math.inf
    gradient_threshold_method: str = "l2norm"

    @property
    def custom(self) -> bool:
        return not isinstance(self.solver, str)

    def with_learn_rate(self, rate: float) -> SolverRule:
        return dataclasses.replace(self, learn_rate=rate)

    def make(self, model: nn.Module) -> torch.optim.Optimizer:
        """The solver over `model`'s parameters (the network the plan was made for, or a pool rank's copy)."""
        named = dict(model.named_parameters())
        base = self.learn_rate
        groups: list[dict[str, Any]] = []
        for group in self.groups:
            given: dict[str, Any] = {"params": [named[name] for name in group.names], "lr_factor": group.lr_factor}
            if group.weight_decay is not None:  # a named solver's: the rate and L2 of each group are nbscale's
                given |= {"lr": base * group.lr_factor, "weight_decay": group.weight_decay}
            groups.append(given)
        if not isinstance(self.solver, str):
            return _custom_optimizer(self.solver, groups)
        if self.solver == "sgdm":
            return torch.optim.SGD(groups, lr=base, momentum=self.momentum)
        if self.solver == "adam":
            return torch.optim.Adam(groups, lr=base, betas=self.betas, eps=self.epsilon)
        if self.solver == "adamw":
            return torch.optim.AdamW(groups, lr=base, betas=self.betas, eps=self.epsilon)
        return torch.optim.RMSprop(groups, lr=base, alpha=self.betas[1], eps=self.epsilon)


def solver_rule(model: nn.Module, options: TrainingOptions) -> SolverRule:
    """The SolverRule of `options` for `model`: biases get no L2 (MATLAB's BiasL2Factor 0); per-layer learn-rate
    factors and frozen layers come from nbscale.models.learn_rates. OptionsError when nothing is trainable."""
    from nbscale.models.learn_rates import param_groups  # here: the nbscale.models package loads torchvision

    base = float(options.initial_learn_rate)
    names = {id(p): name for name, p in model.named_parameters()}
    l2 = None if not isinstance(options.solver, str) else float(options.l2_regularization)
    groups: list[ParameterGroup] = []
    for group in param_groups(model, 1.0):  # the groups of each learn-rate factor
        chosen = [names[id(p)] for p in group["params"] if p.requires_grad]
        factor = float(group["learn_rate_factor"])
        parts = (
            [(l2, chosen)]
            if not l2
            else [(l2, [n for n in chosen if not n.endswith("bias")]), (0.0, [n for n in chosen if n.endswith("bias")])]
        )
        groups += [ParameterGroup(tuple(part), factor, decay) for decay, part in parts if part]
    if not groups:
        raise OptionsError("The model has no trainable parameters (all frozen?): unfreeze a layer to train.")
    return SolverRule(
        options.solver,
        base,
        tuple(groups),
        float(options.momentum),
        (float(options.gradient_decay_factor), float(options.squared_gradient_decay_factor)),
        float(options.epsilon),
        float(options.gradient_threshold),
        options.gradient_threshold_method,
    )


def _custom_optimizer(factory: Any, groups: list[dict[str, Any]]) -> torch.optim.Optimizer:
    """`factory(groups)` (solver=callable): each group holds its trainable parameters and its "lr_factor"; the
    factory's lr (and weight_decay) apply to every group, its lr times the group's factor (l2_regularization and
    initial_learn_rate do not apply: the factory's own arguments say them)."""
    how = (
        "solver must be a function of the parameter groups returning a torch optimizer, e.g. "
        "solver=lambda params: torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.95))"
    )
    name = getattr(factory, "__name__", type(factory).__name__)
    try:
        optimizer = factory(groups)
    except TypeError as error:
        raise OptionsError(f"solver={name} failed on the parameter groups ({error}): {how}.") from None
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise OptionsError(f"solver={name} returned {type(optimizer).__name__}, not a torch.optim.Optimizer: {how}.")
    for group in optimizer.param_groups:  # the factory's lr is the base rate; a group's factor scales it
        group["lr"] = group["lr"] * group.get("lr_factor", 1.0)
    return optimizer


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
