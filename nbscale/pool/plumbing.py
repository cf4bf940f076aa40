"""What other nbscale modules use of a Pool beyond its user-facing face (docs/pool.md): tasks whose events reach
the notebook, and messages to a running request. Training on the pool builds on these (nbscale.training.runs,
nbscale.training.distributed); user code needs neither.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from nbscale.pool.pool import Pool


def submit_with_events(
    pool: Pool, fn: Callable[..., Any], on_event: Callable[[int, Any], None] | None, /, *args: Any, **kwargs: Any
) -> Future[Any]:
    """Like `pool.submit`; `on_event(rank, payload)` receives each `worker_context().emit(payload)` of the task.

    `on_event` runs on the pool's receiver thread: keep it short and never block in it.
    """
    return pool._submit_with_events(fn, on_event, *args, **kwargs)


def message_running_request(pool: Pool, payload: Any) -> None:
    """Send a small picklable `payload` to the workers running the request the caller waits for (from a
    `pool.run(..., on_event=...)` callback); its code reads it with `worker_context().next_message()`, in the
    order sent. Nothing happens when no request is waited for; a worker drops it once that request ended."""
    pool._message_foreground(payload)
