"""Watching a running pool: the workers' heartbeat (memory, and whether each still answers), the published state
(registry), and the idle timeout."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from nbscale.notices import notices
from nbscale.pool import protocol as p
from nbscale.pool import registry
from nbscale.pool.health import process_state, unresponsive, unresponsive_description
from nbscale.pool.routing import Router

STATUS_TIMEOUT_S = 1.0
LAST_CHANCE_S = 2.0  # a silent worker is asked once more before it is given up
_refusal_said = threading.Event()  # an unsafe registry folder is said once per process, not at every heartbeat


class Monitor:
    """A thread that, every registry.HEARTBEAT_S seconds, asks every worker for its memory (the heartbeat), gives
    up workers that stopped answering (nbscale.pool.health), publishes the pool's state, and calls `on_idle()`
    once the pool was idle longer than `idle_timeout_s` (None: never)."""

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
        self._publishing = threading.Lock()  # a beat's publish and the pool's withdrawal never interleave

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
        while (
            wait and time.monotonic() < deadline and any(w.status_round < query.request_id for w in alive if not w.dead)
        ):
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
            self._give_up_silent_workers()
            self._publish()

    def _give_up_silent_workers(self) -> None:
        """Mark dead the workers silent for health.UNRESPONSIVE_S, after one last query (so a kernel that was itself
        paused, whose workers' answers wait unread in its sockets, gives up no one)."""
        silent = [w for w in self.router.workers if unresponsive(w)]
        if not silent:
            return
        self.refresh_memory(wait=False)
        deadline = time.monotonic() + LAST_CHANCE_S
        while time.monotonic() < deadline and any(unresponsive(w) for w in silent):
            time.sleep(0.05)
        # a stopped or gone process first, even one silent for less time (a busy machine may delay the answers of the
        # one it stopped less than those of a peer now waiting for it in a collective): the others may only wait on
        # it, and the first worker given up is the one the failed cell names
        still_silent = [w for w in silent if unresponsive(w)]
        if not still_silent:
            return
        culprits = [w for w in self.router.workers if not w.dead and process_state(w) in ("stopped", "gone")]
        for worker in [*culprits, *(w for w in still_silent if w not in culprits)]:
            if not worker.dead and not self.router.stopping.is_set():
                self.router.worker_died(worker, unresponsive_description(worker))

    def _idle_soon(self) -> bool:
        return self.idle_timeout_s is not None and self.idle_timeout_s < 2 * registry.HEARTBEAT_S

    def withdraw(self) -> None:
        """Remove the pool's published state (it stopped): a publish under way ends first, and none comes after."""
        with self._publishing:
            try:
                registry.withdraw()
            except (OSError, registry.RegistryUnsafe):  # nothing was published there
                pass

    def _publish(self) -> None:
        with self._publishing:
            if not self.router.stopping.is_set():  # the pool may have stopped while this beat asked for memory
                self._publish_now()

    def _publish_now(self) -> None:
        try:
            registry.publish(self._state())
        except (OSError, ValueError):  # a full disk, or a number JSON cannot hold: the next beat tries again
            pass
        except registry.RegistryUnsafe as refusal:  # the pool works; only the JupyterLab panel will not show it
            if not _refusal_said.is_set():
                _refusal_said.set()
                notices.warning(f"[nbscale] {refusal}")
