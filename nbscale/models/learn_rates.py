"""Per-layer learn-rate factors and frozen layers (MATLAB's WeightLearnRateFactor), kept on the model itself.

`transfer()` and `set_learn_rate_factor()` record factors in `model.nbscale_learn_rate_factors`, a dict from
parameter name (as in `model.named_parameters()`) to factor; frozen parameters have `requires_grad=False`.
The dict lives in the module's `__dict__`, so it survives `.to(device)`, pickling and copies to pool workers.
A trainer builds its optimizer from `param_groups(model, base_lr)`.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from nbscale.errors import ModelError

FACTORS_ATTRIBUTE = "nbscale_learn_rate_factors"


def learn_rate_factors(model: nn.Module) -> dict[str, float]:
    """The recorded factor of every parameter that has one (the others learn at the base rate)."""
    return dict(getattr(model, FACTORS_ATTRIBUTE, {}))


def set_learn_rate_factor(model: nn.Module, layer: str, factor: float) -> None:
    """Make every parameter of the named module learn `factor` times the base rate (0 freezes it)."""
    modules = dict(model.named_modules())
    if layer not in modules:
        raise ModelError(f"set_learn_rate_factor: the model has no layer {layer!r}; its top-level layers are "
                         f"{[name for name, _ in model.named_children()]}.")
    factors = learn_rate_factors(model)
    for name, parameter in modules[layer].named_parameters():
        full = f"{layer}.{name}" if layer else name
        factors[full] = float(factor)
        parameter.requires_grad_(factor != 0)
    setattr(model, FACTORS_ATTRIBUTE, factors)


def param_groups(model: nn.Module, base_lr: float) -> list[dict[str, Any]]:
    """Optimizer parameter groups: one per learn-rate factor, lr = base_lr * factor; frozen parameters left out.

    Frozen means `requires_grad=False` or a factor of 0. Each group also carries its `learn_rate_factor`, so a
    schedule that sets a new base rate can scale every group (`group["lr"] = rate * group["learn_rate_factor"]`).
    """
    factors = learn_rate_factors(model)
    unwrapped = model.module if hasattr(model, "module") and isinstance(model.module, nn.Module) else model
    factors = factors or learn_rate_factors(unwrapped)
    groups: dict[float, list[nn.Parameter]] = {}
    for name, parameter in model.named_parameters():
        name = name.removeprefix("module.") if unwrapped is not model else name
        factor = factors.get(name, 1.0)
        if parameter.requires_grad and factor != 0:
            groups.setdefault(factor, []).append(parameter)
    return [{"params": params, "lr": base_lr * factor, "learn_rate_factor": factor}
            for factor, params in sorted(groups.items())]
