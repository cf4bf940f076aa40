"""A user's `torch.utils.data.DataLoader` as `train_data` / `validation_data`: the loader keeps its PyTorch meaning.

nbscale keeps the loader's dataset and every setting that says how it is read: its batch sampler (shuffle or its
own sampler, batch_size, drop_last), its generator, collate_fn, and its worker settings (num_workers,
worker_init_fn, timeout, persistent_workers, pin_memory, prefetch_factor, multiprocessing_context, in_order).
nbscale.data.loader_order draws each epoch's batches as iterating the loader would; nbscale.data.streaming reads
them with the loader's worker settings. What nbscale cannot follow is refused by name: a batch sampler of the
user's own (the pool splits each mini-batch across workers), an IterableDataset, a dataset without __len__.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, IterableDataset, Subset, default_collate

from nbscale.errors import OptionsError

_SUPPORTED = (
    "DataLoader(dataset, batch_size=..., shuffle=... or sampler=..., drop_last=..., collate_fn=..., generator=..., "
    "and its worker settings): a map-style dataset"
)


class LoaderData(Dataset[Any]):
    """The dataset of a DataLoader, with how the loader reads it. Indexing and length are the dataset's.

    `batch_sampler` is the loader's own (a BatchSampler over its sampler), `generator` the loader's (None: torch's
    global stream), `collate_fn` None for torch's default, `workers` the keyword arguments of its worker settings.
    """

    def __init__(
        self,
        dataset: Dataset[Any],
        collate_fn: Any,
        num_workers: int,
        batch_size: int,
        *,
        batch_sampler: Iterable[list[int]] | None = None,
        generator: torch.Generator | None = None,
        drop_last: bool = False,
        workers: dict[str, Any] | None = None,
    ) -> None:
        self.dataset, self.collate_fn, self.num_workers, self.batch_size = dataset, collate_fn, num_workers, batch_size
        self.batch_sampler, self.generator, self.drop_last = batch_sampler, generator, drop_last
        self.workers = dict(workers or {})

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]  # a map-style dataset: loader_data checked it

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]

    @property
    def classes(self) -> list[Any]:
        """The dataset's class names, where it has them (torchvision's datasets, nbscale's datastores)."""
        return list(getattr(self.dataset, "classes", []))

    @property
    def persistent_workers(self) -> bool:
        """True when the loader keeps its worker processes between epochs (it then draws one base seed only)."""
        return bool(self.workers.get("persistent_workers")) and self.num_workers > 0


def loader_data(loader: DataLoader[Any], what: str = "train_data") -> LoaderData:
    """`loader` as a LoaderData; OptionsError naming `what` for what nbscale cannot take from a DataLoader."""
    name = f"{what} is a DataLoader"
    if isinstance(loader.dataset, IterableDataset):
        raise OptionsError(
            f"{name} over an IterableDataset ({type(loader.dataset).__name__}), which nbscale cannot "
            f"index, split across workers or resume: give a map-style Dataset (with __getitem__ and "
            f"__len__). Supported: {_SUPPORTED}."
        )
    if loader.batch_size is None or type(loader.batch_sampler) is not BatchSampler:
        sampler = type(loader.batch_sampler).__name__ if loader.batch_sampler is not None else "batch_size=None"
        raise OptionsError(
            f"{name} with its own batch_sampler ({sampler}), which nbscale cannot follow (it splits each "
            f"mini-batch across a pool's workers): give batch_size= (with shuffle= or sampler=) instead. "
            f"Supported: {_SUPPORTED}."
        )
    if not hasattr(loader.dataset, "__len__"):
        raise OptionsError(f"{name} whose dataset has no __len__: give the dataset a __len__. Supported: {_SUPPORTED}.")
    if len(loader) == 0:
        raise OptionsError(
            f"{name} that yields no batch: its {len(loader.sampler)} samples are fewer than batch_size="  # type: ignore[arg-type]
            f"{loader.batch_size} with drop_last=True: lower batch_size, or give drop_last=False. "
            f"Supported: {_SUPPORTED}."
        )
    collate = None if loader.collate_fn is default_collate else loader.collate_fn
    workers = {
        "worker_init_fn": loader.worker_init_fn,
        "timeout": loader.timeout,
        "persistent_workers": loader.persistent_workers,
        "pin_memory": loader.pin_memory,
        "prefetch_factor": loader.prefetch_factor,
        "multiprocessing_context": loader.multiprocessing_context,
    }
    if hasattr(loader, "in_order"):  # torch 2.6+ (a DataLoader of torch 2.5 always keeps the order)
        workers["in_order"] = loader.in_order
    return LoaderData(
        loader.dataset,
        collate,
        loader.num_workers,
        int(loader.batch_size),
        batch_sampler=loader.batch_sampler,
        generator=loader.generator,
        drop_last=bool(loader.drop_last),
        workers=workers,
    )


def loader_of(dataset: object) -> LoaderData | None:
    """The LoaderData `dataset` is (or a Subset of one is), else None."""
    while isinstance(dataset, Subset):
        dataset = dataset.dataset
    return dataset if isinstance(dataset, LoaderData) else None


def first_item(dataset: Dataset[Any]) -> Any:
    """The first item of `dataset`, read as its DataLoader would read it: in one worker process (after the
    loader's worker_init_fn, within its timeout) when the loader has a worker_init_fn, else here."""
    loader = dataset if isinstance(dataset, LoaderData) else None
    if loader is None or not loader.num_workers or loader.workers.get("worker_init_fn") is None:
        return dataset[0]
    reader = DataLoader(
        loader.dataset,
        batch_size=None,
        sampler=[0],
        num_workers=1,
        collate_fn=_as_read,
        worker_init_fn=loader.workers["worker_init_fn"],
        timeout=loader.workers["timeout"],
        multiprocessing_context=loader.workers["multiprocessing_context"],
    )
    return next(iter(reader))


def _as_read(item: Any) -> Any:
    return item
