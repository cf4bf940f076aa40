"""The hook through which packages above train/ watch every training run (a batch job records its runs).

A run observer is a function `(channel, stop) -> context manager`: `nbscale.train` enters every registered
observer around its run, with the run's event channel (nbscale.training.events) and stop signal, and leaves it
however the run ends. An observer subscribes its listeners to the channel and may request a stop. The job
runner (nbscale.jobs.runner) adds the job monitor's recorder when a job starts, so train/ never imports jobs/.
Observers are per process: a run inside a pool's worker sees only what that worker added.
"""

from __future__ import annotations

import atexit
import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

from nbscale.training.events import EventChannel, StopSignal

RunObserver = Callable[[EventChannel, StopSignal], AbstractContextManager[object]]

_observers: list[RunObserver] = []
_open_runs: list[Callable[[], None]] = []  # how to end each observed run its code may leave open (a monitor)


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


@contextlib.contextmanager
def ended_with_the_process(end: Callable[[], None]) -> Iterator[None]:
    """While inside: `end()` ends the run when its code leaves it open, at `end_open_runs()` (a job's cell ended)
    or when the process exits, whichever comes first; so its observers get its end (a TrainingMonitor never
    closed)."""
    _open_runs.append(end)
    atexit.register(end)
    try:
        yield
    finally:
        atexit.unregister(end)
        if end in _open_runs:
            _open_runs.remove(end)


def end_open_runs() -> None:
    """End every observed run its code left open (the job runner calls it when the cell ends, before it saves
    the cell's variables and records the job's end)."""
    for end in reversed(tuple(_open_runs)):
        try:
            end()  # a run that ends leaves its ended_with_the_process, which forgets it
        finally:
            if end in _open_runs:
                _open_runs.remove(end)
