"""The worker pool (MATLAB's parpool): start, run code on every worker, futures, status, stop.

`Pool` is the public face over one module per concept: session.py (the kernel's running pool), settings.py (what
was asked for), worker_group.py (one start's workers and the parts over them, from launch to stop), startup.py
(launch and connect the workers, form the group), spare.py (a replacement begun while interrupted workers get their
chance to stop), routing.py (every reply to its request), foreground.py (the requests `run`, `spmd`, `push` and
`pull` wait for), waiting.py (blocking waits, interrupts, restarts), spmd.py (an spmd cell), tasks.py (the futures
queue), parallel_map.py (`map`), monitor.py (memory, idle timeout, the published state), status.py (what
`status()` returns) and output.py (workers' printing). Here: the face, and which start (`WorkerGroup`) is the
current one. What other nbscale modules use beyond this face is private here and reached through plumbing.py.
Blocking calls (`run`, `spmd`, `push`, `pull`) wait in the caller's thread and print workers' output live, each
line prefixed with its rank.
"""

from __future__ import annotations

import atexit
import secrets
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from typing import Any, TypeVar, cast

from nbscale.errors import PoolError, PoolInterrupted, UnsendableError, WorkerError
from nbscale.pool import protocol as p
from nbscale.pool import session
from nbscale.pool.backends.base import Backend
from nbscale.pool.cell_events import cell_events
from nbscale.pool.composite import Composite
from nbscale.pool.folders import current_folder
from nbscale.pool.foreground import target_ranks
from nbscale.pool.handles import WorkerHandle
from nbscale.pool.interrupts import each_despite_interrupts
from nbscale.pool.owner import pool_owner
from nbscale.pool.parallel_map import map_in_order
from nbscale.pool.requests import Request
from nbscale.pool.resident import forget_all
from nbscale.pool.settings import PoolSettings
from nbscale.pool.spare import SpareBackend
from nbscale.pool.spmd import SpmdCell, each_workers_own
from nbscale.pool.startup import require_fork
from nbscale.pool.status import PoolStatus, worker_statuses
from nbscale.pool.unsendable import call_error, variable_error
from nbscale.pool.waiting import Restarter
from nbscale.pool.worker_group import WorkerGroup
from nbscale.processes import kernel_id


def current_pool(start: bool = False) -> Pool | None:
    """The running pool, or None; with `start=True`, the running pool or a new one (`open_pool`)."""
    pool = session.running()
    if pool is not None:
        return cast(Pool, pool)
    return open_pool() if start else None


def open_pool(settings: PoolSettings | None = None) -> Pool:
    """The running pool, or a new one: with `settings`, one with them; else the pool that shut itself down idle
    again (its settings, cluster included), or one with default settings. `%pool restart` after an idle stop,
    `%%spmd` and training on the pool all open their pool here."""
    pool = session.running()
    if pool is not None:
        return cast(Pool, pool)
    return Pool.from_settings(settings or session.idle_settings() or PoolSettings())


_Result = TypeVar("_Result")  # what a function run on the workers returns


class Pool:
    """A pool of worker processes in one torch.distributed group (parpool).

    `Pool(n=None, gpus=None, cpu=False, cluster=None, idle_timeout=30, env=None, force=False,
    connect_timeout=None)` starts the workers and returns once every one has imported torch and joined the group.
    N defaults to the number of free GPUs (one worker each; a GPU another process holds is not free, see
    nbscale.gpu_reservations) or, without GPUs, the CPU count (at most 4). The pool holds its GPUs until it stops;
    `force=True` takes held GPUs too, sharing them. `idle_timeout` is in minutes (0: never). `env` values are set
    on every worker and never shown. `connect_timeout` (cluster pools) is the seconds allowed to reach the cluster
    and start its actors (default: the profile's, else 120). Use as a context manager, or call `close()`.
    Raises PoolError for bad settings, held GPUs, or when a pool is already running.
    """

    def __init__(
        self,
        n: int | None = None,
        gpus: Iterable[int] | None = None,
        cpu: bool = False,
        cluster: str | None = None,
        idle_timeout: float = 30,
        env: dict[str, str] | None = None,
        force: bool = False,
        connect_timeout: float | None = None,
    ) -> None:
        session.refuse_second_pool()  # before checking the settings, as the first thing wrong
        # PoolSettings checks and normalises what users pass: gpus any iterable, env None
        settings = PoolSettings(n, gpus, cpu, cluster, idle_timeout, env, force, connect_timeout)  # type: ignore[arg-type]
        self._open(settings)

    @classmethod
    def from_settings(cls, settings: PoolSettings) -> Pool:
        """Start a pool with `settings` (what `%pool start`, `%pool restart` after an idle stop, `%%spmd` and
        training on the pool start); raises as `Pool(...)` does."""
        pool = cls.__new__(cls)
        pool._open(settings)
        return pool

    def _open(self, settings: PoolSettings) -> None:
        session.refuse_second_pool()
        self.settings = settings
        self.closed: bool = True
        self.stopped_because = "It was stopped."  # what a use of this pool after it stopped says
        self._spare = SpareBackend(settings)  # a replacement prepared while interrupted workers get time to stop
        self._start()

    # ---- life cycle -----------------------------------------------------------------------------------------

    def _start(self, backend: Backend | None = None) -> None:
        """Start the workers (a fresh start, a restart, or %%spmd's automatic start); an interrupt while they start
        stops whatever started and says so in one line, not with the wait's internal traceback."""
        try:
            self._start_workers(backend)
        except KeyboardInterrupt as interrupted:
            if isinstance(interrupted, PoolInterrupted):
                raise
            raise PoolInterrupted(
                "Starting the pool was interrupted: the workers it had started were stopped, and no pool is running. "
                "Start it again with %pool start (nbscale.Pool(...))."
            ) from None

    def _start_workers(self, backend: Backend | None) -> None:
        require_fork()
        started = time.monotonic()
        self.start_seconds: float | None = None
        self.generation = secrets.token_hex(4)  # Composites of an earlier start know they are stale
        restarter = Restarter(self.restart, self._spare.prepare, self._spare.drop)
        self._group = WorkerGroup(self.settings, backend, restarter, self._state, self._stop_idle)
        self.closed = False
        session.started(self)
        try:
            self._group.join()
        except BaseException:
            self.close()
            raise
        self.start_seconds = time.monotonic() - started
        session.started_fully()
        self._group.monitor.start()
        atexit.register(self.close)

    def close(self) -> None:
        """Stop every worker (idempotent); takes well under a second."""
        self._shut_down(queued="the pool was stopped", running="the pool was stopped")

    def _shut_down(self, queued: str, running: str) -> None:
        """close(), failing the tasks still queued with `queued` and the requests running with `running`."""
        if self.closed:
            return
        self.closed = True
        self._group.router.stopping.set()
        # every step runs even if the kernel is interrupted meanwhile (a second Ctrl-C, one meant for the cell
        # before): a step cut short would leave a launcher, its workers or a waiting future behind
        interrupted = each_despite_interrupts(
            [
                self._spare.drop,
                *self._group.stop_steps(queued, running),
                forget_all,  # notebook tensors kept in shared memory for the workers (nbscale.pool.resident)
            ]
        )
        session.stopped(self)
        self._group.monitor.withdraw()
        if interrupted:
            raise PoolInterrupted("Interrupted while the pool stopped: it stopped all the same, and no worker is left.")

    def _stop_idle(self) -> None:
        notice = (
            f"The pool shut itself down after {self.settings.idle_timeout:g} idle "
            f"minute{'' if self.settings.idle_timeout == 1 else 's'} (--idle-timeout)."
        )
        session.stopped_idle(self.settings, notice)
        self.stopped_because = notice
        self.close()

    def restart(self) -> None:
        """Fresh processes with the same size and settings (variables on the workers are lost)."""
        spare = self._spare.take()
        # what was running is lost with its worker: say so, rather than that the pool stopped
        self._shut_down(
            queued="the pool was restarted; submit it again",
            running="the pool was restarted before it finished: run it again",
        )
        self._start(spare)

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- properties -----------------------------------------------------------------------------------------

    @property
    def workers(self) -> list[WorkerHandle]:
        """Each worker's handle by rank: rank, pid, host, device, state."""
        return self._group.router.workers

    @property
    def size(self) -> int:
        return len(self.workers)

    @property
    def devices(self) -> list[str]:
        return [w.device for w in self.workers]

    @property
    def busy(self) -> bool:
        """Whether a started pool's workers are running something (a cell, a call, a task, a training)."""
        return not self.closed and self.start_seconds is not None and self._group.router.busy

    @property
    def rejected_connections(self) -> int:
        """How many connections to the pool's port were refused while it started, not being from a worker."""
        return self._group.rejected_connections

    @property
    def kind(self) -> str:
        """ "gpu" when every worker has a GPU, else "cpu"."""
        return "gpu" if self.workers and all(d.startswith("cuda") for d in self.devices) else "cpu"

    def __repr__(self) -> str:
        env_keys = ", ".join(f"{key}=***" for key in self.settings.env)
        workers = f"{self.size} worker{'s' if self.size != 1 else ''}"
        state = "closed" if self.closed else f"{workers} ({self.kind}, {self._group.backend.describe()})"
        return f"<nbscale.Pool {state}{'; env ' + env_keys if env_keys else ''}>"

    # ---- run code on the workers ----------------------------------------------------------------------------

    def _request(
        self,
        message_factory: Callable[[int], Any],
        targets: Iterable[int] | None = None,
        on_event: Callable[[int, Any], None] | None = None,
        what: str = "The cell",
        unsendable: Callable[[Exception], UnsendableError] | None = None,
        on_failure: Callable[[Request], None] | None = None,
    ) -> list[Any]:
        """Send one message (built from a fresh request id) to `targets` and wait for every reply, as
        `Foreground.request` does, once the ranks are checked (PoolError for a stopped pool or a rank it lacks,
        WorkerError for a dead worker)."""
        ranks = target_ranks(targets, self.size)
        self._check_usable(ranks)
        return self._group.foreground.request(
            message_factory, ranks, what=what, on_event=on_event, unsendable=unsendable, on_failure=on_failure
        )

    def run(
        self,
        fn: Callable[..., _Result],
        *args: object,
        targets: Iterable[int] | None = None,
        on_event: Callable[[int, Any], None] | None = None,
        **kwargs: object,
    ) -> list[_Result]:
        """Run `fn(*args, **kwargs)` on every worker (or `targets`); a list of return values by rank.

        It runs in the notebook's current folder (see docs/pool.md). Worker output streams live; `on_event(rank,
        payload)` receives `worker_context().emit(payload)`. A Composite argument is each worker's own value, as in a
        %%spmd cell. Raises WorkerError with each failing rank's traceback.
        """
        name = getattr(fn, "__name__", "the function")
        args = tuple(each_workers_own(a, self, f"Argument {i + 1} of {name}()") for i, a in enumerate(args))
        kwargs = {key: each_workers_own(value, self, f"Argument {key}= of {name}()") for key, value in kwargs.items()}
        return self._request(
            lambda rid: p.Call(rid, fn, args, kwargs, current_folder()),
            targets,
            on_event,
            what=f"{name}()",
            unsendable=lambda error: call_error(fn, args, kwargs, error),
        )

    def spmd(
        self,
        code: str,
        targets: Iterable[int] | None = None,
        namespace: dict[str, Any] | None = None,
        *,
        filename: str | None = None,
    ) -> dict[str, Composite]:
        """Run `code` on every worker as an spmd cell (the Python form of `%%spmd`); returns its Composites,
        which are also bound in `namespace` (whose variables the cell reads are sent along; default: the caller's
        globals, the notebook's in a notebook, as `%%spmd` does).

        `filename` names the code in tracebacks (default `<spmd cell N>`); `%%spmd` passes the name IPython gave
        the notebook cell, so they say `Cell In[7], line 4`. Raises WorkerError when a rank fails (PoolInterrupted
        when the kernel is interrupted), after binding the Composites of what the workers hold then (the variables
        assigned before the error or the interrupt)."""
        namespace = namespace if namespace is not None else sys._getframe(1).f_globals
        ranks = target_ranks(targets, self.size)
        cell = SpmdCell.prepare(code, namespace, self, filename)
        group_ranks = None if ranks == tuple(range(self.size)) else ranks
        if group_ranks is not None:
            self._ensure_group(group_ranks)
        generation = self.generation

        def keep_what_workers_hold(request: Request) -> None:
            # as in IPython, what the cell assigned before it failed or was interrupted stays defined (unless the
            # pool restarted)
            if self.generation == generation:
                held = [request.replies.get(rank) or list(request.names_held.get(rank, ())) for rank in ranks]
                cell.bind_results(self, ranks, held, namespace)

        present = self._request(
            lambda rid: cell.message(rid, group_ranks),
            ranks,
            cell_events(self),
            what="The cell",
            on_failure=keep_what_workers_hold,
        )
        return cell.bind_results(self, ranks, present, namespace)

    def push(self, targets: Iterable[int] | None = None, **variables: object) -> None:
        """Bind variables in every worker's namespace (sent once through shared memory locally); a Composite binds
        each worker's own value."""
        variables = {name: each_workers_own(value, self, f"Variable {name!r}") for name, value in variables.items()}
        self._request(
            lambda rid: p.Push(rid, variables),
            targets,
            what="push",
            unsendable=lambda error: variable_error(variables, error, "Push something picklable instead."),
        )

    def pull(self, name: str, targets: Iterable[int] | None = None) -> list[Any]:
        """The value of `name` on every worker (or `targets`), by rank."""
        values = self._request(lambda rid: p.Pull(rid, (name,)), targets, what=f"pull({name!r})")
        return [value[name] for value in values]

    def _ensure_group(self, ranks: tuple[int, ...]) -> None:
        """Create the torch.distributed subgroup over `ranks` once (every worker takes part)."""
        if ranks == tuple(range(self.size)) or ranks in self._group.subgroups:
            return
        self._request(lambda rid: p.MakeGroup(rid, ranks), what="Creating the worker subgroup")
        self._group.subgroups.add(ranks)

    def request_stop(self, future: Future[Any] | None = None) -> None:
        """Ask running code to stop at its next check of `worker_context().stop_requested`.

        With `future` (from `submit`), only the worker running that task is asked.
        """
        group = self._group
        group.router.tell(p.RequestStop(), None if future is None else group.tasks.ranks_of(future))

    def _message_foreground(self, payload: Any) -> None:
        """Send `payload` to the workers running the request the caller's thread waits for (a `run` whose
        on_event is running now); its code reads it with `worker_context().next_message()`. Nothing when no
        request is waited for."""
        self._group.foreground.message_running_request(payload)

    def _check_usable(self, ranks: Iterable[int]) -> None:
        if self.closed:
            raise PoolError(
                f"This pool is no longer running. {self.stopped_because} Start a new one with %pool start "
                "(nbscale.Pool(N))."
            )
        dead = [w for w in self.workers if w.dead and w.rank in ranks]
        if dead:
            described = "; ".join(w.dead[0].upper() + w.dead[1:] for w in dead if w.dead)
            raise WorkerError(f"{described}. Run %pool restart (pool.restart()) for fresh workers.")

    # ---- futures (parfeval, parfor) -------------------------------------------------------------------------

    def submit(self, fn: Callable[..., Any], /, *args: object, **kwargs: object) -> Future[Any]:
        """Run `fn(*args, **kwargs)` on a free worker, in the notebook's current folder as of this call; returns a
        concurrent.futures.Future (parfeval)."""
        return self._submit_with_events(fn, None, *args, **kwargs)

    def _submit_with_events(
        self, fn: Callable[..., Any], on_event: Callable[[int, Any], None] | None, /, *args: object, **kwargs: object
    ) -> Future[Any]:
        """Like `submit`; `on_event(rank, payload)` receives each `worker_context().emit(payload)` of the task.

        `on_event` runs on the pool's receiver thread: keep it short and never block in it.
        """
        self._check_usable(())
        return self._group.tasks.submit(fn, args, kwargs, on_event)

    def cancel(self, future: Future[Any]) -> bool:
        """Cancel a task from `submit`: a queued one never runs; a running one is interrupted on its worker.

        Either way the future is cancelled at once, as concurrent.futures cancels a pending one: `cancelled()` is
        True and `result()` raises `concurrent.futures.CancelledError`. The worker is free for the next task as
        soon as the task has stopped; code that stops gracefully on the user's interrupt (training) stops at once,
        and says nothing. Returns False when the task had already finished.
        """
        return self._group.tasks.cancel(future)

    def map(
        self, fn: Callable[..., Any], *iterables: Iterable[Any], timeout: float | None = None, progress: bool = False
    ) -> Iterator[Any]:
        """Like `concurrent.futures.Executor.map`: results in order, computed on free workers (parfor).

        Items are submitted in a window of a few per worker ahead of the result taken last (as Executor.map's
        `buffersize` in Python 3.14; nbscale.pool.parallel_map): the first window now, the rest as results are
        taken, so an endless iterable works and a long one costs no time up front. `timeout` counts from this call,
        as in concurrent.futures. A failing item raises its WorkerError naming the item; interrupting the kernel
        raises PoolInterrupted. Either way the submitted items not yet done are cancelled (the running ones
        interrupted on their workers), and no more are submitted. `progress=True` shows a done/total bar under the
        cell (nbscale.progress_bar; the total when every iterable has a length).
        """
        self._check_usable(())
        return map_in_order(
            # through the pool at each call: a restart while the map runs gives it a new task queue
            lambda item_fn, args, what: self._group.tasks.submit(item_fn, args, {}, None, what=what),
            self.cancel,
            fn,
            iterables,
            workers=self.size,
            timeout=timeout,
            progress=progress,
        )

    # ---- status ---------------------------------------------------------------------------------------------

    def status(self) -> PoolStatus:
        """The pool and each worker (rank, host, pid, device, state, memory) now: a table in notebooks.

        Raises PoolError once the pool is closed (its workers are gone: a table of them would be stale)."""
        self._check_usable(())
        self._group.monitor.refresh_memory(wait=True)
        return self._snapshot()

    def _state(self) -> dict[str, Any]:
        """What the pool publishes for the JupyterLab extension (no secrets, no env values)."""
        return {"kernel_id": kernel_id(), **pool_owner(), **self._snapshot().to_dict()}

    def _snapshot(self) -> PoolStatus:
        group = self._group
        idle_left_s = group.monitor.idle_left_s()
        return PoolStatus(self.size, self.kind, group.backend.status_name(), idle_left_s, worker_statuses(self.workers))
