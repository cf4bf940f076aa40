"""The interface every pool backend implements: plan the workers, start them, stop them, tell if they are alive,
and say at which address a worker is reached.

A backend only launches processes that run `nbscale.pool.worker.serve(config)`; the workers then connect back to
the kernel's authenticated listener. Nothing above the pool knows which backend it runs on.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

from nbscale.pool.protocol import WorkerConfig
from nbscale.pool.settings import PoolSettings


@dataclass(frozen=True)
class WorkerSpec:
    """One planned worker: its device ("cpu" or "cuda:0"), its environment, and its CPU thread cap."""

    device: str
    env: dict[str, str] = field(default_factory=dict)
    threads: int | None = None


class Backend(ABC):
    """Launches and stops the worker processes of one pool."""

    name: str = "backend"
    #: the interface the kernel's listener binds (loopback for local workers)
    listen_host: str = "127.0.0.1"
    #: the address workers connect back to
    kernel_host: str = "127.0.0.1"
    #: seconds the started workers have to connect back (a loaded machine or cluster may need longer)
    start_timeout: float = 120.0

    @abstractmethod
    def plan(self, settings: PoolSettings) -> list[WorkerSpec]:
        """The workers to start, by rank; PoolError when the machine or cluster cannot hold them."""

    def prepare(self) -> None:  # noqa: B027 - optional: most backends have nothing to begin early
        """Begin what `start` needs that takes time (a restart prepares its replacement while the old workers are
        given their chance to stop); `stop` undoes it."""

    @abstractmethod
    def start(self, configs: Sequence[WorkerConfig]) -> None:
        """Launch one worker per config (configs hold the secret: pass them on pipes, never command lines)."""

    @abstractmethod
    def stop(self) -> None:
        """Stop every worker now (idempotent)."""

    @abstractmethod
    def alive(self) -> bool:
        """Whether the launcher still runs (workers report their own death through their channels)."""

    @abstractmethod
    def address(self, rank: int) -> str:
        """The address at which the other workers reach worker `rank` (rank 0 serves the group's store there)."""

    def exit_status(self, rank: int, pid: int) -> str | None:
        """How worker `rank` (process `pid`) ended, in words ("was killed by SIGKILL", "exited with code 1"), as the
        backend knows it; None when it does not know (or the worker still runs). May wait a moment for the news."""
        return None

    def node(self, rank: int) -> str | None:
        """Which node of a cluster runs worker `rank`, for `status()` (None: this machine, nothing to add)."""
        return None

    def describe(self) -> str:
        return self.name

    def status_name(self) -> str:
        """What `%pool` shows as the backend ("local", "ray", "slurm job 42 RUNNING")."""
        return self.name
