"""What code running on a worker can ask about where it runs: `worker_context()`."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


@dataclass
class WorkerContext:
    """This worker's rank, group size and device, its stop flag, and a way to send events to the notebook."""

    rank: int
    world_size: int
    device: torch.device
    host: str
    _emit: Any = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _messages: queue.Queue[Any] = field(default_factory=queue.Queue)  # to the running request, from the notebook
    # run once when the running %%spmd cell ends, however it ends (a TrainingMonitor's last records go out)
    at_cell_end: list[Callable[[], None]] = field(default_factory=list)
    # run when the notebook asks running code to stop (a TrainingMonitor's `stop` is set, not polled)
    on_stop: list[Callable[[], None]] = field(default_factory=list)

    @property
    def stop_requested(self) -> bool:
        """True once the notebook asked running code to stop (Stop button, `pool.request_stop()`)."""
        return self._stop.is_set()

    def request_stop(self) -> None:
        """Set the stop flag and run the `on_stop` callbacks (from the worker's receiver thread)."""
        self._stop.set()
        for callback in list(self.on_stop):
            callback()

    def next_message(self) -> Any:
        """Block until the notebook sends the running request a message (`nbscale.pool.plumbing`); its payload.
        Messages come in the order they were sent."""
        while True:
            try:
                return self._messages.get(timeout=0.1)  # woken every 0.1 s: the interrupt and the heartbeat see it move
            except queue.Empty:
                continue

    def deliver_message(self, payload: Any) -> None:
        """Keep a message to the running request (called by the worker's receiver thread)."""
        self._messages.put(payload)

    def reset(self) -> None:
        """Forget the stop flag, its callbacks and the messages (a new request starts)."""
        self._stop.clear()
        self.on_stop = []
        self._messages = queue.Queue()

    def cell_ended(self) -> None:
        """Run and forget the `at_cell_end` callbacks."""
        callbacks, self.at_cell_end = self.at_cell_end, []
        for callback in callbacks:
            callback()

    def emit(self, payload: object) -> None:
        """Send `payload` to the notebook, where `pool.run(..., on_event=...)` receives it as it arrives."""
        if self._emit is not None:
            self._emit(payload)


@dataclass
class _This:
    context: WorkerContext | None = None  # set once, when this process starts as a pool worker


_this = _This()


def worker_context() -> WorkerContext:
    """The context of the worker this code runs on; raises outside a pool worker."""
    current = _this.context
    if current is None:
        from nbscale.errors import PoolError

        raise PoolError("worker_context() only works in code running on a pool worker (pool.run, %%spmd).")
    return current


def in_worker() -> bool:
    """Whether this process is a pool worker."""
    return _this.context is not None


def set_worker_context(context: WorkerContext) -> None:
    _this.context = context
