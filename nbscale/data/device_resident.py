"""The resident loader: a whole dataset held as tensors where training runs, cut into mini-batches by index.

`DeviceResidentData` is the one loader for data that fits, like airbench's loader:
- tensors and TensorDatasets (and Subsets of them) are taken with whole-tensor operations, never item by item;
- an ImageDatastore's files are decoded once (in threads where that pays) into one tensor (uint8 for 8-bit files: 4x less
  memory than float32);
- an AugmentedImageDatastore over either keeps its colour-converted source images and augments and sizes whole
  batches where they are, each image by its own random values, drawn there for a whole epoch at once;
- any other Dataset is read item by item, once.
The tensors sit on the training device; on a GPU, tensors too large for it stay in host memory and each batch
is gathered into pinned memory and copied over without making the host wait. Each epoch the sample order goes
to the device once, and nothing in an epoch waits for the device. `make_batch_source` (nbscale.train.loading)
chooses between this loader and streaming.
"""

from __future__ import annotations

import functools
import os
import time
import warnings
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from torch.utils.data import Dataset, Subset, TensorDataset

from nbscale.data.augmented import AugmentedImageDatastore, convert_color, fit_to_size
from nbscale.data.datastore import ImageDatastore
from nbscale.data.labels import as_labels
from nbscale.data.reading import is_url, to_float
from nbscale.errors import DatastoreError

Batch = tuple[torch.Tensor, torch.Tensor]
Rows = torch.Tensor | Sequence[torch.Tensor]  # sample indices of each batch: a 2-D tensor, or 1-D tensors

# reading a file from a network store waits on I/O: many threads pay there
DECODE_THREADS = min(32, (os.cpu_count() or 1) + 4)


def holds_tensors(dataset: Any) -> bool:
    """True for a TensorDataset of (inputs, labels) or a Subset of one: data `whole_tensors` takes at once."""
    if isinstance(dataset, Subset):
        return holds_tensors(dataset.dataset)
    return isinstance(dataset, TensorDataset) and len(dataset.tensors) == 2


def whole_tensors(dataset: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(inputs, labels) of a TensorDataset of two tensors, or of a Subset of one (taken by one indexing);
    None for any other dataset."""
    if isinstance(dataset, TensorDataset) and len(dataset.tensors) == 2:
        return dataset.tensors[0], as_labels(dataset.tensors[1])
    if isinstance(dataset, Subset):
        inner = whole_tensors(dataset.dataset)
        if inner is not None:
            index = torch.as_tensor(dataset.indices, dtype=torch.long)
            return inner[0][index], inner[1][index]
    return None


def _tensor_bytes(dataset: Any) -> int:
    if isinstance(dataset, Subset):
        # torch's Dataset declares no __len__; tensors have one
        return _tensor_bytes(dataset.dataset) * len(dataset) // max(len(dataset.dataset), 1)  # type: ignore[arg-type]
    return sum(t.numel() * t.element_size() for t in dataset.tensors)


def _available_bytes(device: torch.device) -> int:
    """Free memory of a GPU, or the memory available on the host (free plus what the OS would reclaim from its file
    cache: a long-running machine's free memory alone is often a small part of it)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    import psutil

    return int(psutil.virtual_memory().available)


def estimated_bytes(dataset: Dataset) -> int:
    """Bytes the resident copy would take: exact for tensors, else estimated from the first item (one file read)."""
    source = dataset.ds if isinstance(dataset, AugmentedImageDatastore) else dataset
    if holds_tensors(source):
        return _tensor_bytes(source)
    # torch's Dataset declares no __len__; the trainer checked it
    count = len(dataset)  # type: ignore[arg-type]
    if count == 0:
        return 0
    image = next(item[0] for i in range(count) if (item := _stored_item(dataset, i)) is not None)
    return count * (image.numel() * image.element_size() + 8)


def fits_on_device(dataset: Dataset, device: torch.device, budget_fraction: float = 0.5) -> bool:
    """True when the resident dataset takes at most `budget_fraction` of the device's free memory (RAM on CPU)."""
    try:
        len(dataset)  # type: ignore[arg-type]  # torch's Dataset declares no __len__; this checks it
    except TypeError:
        return False  # an IterableDataset cannot be indexed
    return estimated_bytes(dataset) <= budget_fraction * _available_bytes(torch.device(device))


class DeviceResidentData:
    """A dataset held whole as tensors; `epoch()` (the training loop) and `batches()` give (inputs, labels) on the
    device.

    Inputs come as the dataset gives them: a TensorDataset's own tensors (any dtype), float32 images in [0, 1] for
    datastores (augmented and sized per batch for an AugmentedImageDatastore). `keep_on_host=True` keeps the
    tensors in host memory for a GPU they do not fit on (each batch goes over through pinned memory).
    """

    def __init__(self, dataset: Dataset, device: torch.device | str, keep_on_host: bool = False) -> None:
        self.device = torch.device(device)
        self.augmented = dataset if isinstance(dataset, AugmentedImageDatastore) else None
        images, labels, self.decoded, self.skipped = _stored(dataset)
        home = torch.device("cpu") if keep_on_host and self.device.type == "cuda" else self.device
        self.images, self.labels = images.to(home), labels.to(home)
        self.classes = list(getattr(dataset, "classes", []))
        self._draws_generator = torch.Generator(device=home) if self.augmented is not None else None
        megabytes = self.images.numel() * self.images.element_size() / 1e6
        where = "host memory" if home != self.device else str(self.device)
        self.description = f"device-resident ({len(self.labels)} images, {megabytes:.1f} MB on {where})"
        if self.augmented is not None and self.augmented.augmenter is not None:
            self.description += f", augmented in batches on the {self.device.type.upper()}"

    def __len__(self) -> int:
        return len(self.labels)

    def epoch(self, rows: Rows, seed: int) -> Iterator[Batch]:
        """One batch per row of sample indices (the rows go to the data's device in one copy); an augmented
        dataset's random values for the pass are drawn at once from `seed`, each image's by its index."""
        images, labels, home, augmented = self.images, self.labels, self.images.device, self.augmented
        take = _take if home == self.device else functools.partial(_take_pinned, device=self.device)
        draws = None
        if augmented is not None:
            assert self._draws_generator is not None  # made with self.augmented
            draws = augmented.draw(len(self), self._draws_generator.manual_seed(seed), home)
        for index in _on_device(rows, home):
            inputs, targets = take(images, index), take(labels, index)
            if augmented is not None and draws is not None:
                inputs = augmented.apply(inputs, take(draws, index))
            elif self.decoded:
                inputs = to_float(inputs)
            yield inputs, targets

    def batches(self, batch_size: int, *, shuffle: bool, generator: torch.Generator | None = None,
                indices: torch.Tensor | None = None,
                drop_last: bool = False) -> Iterator[Batch]:
        """Mini-batches of `batch_size` on the device, the last one smaller unless `drop_last`.

        `indices` restricts the pass to those items (a shard), in that order unless `shuffle`; random draws
        (order, augmentation) come from `generator` (a CPU generator) when given.
        """
        order = torch.arange(len(self)) if indices is None else torch.as_tensor(indices, dtype=torch.long).cpu()
        if shuffle:
            order = order[torch.randperm(len(order), generator=generator)]
        rows = list(order.split(batch_size))
        if drop_last and rows and len(rows[-1]) < batch_size:
            rows.pop()
        # only augmentation takes a seed from the generator: unaugmented data leaves it as it was for the caller
        seed = int(torch.randint(2**62, (1,), generator=generator)) if self.augmented is not None else 0
        yield from self.epoch(rows, seed)


def _on_device(rows: Rows, device: torch.device) -> Sequence[torch.Tensor]:
    """The rows of indices on `device`, moved in one copy that does not make the host wait."""
    if isinstance(rows, torch.Tensor):
        return _moved(rows.contiguous(), device).unbind(0)
    if not rows:
        return ()
    sizes = [len(row) for row in rows]
    return _moved(torch.cat(list(rows)), device).split(sizes)


def _moved(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    if tensor.device == device:
        return tensor
    if device.type == "cuda":  # from pageable memory the copy would wait for the GPU to finish its queue
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def _take(tensor: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return tensor.index_select(0, index)


def _take_pinned(tensor: torch.Tensor, index: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Rows `index` of a host tensor on `device`, gathered into pinned memory so the copy does not make the
    host wait (the pinned block is reused only once the copy is done)."""
    out = torch.empty((len(index), *tensor.shape[1:]), dtype=tensor.dtype, pin_memory=True)
    return torch.index_select(tensor, 0, index, out=out).to(device, non_blocking=True)


# ---- what a dataset becomes ---------------------------------------------------------------------------------------

def _stored(dataset: Dataset) -> tuple[torch.Tensor, torch.Tensor, bool, int]:
    """(images, labels, decoded, skipped): the tensors kept for `dataset`; `decoded` when the images are a
    datastore's pixels (integer pixels become float per batch); `skipped` unreadable files left out."""
    augmented = dataset if isinstance(dataset, AugmentedImageDatastore) else None
    source = augmented.ds if augmented is not None else dataset
    tensors = whole_tensors(source)
    if tensors is not None:
        images, labels = tensors
        if augmented is not None:
            images, labels = convert_color(torch.as_tensor(images), augmented.color_preprocessing), labels.long()
        return images, labels, augmented is not None, 0
    if isinstance(source, ImageDatastore):
        items = _read_all(source, augmented)
    else:
        # torch's Dataset declares no __len__; the trainer checked it
        items = [_stored_item(dataset, index) for index in range(len(dataset))]  # type: ignore[arg-type]
    readable = [item for item in items if item is not None]
    skipped = len(items) - len(readable)
    if skipped:
        warnings.warn(f"Left out {skipped} unreadable image(s) of {len(items)} (on_error='skip').", stacklevel=4)
    if not readable:
        raise DatastoreError("DeviceResidentData: the dataset has no readable items.")
    pictures = _common_size([image for image, _ in readable], dataset)
    if len({picture.dtype for picture in pictures}) > 1:
        pictures = [to_float(picture) for picture in pictures]
    labels = torch.stack([torch.as_tensor(label) for _, label in readable])
    decoded = isinstance(source, ImageDatastore) or augmented is not None
    return torch.stack(pictures), as_labels(labels), decoded, skipped


def _read_all(source: ImageDatastore, augmented: AugmentedImageDatastore | None) -> list[Any]:
    """Every file of `source` read and decoded (None where unreadable and skipped): in threads where that pays
    (files on a network store, or images slow enough to decode), else one after the other (a small local file
    decodes in less time than handing it to a thread costs)."""
    def read(index: int) -> tuple[torch.Tensor, int] | None:
        raw, read_index = source.read_raw(index)
        if read_index != index:  # read_raw replaced an unreadable file by the next one: leave it out instead
            return None
        image = convert_color(raw, augmented.color_preprocessing) if augmented is not None else raw
        return image, source.label_index(index)

    def read_range(indices: range) -> list[Any]:
        return [read(index) for index in indices]

    count = len(source)
    started = time.perf_counter()
    items = read_range(range(min(count, _PROBE_FILES)))
    per_file = (time.perf_counter() - started) / max(len(items), 1)
    rest = range(len(items), count)
    remote = any(is_url(file) for file in source.files[:1])
    if not rest or (per_file < _THREADED_DECODE_FROM and not remote):
        return items + read_range(rest)
    workers = DECODE_THREADS if remote else (os.cpu_count() or 1)
    chunks = [rest[i:i + _FILES_PER_TASK] for i in range(0, len(rest), _FILES_PER_TASK)]
    with ThreadPoolExecutor(workers) as threads:
        return items + [item for chunk in threads.map(read_range, chunks) for item in chunk]


_PROBE_FILES = 16  # read first, one after the other, to time a file
_THREADED_DECODE_FROM = 150e-6  # seconds a file: slower files are decoded in threads
_FILES_PER_TASK = 16


def _stored_item(dataset: Dataset, index: int) -> tuple[torch.Tensor, Any] | None:
    """Item `index` as it is kept: the un-augmented image (integer pixels where read raw) and its label.

    None when the file is unreadable and the datastore skips such files (on_error="skip").
    """
    augmented = dataset if isinstance(dataset, AugmentedImageDatastore) else None
    source = augmented.ds if augmented is not None else dataset
    if isinstance(source, ImageDatastore):
        raw, read = source.read_raw(index)
        if read != index:
            return None
        image, label = raw, source.label_index(read)
    elif augmented is not None:
        return augmented.source_item(index)  # colour-converted; PIL images and arrays made tensors
    else:
        item = source[index]
        image, label = (item[0], item[1]) if isinstance(item, tuple | list) else (item, -1)
        image = torch.as_tensor(image)
    if augmented is not None:
        image = convert_color(image, augmented.color_preprocessing)
    return image, label


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
