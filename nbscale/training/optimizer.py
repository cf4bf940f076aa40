"""The solver (MATLAB's solverName) over a network's trainable parameters, with per-layer learn-rate factors."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from nbscale.training.options import TrainingOptions


def make_optimizer(model: nn.Module, options: TrainingOptions) -> torch.optim.Optimizer:
    """The solver over the model's trainable parameters; biases get no L2 (MATLAB's BiasL2Factor 0).

    Per-layer learn-rate factors and frozen layers come from nbscale.models.learn_rates.
    """
    from nbscale.models.learn_rates import param_groups  # here: the nbscale.models package loads torchvision

    base = float(options.initial_learn_rate)
    groups = param_groups(model, base)
    if not isinstance(options.solver, str):
        return _custom_optimizer(model, options.solver, groups, base)
    names = {id(p): name for name, p in model.named_parameters()}
    l2 = float(options.l2_regularization)
    split: list[dict[str, Any]] = []
    for group in groups:
        params = [p for p in group["params"] if p.requires_grad]
        factor = float(group.get("lr", base)) / base
        is_bias = [names.get(id(p), "").endswith("bias") for p in params]
        parts = (
            ((0.0, params),)
            if l2 == 0
            else (
                (l2, [p for p, b in zip(params, is_bias, strict=True) if not b]),
                (0.0, [p for p, b in zip(params, is_bias, strict=True) if b]),
            )
        )
        for decay, chosen in parts:
            if chosen:
                split.append({"params": chosen, "lr": base * factor, "lr_factor": factor, "weight_decay": decay})
    if not split:
        from nbscale.errors import OptionsError

        raise OptionsError("The model has no trainable parameters (all frozen?): unfreeze a layer to train.")
    solver = options.solver
    if solver == "sgdm":
        return torch.optim.SGD(split, lr=base, momentum=float(options.momentum))
    betas = (float(options.gradient_decay_factor), float(options.squared_gradient_decay_factor))
    if solver == "adam":
        return torch.optim.Adam(split, lr=base, betas=betas, eps=float(options.epsilon))
    if solver == "adamw":
        return torch.optim.AdamW(split, lr=base, betas=betas, eps=float(options.epsilon))
    return torch.optim.RMSprop(
        split, lr=base, alpha=float(options.squared_gradient_decay_factor), eps=float(options.epsilon)
    )


def _custom_optimizer(
    model: nn.Module, factory: Any, groups: list[dict[str, Any]], base: float
) -> torch.optim.Optimizer:
    """`factory(groups)` (solver=callable): each group holds its trainable parameters and its "lr_factor"; the
    factory's lr (and weight_decay) apply to every group, its lr times the group's factor (l2_regularization and
    initial_learn_rate do not apply: the factory's own arguments say them)."""
    from nbscale.errors import OptionsError

    given = [
        {"params": [p for p in g["params"] if p.requires_grad], "lr_factor": float(g.get("lr", base)) / base}
        for g in groups
    ]
    given = [g for g in given if g["params"]]
    if not given:
        raise OptionsError("The model has no trainable parameters (all frozen?): unfreeze a layer to train.")
    how = (
        "solver must be a function of the parameter groups returning a torch optimizer, e.g. "
        "solver=lambda params: torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.95))"
    )
    name = getattr(factory, "__name__", type(factory).__name__)
    try:
        optimizer = factory(given)
    except TypeError as error:
        raise OptionsError(f"solver={name} failed on the parameter groups ({error}): {how}.") from None
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise OptionsError(f"solver={name} returned {type(optimizer).__name__}, not a torch.optim.Optimizer: {how}.")
    for group in optimizer.param_groups:  # the factory's lr is the base rate; a group's factor scales it
        group["lr"] = group["lr"] * group.get("lr_factor", 1.0)
    return optimizer


def check_factories(model: nn.Module, options: TrainingOptions) -> None:
    """A callable solver or learn_rate_schedule tried once on `model`'s parameters (their OptionsError before
    training starts); the optimizer made is thrown away (its state is made lazily: nothing is allocated)."""
    if isinstance(options.solver, str) and isinstance(options.learn_rate_schedule, str):
        return
    from nbscale.training.schedules import make_schedule

    make_schedule(options, make_optimizer(model, options), 1)
