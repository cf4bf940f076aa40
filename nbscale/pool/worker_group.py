"""One start of a pool: its worker processes and what runs over their connections, from launch to shut-down.

A `Pool` makes a `WorkerGroup` each time it starts (a restart makes a new one): the backend that runs the workers,
the router that hands every reply to its request, the task queue of `submit`/`map`, the monitor (heartbeat, idle
timeout, published state), the foreground requests of `run`/`spmd`/`push`/`pull`, and the torch.distributed group
the workers form (with its subgroups and, for a local pool, its store folder). The pool keeps what outlives a start:
its settings, its spare backend and its place in the kernel's session.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nbscale.pool import protocol as p
from nbscale.pool.backends.base import Backend
from nbscale.pool.foreground import Foreground
from nbscale.pool.monitor import Monitor
from nbscale.pool.requests import secrets_of
from nbscale.pool.routing import Router
from nbscale.pool.settings import PoolSettings
from nbscale.pool.startup import join_group, launch_workers, make_backend, remove_stale_group_folders
from nbscale.pool.tasks import TaskQueue
from nbscale.pool.transport import remove_stale_files
from nbscale.pool.waiting import Restarter


class WorkerGroup:
    """The workers of one start, launched and connected; `join` forms their torch.distributed group.

    `restarter` is how a wait replaces workers that do not stop; `state` and `stop_idle` are the pool's published
    state and its idle shutdown, which the monitor calls. Raises what `launch_workers` raises (PoolError), after
    stopping the backend.
    """

    def __init__(
        self,
        settings: PoolSettings,
        backend: Backend | None,
        restarter: Restarter,
        state: Callable[[], dict[str, Any]],
        stop_idle: Callable[[], None],
    ) -> None:
        remove_stale_files()  # shared-memory files of kernels and workers killed mid-transfer
        remove_stale_group_folders()  # store folders of killed kernels' pools
        self.backend = backend or make_backend(settings)
        try:
            workers, self.rejected_connections = launch_workers(self.backend, settings)
        except BaseException:
            self.backend.stop()
            raise
        # the task queue sends through the router, which hands it its tasks' replies: both ends named here
        self.router = Router(
            workers,
            secrets=secrets_of(settings.env),
            exit_status=lambda worker: self.backend.exit_status(worker.rank, worker.pid),
            on_task_reply=lambda request, item: self.tasks.complete(request, item),
            on_worker_free=lambda: self.tasks.dispatch(),
        )
        self.tasks = TaskQueue(self.router)
        self.monitor = Monitor(self.router, settings.idle_timeout_s, lambda: bool(self.tasks.queued), state, stop_idle)
        self.foreground = Foreground(self.router, self.tasks, restarter)
        self.subgroups: set[tuple[int, ...]] = set()  # the torch.distributed subgroups made so far (%%spmd --targets)
        self.store_folder: Path | None = None  # the group's store file's folder (a local pool), removed at stop

    def join(self) -> None:
        """Start routing the workers' replies and form their torch.distributed group; the caller shuts the group
        down when this raises (PoolError naming each rank's cause)."""
        self.router.start()
        self.store_folder = join_group(self.router, self.backend)

    def stop_steps(self, queued: str, running: str) -> list[Callable[[], None]]:
        """The steps that stop the workers and everything over them, in order, each safe to repeat: tasks still
        queued fail with `queued`, requests running with `running`. Call once the router is `stopping`."""
        return [
            lambda: self.router.tell(p.Shutdown()),
            self.backend.stop,
            self._close_channels,
            lambda: self.tasks.fail_queued(queued),
            lambda: self.router.fail_everything(running),
            self._remove_store_folder,
        ]

    def _close_channels(self) -> None:
        for worker in self.router.workers:
            worker.channel.close()

    def _remove_store_folder(self) -> None:
        if self.store_folder is not None:  # the group's store file: its workers are gone
            shutil.rmtree(self.store_folder, ignore_errors=True)
