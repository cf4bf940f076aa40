"""`pretrained(name, weights)`: a torchvision network by name, with its weights from torchvision or a file."""

from __future__ import annotations

import difflib
import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torchvision
from torch import nn

from nbscale.errors import ModelError
from nbscale.safe_load import RefusedPickle, load_restricted

# modules whose layer classes (nn.Module subclasses defined there) a whole saved network may refer to
_LAYER_MODULES = ("torch.nn.modules.", "torchvision.models.", "torchvision.ops.")
# the other globals torchvision's networks hold: quantization stubs, detection helpers, norm_layer partials
_NETWORK_EXTRAS = (
    ("functools", "partial"),
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


def _unwrap_state_dict(loaded: object) -> dict[str, torch.Tensor] | None:
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
    import torchvision.models.detection  # noqa: F401 (imported by torchvision.models; named for the reader)
    import torchvision.models.optical_flow  # noqa: F401

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
            raise ModelError(f"pretrained: {str(path)!r} is a pickle that {refused.describe()}, which nbscale "
                             "does not unpickle (it loads tensors, and whole networks made of torch.nn and "
                             "torchvision layers only). If you trust the file, load it yourself with "
                             "torch.load(path, weights_only=False), or save model.state_dict() instead.") from None


def pretrained(name: str, weights: str | os.PathLike | None = "DEFAULT", **kwargs: object) -> nn.Module:
    """Build torchvision network `name` (e.g. "resnet18") with `weights`.

    weights: "DEFAULT" (or any torchvision weights name such as "IMAGENET1K_V1") loads through torchvision's
    own cache (downloaded once if the machine can reach the internet); a path to a file saved with
    `torch.save(model.state_dict(), path)` loads that (also a checkpoint dict with a "state_dict", names
    prefixed by DDP's "module.", or a classification layer with another class count, as transfer() leaves it);
    a whole network saved with `torch.save(model, path)` is returned as it is when it is made of torch and
    torchvision layers; None gives random weights. Extra keyword arguments go to the torchvision constructor.
    Raises ModelError for an unknown name or a missing or mismatching file.
    """
    available = torchvision.models.list_models()
    if name not in available:
        close = difflib.get_close_matches(name, available, n=5)
        hint = f"Did you mean {close}?" if close else "See torchvision.models.list_models() for the names."
        raise ModelError(f"pretrained: {name!r} is not a torchvision network. {hint}")
    if weights is None:
        return torchvision.models.get_model(name, weights=None, **kwargs)
    text = os.fspath(weights)
    looks_like_file = isinstance(weights, os.PathLike) or any(c in text for c in "/\\.") or Path(text).exists()
    if not looks_like_file:
        try:
            return torchvision.models.get_model(name, weights=text, **kwargs)
        except (ValueError, KeyError) as error:
            raise ModelError(f"pretrained: {text!r} is not a weights name of {name} ({error}). Use 'DEFAULT', a "
                             "local file path, or None.") from error
        except (OSError, RuntimeError) as error:  # no network and nothing in torchvision's cache
            raise ModelError(f"pretrained: cannot fetch the {text} weights of {name} ({error}). On a machine "
                             f"without internet, save them elsewhere with torch.save(model.state_dict(), path) "
                             f"and pass weights=path (torch hub cache: {torch.hub.get_dir()}).") from error
    path = Path(text).expanduser()
    if not path.is_file():
        raise ModelError(f"pretrained: the weights file {str(path)!r} does not exist. Pass an existing file saved "
                         "with torch.save(model.state_dict(), path), 'DEFAULT', or None.")
    try:
        loaded = _load(path)
    except ModelError:
        raise
    except Exception as error:
        raise ModelError(f"pretrained: cannot read weights file {str(path)!r} ({error}). It should hold a "
                         "state_dict saved with torch.save(model.state_dict(), path).") from error
    if isinstance(loaded, nn.Module) and not kwargs:
        return loaded  # a whole network saved with torch.save(model, path): it is the network asked for
    state = _unwrap_state_dict(loaded)
    if state is None:
        raise ModelError(f"pretrained: {str(path)!r} holds a {type(loaded).__name__}, not a state_dict of {name}.")
    model = torchvision.models.get_model(name, weights=None, **kwargs)
    file_classes = _class_count_in(state, model)
    if file_classes is not None and "num_classes" not in kwargs:
        # a network saved after transfer(): build it with the file's class count
        model = torchvision.models.get_model(name, weights=None, num_classes=file_classes, **kwargs)
    try:
        model.load_state_dict(state)
    except RuntimeError as error:
        details = [line.strip() for line in str(error).splitlines()[1:3]]
        raise ModelError(f"pretrained: the weights in {str(path)!r} do not fit {name}: {' '.join(details)} "
                         "Check the network name, or pass num_classes= to match the file.") from error
    return model


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
