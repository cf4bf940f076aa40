"""The solver (MATLAB's solverName) over a network's trainable parameters, with per-layer learn-rate factors."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from nbscale.train.options import TrainingOptions


def make_optimizer(model: nn.Module, options: TrainingOptions) -> torch.optim.Optimizer:
    """The solver over the model's trainable parameters; biases get no L2 (MATLAB's BiasL2Factor 0).

    Per-layer learn-rate factors and frozen layers come from nbscale.models.learn_rates.
    """
    from nbscale.models.learn_rates import param_groups  # here: the nbscale.models package loads torchvision

    base = float(options.initial_learn_rate)
    groups = param_groups(model, base)
    names = {id(p): name for name, p in model.named_parameters()}
    l2 = float(options.l2_regularization)
    split: list[dict[str, Any]] = []
    for group in groups:
        params = [p for p in group["params"] if p.requires_grad]
        factor = float(group.get("lr", base)) / base
        is_bias = [names.get(id(p), "").endswith("bias") for p in params]
        parts = ((0.0, params),) if l2 == 0 else ((l2, [p for p, b in zip(params, is_bias, strict=True) if not b]),
                                                  (0.0, [p for p, b in zip(params, is_bias, strict=True) if b]))
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
    return torch.optim.RMSprop(split, lr=base, alpha=float(options.squared_gradient_decay_factor),
                               eps=float(options.epsilon))
