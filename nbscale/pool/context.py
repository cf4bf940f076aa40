"""What code running on a worker can ask about where it runs: `worker_context()`."""

from __future__ import annotations

import threading
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

    @property
    def stop_requested(self) -> bool:
        """True once the notebook asked running code to stop (Stop button, `pool.request_stop()`)."""
        return self._stop.is_set()

    def emit(self, payload: Any) -> None:
        """Send `payload` to the notebook, where `pool.run(..., on_event=...)` receives it as it arrives."""
        if self._emit is not None:
            self._emit(payload)


_current: WorkerContext | None = None


def worker_context() -> WorkerContext:
    """The context of the worker this code runs on; raises outside a pool worker."""
    if _current is None:
        from nbscale.errors import PoolError

        raise PoolError("worker_context() only works in code running on a pool worker (pool.run, %%spmd).")
    return _current


def in_worker() -> bool:
    """Whether this process is a pool worker."""
    return _current is not None


def set_worker_context(context: WorkerContext) -> None:
    global _current
    _current = context
