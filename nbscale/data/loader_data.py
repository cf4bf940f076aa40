"""A user's `torch.utils.data.DataLoader` as `train_data` / `validation_data`.

nbscale takes the loader's dataset, `collate_fn`, `num_workers` and `batch_size`; the order of the samples is the
options' (`shuffle`), so that a pool's ranks can split each global mini-batch. What nbscale cannot honour is refused
by name: a batch sampler, a custom sampler (anything but sequential or random), an IterableDataset.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    Subset,
    default_collate,
)

from nbscale.errors import OptionsError

_SUPPORTED = (
    "DataLoader(dataset, batch_size=..., shuffle=..., collate_fn=..., num_workers=...): a map-style "
    "dataset read in order or at random"
)


class LoaderData(Dataset[Any]):
    """The dataset of a DataLoader, with what nbscale uses of the loader: its `collate_fn` (None for torch's
    default), `num_workers` and `batch_size`. Indexing and length are the dataset's."""

    def __init__(self, dataset: Dataset[Any], collate_fn: Any, num_workers: int, batch_size: int) -> None:
        self.dataset, self.collate_fn, self.num_workers, self.batch_size = dataset, collate_fn, num_workers, batch_size

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]  # a map-style dataset: loader_data checked it

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]

    @property
    def classes(self) -> list[Any]:
        """The dataset's class names, where it has them (torchvision's datasets, nbscale's datastores)."""
        return list(getattr(self.dataset, "classes", []))


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
            f"{name} with its own batch_sampler ({sampler}), which nbscale cannot follow (it makes "
            f"the mini-batches itself, split across workers): give batch_size= instead. "
            f"Supported: {_SUPPORTED}."
        )
    if type(loader.sampler) not in (SequentialSampler, RandomSampler):
        raise OptionsError(
            f"{name} with sampler={type(loader.sampler).__name__}, which nbscale cannot follow (the "
            f"order is TrainingOptions' shuffle): give shuffle=True or False instead of a sampler "
            f"(weight the loss for unbalanced classes). Supported: {_SUPPORTED}."
        )
    if not hasattr(loader.dataset, "__len__"):
        raise OptionsError(f"{name} whose dataset has no __len__: give the dataset a __len__. Supported: {_SUPPORTED}.")
    collate = None if loader.collate_fn is default_collate else loader.collate_fn
    return LoaderData(loader.dataset, collate, loader.num_workers, int(loader.batch_size))


def loader_of(dataset: object) -> LoaderData | None:
    """The LoaderData `dataset` is (or a Subset of one is), else None."""
    while isinstance(dataset, Subset):
        dataset = dataset.dataset
    return dataset if isinstance(dataset, LoaderData) else None
