"""The Stop signals of the pool trainings running in this kernel, so that a pool's backend (a SLURM allocation
reaching its time limit) can stop them the way the Stop button does: `nbscale.train` on the pool while it runs,
and each `train_async` run (sweeps too) from its submission to its end. Here, below training/, as anything with
`request`."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Protocol


class StopSignal(Protocol):
    """A run's stop signal (nbscale.training.events.StopSignal): the first reason requested wins."""

    def request(self, reason: str) -> None: ...


_LOCK = threading.Lock()
_ACTIVE: list[StopSignal] = []


@contextlib.contextmanager
def registered(stop: StopSignal, on_pool: bool = True) -> Iterator[None]:
    """Keep `stop` among the running pool trainings' signals while the block runs (a local one: not)."""
    if not on_pool:
        yield
        return
    add(stop)
    try:
        yield
    finally:
        discard(stop)


def add(stop: StopSignal) -> None:
    """Keep `stop` among the running pool trainings' signals until `discard(stop)`."""
    with _LOCK:
        _ACTIVE.append(stop)


def discard(stop: StopSignal) -> None:
    """Forget `stop` (nothing when it is not kept)."""
    with _LOCK, contextlib.suppress(ValueError):
        _ACTIVE.remove(stop)


def stop_all(reason: str) -> int:
    """Ask every running training to stop at the end of its iteration with `reason`; how many were asked."""
    with _LOCK:
        running = list(_ACTIVE)
    for stop in running:
        stop.request(reason)
    return len(running)
