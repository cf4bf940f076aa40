"""Batches as PyTorch users build them, on every path (notebook, pool, jobs, classify/predict).

Inputs are a tensor (`model(x)`), a tuple or list (`model(*inputs)`) or a dict (`model(**inputs)`); targets a
tensor, a tuple/list or a dict. Nested structures move to the device as a whole; anything that is not a tensor
(a string, a number) travels unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn


def call_model(model: nn.Module | Any, inputs: object) -> Any:
    """`model` applied to a batch's inputs: `model(x)`, `model(*inputs)` for a tuple/list, `model(**inputs)` for
    a dict."""
    if type(inputs) is torch.Tensor:  # the usual case first: this runs every iteration
        return model(inputs)
    if isinstance(inputs, Mapping):
        return model(**inputs)
    if isinstance(inputs, tuple | list):
        return model(*inputs)
    return model(inputs)


def to_device(batch: object, device: torch.device, non_blocking: bool = False) -> Any:
    """`batch` with every tensor in it on `device` (tuples, lists, dicts and named tuples kept as they are)."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, Mapping):  # a plain dict for any mapping (a BatchEncoding is a dict too)
        return {key: to_device(value, device, non_blocking) for key, value in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a named tuple
        return type(batch)(*(to_device(value, device, non_blocking) for value in batch))
    if isinstance(batch, tuple | list):
        return type(batch)(to_device(value, device, non_blocking) for value in batch)
    return batch


def first_tensor(batch: object) -> torch.Tensor | None:
    """The first tensor in `batch` (depth first), or None."""
    if isinstance(batch, torch.Tensor):
        return batch
    values = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, tuple | list) else ()
    for value in values:
        found = first_tensor(value)
        if found is not None:
            return found
    return None


def batch_length(batch: object) -> int:
    """How many samples `batch` holds: the length of its first tensor (0 for a batch without one)."""
    tensor = first_tensor(batch)
    return 0 if tensor is None or tensor.dim() == 0 else len(tensor)


def one_sample_batch(sample: object) -> Any:
    """A batch of one from a single sample's inputs (a tensor, array, tuple/list or dict of them), as a
    DataLoader would make it."""
    from torch.utils.data import default_collate

    return default_collate([sample])


def first_output(outputs: object) -> Any:
    """The output metrics and predictions use: the logits of a structure holding them (nbscale.outputs), else the
    first of several outputs (a tuple or list), else `outputs` itself."""
    from nbscale.outputs import first_of, main_output

    return first_of(main_output(outputs))
