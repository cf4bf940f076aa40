"""Process-wide settings the loop changes while training runs and restores after: the garbage collector's
passes and cuDNN's autotuning."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def cheap_garbage_collection() -> Iterator[None]:
    """Keep the garbage collector's passes short and rare while training runs; restored afterwards.

    - The objects that exist before training are frozen out of full passes: a notebook's heap (matplotlib,
      pandas, a kernel's history) is often large, and a full pass over it stalls a random iteration. A heap the
      user froze is left as it is.
    - The youngest generation is collected every YOUNG_COLLECTION_THRESHOLD new objects instead of 700: each
      iteration makes a few objects that live on (its history entry), and frequent young passes kept scanning
      them, a cost paid every iteration that shows on a small network.
    """
    threshold = gc.get_threshold()
    gc.set_threshold(max(threshold[0], YOUNG_COLLECTION_THRESHOLD), *threshold[1:])
    freeze = gc.get_freeze_count() == 0
    if freeze:
        gc.freeze()
    try:
        yield
    finally:
        if freeze:
            gc.unfreeze()
        gc.set_threshold(*threshold)


YOUNG_COLLECTION_THRESHOLD = 10_000


@contextlib.contextmanager
def cudnn_setting_restored() -> Iterator[None]:
    benchmark = torch.backends.cudnn.benchmark
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = benchmark


def autotune_convolutions(device: torch.device) -> None:
    """On a GPU, cuDNN times its convolution algorithms on the first batches and keeps the fastest (worth it:
    training batches keep one shape), as a hand-written loop sets `cudnn.benchmark`; left alone where the user
    asked for deterministic algorithms. Restored after training (`cudnn_setting_restored`)."""
    if device.type == "cuda" and not torch.backends.cudnn.deterministic:
        torch.backends.cudnn.benchmark = True
