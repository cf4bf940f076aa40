"""Checks of what `train` is given, made before training starts.

A bad model, data items of the wrong kind, float class labels or a checkpoint from another run would otherwise
fail deep inside torch (or only after an epoch), with a message that names neither the input nor the fix.
Each check raises OptionsError naming the argument and what to do.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from nbscale.errors import OptionsError


def check_model(model: Any) -> None:
    """`model` must be a torch network."""
    if isinstance(model, type) and issubclass(model, nn.Module):
        raise OptionsError(f"model is the class {model.__name__}, not a network: create one, e.g. "
                           f"model = {model.__name__}(...).")
    if not isinstance(model, nn.Module):
        raise OptionsError(f"model must be a torch nn.Module (a network such as nn.Sequential(...)), not "
                           f"{type(model).__name__}: pass the network itself, not a function that builds one.")


def check_items(dataset: Dataset, what: str) -> Any:
    """The first item of `dataset` must be an (input, label) pair whose input is a tensor or an array; returns
    that item (None for an empty dataset), so later checks need not read it again."""
    if len(dataset) == 0:  # type: ignore[arg-type]
        return None
    item = dataset[0]
    if isinstance(item, dict):
        raise OptionsError(f"{what} yields dicts (keys {sorted(item)[:5]}), but training takes (input, label) "
                           "pairs: make its __getitem__ return (input, label), e.g. (item['x'], item['y']).")
    if not isinstance(item, tuple | list) or len(item) < 2:
        raise OptionsError(f"{what} must yield (input, label) pairs, but its first item is a "
                           f"{type(item).__name__}: make its __getitem__ return (input, label).")
    if type(item[0]).__module__.startswith("PIL"):
        raise OptionsError(f"{what} yields PIL images: give its dataset transform=torchvision.transforms.ToTensor() "
                           "(plus the resizing you need), or wrap it in nbscale.data.AugmentedImageDatastore("
                           f"output_size, {what}), which turns images into tensors.")
    return item


def with_class_labels(dataset: Dataset, what: str, first_item: Any) -> Dataset:
    """`dataset` with integer class labels, as the default loss (cross-entropy) needs.

    Whole-number float labels in an (inputs, labels) pair become int64 (numpy and pandas often give labels as
    float64); other float labels, which cross-entropy cannot take as class indices, are an OptionsError.
    `first_item` is dataset[0] as check_items read it.
    """
    if isinstance(dataset, TensorDataset) and len(dataset.tensors) == 2:
        inputs, labels = dataset.tensors
        if labels.is_floating_point() and labels.ndim == 1:
            if not bool(torch.all(labels == labels.round())):
                raise _float_labels_error(what)
            return TensorDataset(inputs, labels.long())
        return dataset
    if first_item is None:
        return dataset
    try:
        label = torch.as_tensor(first_item[1])
    except (TypeError, ValueError, RuntimeError):  # not a number: the loss will say what it needs
        return dataset
    if label.is_floating_point() and label.ndim == 0:
        raise _float_labels_error(what)
    return dataset


def _float_labels_error(what: str) -> OptionsError:
    return OptionsError(f"{what} has float labels, but the default loss (cross-entropy) takes class indices: give "
                        "integer labels (y.long(), y.astype(int)), or pass loss_fn= (e.g. nn.MSELoss()) for "
                        "regression targets.")


def check_resume(checkpoint: dict[str, Any], model: nn.Module, solver: str, mini_batch_size: int, samples: int,
                 path: Any) -> None:
    """A run resumed from `checkpoint` must train the same network with the same solver, mini-batch and data, so
    that it continues the same schedule (max_epochs may change)."""
    name = f"resume_from={os.fspath(path)!r}"
    saved = checkpoint.get("options", {})
    differences = [f"{field}={saved[field]!r} there, {value!r} here"
                   for field, value in (("solver", solver), ("mini_batch_size", mini_batch_size))
                   if field in saved and saved[field] != value]
    if "samples" in checkpoint and checkpoint["samples"] != samples:
        differences.append(f"train_data of {checkpoint['samples']} samples there, {samples} here")
    if differences:
        raise OptionsError(f"{name} was written by a run that differs from this one ({'; '.join(differences)}): "
                           "resume with the same solver, mini_batch_size and train_data (only max_epochs may "
                           "change), or train from the start without resume_from.")
    mismatched = _mismatched_parameters(model.state_dict(), checkpoint["model"])
    if mismatched:
        raise OptionsError(f"{name} holds another network's weights ({'; '.join(mismatched[:3])}): build the model "
                           "as in the run that wrote the checkpoint, or train from the start without resume_from.")


def _mismatched_parameters(mine: dict[str, torch.Tensor], saved: dict[str, torch.Tensor]) -> list[str]:
    missing = [f"{name} missing from the checkpoint" for name in mine if name not in saved]
    extra = [f"{name} not in this model" for name in saved if name not in mine]
    shapes = [f"{name} is {tuple(saved[name].shape)} there, {tuple(tensor.shape)} here"
              for name, tensor in mine.items() if name in saved and saved[name].shape != tensor.shape]
    return shapes + missing + extra
