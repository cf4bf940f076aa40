"""A user's `torch.utils.data.DataLoader` as `train_data` / `validation_data`: the loader keeps its PyTorch meaning.

nbscale keeps the loader's dataset and every setting that says how it is read: its batch sampler (shuffle or its
own sampler, batch_size, drop_last), its generator, collate_fn, and its worker settings (num_workers,
worker_init_fn, timeout, persistent_workers, pin_memory, prefetch_factor, multiprocessing_context, in_order).
Each epoch's batches are drawn below as iterating the loader would; nbscale.data.streaming reads
them with the loader's worker settings. What nbscale cannot follow is refused by name: a batch sampler of the
user's own (the pool splits each mini-batch across workers), an IterableDataset, a dataset without __len__.

Which samples each iteration of an epoch trains on: a DataLoader's own batches, or MATLAB's when nbscale
batches the data itself.

- A DataLoader keeps its PyTorch meaning (`LoaderBatches`): each epoch's batches are drawn as `for x, y in loader`
  draws them, one base seed from the loader's generator (torch's global stream when it has none; once only with
  persistent workers), then its batch sampler: shuffle (a new order every epoch) or its own sampler, batch_size,
  drop_last (the last partial batch is trained unless drop_last=True). So the order equals a plain loop's.
  TrainingOptions' shuffle, set to "never" or "every-epoch" (not its default "once"), replaces the loader's
  order; the batches keep the loader's batch_size and drop_last.
- Data nbscale batches itself follows MATLAB (`MatlabBatches`): TrainingOptions' shuffle ("once" by default) and
  the last partial mini-batch dropped.
On a pool every rank draws the same batches and takes its share of each (rank r the `counts[r]` samples after those
of the ranks before it), so each update is the one a single process makes: a pool's ranks together read each
sample of an epoch once, as DistributedSampler shards them, but by mini-batch rather than by rank. A loader
without a generator draws there from the run's seed (each epoch's draws a pure function of it, the same on every
rank) rather than from each rank's global stream. A last partial batch that the shares cannot split exactly is
padded with the epoch's first samples, as DistributedSampler pads its shards.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator
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


DEFAULT_SHUFFLE = "once"  # TrainingOptions' default: with a DataLoader, the loader's order stands


def epoch_order(shuffle: str, seed: int, epoch: int, samples: int) -> torch.Tensor:
    """MATLAB's sample order of `epoch` (1-based): the same on every rank, and a pure function so resume is exact."""
    if shuffle == "never":
        return torch.arange(samples)
    generator = torch.Generator().manual_seed(seed + (epoch if shuffle == "every-epoch" else 0))
    return torch.randperm(samples, generator=generator)


class MatlabBatches:
    """Data nbscale batches itself: TrainingOptions' shuffle order, full global mini-batches only (MATLAB drops
    the last partial one); `rows(epoch)` is this rank's share, iterations x counts[rank]."""

    def __init__(self, shuffle: str, seed: int, samples: int, counts: list[int], rank: int) -> None:
        self.shuffle, self.seed, self.samples = shuffle, seed, samples
        self.global_batch, self.offset, self.local = sum(counts), sum(counts[:rank]), counts[rank]
        self.iterations = max(1, samples // self.global_batch)
        self.sizes = [self.global_batch] * self.iterations

    def rows(self, epoch: int) -> torch.Tensor:
        order = epoch_order(self.shuffle, self.seed, epoch, self.samples)
        if len(order) < self.global_batch:  # fewer samples than a mini-batch (unreadable files left out): one
            self.sizes = [len(order)]
            return order[self.offset : self.offset + self.local][None]
        whole = order[: self.iterations * self.global_batch].view(self.iterations, self.global_batch)
        return whole[:, self.offset : self.offset + self.local]

    def first_rows(self) -> torch.Tensor:
        """The first iteration's rows of epoch 1 (a compile trial's batch)."""
        return self.rows(1)[:1]

    def skip(self, epochs: int) -> None:
        """Nothing to replay: each epoch's order is a pure function of the seed."""


class LoaderBatches:
    """A DataLoader's batches, drawn as iterating it draws them (see the module docstring); `rows(epoch)` holds
    this rank's share of each, and `sizes` the whole batches' sizes of the epoch drawn last."""

    def __init__(self, loader: LoaderData, seed: int, counts: list[int], rank: int, shuffle: str | None = None) -> None:
        self.loader, self.seed, self.counts, self.rank, self.shuffle = loader, seed, counts, rank, shuffle
        self.on_pool = len(counts) > 1
        self.global_batch = sum(counts)
        self.iterations = max(1, self._length())
        self.sizes: list[int] = []

    def _length(self) -> int:
        if self.shuffle is None:
            assert self.loader.batch_sampler is not None  # loader_data keeps the loader's
            return len(self.loader.batch_sampler)  # type: ignore[arg-type]  # a BatchSampler has a length
        whole, partial = divmod(len(self.loader), self.loader.batch_size)
        return whole + (1 if partial and not self.loader.drop_last else 0)

    def rows(self, epoch: int) -> list[torch.Tensor]:
        batches = self._draw(epoch)
        self.sizes = [len(batch) for batch in batches]
        padding = torch.cat(batches) if self.on_pool and batches else torch.zeros(0, dtype=torch.long)
        return [share_of(batch, self.counts, self.rank, padding) for batch in batches]

    def first_rows(self) -> list[torch.Tensor]:
        """A first batch of this rank's size for a compile trial, drawing nothing from the loader's streams."""
        return [torch.arange(min(max(self.counts[self.rank], 1), len(self.loader)))]

    def skip(self, epochs: int) -> None:
        """Draw `epochs` epochs and drop them (a resumed run goes on where its generator would be)."""
        for epoch in range(1, epochs + 1):
            self._draw(epoch)

    def _draw(self, epoch: int) -> list[torch.Tensor]:
        loader = self.loader
        if self.shuffle is not None:
            order = epoch_order(self.shuffle, self.seed, epoch, len(loader))
            batches = list(torch.split(order, loader.batch_size))
            return batches[:-1] if loader.drop_last and len(batches[-1]) < loader.batch_size else batches
        assert loader.batch_sampler is not None
        with self._stream(epoch):
            if epoch == 1 or not loader.persistent_workers:  # what DataLoader.__iter__ draws before its sampler
                torch.empty((), dtype=torch.int64).random_(generator=loader.generator)
            return [torch.as_tensor(list(batch), dtype=torch.long) for batch in loader.batch_sampler]

    def _stream(self, epoch: int) -> contextlib.AbstractContextManager[object]:
        """On a pool, a loader without a generator draws from the run's seed; else as PyTorch draws."""
        if not self.on_pool or self.loader.generator is not None:
            return contextlib.nullcontext()
        return _seeded((self.seed * 1_000_003 + epoch) % 2**62)


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def share_of(batch: torch.Tensor, counts: list[int], rank: int, padding: torch.Tensor) -> torch.Tensor:
    """Rank `rank`'s samples of a global `batch`, in proportion to `counts`; a batch they cannot split exactly is
    first padded from `padding` (the epoch's samples from its start) to the next size they can."""
    if len(counts) == 1:
        return batch
    total, divisor = sum(counts), math.gcd(*counts)
    if len(batch) == total:
        return batch[sum(counts[:rank]) : sum(counts[: rank + 1])]
    unit = total // divisor  # the smallest batch the shares split exactly
    size = -(-len(batch) // unit) * unit
    if size > len(batch):
        repeats = -(-(size - len(batch)) // max(len(padding), 1))
        batch = torch.cat([batch, padding.repeat(repeats)[: size - len(batch)]])
    scale = size // unit  # rank r takes counts[r] / divisor * scale samples
    return batch[sum(counts[:rank]) // divisor * scale : sum(counts[: rank + 1]) // divisor * scale]


def validation_order(data: object) -> torch.Tensor | None:
    """The samples a validation DataLoader gives in one pass (its sampler, its drop_last), drawn once without
    touching torch's global stream; None for every sample in order (any other validation data, or a loader read
    in order)."""
    if not isinstance(data, LoaderData) or data.batch_sampler is None:
        return None
    with torch.random.fork_rng(devices=[]):
        order = torch.as_tensor([index for batch in data.batch_sampler for index in batch], dtype=torch.long)
    return None if torch.equal(order, torch.arange(len(data))) else order


def make_epoch_batches(
    data: object, samples: int, shuffle: str, seed: int, counts: list[int], rank: int
) -> MatlabBatches | LoaderBatches:
    """The epochs' batches of `data` (the training Dataset, of which `samples` were read): the loader's own for a
    LoaderData, with TrainingOptions' shuffle in place of its order when set (not its default "once"); else
    MATLAB's."""
    if isinstance(data, LoaderData) and data.batch_sampler is not None:
        return LoaderBatches(data, seed, counts, rank, None if shuffle == DEFAULT_SHUFFLE else shuffle)
    return MatlabBatches(shuffle, seed, samples, counts, rank)


def options_over_loader(shuffle: str, dispatch_in_background: bool, data: object) -> list[str]:
    """One line for each TrainingOptions field set explicitly that wins over a DataLoader's own setting."""
    if not isinstance(data, LoaderData):
        return []
    notes = []
    if shuffle != DEFAULT_SHUFFLE:
        notes.append(
            f"TrainingOptions(shuffle={shuffle!r}) replaces the DataLoader's order (its shuffle or sampler); its "
            "batch_size and drop_last stand. Leave shuffle at its default to read the DataLoader as it is."
        )
    if dispatch_in_background and not data.num_workers:
        notes.append(
            "TrainingOptions(dispatch_in_background=True) reads the DataLoader in 4 background processes where it "
            "has num_workers=0. Leave dispatch_in_background out, or set the DataLoader's num_workers, to choose."
        )
    return notes
