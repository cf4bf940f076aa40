"""The resident loader: a whole dataset held as tensors where training runs, cut into mini-batches by index.

`DeviceResidentData` is the one loader for data that fits, like airbench's loader:
- tensors and TensorDatasets (and Subsets of them) are taken with whole-tensor operations, never item by item;
- an ImageDatastore's files are decoded once (in threads where that pays) into one tensor (uint8 for 8-bit files: 4x less
  memory than float32);
- an AugmentedImageDatastore over either keeps its colour-converted source images and augments and sizes whole
  batches where they are, each image by its own random values, drawn there for a whole epoch at once;
- any other Dataset is read item by item, once.
On a pool the ranks read a dataset together (nbscale.train.preparing.Readers): each reads and decodes a block of
the items and they exchange the tensors, so each file is read once in all; a rank may also hold only some rows
(its share of the validation data). `residence` decides whether "auto" keeps a dataset resident.
The tensors sit on the training device; on a GPU, tensors too large for it stay in host memory and each batch
is gathered into pinned memory and copied over without making the host wait. Each epoch the sample order goes
to the device once, and nothing in an epoch waits for the device. `make_batch_source` (nbscale.train.loading)
chooses between this loader and streaming.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import Dataset, Subset, TensorDataset

from nbscale.data.augmented import AugmentedImageDatastore, convert_color, fit_to_size
from nbscale.data.datastore import ImageDatastore
from nbscale.data.reading import is_url, to_float
from nbscale.errors import DatastoreError
from nbscale.train.labels import as_labels
from nbscale.train.preparing import Progress, Readers
from nbscale.user_warnings import warn_user

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


def estimated_bytes(dataset: Dataset) -> int:
    """Bytes the resident copy would take: exact for tensors, else estimated from the first item (one file read)."""
    source = dataset.ds if isinstance(dataset, AugmentedImageDatastore) else dataset
    if holds_tensors(source):
        return _tensor_bytes(source)
    count = len(dataset)  # type: ignore[arg-type]
    if count == 0:
        return 0
    image = next(item[0] for i in range(count) if (item := _stored_item(dataset, i)) is not None)
    return count * (image.numel() * image.element_size() + 8)


def fits_on_device(dataset: Dataset, device: torch.device, budget_fraction: float = 0.5) -> bool:
    """True when the resident dataset takes at most `budget_fraction` of the device's free memory (RAM on CPU)."""
    try:
        len(dataset)  # type: ignore[arg-type]
    except TypeError:
        return False  # an IterableDataset cannot be indexed
    return estimated_bytes(dataset) <= budget_fraction * _available_bytes(torch.device(device))


def residence(dataset: Dataset, device: torch.device, *, rows: Sequence[int] | None = None,
              readers: Readers | None = None, budget_fraction: float = 0.5) -> tuple[bool, dict[int, Any]]:
    """Whether `data_placement="auto"` keeps `dataset` (its `rows` only, when given) resident: its items have
    class labels and tensor inputs, and take at most `budget_fraction` of the device's free memory (the host's
    for the CPU). Reads one item, returned as {index: item} for `DeviceResidentData(first=...)`, so it is not
    read again. With `readers` (a pool) the first reader reads it and every rank takes the same decision, with
    the least free memory among them."""
    try:
        count = len(dataset)  # type: ignore[arg-type]
    except TypeError:
        return False, {}  # an IterableDataset cannot be indexed
    source = dataset.ds if isinstance(dataset, AugmentedImageDatastore) else dataset
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


def _probe(dataset: Dataset, indices: Sequence[int], count: int) -> tuple[int | None, dict[int, Any]]:
    """(bytes `count` items would take resident, judged by the first readable one of `indices`, or None where
    the items are no (tensor input, class label) pairs; the items read, by index, as they are kept)."""
    first: dict[int, Any] = {}
    datastore = isinstance(dataset, AugmentedImageDatastore | ImageDatastore)
    for index in indices:
        if datastore:  # labels are class indices
            item = first[index] = _stored_item(dataset, index)
        else:  # other labels (regression targets) are streamed under "auto", as they always were
            raw = dataset[index]
            if not _is_pair(raw) or not _is_class_label(raw[1]):
                return None, first
            try:
                item = first[index] = (torch.as_tensor(raw[0]), raw[1])
            except (TypeError, ValueError, RuntimeError):  # an input that is no tensor: streamed, as it comes
                return None, first
        if item is not None:
            return count * (item[0].numel() * item[0].element_size() + 8), first
    return 0, first


class DeviceResidentData:
    """A dataset held whole as tensors; `epoch()` (the training loop) and `batches()` give (inputs, labels) on the
    device.

    Inputs come as the dataset gives them: a TensorDataset's own tensors (any dtype), float32 images in [0, 1] for
    datastores (augmented and sized per batch for an AugmentedImageDatastore). `keep_on_host=True` keeps the
    tensors in host memory for a GPU they do not fit on (each batch goes over through pinned memory).
    """

    def __init__(self, dataset: Dataset, device: torch.device | str, keep_on_host: bool = False, *,
                 rows: Sequence[int] | None = None, readers: Readers | None = None, progress: Progress | None = None,
                 first: dict[int, Any] | None = None) -> None:
        """`rows` holds only those items of `dataset` (a pool rank's share of the validation data); `readers`
        reads the whole dataset together with the pool's other ranks, each reading a block of it
        (nbscale.train.preparing); `progress` counts the items read; `first` holds items already read, as
        {index: item} (what `residence` read to decide)."""
        self.device = torch.device(device)
        self.augmented = dataset if isinstance(dataset, AugmentedImageDatastore) else None
        stored = _stored(dataset, rows, readers, progress, first or {})
        self.decoded, self.skipped = stored.decoded, stored.skipped
        home = torch.device("cpu") if keep_on_host and self.device.type == "cuda" else self.device
        self.images, self.labels = stored.images.to(home), stored.labels.to(home)
        # a part draws each image's random values at its index in the whole dataset, as the whole set would
        self._origin = stored.origin.to(home) if stored.origin is not None else None
        self._dataset_size = len(dataset)  # type: ignore[arg-type]
        self.classes = list(getattr(dataset, "classes", []))
        self._draws_generator = torch.Generator(device=home) if self.augmented is not None else None
        megabytes = self.images.numel() * self.images.element_size() / 1e6
        where = "host memory" if home != self.device else str(self.device)
        self.description = f"device-resident ({len(self.labels)} images, {megabytes:.1f} MB on {where})"
        if readers is not None and stored.read:
            self.description += f" on each of {readers.count} workers, which read 1/{readers.count} of it each"
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
            generator = self._draws_generator.manual_seed(seed)
            if self._origin is None:
                draws = augmented.draw(len(self), generator, home)
            else:
                draws = augmented.draw(self._dataset_size, generator, home).index_select(0, self._origin)
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

@dataclass
class _Stored:
    """What a dataset is kept as: images, labels, whether the images are a datastore's pixels (integer pixels
    become float per batch), how many unreadable files were left out, each kept row's index in the dataset where
    only some rows are kept (else None), and whether files or items were read (tensors are not)."""

    images: torch.Tensor
    labels: torch.Tensor
    decoded: bool
    skipped: int
    origin: torch.Tensor | None
    read: bool


def _stored(dataset: Dataset, rows: Sequence[int] | None, readers: Readers | None, progress: Progress | None,
            first: dict[int, Any]) -> _Stored:
    """The tensors kept for `dataset` (its `rows` only, when given); with `readers`, this rank reads its block of
    the items and gets the others' from them."""
    augmented = dataset if isinstance(dataset, AugmentedImageDatastore) else None
    source = augmented.ds if augmented is not None else dataset
    wanted = torch.as_tensor(rows, dtype=torch.long) if rows is not None else None
    tensors = whole_tensors(source)
    if tensors is not None:  # nothing to read: every rank takes what it needs
        images, labels = tensors if wanted is None else (tensors[0][wanted], tensors[1][wanted])
        if augmented is not None:
            images, labels = convert_color(torch.as_tensor(images), augmented.color_preprocessing), labels.long()
        return _Stored(images, labels, augmented is not None, 0, wanted, read=False)
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
        warn_user(f"Left out {shape.skipped} unreadable image(s) of {shape.skipped + shape.count} "
                  "(on_error='skip').")
    if not shape.count:
        raise DatastoreError("DeviceResidentData: the dataset has no readable items.")
    images, labels = shape.stack(readable, dataset)
    if readers is not None:
        images, labels = readers.gather_rows(images, counts), readers.gather_rows(labels, counts)
    decoded = isinstance(source, ImageDatastore) or augmented is not None
    origin = torch.as_tensor(kept, dtype=torch.long) if rows is not None and readers is None else None
    return _Stored(images, as_labels(labels), decoded, shape.skipped, origin, read=True)


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
        return cls({tuple(image.shape) for image, _ in items}, {image.dtype for image, _ in items},
                   {(tuple(label.shape), label.dtype) for label in (torch.as_tensor(label) for _, label in items)},
                   len(items), skipped)

    @classmethod
    def merged(cls, shapes: list[_Shape]) -> _Shape:
        return cls(set().union(*(s.sizes for s in shapes)), set().union(*(s.dtypes for s in shapes)),
                   set().union(*(s.labels for s in shapes)), sum(s.count for s in shapes),
                   sum(s.skipped for s in shapes))

    def stack(self, items: list[Any], dataset: Dataset) -> tuple[torch.Tensor, torch.Tensor]:
        """The items as (images, labels) tensors whose rows are alike on every rank: images brought to one size,
        and to float32 where sizes or dtypes differ; an empty block for a rank that read none."""
        row = self.row_shape(dataset)
        if len(self.labels) > 1:
            raise DatastoreError(f"The labels differ in shape or type ({sorted(map(str, self.labels))[:3]}), so "
                                 "they cannot be batched: give every item a label of the same kind.")
        ((label_shape, label_dtype),) = self.labels
        floats = len(self.sizes) > 1 or len(self.dtypes) > 1
        dtype = torch.float32 if floats else next(iter(self.dtypes))
        if not items:
            return torch.empty((0, *row), dtype=dtype), torch.empty((0, *label_shape), dtype=label_dtype)
        images = [_fitted(image, row, dataset) for image, _ in items]
        images = [to_float(image) if floats else image for image in images]
        labels = torch.stack([torch.as_tensor(label).to(label_dtype) for _, label in items])
        return torch.stack(images), labels

    def row_shape(self, dataset: Dataset) -> tuple[int, ...]:
        """The shape every image is brought to: images of different sizes only in an AugmentedImageDatastore
        (resized, or centre-cropped to the smallest), and in any case with one channel count."""
        if len(self.sizes) == 1:
            return next(iter(self.sizes))
        leading = {size[:-2] for size in self.sizes}
        if len(leading) > 1:
            channels = ", ".join(sorted(str(size[0]) if size else "none" for size in leading))
            raise DatastoreError(f"The images differ in channels ({channels}), so they cannot be batched: wrap the "
                                 "datastore in AugmentedImageDatastore(output_size, ds, color_preprocessing="
                                 "'gray2rgb') (or 'rgb2gray').")
        sizes = {size[-2:] for size in self.sizes}
        if not isinstance(dataset, AugmentedImageDatastore):
            raise DatastoreError(f"The images differ in size ({len(sizes)} sizes, e.g. {sorted(sizes)[:3]}), so they "
                                 "cannot be batched: wrap the datastore in AugmentedImageDatastore(output_size, ds).")
        # resize mode: resize now; crop modes: centre-crop to the smallest height and width, crop further per batch
        if dataset.output_size_mode == "resize":
            target = dataset.output_size
        else:
            target = (min(s[0] for s in sizes), min(s[1] for s in sizes))
        return (*next(iter(leading)), *target)


def _fitted(image: torch.Tensor, row: tuple[int, ...], dataset: Dataset) -> torch.Tensor:
    """`image` brought to the shape `row` (only an AugmentedImageDatastore's images can differ from it)."""
    if tuple(image.shape) == row:
        return image
    mode = "resize" if dataset.output_size_mode == "resize" else "centercrop"  # type: ignore[attr-defined]
    return fit_to_size(to_float(image)[None], row[-2:], mode)[0]  # type: ignore[arg-type]


def _read(dataset: Dataset, indices: Sequence[int], progress: Progress | None,
          first: dict[int, Any]) -> list[Any]:
    """Items `indices` of `dataset` as they are kept (None where unreadable and skipped); `first` holds items
    already read."""
    progress = progress or Progress()
    progress.start(len(indices))
    augmented = dataset if isinstance(dataset, AugmentedImageDatastore) else None
    source = augmented.ds if augmented is not None else dataset
    if isinstance(source, ImageDatastore):
        return _read_files(source, augmented, indices, progress, first)
    items = []
    for index in indices:
        items.append(first[index] if index in first else _stored_item(dataset, index))
        progress.add(1)
    return items


def _read_files(source: ImageDatastore, augmented: AugmentedImageDatastore | None, indices: Sequence[int],
                progress: Progress, first: dict[int, Any]) -> list[Any]:
    """Files `indices` of `source` read and decoded (None where unreadable and skipped): in threads where that
    pays (files on a network store, or images slow enough to decode), else one after the other (small local
    files decode in tens of microseconds, less than handing them to a thread costs)."""
    def read(index: int) -> tuple[torch.Tensor, int] | None:
        if index in first:
            return first[index]
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
    rest = indices[len(items):]
    chunks = [rest[i:i + _FILES_PER_TASK] for i in range(0, len(rest), _FILES_PER_TASK)]
    remote = any(is_url(source.files[index]) for index in indices[:1])
    if per_file < _THREADED_DECODE_FROM and not remote:
        return items + _counted(map(read_range, chunks), progress)
    threads = ThreadPoolExecutor(DECODE_THREADS if remote else (os.cpu_count() or 1))
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
        image, label = (item[0], item[1]) if _is_pair(item) else (item, -1)
        image = torch.as_tensor(image)
    if augmented is not None:
        image = convert_color(image, augmented.color_preprocessing)
    return image, label


def _is_pair(item: Any) -> bool:
    return isinstance(item, tuple | list) and len(item) >= 2


def _is_class_label(label: Any) -> bool:
    try:
        value = torch.as_tensor(label)
    except (TypeError, ValueError, RuntimeError):  # a label that is no number
        return False
    return value.ndim == 0 and not value.is_floating_point() and not value.is_complex() and value.dtype != torch.bool
