"""Learn-rate schedules: the learn rate as a pure function of the (0-based) iteration.

A pure function keeps resume exact: a run resumed at iteration k sees the same rates as one never stopped.
- "none": the initial rate throughout.
- "piecewise": multiplied by learn_rate_drop_factor every learn_rate_drop_period epochs (MATLAB's rule).
- "cosine": half a cosine from the initial rate down to 0 over all iterations.
- "warmup-cosine": a linear ramp over the first epoch (at most half the run), then the cosine.
Or the user's own torch scheduler (`learn_rate_schedule=lambda optimizer: ...`), whose state checkpoints keep.
The loop sees either through the same five calls (`make_schedule`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from nbscale.errors import OptionsError
from nbscale.training.options import TrainingOptions


def learn_rate_schedule(options: TrainingOptions, iterations_per_epoch: int) -> Callable[[int], float]:
    """`rate(iteration)` for these options; `iteration` counts from 0 over the whole run."""
    base = float(options.initial_learn_rate)
    total = iterations_per_epoch * int(options.max_epochs)
    kind = options.learn_rate_schedule
    if kind == "none":
        return lambda iteration: base
    if kind == "piecewise":
        period, factor = int(options.learn_rate_drop_period), float(options.learn_rate_drop_factor)
        return lambda iteration: base * factor ** ((iteration // iterations_per_epoch) // period)
    warmup = min(iterations_per_epoch, total // 2) if kind == "warmup-cosine" else 0

    def rate(iteration: int) -> float:
        if iteration < warmup:
            return base * (iteration + 1) / warmup
        progress = (iteration - warmup) / max(1, total - warmup)
        return base * 0.5 * (1.0 + math.cos(math.pi * progress))

    return rate


class NamedSchedule:
    """A named schedule (the pure `rate` above) setting the optimizer's groups each iteration it changes, each
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
    value or the validation loss (nbscale.training.plateau)."""

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
        """ReduceLROnPlateau's step with `value` (the run plan's: nbscale.training.plateau); None: no step."""
        if self.each == "validation" and value is not None:
            self.scheduler.step(value)

    def state_dict(self) -> dict[str, Any]:
        return dict(self.scheduler.state_dict())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            self.scheduler.load_state_dict(state)


Schedule = NamedSchedule | CustomSchedule


def make_schedule(options: TrainingOptions, optimizer: torch.optim.Optimizer, iterations_per_epoch: int) -> Schedule:
    """The schedule of `options` over `optimizer` (nbscale.training.optimizer.make_optimizer's)."""
    factory = options.learn_rate_schedule
    if isinstance(factory, str):
        base = float(options.initial_learn_rate)
        scale = 1.0 if isinstance(options.solver, str) else base_rate(optimizer) / base
        return NamedSchedule(learn_rate_schedule(options, iterations_per_epoch), optimizer, scale)
    how = (
        "learn_rate_schedule must be a function of the optimizer alone returning a torch scheduler, e.g. "
        "learn_rate_schedule=lambda optimizer: torch.optim.lr_scheduler.StepLR(optimizer, step_size=5)"
    )
    try:
        scheduler = factory(optimizer)
    except TypeError as error:  # a scheduler class given itself, or a factory taking other arguments
        raise OptionsError(f"learn_rate_schedule={_name(factory)} failed on the optimizer ({error}): {how}.") from None
    if not isinstance(scheduler, torch.optim.lr_scheduler.LRScheduler | torch.optim.lr_scheduler.ReduceLROnPlateau):
        raise OptionsError(
            f"learn_rate_schedule={_name(factory)} returned {type(scheduler).__name__}, not a torch scheduler: {how}."
        )
    if scheduler.optimizer is not optimizer:
        raise OptionsError(f"learn_rate_schedule={_name(factory)} returned a scheduler of another optimizer: {how}.")
    return CustomSchedule(scheduler, options.learn_rate_schedule_step)


def base_rate(optimizer: torch.optim.Optimizer) -> float:
    """The base learn rate of an optimizer made by make_optimizer: its first group's rate over its lr_factor."""
    group = optimizer.param_groups[0]
    return float(group["lr"]) / float(group.get("lr_factor", 1.0))


def _name(factory: object) -> str:
    return getattr(factory, "__name__", type(factory).__name__)
