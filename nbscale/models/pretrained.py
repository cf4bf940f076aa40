"""`pretrained(name, weights)`: a torchvision network by name, with its weights from torchvision or a file."""

from __future__ import annotations

import os
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch
from torch import nn

from nbscale.errors import ModelError
from nbscale.models.normalization import LAYER_NAME, weights_normalization, with_normalization
from nbscale.models.weight_files import network_from_file, network_globals
from nbscale.suggestions import did_you_mean

if TYPE_CHECKING:
    from torchvision.models import WeightsEnum
# torchvision is imported where a network is built, so importing nbscale.models (training imports its learn-rate
# factors) stays free of torchvision's import time

# network_globals (the allow-list of a whole saved network's globals) is weight_files', kept importable from here
__all__ = ["pretrained", "FETCH_TIMEOUT_S", "network_globals"]

# how long the weights' download server may take to answer before pretrained() gives up
FETCH_TIMEOUT_S = 10.0
_OFFLINE_FIX = (
    "On a machine without internet, save the weights elsewhere with torch.save(model.state_dict(), path) "
    "and pass weights=path, or copy the file into torchvision's cache ({cache})."
)


def _torchvision_weights(name: str, weights: str | os.PathLike[str] | WeightsEnum) -> WeightsEnum | None:
    """The torchvision weights that `weights` names ("DEFAULT", "IMAGENET1K_V1", "ResNet18_Weights.DEFAULT" or
    the enum), or None when it names a file (an existing path, or text with a path separator or a dot)."""
    import torchvision
    from torchvision.models import WeightsEnum

    if isinstance(weights, WeightsEnum):
        if type(weights) is not torchvision.models.get_model_weights(name):
            raise ModelError(f"pretrained: {weights} are not weights of {name}; its weights are {_weight_names(name)}.")
        return weights
    if not isinstance(weights, str | os.PathLike):
        raise ModelError(
            f"pretrained: weights must be 'DEFAULT', a torchvision weights name, a file path or None, "
            f"not {type(weights).__name__}."
        )
    text = os.fspath(weights)
    if isinstance(weights, os.PathLike) or Path(text).expanduser().exists():
        return None
    if "_Weights." in text and not any(c in text for c in "/\\"):
        try:
            return _torchvision_weights(name, torchvision.models.get_weight(text))
        except (KeyError, ValueError, AttributeError):
            raise ModelError(
                f"pretrained: {text!r} is not a torchvision weights name; the weights of {name} are "
                f"{_weight_names(name)}."
            ) from None
    if any(c in text for c in "/\\."):
        return None
    try:
        return torchvision.models.get_model_weights(name)[text]
    except KeyError:
        raise ModelError(
            f"pretrained: {text!r} is not a weights name of {name}; its weights are "
            f"{_weight_names(name)}. Use 'DEFAULT', a local file path, or None."
        ) from None


def _weight_names(name: str) -> list[str]:
    import torchvision

    return ["DEFAULT", *(weights.name for weights in torchvision.models.get_model_weights(name))]


def _check_reachable(name: str, weights: WeightsEnum) -> None:
    """Raise ModelError at once when `weights` are not in torchvision's cache and their server does not answer
    within FETCH_TIMEOUT_S (torch.hub downloads without a timeout: an unanswered connection would hang the cell)."""
    cached = Path(torch.hub.get_dir()) / "checkpoints" / Path(urllib.parse.urlparse(weights.url).path).name
    if cached.is_file():
        return
    try:
        urllib.request.urlopen(urllib.request.Request(weights.url, method="HEAD"), timeout=FETCH_TIMEOUT_S).close()
    except (OSError, ValueError) as error:  # URLError, timeouts and refused connections are OSErrors
        reason = getattr(error, "reason", None) or error or "no answer"
        raise ModelError(
            f"pretrained: cannot fetch the {weights} weights of {name} from {weights.url} ({reason}). "
            f"{_OFFLINE_FIX.format(cache=cached)}"
        ) from None


def pretrained(
    name: str,
    weights: str | os.PathLike[str] | WeightsEnum | None = "DEFAULT",
    normalize: bool | tuple[Sequence[float], Sequence[float]] = True,
    **kwargs: object,
) -> nn.Module:
    """Build torchvision network `name` (e.g. "resnet18") with `weights`, normalizing its input as they need.

    weights: "DEFAULT" (or any torchvision weights name such as "IMAGENET1K_V1", "ResNet18_Weights.IMAGENET1K_V1",
    or the enum itself, ResNet18_Weights.DEFAULT) loads through torchvision's own cache, downloaded once if the
    machine can reach the internet (a download server that does not answer within FETCH_TIMEOUT_S seconds is an
    error, not a hang); a path to a file saved with
    `torch.save(model.state_dict(), path)` loads that (also a checkpoint dict with a "state_dict", names
    prefixed by DDP's "module.", or a classification layer with another class count, as transfer() leaves it);
    a whole network saved with `torch.save(model, path)` is returned as it is when it is made of torch and
    torchvision layers; None gives random weights. Extra keyword arguments go to the torchvision constructor.
    normalize: True (the default) builds the weights' input normalization into the network (a `normalize` layer
    applied first, nbscale.models.normalization), so images scaled to [0, 1] go in as MATLAB's pretrained networks
    take them; for a local weights file it is the normalization of `name`'s torchvision default weights (ImageNet's
    mean/std for the classification networks); with weights=None, none. `(mean, std)` gives another; False none.
    Raises ModelError for an unknown name or a missing or mismatching file.
    """
    network = _network(name, weights, kwargs)
    if normalize is False or hasattr(network, LAYER_NAME):  # a whole saved network may carry its normalization
        return network
    mean: Sequence[float]
    std: Sequence[float]
    if normalize is True:
        if weights is None:
            return network
        named = _torchvision_weights(name, weights)
        found = weights_normalization(name, named)
        if found is None:  # weights whose preprocessing has no mean/std (detection, video)
            return network
        mean, std = found
    elif isinstance(normalize, tuple) and len(normalize) == 2:
        mean, std = normalize
    else:
        raise ModelError(
            f"pretrained: normalize must be True, False or a (mean, std) pair of per-channel "
            f"sequences, not {normalize!r}."
        )
    return with_normalization(network, mean, std)


def _network(name: str, weights: str | os.PathLike[str] | WeightsEnum | None, kwargs: dict[str, object]) -> nn.Module:
    """The network of `pretrained`, before its normalization."""
    import torchvision

    available = torchvision.models.list_models()
    if name not in available:
        hint = did_you_mean(name, available, n=5) or " See torchvision.models.list_models() for the names."
        raise ModelError(f"pretrained: {name!r} is not a torchvision network.{hint}")
    if weights is None:
        return cast(nn.Module, torchvision.models.get_model(name, weights=None, **kwargs))
    named = _torchvision_weights(name, weights)
    if named is not None:
        _check_reachable(name, named)
        try:
            return cast(nn.Module, torchvision.models.get_model(name, weights=named, **kwargs))
        except ValueError as error:  # torchvision refuses constructor arguments that do not fit the weights
            raise ModelError(
                f"pretrained: {name} with the {named} weights: {error}. For another class count, build "
                "it with the weights and call nbscale.models.transfer(model, num_classes)."
            ) from None
        except (OSError, RuntimeError) as error:  # the download failed half way, or the cached file is damaged
            raise ModelError(
                f"pretrained: cannot fetch the {named} weights of {name} ({error}). "
                f"{_OFFLINE_FIX.format(cache=torch.hub.get_dir())}"
            ) from error
    return network_from_file(name, Path(os.fspath(weights)).expanduser(), kwargs)  # a WeightsEnum was handled above
