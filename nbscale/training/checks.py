"""Checks of what `train` is given, made before training starts.

A bad model, data items of the wrong kind, float class labels or a checkpoint from another run would otherwise
fail deep inside torch (or only after an epoch), with a message that names neither the input nor the fix.
Each check raises OptionsError naming the argument and what to do. Labels against the network's class outputs
are nbscale.training.head_checks'.
"""

from __future__ import annotations

import os
import re
from typing import Any

import torch
from torch import nn
from torch.nn.parameter import is_lazy
from torch.utils.data import Dataset, TensorDataset

from nbscale.data.batches import call_model, first_output, one_sample_batch, to_device
from nbscale.data.loader_data import first_item
from nbscale.errors import ModelError, OptionsError
from nbscale.training.losses import unknown_loss


def check_model(model: object) -> None:
    """`model` must be a torch network."""
    if isinstance(model, type) and issubclass(model, nn.Module):
        raise OptionsError(
            f"model is the class {model.__name__}, not a network: create one, e.g. model = {model.__name__}(...)."
        )
    if not isinstance(model, nn.Module):
        raise OptionsError(
            f"model must be a torch nn.Module (a network such as nn.Sequential(...)), not "
            f"{type(model).__name__}: pass the network itself, not a function that builds one."
        )


def check_loss_fn(loss_fn: object) -> None:
    """`loss_fn` must be None (cross-entropy), a name `TrainingOptions(loss=...)` takes, or a function of
    (outputs, labels) returning the batch's loss."""
    if isinstance(loss_fn, str):
        problem = unknown_loss(loss_fn)
        if problem is not None:
            raise OptionsError(f"loss_fn={loss_fn!r} is not a loss: loss_fn must be {problem}.")
        return
    if isinstance(loss_fn, type) and issubclass(loss_fn, nn.Module):
        raise OptionsError(
            f"loss_fn is the class {loss_fn.__name__}, not a loss: create one, e.g. loss_fn={loss_fn.__name__}()."
        )
    if loss_fn is not None and not callable(loss_fn):
        raise OptionsError(
            f"loss_fn must be a loss name such as 'mse', or a function of (outputs, labels) returning the loss, "
            f"such as nn.MSELoss() or torch.nn.functional.cross_entropy, not {type(loss_fn).__name__} "
            f"{loss_fn!r:.40}: leave it out for cross-entropy."
        )


_CHANNELS = re.compile(r"expected input\[([^\]]*)\] to have (\d+) channels, but got (\d+) channels")


def channel_mismatch(error: BaseException) -> str | None:
    """The fix, when `error` is a convolution's refusal of images with another channel count (grayscale images
    into a network built for colour, the usual transfer-learning slip), else None."""
    found = _CHANNELS.search(str(error))
    if found is None:
        return None
    shape, wanted, got = found.group(1), int(found.group(2)), int(found.group(3))
    message = (
        f"The network takes {wanted}-channel images but the data has {got} channel(s) (inputs of shape [{shape}])."
    )
    conversion = {(3, 1): ("gray2rgb", "repeats the gray channel"), (1, 3): ("rgb2gray", "turns colour into gray")}
    if (wanted, got) in conversion:
        name, does = conversion[(wanted, got)]
        return (
            f"{message} AugmentedImageDatastore(output_size, ds, color_preprocessing={name!r}) {does} (or give "
            f"output_size as (height, width, {wanted}))."
        )
    return f"{message} Give it {wanted}-channel inputs."


def misfit_error(error: Exception, inputs: Any, labels: Any = None, what: str = "The first mini-batch") -> ModelError:
    """What to say when the first mini-batch (or `what`) fails in the network or the loss (inference: no
    `labels`, no loss): the network does not fit the data (`error` is torch's own, chained to this one, so its
    traceback into the user's forward stays visible)."""
    channels_fix = channel_mismatch(error)
    if channels_fix is not None:
        return ModelError(f"{what} failed in the network: {channels_fix}")
    said = str(error).strip().rstrip(".")
    if labels is None:
        where, data, also = "the network", described(inputs), "the data is what the network was trained on"
    else:
        where, data = "the network or its loss", f"{described(inputs)} and its labels {described(labels)}"
        also = "the loss takes its outputs with these labels"
    return ModelError(
        f"{what} failed in {where}: {type(error).__name__}: {said}. The batch's inputs are {data}. Check that the "
        "network's first layer takes inputs of that shape (a conv's in_channels is C; after nn.Flatten, the first "
        f"nn.Linear's in_features is C*H*W) and that {also}; try net(inputs) on one batch to see it."
    )


def described(value: object) -> str:
    """A value for an error message: a tensor's dtype and shape (as 60x1x8x8), else its type."""
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {'x'.join(map(str, value.shape)) or '()'}"
    if isinstance(value, dict):  # nested batches: what each part is
        return "a dict {" + ", ".join(f"{key!r}: {described(part)}" for key, part in value.items()) + "}"
    if isinstance(value, tuple | list):
        return f"a {type(value).__name__} (" + ", ".join(described(part) for part in value) + ")"
    return f"a {type(value).__name__}"


def check_items(dataset: Dataset[Any], what: str) -> Any:
    """The first item of `dataset` must be an (input, label) pair whose input is a tensor or an array; returns
    that item (None for an empty dataset), so later checks need not read it again."""
    # torch's Dataset declares no __len__; as_dataset checked it
    if len(dataset) == 0:  # type: ignore[arg-type]
        return None
    with torch.random.fork_rng(devices=[]):  # reading an augmented item draws numbers: the run's stream stays as it was
        item = first_item(dataset)  # a DataLoader's with a worker_init_fn: in a worker process of its own
    if isinstance(item, dict):
        raise OptionsError(
            f"{what} yields dicts (keys {sorted(item)[:5]}), but training takes (input, label) "
            "pairs: make its __getitem__ return (input, label), e.g. (item['x'], item['y'])."
        )
    if not isinstance(item, tuple | list) or len(item) < 2:
        raise OptionsError(
            f"{what} must yield (input, label) pairs, but its first item is a "
            f"{type(item).__name__}: make its __getitem__ return (input, label)."
        )
    if type(item[0]).__module__.startswith("PIL"):
        raise OptionsError(
            f"{what} yields PIL images: give its dataset transform=torchvision.transforms.ToTensor() "
            "(plus the resizing you need), or wrap it in nbscale.data.AugmentedImageDatastore("
            f"output_size, {what}), which turns images into tensors."
        )
    return item


def with_class_labels(dataset: Dataset[Any], what: str, first_item: Any) -> Dataset[Any]:
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
    return OptionsError(
        f"{what} has float labels, but the default loss (cross-entropy) takes class indices: give "
        "integer labels (y.long(), y.astype(int)), or pass loss_fn= (e.g. nn.MSELoss()) for "
        "regression targets."
    )


def check_resume(
    checkpoint: dict[str, Any],
    model: nn.Module,
    solver: str,
    mini_batch_size: int | None,
    samples: int,
    path: str | os.PathLike[str],
) -> None:
    """A run resumed from `checkpoint` must train the same network with the same solver, mini-batch and data, so
    that it continues the same schedule (max_epochs may change). `mini_batch_size` None ("auto"): the checkpoint's."""
    name = f"resume_from={os.fspath(path)!r}"
    saved = checkpoint.get("options", {})
    differences = [
        f"{field}={saved[field]!r} there, {value!r} here"
        for field, value in (("solver", solver), ("mini_batch_size", mini_batch_size))
        if field in saved and value is not None and saved[field] != value
    ]
    if "samples" in checkpoint and checkpoint["samples"] != samples:
        differences.append(f"train_data of {checkpoint['samples']} samples there, {samples} here")
    if differences:
        raise OptionsError(
            f"{name} was written by a run that differs from this one ({'; '.join(differences)}): "
            "resume with the same solver, mini_batch_size and train_data (other options, such as "
            "max_epochs and the learn rate, may change), or train from the start without resume_from."
        )
    mismatched = _mismatched_parameters(model.state_dict(), checkpoint["model"])
    if mismatched:
        raise OptionsError(
            f"{name} holds another network's weights ({'; '.join(mismatched[:3])}): build the model "
            "as in the run that wrote the checkpoint, or train from the start without resume_from."
        )


def _mismatched_parameters(mine: dict[str, torch.Tensor], saved: dict[str, torch.Tensor]) -> list[str]:
    missing = [f"{name} missing from the checkpoint" for name in mine if name not in saved]
    extra = [f"{name} not in this model" for name in saved if name not in mine]
    shapes = [
        f"{name} is {tuple(saved[name].shape)} there, {tuple(tensor.shape)} here"
        for name, tensor in mine.items()
        if name in saved and saved[name].shape != tensor.shape
    ]
    return shapes + missing + extra


def materialise_lazy_layers(model: nn.Module, first_item: Any) -> None:
    """Give lazy layers (nn.LazyLinear, nn.LazyConv2d, ...) their shapes by running the network once on the first
    sample, as a user's dry run would, so that the optimizer, the layout and DDP see real parameters; a network
    without lazy layers is left untouched. ModelError (misfit_error) when that run fails."""
    if first_item is None or not any(is_lazy(parameter) for parameter in model.parameters()):
        return
    inputs = first_item[0]
    try:
        outputs_for_one(model, inputs)
    except Exception as error:
        raise misfit_error(error, one_sample_batch(inputs), first_item[1], "The first sample") from error


def outputs_for_one(model: nn.Module, sample: object) -> Any:
    """The network's (first) outputs for one sample (given without the batch dimension: a tensor, array, tuple or
    dict of them), in eval mode without gradients, on
    the device of its parameters; the modes of its layers and the caller's random number stream stay as they were."""
    parameter = next(model.parameters(), None)
    device = parameter.device if parameter is not None else torch.device("cpu")
    if device.type == "meta":
        raise ModelError("the network's parameters are on the meta device: it holds no weights to run")
    modes = {module: module.training for module in model.modules()}
    try:
        model.eval()
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            return first_output(call_model(model, to_device(one_sample_batch(sample), device)))
    finally:
        for module, training in modes.items():
            module.training = training
