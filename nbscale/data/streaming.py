"""Streaming: mini-batches read through a torch DataLoader, in background processes when asked.

The loop replaces the DataLoader's batch indices every epoch (so its processes persist); an
AugmentedImageDatastore is augmented by seed, as the resident loader (nbscale.data.device_resident) augments it,
so both paths give every image the same random values. `make_batch_source` (nbscale.data.loading) chooses
between this loader and the resident one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Subset

from nbscale.cpus import available_cpus
from nbscale.data.batches import to_device
from nbscale.data.labels import as_labels
from nbscale.data.loader_data import LoaderData, loader_of
from nbscale.errors import OptionsError

Batch = tuple[torch.Tensor, torch.Tensor]


class _EpochBatchSampler:
    """A batch sampler whose index lists the loop replaces every epoch (so DataLoader workers persist); with a
    `seed`, each index goes as (index, seed), for `_AugmentedBySeed`."""

    def __init__(self) -> None:
        self.lists: torch.Tensor | Sequence[torch.Tensor] = []
        self.seed: int | None = None

    def __iter__(self) -> Iterator[list[Any]]:
        if self.seed is None:
            return (indices.tolist() for indices in self.lists)
        return ([(index, self.seed) for index in indices.tolist()] for indices in self.lists)

    def __len__(self) -> int:
        return len(self.lists)


class StreamBatches:
    """Batches read through a torch DataLoader, in background processes when asked.

    The DataLoader draws its processes' seeds from its own generator, seeded by `seed`, not from torch's global
    random stream (a draw each epoch without background processes): so the network's own random numbers (dropout)
    come out as when the data are resident."""

    def __init__(self, dataset: Dataset[Any], device: torch.device, background: bool, seed: int) -> None:
        from nbscale.data.augmented import AugmentedImageDatastore

        self.dataset = dataset
        self.sampler = _EpochBatchSampler()
        self.device = device
        self.by_seed = isinstance(dataset, AugmentedImageDatastore)
        loader = loader_of(dataset)  # a user's DataLoader: its collate_fn and worker settings
        workers, settings = _reading(loader, background, device)
        collate: Callable[[list[Any]], Any] | None = loader.collate_fn if loader is not None else None
        # a DataLoader's own dataset, as its worker_init_fn finds it in get_worker_info().dataset
        read, self.positions = _users_dataset(dataset)
        read = _AugmentedBySeed(read) if self.by_seed else read
        self.loader = DataLoader(
            read,
            batch_sampler=self.sampler,
            num_workers=workers,
            collate_fn=collate,
            generator=torch.Generator().manual_seed(seed),
            **settings,
        )
        self.description = (
            f"streamed by a DataLoader ({workers} background workers)" if workers else "streamed by a DataLoader"
        )

    def __len__(self) -> int:
        # torch's Dataset declares no __len__; as_dataset checked it
        return len(self.dataset)  # type: ignore[arg-type]

    def close(self) -> None:
        """Stop the background processes now. A run that failed leaves its traceback in the notebook (IPython keeps
        it), whose frames hold this source, its epoch's generator and the DataLoader's iterator, so the processes
        would live on, two more with every failed run."""
        _stop_worker_processes(self.loader)

    def epoch(self, rows: torch.Tensor | Sequence[torch.Tensor], seed: int) -> Iterator[Batch]:
        self.sampler.lists = rows if self.positions is None else [self.positions[row] for row in rows]
        self.sampler.seed = seed if self.by_seed else None
        non_blocking, device = self.device.type == "cuda", self.device
        for batch in self.loader:  # nested inputs and targets (tuples, dicts) move whole
            x, y = _inputs_and_targets(batch)
            y = to_device(y, device, non_blocking)
            yield to_device(x, device, non_blocking), (as_labels(y) if isinstance(y, torch.Tensor) else y)


def _users_dataset(dataset: Dataset[Any]) -> tuple[Dataset[Any], torch.Tensor | None]:
    """(the dataset to read, where each of `dataset`'s items sits in it or None): the user's own dataset inside
    a DataLoader's (LoaderData, or Subsets of one), else `dataset` itself."""
    if loader_of(dataset) is None:
        return dataset, None
    positions = None
    while isinstance(dataset, Subset):
        chosen = torch.as_tensor(dataset.indices, dtype=torch.long)
        positions = chosen if positions is None else chosen[positions]
        dataset = dataset.dataset
    assert isinstance(dataset, LoaderData)  # loader_of found it
    return dataset.dataset, positions


def _reading(loader: LoaderData | None, background: bool, device: torch.device) -> tuple[int, dict[str, Any]]:
    """(worker processes, DataLoader settings): a user's DataLoader's own (num_workers, worker_init_fn, timeout,
    persistent_workers, pin_memory, prefetch_factor, ...); nbscale's (4 persistent processes, pinned memory on a
    GPU) for its own data, or when dispatch_in_background=True asks for processes a DataLoader has none of."""
    own: dict[str, Any] = {"pin_memory": device.type == "cuda"}
    workers = min(4, available_cpus()) if background else 0
    if loader is not None and (loader.num_workers or not background):
        return loader.num_workers, dict(loader.workers)
    if workers:
        own.update(persistent_workers=True, prefetch_factor=4)
    if loader is not None:  # its worker_init_fn, timeout and start method apply to nbscale's processes too
        own.update({key: loader.workers[key] for key in ("worker_init_fn", "timeout", "multiprocessing_context")})
    return workers, own


def _inputs_and_targets(batch: object) -> tuple[Any, Any]:
    """A DataLoader's batch as (inputs, targets); an OptionsError naming collate_fn when it is not such a pair."""
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return batch[0], batch[1]
    shape = getattr(batch, "shape", None)
    got = f"a {type(batch).__name__}" + (f" of shape {tuple(shape)}" if shape is not None else "")
    if isinstance(batch, (tuple, list)):
        got = f"a {type(batch).__name__} of {len(batch)} elements"
    raise OptionsError(
        f"The DataLoader's collate_fn returned {got} for a batch, not (inputs, targets): "
        "return both, as torch's default collate does (a tuple of the batch's inputs and its targets)."
    )


def _stop_worker_processes(loader: DataLoader[Any]) -> None:
    """Stop the persistent worker processes of `loader` now (the next epoch would start new ones).

    torch has no public call for this. Its iterator stops them when freed (`__del__`), but freeing is not in our
    hands: a failed run's traceback can hold the iterator itself (a read error in a loader process is raised again
    from the iterator's own frames, whose `self` IPython's kept traceback keeps). So this calls what `__del__`
    calls, the iterator's private `_shutdown_workers`, which the DataLoader keeps in its private `_iterator`."""
    iterator = getattr(loader, "_iterator", None)
    if iterator is not None and hasattr(iterator, "_shutdown_workers"):
        iterator._shutdown_workers()
    loader._iterator = None


class _AugmentedBySeed(Dataset[tuple[torch.Tensor, int]]):
    """An AugmentedImageDatastore read by a DataLoader, each image augmented by the random values of its index
    in the pass's draws from the epoch's seed, as DeviceResidentData draws them: so training streamed (in background
    processes or not), resident, on a pool's workers (each reading its share) or resumed from a checkpoint augments
    every image alike, where a loader process's own random stream would depend on which process read which batch.
    The sampler sends (index, seed) pairs; each loader process draws an epoch's values once (N rows of a few
    floats)."""

    def __init__(self, augmented: Any) -> None:
        self.augmented = augmented
        self.seed: int | None = None
        self.draws = torch.empty(0)

    def __len__(self) -> int:
        return len(self.augmented)

    def __getitem__(self, key: tuple[int, int]) -> tuple[torch.Tensor, int]:
        return self.__getitems__([key])[0]

    def __getitems__(self, keys: Sequence[tuple[int, int]]) -> list[tuple[torch.Tensor, int]]:
        seed = keys[0][1]
        if seed != self.seed:
            self.seed, self.draws = seed, self.augmented.draw(len(self.augmented), torch.Generator().manual_seed(seed))
        indices = [index for index, _ in keys]
        items = [self.augmented.source_item(index) for index in indices]
        draws = self.draws[indices]
        if len({tuple(image.shape) for image, _ in items}) > 1:  # images of different sizes: one at a time
            return [
                (self.augmented.apply(image[None], draws[k : k + 1])[0], label)
                for k, (image, label) in enumerate(items)
            ]
        batch = self.augmented.apply(torch.stack([image for image, _ in items]), draws)
        return list(zip(batch.unbind(0), [label for _, label in items], strict=True))
