"""The Stop signals of the trainings running in this kernel, so that something other than the run (a SLURM
allocation reaching its time limit) can stop them the way the Stop button does."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from nbscale.training.events import StopSignal

_LOCK = threading.Lock()
_ACTIVE: list[StopSignal] = []


@contextlib.contextmanager
def registered(stop: StopSignal) -> Iterator[None]:
    """Keep `stop` among the running trainings' signals while the block runs."""
    with _LOCK:
        _ACTIVE.append(stop)
    try:
        yield
    finally:
        with _LOCK:
            _ACTIVE.remove(stop)


def stop_all(reason: str) -> int:
    """Ask every running training to stop at the end of its iteration with `reason`; how many were asked."""
    with _LOCK:
        running = list(_ACTIVE)
    for stop in running:
        stop.request(reason)
    return len(running)
