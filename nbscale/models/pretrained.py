"""`pretrained(name, weights)`: a torchvision network by name, with its weights from torchvision or a file."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import torch
import torchvision
from torch import nn

from nbscale.errors import ModelError


def _unwrap_state_dict(loaded: object) -> dict[str, torch.Tensor] | None:
    if isinstance(loaded, nn.Module):
        return loaded.state_dict()
    if isinstance(loaded, dict):
        for key in ("state_dict", "model_state_dict", "model"):
            if isinstance(loaded.get(key), dict):
                return loaded[key]
        if all(isinstance(v, torch.Tensor) for v in loaded.values()):
            return loaded  # type: ignore[return-value]
    return None


def pretrained(name: str, weights: str | os.PathLike | None = "DEFAULT", **kwargs: object) -> nn.Module:
    """Build torchvision network `name` (e.g. "resnet18") with `weights`.

    weights: "DEFAULT" (or any torchvision weights name such as "IMAGENET1K_V1") loads through torchvision's
    own cache (downloaded once if the machine can reach the internet); a path to a file saved with
    `torch.save(model.state_dict(), path)` loads that; None gives random weights. Extra keyword arguments go
    to the torchvision constructor. Raises ModelError for an unknown name or a missing or mismatching file.
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
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise ModelError(f"pretrained: cannot read weights file {str(path)!r} ({error}). It should hold a "
                         "state_dict saved with torch.save(model.state_dict(), path).") from error
    state = _unwrap_state_dict(loaded)
    if state is None:
        raise ModelError(f"pretrained: {str(path)!r} holds a {type(loaded).__name__}, not a state_dict of {name}.")
    model = torchvision.models.get_model(name, weights=None, **kwargs)
    try:
        model.load_state_dict(state)
    except RuntimeError as error:
        raise ModelError(f"pretrained: the weights in {str(path)!r} do not fit {name}: "
                         f"{str(error).splitlines()[0]} Check the network name, or pass num_classes= to match "
                         "the file.") from error
    return model
