"""Weights files for `pretrained(name, weights=path)`: loaded without running code, and checked against the
network they are for.

A file holds a state_dict (plain, in a checkpoint dict, or with the prefixes DDP and torch.compile add), or a
whole network made only of torch.nn and torchvision layers: torch's weights-only unpickler loads it with an
exact allow-list of globals (`network_globals()`), and refuses anything else before it runs. A file that does not
fit is a ModelError naming the parameters that are missing, extra or of other shapes.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from nbscale.errors import ModelError
from nbscale.safe_load import RefusedPickle, load_restricted

# modules whose layer classes (nn.Module subclasses defined there) a whole saved network may refer to
_LAYER_MODULES = ("torch.nn.modules.", "torchvision.models.", "torchvision.ops.")
# the other globals torchvision's networks hold: quantization stubs, detection helpers, norm_layer partials
_NETWORK_EXTRAS = (
    ("functools", "partial"),
    ("nbscale.models.normalization", "Normalize"),  # pretrained(..., normalize=True): the layer and its hook
    ("nbscale.models.normalization", "normalize_inputs"),
    ("torch.ao.nn.quantized.modules.functional_modules", "FloatFunctional"),
    ("torch.ao.quantization.stubs", "DeQuantStub"),
    ("torch.ao.quantization.stubs", "QuantStub"),
    ("torchvision.models.detection._utils", "BalancedPositiveNegativeSampler"),
    ("torchvision.models.detection._utils", "BoxCoder"),
    ("torchvision.models.detection._utils", "BoxLinearCoder"),
    ("torchvision.models.detection._utils", "Matcher"),
    ("torchvision.models.detection._utils", "SSDMatcher"),
    ("torchvision.models.optical_flow.raft", "_pass_through_h"),
    ("torchvision.ops.boxes", "box_iou"),
)
# prefixes that DistributedDataParallel / DataParallel and torch.compile add to every parameter name
_WRAPPER_PREFIXES = ("module.", "_orig_mod.")


def network_from_file(name: str, path: Path, kwargs: dict[str, Any]) -> nn.Module:
    """Torchvision network `name` with the weights in the file at `path` (`kwargs` go to its constructor): a
    whole saved network is returned as it is once checked to be `name`; a state_dict whose classification layer
    has another class count builds the network with that count (as transfer() left it). Raises ModelError."""
    import torchvision

    if path.is_dir():
        raise ModelError(
            f"pretrained: {str(path)!r} is a folder; weights= takes the file in it that was saved with "
            "torch.save(model.state_dict(), path)."
        )
    if path.exists() and not path.is_file():  # a pipe would block the read forever, a device read without end
        raise ModelError(
            f"pretrained: {str(path)!r} is not a regular file (a pipe, device or socket): pass a file "
            "saved with torch.save(model.state_dict(), path), 'DEFAULT', or None."
        )
    if not path.is_file():
        raise ModelError(
            f"pretrained: the weights file {str(path)!r} does not exist. Pass an existing file saved "
            "with torch.save(model.state_dict(), path), 'DEFAULT', or None."
        )
    try:
        loaded = _load(path)
    except ModelError:
        raise
    except Exception as error:
        raise ModelError(
            f"pretrained: cannot read weights file {str(path)!r} ({error}). It should hold a "
            "state_dict saved with torch.save(model.state_dict(), path)."
        ) from error
    if isinstance(loaded, nn.Module) and not kwargs:  # a whole network saved with torch.save(model, path)
        _check_whole_network(name, loaded, path)
        return loaded
    state = _unwrap_state_dict(loaded)
    if state is None:
        raise ModelError(f"pretrained: {str(path)!r} holds a {type(loaded).__name__}, not a state_dict of {name}.")
    model: nn.Module = torchvision.models.get_model(name, weights=None, **kwargs)
    file_classes = _class_count_in(state, model)
    if file_classes is not None and "num_classes" not in kwargs:
        # a network saved after transfer(): build it with the file's class count
        model = torchvision.models.get_model(name, weights=None, num_classes=file_classes, **kwargs)
    try:
        model.load_state_dict(state)
    except RuntimeError as error:
        problem = _misfit(state, model.state_dict()) or str(error).strip().splitlines()[-1].strip()
        raise ModelError(
            f"pretrained: the weights in {str(path)!r} do not fit {name}: {problem}. Check the network "
            "name, or pass num_classes= to match the file."
        ) from None
    return model


def _unwrap_state_dict(loaded: object) -> dict[str, torch.Tensor] | None:
    """The state_dict a loaded file holds (a network's, a checkpoint dict's, or itself), wrapper prefixes
    removed; None when it holds none."""
    if isinstance(loaded, nn.Module):
        return loaded.state_dict()
    if isinstance(loaded, dict):
        for key in ("state_dict", "model_state_dict", "model"):
            if isinstance(loaded.get(key), dict):
                return _strip_wrapper_prefixes(loaded[key])
        if all(isinstance(v, torch.Tensor) for v in loaded.values()):
            return _strip_wrapper_prefixes(loaded)
    return None


def _strip_wrapper_prefixes(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    for prefix in _WRAPPER_PREFIXES:
        if state and all(key.startswith(prefix) for key in state):
            state = {key.removeprefix(prefix): value for key, value in state.items()}
    return state


@functools.cache
def network_globals() -> dict[tuple[str, str], Callable[..., Any]]:
    """The exact (module, name) pairs a whole saved network may refer to, besides what torch needs for tensors:
    every layer class of torch.nn and torchvision's networks and ops, and the few helpers they hold."""
    import torchvision.models.detection  # imported by torchvision.models; named for the reader
    import torchvision.models.optical_flow  # noqa: F401

    import nbscale.models.normalization  # noqa: F401 (its layer and hook are in _NETWORK_EXTRAS)

    found: dict[tuple[str, str], Callable[..., Any]] = {}
    for module_name, module in list(sys.modules.items()):
        if module is None or not module_name.startswith(_LAYER_MODULES):
            continue
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, nn.Module) and value.__module__ == module_name:
                found[(value.__module__, value.__qualname__)] = value
    for module_name, name in _NETWORK_EXTRAS:
        found[(module_name, name)] = getattr(sys.modules[module_name], name)
    return found


def _load(path: Path) -> object:
    """torch.load a weights file with torch's weights-only unpickler: tensors and plain values, or a whole
    network whose every global is one of network_globals(); anything else is refused without running."""
    with open(path, "rb") as stream:
        try:
            return load_restricted(stream, network_globals())
        except RefusedPickle as refused:
            raise ModelError(
                f"pretrained: {str(path)!r} is a pickle that {refused.describe()}, which nbscale "
                "does not unpickle (it loads tensors, and whole networks made of torch.nn and "
                "torchvision layers only). If you trust the file, load it yourself with "
                "torch.load(path, weights_only=False), or save model.state_dict() instead."
            ) from None


_NAMES_SHOWN = 3  # a misfit names this many parameters of each kind, and counts the rest


def _misfit(state: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], ignore: str | None = None) -> str | None:
    """What keeps `state` from loading into a network whose state_dict is `expected` (missing names, names it
    does not have, other shapes), counted and with a few names each; None when it fits. Shapes of parameters
    under `ignore` (a layer name: the classification layer) may differ."""

    def listed(names: list[str]) -> str:
        more = f", ... ({len(names)} in all)" if len(names) > _NAMES_SHOWN else ""
        return ", ".join(names[:_NAMES_SHOWN]) + more

    # BatchNorm fills in a missing num_batches_tracked (files of older torch versions lack it)
    missing = [key for key in expected if key not in state and not key.endswith("num_batches_tracked")]
    unexpected = [key for key in state if key not in expected]
    reshaped = [
        f"{key} {tuple(state[key].shape)} instead of {tuple(expected[key].shape)}"
        for key in expected
        if key in state and state[key].shape != expected[key].shape and not (ignore and key.startswith(ignore + "."))
    ]
    problems = [
        f"{what}: {listed(names)}"
        for what, names in (
            ("it lacks", missing),
            ("it has parameters the network does not", unexpected),
            ("other shapes", reshaped),
        )
        if names
    ]
    return "; ".join(problems) if problems else None


def _check_whole_network(name: str, loaded: nn.Module, path: Path) -> None:
    """ModelError when a whole saved network is not `name` (another class, or other layers or sizes); only its
    classification layer may differ (a network saved after transfer())."""
    import warnings

    import torchvision

    from nbscale.models.transfer import classification_layer

    # detection networks would download their backbone's weights by default: the skeleton needs none
    parameters = inspect.signature(torchvision.models.get_model_builder(name)).parameters
    options = {"weights_backbone": None} if "weights_backbone" in parameters else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with torch.device("meta"):  # only names and shapes are compared: no memory, no initialisation
                expected = torchvision.models.get_model(name, weights=None, **options)
        except Exception:  # a few networks (RegNet) cannot initialise meta tensors
            expected = torchvision.models.get_model(name, weights=None, **options)
    fix = (
        "Pass the name of the network the file holds, or load it with torch.load(path, weights_only=False) if "
        "you trust it."
    )
    if type(loaded) is not type(expected):
        raise ModelError(
            f"pretrained: {str(path)!r} holds a whole {type(loaded).__name__} network, not {name} (a "
            f"{type(expected).__name__}). {fix}"
        )
    try:
        head: str | None = classification_layer(expected)
    except ModelError:
        head = None
    problem = _misfit(loaded.state_dict(), expected.state_dict(), ignore=head)
    if problem is not None:
        raise ModelError(
            f"pretrained: {str(path)!r} holds a {type(loaded).__name__} that is not {name}: {problem}. {fix}"
        )


def _class_count_in(state: dict[str, torch.Tensor], model: nn.Module) -> int | None:
    """The file's class count when only the classification layer's output size differs from `model`'s."""
    from nbscale.models.transfer import classification_layer

    try:
        head = classification_layer(model)
    except ModelError:
        return None
    expected, saved = model.state_dict().get(f"{head}.weight"), state.get(f"{head}.weight")
    if expected is None or saved is None or saved.ndim != expected.ndim or saved.shape[0] == expected.shape[0]:
        return None
    return int(saved.shape[0]) if saved.shape[1:] == expected.shape[1:] else None
