"""`transfer(model, num_classes, ...)`: replace a network's last classification layer for a new task."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import cast

from torch import nn

from nbscale.errors import ModelError
from nbscale.models.learn_rates import (
    FACTORS_ATTRIBUTE,
    _checked_factor,
    layers_near,
    matching_layers,
    parameter_factors,
    set_learn_rate_factors,
)

TRUNK = "trunk"  # freeze="trunk": every layer but the new one


def classification_layer(model: nn.Module) -> str:
    """The name of the last classification layer: `fc`, `classifier[-1]`, `heads.head`, else the last Linear.

    SqueezeNet scores classes with a 1 x 1 convolution in its classifier (`classifier.1`); that layer counts too.
    """
    modules = dict(model.named_modules())
    for name in ("fc", "heads.head", "head"):
        if isinstance(modules.get(name), nn.Linear):
            return name
    classifier = modules.get("classifier")
    if isinstance(classifier, nn.Sequential) and len(classifier) and isinstance(classifier[-1], nn.Linear):
        return f"classifier.{len(classifier) - 1}"
    if isinstance(classifier, nn.Linear):
        return "classifier"
    if isinstance(classifier, nn.Sequential):
        scoring = [i for i, layer in enumerate(classifier) if _is_class_scoring_conv(layer)]
        # list(): slicing a Sequential rebuilds its class, which subclasses such as DeepLabHead cannot do
        if scoring and not any(isinstance(layer, nn.Linear) for layer in list(classifier)[scoring[-1] :]):
            return f"classifier.{scoring[-1]}"
    linear: list[str] = [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    if not linear:
        raise ModelError(
            f"transfer: {type(model).__name__} has no nn.Linear layer to replace; add a classification "
            "layer yourself, then call transfer()."
        )
    return linear[-1]


def _is_class_scoring_conv(layer: nn.Module) -> bool:
    return isinstance(layer, nn.Conv2d) and layer.kernel_size == (1, 1) and layer.groups == 1


def _new_layer(old: nn.Linear | nn.Conv2d, num_classes: int) -> nn.Module:
    """A freshly initialised layer like `old` (Linear or 1 x 1 Conv2d) with `num_classes` outputs."""
    if isinstance(old, nn.Conv2d):
        new: nn.Module = nn.Conv2d(old.in_channels, num_classes, kernel_size=1, bias=old.bias is not None)
    else:
        new = nn.Linear(old.in_features, num_classes, bias=old.bias is not None)
    return new.to(device=old.weight.device, dtype=old.weight.dtype)


MAX_NEW_LAYER_BYTES = 2**30  # 1 GiB: 2 million classes after a 128-wide layer, 262,144 after ResNet-50's 2048


def _check_layer_size(old: nn.Linear | nn.Conv2d, num_classes: int) -> None:
    """ModelError when the new layer's weights would take more than MAX_NEW_LAYER_BYTES (an absurd class count)."""
    inputs = old.in_channels if isinstance(old, nn.Conv2d) else old.in_features
    size = (inputs + 1) * num_classes * old.weight.element_size()
    if size > MAX_NEW_LAYER_BYTES:
        raise ModelError(
            f"transfer: num_classes={num_classes:,} makes a new layer of {inputs:,} x {num_classes:,} "
            f"weights, {size / 2**30:,.1f} GiB (at most {MAX_NEW_LAYER_BYTES // 2**30} GiB): give the "
            "number of classes of your data, e.g. len(ds.classes)."
        )


def _replace(model: nn.Module, name: str, layer: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, layer)


def transfer(
    model: nn.Module,
    num_classes: int,
    learn_rate_factor: float | Mapping[str, float] = 10.0,
    freeze: str | Iterable[str] | None = None,
) -> nn.Module:
    """Give `model` a new last classification layer with `num_classes` outputs; returns the same model.

    `learn_rate_factor`: a number, how many times the base learn rate the new layer learns; or a dict of layer
    names or glob patterns to factors (`{"layer4.*": 2, "fc": 10}`), applied in order (a later one wins), the
    new layer keeping 10 unless one names it (see nbscale.models.learn_rates). `freeze` names layers whose
    weights stay fixed, whatever their factor: a layer name, glob pattern, or list of them from
    `model.named_modules()` (e.g. ["conv1", "layer1"]), or "trunk" for every layer but the new one.
    `nbscale.models.learn_rate_factors(model)` lists the outcome.
    """
    if not isinstance(num_classes, int) or num_classes < 1:
        raise ModelError(f"transfer: num_classes must be a positive whole number, not {num_classes!r}.")
    head_factor = (
        10.0
        if isinstance(learn_rate_factor, Mapping)
        else _checked_factor(learn_rate_factor, "transfer(..., learn_rate_factor=...)")
    )
    head_name = classification_layer(model)
    old = cast(nn.Linear | nn.Conv2d, model.get_submodule(head_name))  # classification_layer names only these
    _check_layer_size(old, num_classes)
    new = _new_layer(old, num_classes)
    _replace(model, head_name, new)
    if isinstance(getattr(model, "num_classes", None), int):  # SqueezeNet keeps its class count
        setattr(model, "num_classes", num_classes)  # noqa: B010 - nn.Module types attributes as tensors or modules

    frozen, frozen_parameters = _frozen(model, head_name, freeze)
    factors = {n: f for n, f in parameter_factors(model).items() if not n.startswith(head_name + ".")}
    for name, _ in new.named_parameters():
        factors[f"{head_name}.{name}"] = head_factor
    setattr(model, FACTORS_ATTRIBUTE, factors)
    if isinstance(learn_rate_factor, Mapping):
        set_learn_rate_factors(model, learn_rate_factor)
    for parameter in frozen_parameters:  # last: a frozen layer stays fixed whatever factor a pattern gave it
        parameter.requires_grad_(False)
    setattr(model, "nbscale_frozen_layers", tuple(frozen))  # noqa: B010 - as above
    return model


def _frozen(
    model: nn.Module,
    head_name: str,
    freeze: str | Iterable[str] | None,
) -> tuple[list[str], list[nn.Parameter]]:
    """The layers `freeze` names in `model` whose new classification layer is `head_name`, and their parameters;
    ModelError for a name that is no layer."""
    if freeze == TRUNK:

        def holds_head(name: str) -> bool:
            return head_name == name or head_name.startswith(name + ".")

        frozen = [name for name, _ in model.named_children() if not holds_head(name)]
        frozen += [name for name, _ in model.named_modules() if name and head_name.startswith(name + ".")]
        return frozen, [p for n, p in model.named_parameters() if not n.startswith(head_name + ".")]
    modules = dict(model.named_modules())
    named = [freeze] if isinstance(freeze, str) else list(freeze or [])
    unknown = [
        name for name in named if isinstance(name, str) and name not in modules and not any(c in name for c in "*?[")
    ]  # a non-string: matching_layers says what names a layer
    if unknown:
        raise ModelError(
            f"transfer: freeze names {unknown[0]!r}, which is no layer of {type(model).__name__}."
            f"{layers_near(model, unknown[0])}. Name layers as model.named_modules() does "
            "('layer4', 'layer4.0.conv1'), use a glob pattern ('layer4.*'), or pass freeze='trunk' "
            "to freeze every layer but the new one."
        )
    frozen = list(dict.fromkeys(layer for name in named for layer in matching_layers(model, name)))
    return frozen, [p for name in frozen for p in modules[name].parameters()]
