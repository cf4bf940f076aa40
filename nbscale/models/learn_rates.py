"""Per-layer learn-rate factors and frozen layers (MATLAB's WeightLearnRateFactor), kept on the model itself.

`transfer()` and `set_learn_rate_factor()` record factors in `model.nbscale_learn_rate_factors`, a dict from
parameter name (as in `model.named_parameters()`) to factor; frozen parameters have `requires_grad=False`.
The dict lives in the module's `__dict__`, so it survives `.to(device)`, pickling and copies to pool workers.
Layers are named as in `model.named_modules()` ("layer4", "layer4.0.conv1"), or by glob patterns over those
names ("layer4.*", "features.1?", "*.bn*"). A trainer builds its optimizer from `param_groups(model, base_lr)`;
`learn_rate_factors(model)` lists the factor of each layer group.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Mapping
from typing import Any

from torch import nn

from nbscale.errors import ModelError
from nbscale.suggestions import did_you_mean

FACTORS_ATTRIBUTE = "nbscale_learn_rate_factors"
_GLOB_CHARACTERS = "*?["
_LISTED_NAMES = 40  # an error lists every layer name up to this many


def parameter_factors(model: nn.Module) -> dict[str, float]:
    """The recorded factor of every parameter that has one (the others learn at the base rate)."""
    return dict(getattr(model, FACTORS_ATTRIBUTE, {}))


def set_learn_rate_factor(model: nn.Module, layer: str, factor: float) -> list[str]:
    """Make every parameter of the layers named by `layer` learn `factor` times the base rate; returns those layers.

    `layer` is a name from `model.named_modules()` ("fc", "layer4.0") or a glob pattern over those names
    ("layer4.*": every layer inside layer4). A factor of 0 freezes the layers; a factor above 0 makes them learn
    (unfreezing them). Raises ModelError for a pattern that matches no layer (listing the layer names) or a
    factor that is not a number >= 0.
    """
    factor = _checked_factor(factor, f"set_learn_rate_factor(model, {layer!r}, ...)")
    modules = dict(model.named_modules())
    names = matching_layers(model, layer)
    factors = parameter_factors(model)
    for name in names:
        for parameter_name, parameter in modules[name].named_parameters():
            factors[f"{name}.{parameter_name}" if name else parameter_name] = factor
            parameter.requires_grad_(factor != 0)
    setattr(model, FACTORS_ATTRIBUTE, factors)
    return names


def set_learn_rate_factors(model: nn.Module, factors: Mapping[str, float]) -> None:
    """`set_learn_rate_factor` for each `{name or pattern: factor}`, in order: a later pattern wins where two
    name the same layer (`{"*": 0.1, "fc": 10}`: everything slow but fc)."""
    if not isinstance(factors, Mapping):
        raise ModelError(
            f"learn-rate factors are a number or a dict of layer names or patterns to numbers, like "
            f"{{'layer4.*': 2, 'fc': 10}}; not {type(factors).__name__}."
        )
    for pattern, factor in factors.items():
        if not isinstance(pattern, str):
            raise ModelError(f"learn-rate factor keys are layer names or glob patterns (strings), not {pattern!r}.")
        set_learn_rate_factor(model, pattern, factor)


def matching_layers(model: nn.Module, pattern: str) -> list[str]:
    """The names of `model.named_modules()` that `pattern` names: the name itself, or every name the glob
    pattern matches. ModelError, listing the layer names, when there is none."""
    if not isinstance(pattern, str):
        raise ModelError(
            f"A layer is named by a string (a name from model.named_modules(), or a glob pattern "
            f"like 'layer4.*'), not {pattern!r}."
        )
    names = [name for name, _ in model.named_modules()]
    if pattern in names:
        return [pattern]
    matched = [name for name in names if name and fnmatch.fnmatchcase(name, pattern)]
    if matched:
        return matched
    kind = "pattern" if any(c in pattern for c in _GLOB_CHARACTERS) else "name"
    raise ModelError(
        f"The layer {kind} {pattern!r} matches no layer of {type(model).__name__}."
        f"{layers_near(model, pattern)}. Name a layer as model.named_modules() does ('layer4', "
        "'layer4.0.conv1'), or use a glob pattern ('layer4.*')."
    )


def layers_near(model: nn.Module, name: str) -> str:
    """For an error about a layer `name` that `model` does not have: up to three close names, then every layer
    name (or, in a large network, the top-level ones and how to list the rest). Starts with a space."""
    shown = [layer for layer, _ in model.named_modules() if layer]
    hint = did_you_mean(name, shown, n=3)
    if len(shown) > _LISTED_NAMES:
        top = [layer for layer, _ in model.named_children()]
        return (
            f"{hint} Its top-level layers are {', '.join(top)} ({len(shown)} layers in all: "
            "[name for name, _ in model.named_modules()] lists them)"
        )
    return f"{hint} Its layers are {', '.join(shown)}"


def learn_rate_factors(model: nn.Module) -> dict[str, float]:
    """The learn-rate factor of each layer group: {layer: factor}, 0 for frozen layers, 1 for the base rate.

    A top-level layer whose parameters all share one factor is one entry ("layer4": 2.0); one whose parameters
    differ is split into its sub-layers, as far down as needed. Layers without parameters are left out.
    """
    factors = parameter_factors(model)
    groups: dict[str, float] = {}

    def effective(name: str, parameter: nn.Parameter) -> float:
        return float(factors.get(name, 1.0)) if parameter.requires_grad else 0.0

    def visit(prefix: str, module: nn.Module) -> None:
        values = {effective(f"{prefix}{name}", parameter) for name, parameter in module.named_parameters()}
        if not values:
            return
        if len(values) == 1 and prefix:
            groups[prefix[:-1]] = values.pop()
            return
        for name, parameter in module.named_parameters(recurse=False):
            groups[f"{prefix}{name}"] = effective(f"{prefix}{name}", parameter)
        for name, child in module.named_children():
            visit(f"{prefix}{name}.", child)

    visit("", model)
    return groups


def param_groups(model: nn.Module, base_lr: float) -> list[dict[str, Any]]:
    """Optimizer parameter groups: one per learn-rate factor, lr = base_lr * factor; frozen parameters left out.

    Frozen means `requires_grad=False` or a factor of 0. Each group also carries its `learn_rate_factor`, so a
    schedule that sets a new base rate can scale every group (`group["lr"] = rate * group["learn_rate_factor"]`).
    """
    factors = parameter_factors(model)
    unwrapped = model.module if hasattr(model, "module") and isinstance(model.module, nn.Module) else model
    factors = factors or parameter_factors(unwrapped)
    groups: dict[float, list[nn.Parameter]] = {}
    for name, parameter in model.named_parameters():
        name = name.removeprefix("module.") if unwrapped is not model else name
        factor = factors.get(name, 1.0)
        if parameter.requires_grad and factor != 0:
            groups.setdefault(factor, []).append(parameter)
    return [
        {"params": params, "lr": base_lr * factor, "learn_rate_factor": factor}
        for factor, params in sorted(groups.items())
    ]


def _checked_factor(factor: object, where: str) -> float:
    if isinstance(factor, bool) or not isinstance(factor, int | float) or not math.isfinite(factor) or factor < 0:
        raise ModelError(
            f"{where}: a learn-rate factor is a number >= 0 (0 freezes the layer, 10 learns ten times "
            f"faster than the base rate), not {factor!r}."
        )
    return float(factor)
