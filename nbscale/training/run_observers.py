"""The hook through which packages above train/ watch every training run (a batch job records its runs).

A run observer is a function `(channel, stop) -> context manager`: `nbscale.train` enters every registered
observer around its run, with the run's event channel (nbscale.training.events) and stop signal, and leaves it
however the run ends. An observer subscribes its listeners to the channel and may request a stop. The job
runner (nbscale.jobs.runner) adds the job monitor's recorder when a job starts, so train/ never imports jobs/.
Observers are per process: a run inside a pool's worker sees only what that worker added.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

from nbscale.training.events import EventChannel, StopSignal

RunObserver = Callable[[EventChannel, StopSignal], AbstractContextManager[object]]

_observers: list[RunObserver] = []


def add_run_observer(observer: RunObserver) -> None:
    """Enter `observer` around every later training run of this process (once, however often it is added)."""
    if observer not in _observers:
        _observers.append(observer)


def remove_run_observer(observer: RunObserver) -> None:
    """Stop entering `observer` around training runs; nothing happens if it was not added."""
    if observer in _observers:
        _observers.remove(observer)


@contextlib.contextmanager
def observed_run(channel: EventChannel, stop: StopSignal) -> Iterator[None]:
    """Every registered observer entered around the run, in the order they were added (left in reverse)."""
    with contextlib.ExitStack() as stack:
        for observer in tuple(_observers):
            stack.enter_context(observer(channel, stop))
        yield
