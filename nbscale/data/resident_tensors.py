"""Reading a dataset into the tensors a resident loader keeps (nbscale.data.device_resident).

Tensors and TensorDatasets (and Subsets of them) are taken with whole-tensor operations, never item by item; an
ImageDatastore's files are decoded once, in threads where that pays, into one tensor that keeps their integer
pixels (uint8 for 8-bit files, a quarter of float32's memory); an AugmentedImageDatastore keeps its
colour-converted source images, un-augmented; any other Dataset is read item by item, once. On a pool the
ranks read together (nbscale.data.preparing.Readers): each reads a block of the items, they agree on the rows'
shape, and exchange the tensors, so each file is read once in all.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch.utils.data import Dataset, Subset, TensorDataset

from nbscale.cpus import available_cpus
from nbscale.data.augmented import AugmentedImageDatastore, convert_color, fit_to_size
from nbscale.data.datastore import ImageDatastore
from nbscale.data.labels import as_labels
from nbscale.data.preparing import Progress, Readers
from nbscale.data.reading import is_url, to_float
from nbscale.errors import DatastoreError
from nbscale.user_warnings import warn_user

# reading a file from a network store waits on I/O: many threads pay there
DECODE_THREADS = min(32, available_cpus() + 4)
_PROBE_FILES = 16  # read first, one after the other, to time a file
_THREADED_DECODE_FROM = 150e-6  # seconds a file: slower files are decoded in threads
_FILES_PER_TASK = 16


def unwrapped(dataset: Dataset[Any]) -> tuple[AugmentedImageDatastore | None, Dataset[Any]]:
    """(the AugmentedImageDatastore `dataset` is, or None; the dataset whose items are read: its source, or
    `dataset` itself)."""
    if isinstance(dataset, AugmentedImageDatastore):
        return dataset, dataset.ds
    return None, dataset


def holds_tensors(dataset: object) -> bool:
    """True for a TensorDataset of (inputs, labels) or a Subset of one: data `whole_tensors` takes at once."""
    if isinstance(dataset, Subset):
        return holds_tensors(dataset.dataset)
    return isinstance(dataset, TensorDataset) and len(dataset.tensors) == 2


def whole_tensors(dataset: object) -> tuple[torch.Tensor, torch.Tensor] | None:
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


@dataclass
class Stored:
    """What a dataset is kept as: images, labels, whether the images are a datastore's pixels (integer pixels
    become float per batch), how many unreadable files were left out, each kept row's index in the dataset where
    only some rows are kept (else None), and whether files or items were read (tensors are not)."""

    images: torch.Tensor
    labels: torch.Tensor
    decoded: bool
    skipped: int
    origin: torch.Tensor | None
    read: bool


def stored(
    dataset: Dataset[Any],
    rows: Sequence[int] | None,
    readers: Readers | None,
    progress: Progress | None,
    first: dict[int, Any],
) -> Stored:
    """The tensors kept for `dataset` (its `rows` only, when given); with `readers`, this rank reads its block of
    the items and gets the others' from them. `first` holds items already read, by index.

    Raises DatastoreError when no item is readable, or the items cannot be stacked (see `_Shape`).
    """
    augmented, source = unwrapped(dataset)
    wanted = torch.as_tensor(rows, dtype=torch.long) if rows is not None else None
    tensors = whole_tensors(source)
    if tensors is not None:  # nothing to read: every rank takes what it needs
        images, labels = tensors if wanted is None else (tensors[0][wanted], tensors[1][wanted])
        if augmented is not None:
            images, labels = convert_color(torch.as_tensor(images), augmented.color_preprocessing), labels.long()
        return Stored(images, labels, augmented is not None, 0, wanted, read=False)
    count = len(dataset)  # type: ignore[arg-type]
    indices = readers.block(count) if readers is not None else (rows if rows is not None else range(count))
    items = _read(dataset, indices, progress, first)
    kept = [index for index, item in zip(indices, items, strict=True) if item is not None]
    readable = [item for item in items if item is not None]
    shape = _Shape.of(readable, skipped=len(items) - len(readable))
    counts = [len(readable)]
    if readers is not None:  # the ranks agree on what the rows look like before they exchange them
        shapes = readers.exchange(shape)
        shape, counts = _Shape.merged(shapes), [each.count for each in shapes]
    if shape.skipped and (readers is None or readers.position == 0):
        warn_user(f"Left out {shape.skipped} unreadable image(s) of {shape.skipped + shape.count} (on_error='skip').")
    if not shape.count:
        raise DatastoreError("DeviceResidentData: the dataset has no readable items.")
    images, labels = shape.stack(readable, dataset)
    if readers is not None:
        images, labels = readers.gather_rows(images, counts), readers.gather_rows(labels, counts)
    decoded = isinstance(source, ImageDatastore) or augmented is not None
    origin = torch.as_tensor(kept, dtype=torch.long) if rows is not None and readers is None else None
    return Stored(images, as_labels(labels), decoded, shape.skipped, origin, read=True)


@dataclass
class _Shape:
    """What the items read have in common, so that every rank of a pool makes them the same rows: image sizes
    (C, H, W), dtypes, label shapes and dtypes, and the counts of readable and skipped items."""

    sizes: set[tuple[int, ...]]
    dtypes: set[torch.dtype]
    labels: set[tuple[tuple[int, ...], torch.dtype]]
    count: int
    skipped: int

    @classmethod
    def of(cls, items: list[Any], skipped: int = 0) -> _Shape:
        return cls(
            {tuple(image.shape) for image, _ in items},
            {image.dtype for image, _ in items},
            {(tuple(label.shape), label.dtype) for label in (torch.as_tensor(label) for _, label in items)},
            len(items),
            skipped,
        )

    @classmethod
    def merged(cls, shapes: list[_Shape]) -> _Shape:
        return cls(
            set().union(*(s.sizes for s in shapes)),
            set().union(*(s.dtypes for s in shapes)),
            set().union(*(s.labels for s in shapes)),
            sum(s.count for s in shapes),
            sum(s.skipped for s in shapes),
        )

    def stack(self, items: list[Any], dataset: Dataset[Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """The items as (images, labels) tensors whose rows are alike on every rank: images brought to one size,
        and to float32 where sizes or dtypes differ; an empty block for a rank that read none."""
        row = self.row_shape(dataset)
        if len(self.labels) > 1:
            raise DatastoreError(
                f"The labels differ in shape or type ({sorted(map(str, self.labels))[:3]}), so "
                "they cannot be batched: give every item a label of the same kind."
            )
        ((label_shape, label_dtype),) = self.labels
        floats = len(self.sizes) > 1 or len(self.dtypes) > 1
        dtype = torch.float32 if floats else next(iter(self.dtypes))
        if not items:
            return torch.empty((0, *row), dtype=dtype), torch.empty((0, *label_shape), dtype=label_dtype)
        images = [_fitted(image, row, dataset) for image, _ in items]
        images = [to_float(image) if floats else image for image in images]
        labels = torch.stack([torch.as_tensor(label).to(label_dtype) for _, label in items])
        return torch.stack(images), labels

    def row_shape(self, dataset: Dataset[Any]) -> tuple[int, ...]:
        """The shape every image is brought to: images of different sizes only in an AugmentedImageDatastore
        (resized, or centre-cropped to the smallest), and in any case with one channel count."""
        if len(self.sizes) == 1:
            return next(iter(self.sizes))
        leading = {size[:-2] for size in self.sizes}
        if len(leading) > 1:
            channels = ", ".join(sorted(str(size[0]) if size else "none" for size in leading))
            raise DatastoreError(
                f"The images differ in channels ({channels}), so they cannot be batched: wrap the "
                "datastore in AugmentedImageDatastore(output_size, ds, color_preprocessing="
                "'gray2rgb') (or 'rgb2gray')."
            )
        sizes = {size[-2:] for size in self.sizes}
        if not isinstance(dataset, AugmentedImageDatastore):
            raise DatastoreError(
                f"The images differ in size ({len(sizes)} sizes, e.g. {sorted(sizes)[:3]}), so they "
                "cannot be batched: wrap the datastore in AugmentedImageDatastore(output_size, ds)."
            )
        # resize mode: resize now; crop modes: centre-crop to the smallest height and width, crop further per batch
        if dataset.output_size_mode == "resize":
            target = dataset.output_size
        else:
            target = (min(s[0] for s in sizes), min(s[1] for s in sizes))
        return (*next(iter(leading)), *target)


def _fitted(image: torch.Tensor, row: tuple[int, ...], dataset: Dataset[Any]) -> torch.Tensor:
    """`image` brought to the shape `row` (only an AugmentedImageDatastore's images can differ from it)."""
    if tuple(image.shape) == row:
        return image
    mode = "resize" if dataset.output_size_mode == "resize" else "centercrop"  # type: ignore[attr-defined]
    return fit_to_size(to_float(image)[None], row[-2:], mode)[0]  # type: ignore[arg-type]


def _read(dataset: Dataset[Any], indices: Sequence[int], progress: Progress | None, first: dict[int, Any]) -> list[Any]:
    """Items `indices` of `dataset` as they are kept (None where unreadable and skipped); `first` holds items
    already read."""
    progress = progress or Progress()
    progress.start(len(indices))
    augmented, source = unwrapped(dataset)
    if isinstance(source, ImageDatastore):
        return _read_files(source, augmented, indices, progress, first)
    items = []
    for index in indices:
        items.append(first[index] if index in first else stored_item(dataset, index))
        progress.add(1)
    return items


def _read_files(
    source: ImageDatastore,
    augmented: AugmentedImageDatastore | None,
    indices: Sequence[int],
    progress: Progress,
    first: dict[int, Any],
) -> list[Any]:
    """Files `indices` of `source` read and decoded (None where unreadable and skipped): in threads where that
    pays (files on a network store, or images slower to decode than _THREADED_DECODE_FROM), else one after the
    other (a small local file decodes in less time than handing it to a thread costs)."""

    def read(index: int) -> tuple[torch.Tensor, int] | None:
        if index in first:
            return cast("tuple[torch.Tensor, int] | None", first[index])
        raw, read_index = source.read_raw(index)
        if read_index != index:  # read_raw replaced an unreadable file by the next one: leave it out instead
            return None
        image = convert_color(raw, augmented.color_preprocessing) if augmented is not None else raw
        return image, source.label_index(index)

    def read_range(chunk: Sequence[int]) -> list[Any]:
        return [read(index) for index in chunk]

    started = time.perf_counter()
    items = read_range(indices[:_PROBE_FILES])
    progress.add(len(items))
    per_file = (time.perf_counter() - started) / max(len(items), 1)
    rest = indices[len(items) :]
    chunks = [rest[i : i + _FILES_PER_TASK] for i in range(0, len(rest), _FILES_PER_TASK)]
    remote = any(is_url(source.files[index]) for index in indices[:1])
    if per_file < _THREADED_DECODE_FROM and not remote:
        return items + _counted(map(read_range, chunks), progress)
    threads = ThreadPoolExecutor(DECODE_THREADS if remote else available_cpus())
    try:
        return items + _counted(threads.map(read_range, chunks), progress)
    finally:  # after an error or an interrupt, the files not begun are not read
        threads.shutdown(wait=False, cancel_futures=True)


def _counted(chunks: Iterator[list[Any]], progress: Progress) -> list[Any]:
    """The items of `chunks`, counted in `progress` as each chunk comes in."""
    items: list[Any] = []
    for chunk in chunks:
        items += chunk
        progress.add(len(chunk))
    return items


def stored_item(dataset: Dataset[Any], index: int) -> tuple[torch.Tensor, Any] | None:
    """Item `index` as it is kept: the un-augmented image (integer pixels where read raw) and its label.

    None when the file is unreadable and the datastore skips such files (on_error="skip").
    """
    augmented, source = unwrapped(dataset)
    if isinstance(source, ImageDatastore):
        raw, read = source.read_raw(index)
        if read != index:
            return None
        image, label = raw, source.label_index(read)
    elif augmented is not None:
        return augmented.source_item(index)  # colour-converted; PIL images and arrays made tensors
    else:
        item = source[index]
        image, label = (item[0], item[1]) if is_pair(item) else (item, -1)
        image = torch.as_tensor(image)
    if augmented is not None:
        image = convert_color(image, augmented.color_preprocessing)
    return image, label


def is_pair(item: object) -> bool:
    return isinstance(item, tuple | list) and len(item) >= 2
