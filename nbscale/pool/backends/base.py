"""The interface every pool backend implements: start workers, stop them, tell if they are alive.

A backend only launches processes that run `nbscale.pool.worker.serve(config)`; the workers then connect
back to the kernel's authenticated listener. Nothing above the pool knows which backend it runs on.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class Backend(ABC):
    """Launches and stops the worker processes of one pool."""

    name: str = "backend"
    #: the address workers connect back to is bound on this interface
    listen_host: str = "127.0.0.1"

    @abstractmethod
    def start(self, worker_configs: list[dict[str, Any]]) -> None:
        """Launch one worker per config (each holds rank, device, env, and where to connect)."""

    @abstractmethod
    def stop(self) -> None:
        """Stop every worker now (idempotent)."""

    @abstractmethod
    def alive(self) -> bool:
        """Whether the launcher still runs (workers report their own death through their channels)."""

    @abstractmethod
    def kill_worker(self, rank: int, pid: int) -> None:
        """Hard-kill one worker (used when it does not answer an interrupt)."""

    def describe(self) -> str:
        return self.name
