"""The solver (MATLAB's solverName) as the run plan holds it: a SolverRule, resolved once before training with its
parameter groups (by parameter name, so every pool rank builds the same groups on its own copy of the network),
and made into a torch optimizer where the loop runs (`SolverRule.make`)."""

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
