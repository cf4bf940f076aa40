"""What the listeners of a TrainingMonitor know of it (listeners.py attaches them): its layout, its loggers, its
event channel and stop signal, and how to close it. A Protocol, so that the modules which attach listeners do
not import the monitor that attaches them."""

from __future__ import annotations

from typing import Any, Protocol

from nbscale.training.events import EventChannel, StopSignal


class Producer(Protocol):
    """A TrainingMonitor as its listeners see it."""

    metrics: tuple[str, ...]
    info_names: tuple[str, ...]
    x_label: str
    reduce: str
    loggers: list[Any]
    budget: float
    interrupt_stops: bool
    events: EventChannel

    @property
    def stop_signal(self) -> StopSignal: ...

    @property
    def panels(self) -> list[tuple[str, list[str]]]: ...

    def request_stop(self, reason: str = ...) -> None: ...

    def close(self) -> None: ...
