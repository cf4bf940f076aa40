"""Running out of GPU memory leaves nothing of the run behind.

An exception raised inside `except` keeps the one caught as its `__context__` (even `raise ... from None` only
hides it), and that one's traceback holds every frame of the run: the network, the optimizer state, the batch on
the GPU. So nbscale's out-of-memory error is built inside the handler and raised after it, with the run's frames
cleared: neither `__context__`, `__cause__` nor the new traceback reaches them.
"""

from __future__ import annotations

import gc
import traceback
from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")


def released_on_out_of_memory(
    run: Callable[[], T], message: Callable[[torch.OutOfMemoryError], str], after: Callable[[], None] | None = None
) -> T:
    """`run()`; when it runs out of GPU memory, raises `torch.OutOfMemoryError(message(error))` that holds nothing
    of the run, after freeing the run's memory (its frames cleared, torch's cache emptied) and calling `after`
    (which releases what the run reserved)."""
    try:
        return run()
    except torch.OutOfMemoryError as error:
        text = message(error)
        traceback.clear_frames(error.__traceback__)
    # outside the handler: the caught error is gone (Python deletes `error`), so this one has no __context__
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    if after is not None:
        after()
    raise torch.OutOfMemoryError(text)
