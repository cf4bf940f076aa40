"""What `pool.status()` returns: plain data about the pool and each worker (nbscale.ui renders it as a table)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from nbscale.pool.handles import WorkerHandle
from nbscale.rendering import Rendered


@dataclass(frozen=True)
class WorkerStatus:
    """One worker now: memory in MB (None until it first answered; device memory only on GPUs)."""

    rank: int
    host: str
    pid: int
    device: str
    state: str  # "idle", "busy" or "dead"
    memory_mb: float | None
    device_memory_mb: float | None


def worker_statuses(workers: Iterable[WorkerHandle]) -> tuple[WorkerStatus, ...]:
    """Each worker now, by rank; a dead worker's last memory figures are gone with its process."""
    return tuple(
        WorkerStatus(
            w.rank,
            w.host,
            w.pid,
            w.device,
            w.state,
            *((None, None) if w.dead else (w.memory_mb, w.device_memory_mb)),
        )
        for w in workers
    )


@dataclass(frozen=True, repr=False)
class PoolStatus(Rendered):
    """A snapshot of a pool: its size, kind ("cpu"/"gpu"), backend, the seconds left before an idle shutdown
    (None: no idle timeout), and each worker."""

    size: int
    kind: str
    backend: str
    idle_timeout_left_s: float | None
    workers: tuple[WorkerStatus, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (what the pool publishes for the JupyterLab extension)."""
        state = asdict(self)
        state["workers"] = [asdict(worker) for worker in self.workers]
        return state
