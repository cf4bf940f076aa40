"""What code running on a worker can ask about where it runs: `worker_context()`."""

from __future__ import annotations

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
    _verdicts: dict[str, tuple[int, bool]] = field(default_factory=dict)  # run -> (last iteration answered, stop)
    _verdict_came: threading.Condition = field(default_factory=threading.Condition)
    # run once when the running %%spmd cell ends, however it ends (a TrainingMonitor's last records go out)
    at_cell_end: list[Callable[[], None]] = field(default_factory=list)

    @property
    def stop_requested(self) -> bool:
        """True once the notebook asked running code to stop (Stop button, `pool.request_stop()`)."""
        return self._stop.is_set()

    def wait_for_verdict(self, run: str, iteration: int) -> None:
        """Block until the notebook answered `iteration` of training run `run` (nbscale.train.distributed)."""
        with self._verdict_came:
            while self._verdicts.get(run, (0, False))[0] < iteration:
                self._verdict_came.wait(0.1)  # woken every 0.1 s: the interrupt and the heartbeat see it move

    def told_to_stop(self, run: str) -> bool:
        """True once the notebook answered an iteration of `run` with stop."""
        with self._verdict_came:
            return self._verdicts.get(run, (0, False))[1]

    def record_verdict(self, run: str, iteration: int, stop: bool) -> None:
        """Keep the notebook's answer (called by the worker's receiver thread)."""
        with self._verdict_came:
            answered, stopped = self._verdicts.get(run, (0, False))
            self._verdicts[run] = (max(answered, iteration), stopped or stop)
            self._verdict_came.notify_all()

    def reset(self) -> None:
        """Forget the stop flag and the verdicts (a new request starts)."""
        self._stop.clear()
        with self._verdict_came:
            self._verdicts.clear()

    def cell_ended(self) -> None:
        """Run and forget the `at_cell_end` callbacks."""
        callbacks, self.at_cell_end = self.at_cell_end, []
        for callback in callbacks:
            callback()

    def emit(self, payload: object) -> None:
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
