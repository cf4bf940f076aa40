"""Watching a running pool: workers' memory, the published state (registry), and the idle timeout."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from nbscale.pool import protocol as p
from nbscale.pool import registry
from nbscale.pool.routing import Router

STATUS_TIMEOUT_S = 1.0


class Monitor:
    """A thread that, every registry.HEARTBEAT_S seconds, asks every worker for its memory, publishes the pool's
    state, and calls `on_idle(reason)` once the pool was idle longer than `idle_timeout_s` (None: never)."""

    def __init__(
        self,
        router: Router,
        idle_timeout_s: float | None,
        tasks_waiting: Callable[[], bool],
        state: Callable[[], dict[str, Any]],
        on_idle: Callable[[], None],
    ) -> None:
        self.router = router
        self.idle_timeout_s = idle_timeout_s
        self._tasks_waiting = tasks_waiting
        self._state = state
        self._on_idle = on_idle
        self._round = 0

    def start(self) -> None:
        threading.Thread(target=self._watch, name="nbscale-pool-monitor", daemon=True).start()

    def idle_left_s(self) -> float | None:
        """Seconds before the pool stops itself if it stays idle (None: it never does)."""
        if self.idle_timeout_s is None:
            return None
        return max(0.0, self.idle_timeout_s - (time.monotonic() - self.router.last_activity))

    def refresh_memory(self, wait: bool) -> None:
        """Ask every live worker for its memory; with `wait`, until each answered (at most STATUS_TIMEOUT_S).

        Workers keep showing their last figure until the new one arrives.
        """
        alive = [w for w in self.router.workers if not w.dead]
        self._round += 1
        query = p.StatusQuery(self._round)
        for worker in alive:
            worker.send_quietly(query)
        deadline = time.monotonic() + STATUS_TIMEOUT_S
        while wait and time.monotonic() < deadline and any(w.status_round < query.request_id for w in alive if not w.dead):
            time.sleep(0.01)

    def _watch(self) -> None:
        self.refresh_memory(wait=True)
        self._publish()
        while not self.router.stopping.wait(registry.HEARTBEAT_S if not self._idle_soon() else 0.2):
            busy = self.router.busy or self._tasks_waiting()
            left = self.idle_left_s()
            if left is not None and left <= 0 and not busy:
                self._on_idle()
                return
            self.refresh_memory(wait=False)
            self._publish()

    def _idle_soon(self) -> bool:
        return self.idle_timeout_s is not None and self.idle_timeout_s < 2 * registry.HEARTBEAT_S

    def _publish(self) -> None:
        try:
            registry.publish(self._state())
        except (OSError, ValueError):  # a full disk, or a number JSON cannot hold: the next beat tries again
            pass
