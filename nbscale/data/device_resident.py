"""The device-resident fast path: decode a dataset once into one tensor on the training device, then cut batches.

Small-image training is input-bound when every epoch decodes files and augments images one at a time in
Python. Here every item is read once into an (N, C, H, W) tensor (uint8 when the files are 8-bit, so 4x less
memory) with its labels, both on the device; a batch is one `index_select`, and for an AugmentedImageDatastore
the random augmentation and sizing run on whole batches on the device (as in airbench's loader).
The trainer asks `fits_on_device` first and falls back to streaming when the data is too big.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator

import torch
from torch.utils.data import Dataset

from nbscale.data.augmented import AugmentedImageDatastore, convert_color, fit_to_size
from nbscale.data.datastore import ImageDatastore
from nbscale.data.reading import to_float
from nbscale.errors import DatastoreError


def _available_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not POSIX: assume a modest 4 GiB
        return 4 * 2**30


def _stored_item(dataset: Dataset, index: int) -> tuple[torch.Tensor, int] | None:
    """Item `index` as it is kept on the device: the un-augmented image (integer pixels where read raw).

    None when the file is unreadable and the datastore skips such files (on_error="skip").
    """
    augmented = dataset if isinstance(dataset, AugmentedImageDatastore) else None
    source = augmented.ds if augmented is not None else dataset
    if isinstance(source, ImageDatastore):
        raw, read = source.read_raw(index)
        if read != index:  # read_raw replaced an unreadable file by the next one: leave it out instead
            return None
        image, label = raw, source.label_index(read)
    elif augmented is not None:
        return augmented.source_item(index)  # colour-converted; PIL images and arrays made tensors
    else:
        item = source[index]
        image, label = (item[0], int(item[1])) if isinstance(item, tuple | list) else (item, -1)
        image = torch.as_tensor(image)
    if augmented is not None:
        image = convert_color(image, augmented.color_preprocessing)
    return image, label


def estimated_bytes(dataset: Dataset) -> int:
    """Bytes the resident copy would take, estimated from the first item (one file read)."""
    count = len(dataset)  # type: ignore[arg-type]
    if count == 0:
        return 0
    image = next(item[0] for i in range(count) if (item := _stored_item(dataset, i)) is not None)
    return count * (image.numel() * image.element_size() + 8)


def fits_on_device(dataset: Dataset, device: torch.device, budget_fraction: float = 0.5) -> bool:
    """True when the decoded dataset takes at most `budget_fraction` of the device's free memory (RAM on CPU)."""
    try:
        len(dataset)  # type: ignore[arg-type]
    except TypeError:
        return False  # an IterableDataset cannot be indexed
    return estimated_bytes(dataset) <= budget_fraction * _available_bytes(torch.device(device))


def _common_size(images: list[torch.Tensor], dataset: Dataset) -> list[torch.Tensor]:
    """Bring images of different sizes to one size so they stack (only an AugmentedImageDatastore can)."""
    sizes = {tuple(image.shape[-2:]) for image in images}
    if len(sizes) == 1:
        return images
    if not isinstance(dataset, AugmentedImageDatastore):
        raise DatastoreError(f"The images differ in size ({len(sizes)} sizes, e.g. {sorted(sizes)[:3]}), so they "
                             "cannot be batched: wrap the datastore in AugmentedImageDatastore(output_size, ds).")
    # resize mode: resize now; crop modes: centre-crop to the smallest height and width, crop further per batch
    if dataset.output_size_mode == "resize":
        target = dataset.output_size
    else:
        target = (min(s[0] for s in sizes), min(s[1] for s in sizes))
    return [fit_to_size(to_float(image)[None], target, "resize" if dataset.output_size_mode == "resize"
                        else "centercrop")[0] for image in images]


class DeviceResidentData:
    """A dataset decoded once into device tensors; `batches()` yields (images, labels) on the device."""

    def __init__(self, dataset: Dataset, device: torch.device) -> None:
        self.device = torch.device(device)
        self.augmented = dataset if isinstance(dataset, AugmentedImageDatastore) else None
        images: list[torch.Tensor] = []
        labels: list[int] = []
        skipped = 0
        for index in range(len(dataset)):  # type: ignore[arg-type]
            item = _stored_item(dataset, index)
            if item is None:
                skipped += 1
                continue
            images.append(item[0])
            labels.append(item[1])
        if skipped:
            warnings.warn(f"Left out {skipped} unreadable image(s) of {len(dataset)} "  # type: ignore[arg-type]
                          "(on_error='skip').", stacklevel=2)
        if not images:
            raise DatastoreError("DeviceResidentData: the dataset has no readable items.")
        images = _common_size(images, dataset)
        dtypes = {image.dtype for image in images}
        if len(dtypes) > 1:
            images = [to_float(image) for image in images]
        self.images = torch.stack(images).to(self.device)
        self.labels = torch.as_tensor(labels, dtype=torch.long).to(self.device)
        self.classes = list(getattr(dataset, "classes", []))
        self.skipped = skipped
        megabytes = self.images.numel() * self.images.element_size() / 1e6
        self.description = f"device-resident ({len(self.labels)} images, {megabytes:.1f} MB on {self.device})"
        if self.augmented is not None and self.augmented.augmenter is not None:
            self.description += ", augmented in batches on the device"

    def __len__(self) -> int:
        return len(self.labels)

    def batches(self, batch_size: int, *, shuffle: bool, generator: torch.Generator | None = None,
                indices: torch.Tensor | None = None,
                drop_last: bool = False) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Mini-batches (float32 images N x C x H x W in [0, 1], int64 labels) on the device.

        `indices` restricts the pass to those items (a shard), in that order unless `shuffle`; random draws
        (order, augmentation) come from `generator` (a CPU generator) when given.
        """
        order = torch.arange(len(self)) if indices is None else torch.as_tensor(indices, dtype=torch.long).cpu()
        if shuffle:
            order = order[torch.randperm(len(order), generator=generator)]
        for start in range(0, len(order), batch_size):
            chosen = order[start:start + batch_size]
            if drop_last and len(chosen) < batch_size:
                break
            chosen = chosen.to(self.device, non_blocking=True)
            images = self.images.index_select(0, chosen)
            if self.augmented is not None:
                images = self.augmented.prepare_batch(images, generator)
            else:
                images = to_float(images)
            yield images, self.labels.index_select(0, chosen)
