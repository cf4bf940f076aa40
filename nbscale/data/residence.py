"""Whether `data_placement="auto"` keeps a dataset resident (nbscale.data.device_resident): its items are
(tensor input, class label) pairs and their resident copy fits in a share of the device's free memory.

Sizes are exact for tensors; for anything else they are judged from one item read, which is handed on so it is
not read again. On a pool every rank takes the same decision, with the least free memory among them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.data import Dataset, Subset

from nbscale.data.augmented import AugmentedImageDatastore
from nbscale.data.datastore import ImageDatastore
from nbscale.data.preparing import Readers
from nbscale.data.resident_tensors import holds_tensors, is_pair, stored_item, unwrapped

_LABEL_BYTES = 8  # each item's label, kept as an int64 class index


def estimated_bytes(dataset: Dataset[Any]) -> int:
    """Bytes the resident copy would take: exact for tensors, else estimated from the first item (one file read)."""
    _, source = unwrapped(dataset)
    if holds_tensors(source):
        return _tensor_bytes(source)
    count = len(dataset)  # type: ignore[arg-type]
    if count == 0:
        return 0
    image = next(item[0] for i in range(count) if (item := stored_item(dataset, i)) is not None)
    return _resident_bytes(count, image)


def fits_on_device(dataset: Dataset[Any], device: torch.device, budget_fraction: float = 0.5) -> bool:
    """True when the resident dataset takes at most `budget_fraction` of the device's free memory (RAM on CPU)."""
    try:
        len(dataset)  # type: ignore[arg-type]
    except TypeError:
        return False  # an IterableDataset cannot be indexed
    return estimated_bytes(dataset) <= budget_fraction * _available_bytes(torch.device(device))


def residence(
    dataset: Dataset[Any],
    device: torch.device,
    *,
    rows: Sequence[int] | None = None,
    readers: Readers | None = None,
    budget_fraction: float = 0.5,
) -> tuple[bool, dict[int, Any]]:
    """Whether `data_placement="auto"` keeps `dataset` (its `rows` only, when given) resident: its items have
    class labels and tensor inputs, and take at most `budget_fraction` of the device's free memory (the host's
    for the CPU). Reads one item, returned as {index: item} for `DeviceResidentData(first=...)`, so it is not
    read again. With `readers` (a pool) the first reader reads it and every rank takes the same decision, with
    the least free memory among them."""
    try:
        count = len(dataset)  # type: ignore[arg-type]
    except TypeError:
        return False, {}  # an IterableDataset cannot be indexed
    _, source = unwrapped(dataset)
    if holds_tensors(source):  # nothing to read, so nothing to agree on: each rank judges its own memory
        share = len(rows) / max(count, 1) if rows is not None else 1.0
        return _tensor_bytes(source) * share <= budget_fraction * _available_bytes(torch.device(device)), {}
    estimate: int | None = None
    first: dict[int, Any] = {}
    if readers is None or readers.position == 0:
        indices = readers.block(count) if readers is not None else (rows if rows is not None else range(count))
        estimate, first = _probe(dataset, indices, count if readers is not None else len(indices))
    free = _available_bytes(torch.device(device))
    if readers is not None:
        answers = readers.exchange((estimate, free))
        estimate, free = answers[0][0], min(answer[1] for answer in answers)
    return estimate is not None and estimate <= budget_fraction * free, first


def _probe(dataset: Dataset[Any], indices: Sequence[int], count: int) -> tuple[int | None, dict[int, Any]]:
    """(bytes `count` items would take resident, judged by the first readable one of `indices`, or None where
    the items are no (tensor input, class label) pairs; the items read, by index, as they are kept)."""
    first: dict[int, Any] = {}
    datastore = isinstance(dataset, AugmentedImageDatastore | ImageDatastore)
    for index in indices:
        if datastore:  # labels are class indices
            item = first[index] = stored_item(dataset, index)
        else:  # other labels (regression targets) are streamed under "auto", as they always were
            raw = dataset[index]
            if not is_pair(raw) or not _is_class_label(raw[1]):
                return None, first
            try:
                item = first[index] = (torch.as_tensor(raw[0]), raw[1])
            except (TypeError, ValueError, RuntimeError):  # an input that is no tensor: streamed, as it comes
                return None, first
        if item is not None:
            return _resident_bytes(count, item[0]), first
    return 0, first


def _resident_bytes(count: int, image: torch.Tensor) -> int:
    """Bytes `count` items like `image` take resident, labels included."""
    return count * (image.numel() * image.element_size() + _LABEL_BYTES)


def _tensor_bytes(dataset: Any) -> int:
    if isinstance(dataset, Subset):
        whole = len(dataset.dataset)  # type: ignore[arg-type]  # torch's Dataset declares no __len__; a Subset's has one
        return _tensor_bytes(dataset.dataset) * len(dataset) // max(whole, 1)
    return sum(t.numel() * t.element_size() for t in dataset.tensors)


def _available_bytes(device: torch.device) -> int:
    """Free memory of a GPU, or the memory available on the host (free plus what the OS would reclaim from its file
    cache: a long-running machine's free memory alone is often a small part of it)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:  # ipykernel brings psutil; without it, the free pages
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not POSIX: assume a modest 4 GiB
        return 4 * 2**30


def _is_class_label(label: object) -> bool:
    try:
        value = torch.as_tensor(label)
    except (TypeError, ValueError, RuntimeError):  # a label that is no number
        return False
    return value.ndim == 0 and not value.is_floating_point() and not value.is_complex() and value.dtype != torch.bool
