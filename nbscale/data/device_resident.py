"""The resident loader: a whole dataset held as tensors where training runs, cut into mini-batches by index.

`DeviceResidentData` is the one loader for data that fits, like airbench's loader. What it holds is read by
nbscale.data.resident_tensors (tensors taken whole, files decoded once, on a pool each rank reading a block);
nbscale.data.residence decides whether "auto" keeps a dataset resident; `make_batch_source`
(nbscale.data.loading) chooses between this loader and streaming.
The tensors sit on the training device; on a GPU, tensors too large for it stay in host memory and each batch
is gathered into pinned memory and copied over without making the host wait. Each epoch the sample order goes
to the device once, and nothing in an epoch waits for the device. An AugmentedImageDatastore's images are
augmented and sized in whole batches where they are, each image by its own random values, drawn there for a
whole epoch at once.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from typing import Any, cast

import torch
from torch.utils.data import Dataset

from nbscale.data import resident_tensors
from nbscale.data.augmented import AugmentedImageDatastore
from nbscale.data.preparing import Progress, Readers
from nbscale.data.reading import to_float
from nbscale.data.residence import fits_on_device, residence
from nbscale.data.resident_tensors import holds_tensors

# fits_on_device, holds_tensors and residence are the loading decision's, kept importable from here
__all__ = ["DeviceResidentData", "Batch", "Rows", "fits_on_device", "holds_tensors", "residence"]

Batch = tuple[torch.Tensor, torch.Tensor]
Rows = torch.Tensor | Sequence[torch.Tensor]  # sample indices of each batch: a 2-D tensor, or 1-D tensors


class DeviceResidentData:
    """A dataset held whole as tensors; `epoch()` (the training loop) and `batches()` give (inputs, labels) on the
    device.

    Inputs come as the dataset gives them: a TensorDataset's own tensors (any dtype), float32 images in [0, 1] for
    datastores (augmented and sized per batch for an AugmentedImageDatastore). `keep_on_host=True` keeps the
    tensors in host memory for a GPU they do not fit on (each batch goes over through pinned memory).
    """

    def __init__(
        self,
        dataset: Dataset[Any],
        device: torch.device | str,
        keep_on_host: bool = False,
        *,
        rows: Sequence[int] | None = None,
        readers: Readers | None = None,
        progress: Progress | None = None,
        first: dict[int, Any] | None = None,
    ) -> None:
        """`rows` holds only those items of `dataset` (a pool rank's share of the validation data); `readers`
        reads the whole dataset together with the pool's other ranks, each reading a block of it
        (nbscale.data.preparing); `progress` counts the items read; `first` holds items already read, as
        {index: item} (what `residence` read to decide)."""
        self.device = torch.device(device)
        self.augmented = dataset if isinstance(dataset, AugmentedImageDatastore) else None
        stored = resident_tensors.stored(dataset, rows, readers, progress, first or {})
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

    def batches(
        self,
        batch_size: int,
        *,
        shuffle: bool,
        generator: torch.Generator | None = None,
        indices: torch.Tensor | None = None,
        drop_last: bool = False,
    ) -> Iterator[Batch]:
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
    return cast("Sequence[torch.Tensor]", _moved(torch.cat(list(rows)), device).split(sizes))


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
