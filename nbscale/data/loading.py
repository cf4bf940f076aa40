"""Mini-batches for the training loop: each epoch the loop hands over the sample indices of every iteration.

Two ways to feed them, chosen by `data_placement`:
- resident (nbscale.data.device_resident.DeviceResidentData): the whole dataset sits as tensors on the training
  device (tensors too large for a GPU in host memory) and a batch is one `index_select` - no per-sample Python,
  like airbench's loader;
- stream (nbscale.data.streaming.StreamBatches): a torch DataLoader over any Dataset;
  `dispatch_in_background=True` reads in worker processes with pinned memory and prefetching;
- "auto": resident when the data fits (tensors always are), otherwise stream.
On a pool every rank gets only its own share of each global mini-batch (see `split_batch`); resident training data
are read once by the ranks together (`readers`: each reads a block and they exchange them), and each rank's
validation data are its own share (`rows`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol, cast

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset

from nbscale.data.labels import as_labels
from nbscale.data.loader_data import LoaderData, loader_data, loader_of
from nbscale.data.preparing import Progress, Readers
from nbscale.data.streaming import StreamBatches
from nbscale.errors import OptionsError
from nbscale.user_warnings import warn_user

__all__ = ["LoaderData", "as_dataset", "make_batch_source", "split_batch", "tensor_of", "deterministic"]

Batch = tuple[torch.Tensor, torch.Tensor]


class BatchSource(Protocol):
    description: str

    def __len__(self) -> int: ...

    def epoch(self, rows: torch.Tensor | Sequence[torch.Tensor], seed: int) -> Iterator[Batch]:
        """Yield one (inputs, labels) batch on the training device per row of sample indices (a 2-D tensor, or
        1-D tensors); random augmentation of the pass is drawn from `seed` where the source draws it itself."""
        ...


def as_dataset(data: Any, what: str = "train_data") -> Dataset[Any]:
    """A Dataset from a Dataset, a DataLoader (nbscale.data.loader_data) or an (inputs, labels) pair;
    OptionsError otherwise.

    The pair is a tuple, or a list of two tensors or arrays (`[X, y]`). In it either part may be a tensor, a numpy
    array or a list: numpy floats become the default float dtype (float32), and integer labels of any width
    become int64 (what cross-entropy takes).
    """
    if isinstance(data, DataLoader):
        return loader_data(data, what)
    if _is_pair(data):
        inputs, labels = (_as_tensor(part) for part in data)
        if inputs.ndim == 0 or labels.ndim == 0 or len(inputs) != len(labels):
            raise OptionsError(
                f"{what}=(inputs, labels) needs one label per input, got "
                f"{_count(inputs)} inputs and {_count(labels)} labels."
            )
        return TensorDataset(inputs, as_labels(labels))
    if isinstance(data, tuple):
        raise OptionsError(
            f"{what} as a tuple must be (inputs, labels), but it has {len(data)} items: give "
            "(inputs, labels), or a torch Dataset yielding (input, label)."
        )
    if isinstance(data, torch.Tensor | np.ndarray | str | bytes):
        raise OptionsError(
            f"{what} is a single {type(data).__name__}, without labels: give (inputs, labels), or a "
            "torch Dataset yielding (input, label)."
        )
    if isinstance(data, Mapping):  # its __getitem__ takes keys, not sample indices
        keys = [repr(key) for key in list(data)[:4]]
        pair = f"({what}[{keys[0]}], {what}[{keys[1]}])" if len(keys) >= 2 else "(inputs, labels)"
        raise OptionsError(
            f"{what} is a {type(data).__name__} (keys {', '.join(keys) or 'none'}), not samples: give "
            f"(inputs, labels) as a tuple, e.g. {pair}, or a torch Dataset yielding (input, label)."
        )
    if hasattr(data, "__getitem__") and hasattr(data, "__len__"):
        return cast("Dataset[Any]", data)
    raise OptionsError(
        f"{what} must be a torch Dataset or a tuple (inputs, labels) of tensors, not {type(data).__name__}."
    )


def _is_pair(data: object) -> bool:
    """(inputs, labels) as a tuple of array-likes, or as a list of two tensors or arrays (a list of two
    samples would hold pairs, not arrays)."""
    if isinstance(data, tuple):
        return len(data) == 2 and all(_array_like(part) for part in data)
    return (
        isinstance(data, list)
        and len(data) == 2
        and all(isinstance(part, torch.Tensor | np.ndarray) and part.ndim > 0 for part in data)
    )


def _array_like(part: object) -> bool:
    return isinstance(part, (torch.Tensor, list)) or type(part).__module__ == "numpy"


def _as_tensor(part: object) -> torch.Tensor:
    try:
        return tensor_of(part)
    except (TypeError, ValueError, RuntimeError) as error:
        raise OptionsError(
            f"Cannot make a tensor of a {type(part).__name__} in (inputs, labels): {error}. "
            "Give tensors, numpy arrays or lists of numbers."
        ) from None


def tensor_of(values: object) -> torch.Tensor:
    """A tensor of `values` (a tensor, numpy array or list); numpy's float64 becomes the default float dtype
    (float32), as networks use. Raises TypeError, ValueError or RuntimeError for values that are no array."""
    if isinstance(values, torch.Tensor):
        return values
    tensor = torch.as_tensor(np.asarray(values))
    return tensor.to(torch.get_default_dtype()) if tensor.dtype == torch.float64 else tensor


def _count(tensor: torch.Tensor) -> str:
    return "a scalar" if tensor.ndim == 0 else str(len(tensor))


def split_batch(batch_size: int, worker_load: Sequence[float] | None, world_size: int) -> list[int]:
    """How many samples of each global mini-batch every rank takes (largest remainder, sums to batch_size).

    A rank with load 0 takes none and sits out. Raises OptionsError when a loaded rank would get no sample.
    """
    weights = [1.0] * world_size if worker_load is None else [float(w) for w in worker_load]
    if len(weights) != world_size:
        raise OptionsError(
            f"worker_load has {len(weights)} entries but the pool has {world_size} workers: "
            "give one weight per worker (0 leaves a worker out)."
        )
    total = sum(weights)
    exact = [batch_size * w / total for w in weights]
    counts = [int(e) for e in exact]
    by_remainder = sorted(range(world_size), key=lambda r: exact[r] - counts[r], reverse=True)
    for rank in by_remainder[: batch_size - sum(counts)]:
        counts[rank] += 1
    starved = [r for r in range(world_size) if weights[r] > 0 and counts[r] == 0]
    if starved:
        raise OptionsError(
            f"mini_batch_size={batch_size} is too small to give worker(s) {starved} any sample "
            f"with worker_load={list(worker_load or weights)}: raise mini_batch_size or set "
            "their load to 0."
        )
    return counts


def deterministic(dataset: object) -> bool:
    """True for data nbscale knows reads the same every time: tensors (a TensorDataset), its datastores and
    augmented datastores (whose random values it draws itself), and Subsets of them. Any other Dataset (random
    torchvision transforms inside, say) may read differently each epoch, so "auto" reads it afresh each epoch."""
    from nbscale.data.augmented import AugmentedImageDatastore
    from nbscale.data.datastore import ImageDatastore

    if isinstance(dataset, Subset):
        return deterministic(dataset.dataset)
    return isinstance(dataset, TensorDataset | ImageDatastore | AugmentedImageDatastore)


def _warn_here(message: str) -> None:
    warn_user(message, RuntimeWarning)


def _cannot_be_resident(dataset: Dataset[Any]) -> str | None:
    """Why `dataset` cannot be held resident (a DataLoader's own collate_fn, nested samples), or None."""
    loader = loader_of(dataset)
    if loader is not None and loader.collate_fn is not None:
        return "its DataLoader has its own collate_fn"
    if loader is not None and loader.num_workers and loader.workers.get("worker_init_fn") is not None:
        return "its DataLoader has a worker_init_fn, which its worker processes run before reading"
    inner = dataset.dataset if isinstance(dataset, Subset | LoaderData) else dataset
    if isinstance(inner, Subset | LoaderData):
        return _cannot_be_resident(inner)
    if isinstance(inner, TensorDataset) and len(inner.tensors) != 2:
        return f"its samples are {len(inner.tensors)} tensors, not (input, label)"
    if len(inner) == 0 or isinstance(inner, TensorDataset):  # type: ignore[arg-type]
        return None
    with torch.random.fork_rng(devices=[]):
        item = inner[0]
    if not (
        isinstance(item, tuple | list)
        and len(item) == 2
        and isinstance(item[0], torch.Tensor | np.ndarray)
        and isinstance(item[1], torch.Tensor | np.ndarray | int)
    ):
        return "its samples are nested (inputs or labels that are tuples or dicts)"
    return None


def make_batch_source(
    dataset: Dataset[Any],
    device: torch.device,
    placement: str,
    background: bool,
    *,
    seed: int,
    rows: Sequence[int] | torch.Tensor | None = None,
    readers: Readers | None = None,
    progress: Progress | None = None,
    warn: Callable[[str], None] | None = _warn_here,
) -> BatchSource:
    """The batch source for `placement` ("auto" | "stream" | "device"); see the module docstring.

    "auto" streams data nbscale cannot prove deterministic (`deterministic`), so it is read afresh each epoch;
    "device" keeps it resident anyway, warning (through `warn`, once per run) that its randomness is frozen,
    and streams what cannot be resident (a DataLoader's collate_fn, nested samples), warning so.

    `seed` seeds a DataLoader's own random stream (its background processes' seeds; see StreamBatches);
    `rows` keeps only those items (a pool rank's share of the validation data: batches then index into them);
    `readers` reads resident data once across a pool's ranks, each reading a block (nbscale.data.preparing);
    `progress` counts the items read before training.
    """
    rows = [int(row) for row in rows] if rows is not None else None
    held = dataset  # what is held resident: a DataLoader of tensors or datastores, as they are
    if isinstance(dataset, LoaderData) and deterministic(dataset.dataset) and _cannot_be_resident(dataset) is None:
        held = dataset.dataset
    if placement == "stream" or (placement == "auto" and (background or not deterministic(held))):
        return StreamBatches(_part(dataset, rows), device, background, seed)  # a DataLoader's settings kept
    dataset = held
    said = warn if warn is not None else (lambda message: None)  # None: a pool's other ranks, which stay quiet
    why_not = _cannot_be_resident(dataset)
    if why_not is not None:  # "auto" streams it quietly (a TensorDataset of three tensors); "device" says why
        if placement == "device":
            said(
                f"data_placement='device' cannot hold this data on the device ({why_not}): it is streamed by a "
                "DataLoader instead. Give data_placement='stream' (or 'auto') to say so and silence this."
            )
        return StreamBatches(_part(dataset, rows), device, background, seed)
    if placement == "device" and not deterministic(dataset):
        said(
            f"data_placement='device' reads this {type(dataset).__name__} once and keeps it on the device: any "
            "randomness in it (random transforms) is frozen for the whole run. Use data_placement='auto' or "
            "'stream' to read it afresh every epoch."
        )
    from nbscale.data.device_resident import DeviceResidentData, fits_on_device, holds_tensors, residence

    if holds_tensors(dataset):  # tensors need no reading: on a GPU too small, batches go over one by one
        part = _part(dataset, rows)
        too_big = device.type == "cuda" and placement != "device" and not fits_on_device(part, device)
        return DeviceResidentData(part, device, keep_on_host=too_big)
    first: dict[int, Any] = {}
    if placement != "device":
        resident, first = residence(dataset, device, rows=rows, readers=readers)
        if not resident:
            return StreamBatches(_part(dataset, rows), device, background, seed)
    return DeviceResidentData(dataset, device, rows=rows, readers=readers, progress=progress, first=first)


def _part(dataset: Dataset[Any], rows: list[int] | None) -> Dataset[Any]:
    return dataset if rows is None else Subset(dataset, rows)
