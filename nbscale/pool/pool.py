"""The worker pool (MATLAB's parpool): start, run code on every worker, futures, status, stop.

`Pool` owns the workers of one backend, an authenticated channel to each, and one receiver thread that routes
every incoming message to the request it answers. Blocking calls (`run`, `spmd`, `push`, `pull`) wait in the
caller's thread and print workers' output live, each line prefixed with its rank.
"""

from __future__ import annotations

import atexit
import os
import secrets
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass
from multiprocessing.connection import wait as wait_for_connections
from typing import Any

from nbscale.errors import PoolError, PoolInterrupted, WorkerError
from nbscale.pool import protocol as p
from nbscale.pool import registry
from nbscale.pool.backends.base import Backend
from nbscale.pool.channel import AuthenticationError, Channel, ChannelListener, MessageUnreadable, machine_id
from nbscale.pool.devices import plan_devices
from nbscale.pool.requests import Request, WorkerDied, next_request_id
from nbscale.pool.transport import Frame, serialise
from nbscale.processes import pid_running

START_TIMEOUT_S = 120.0
INTERRUPT_GRACE_S = 5.0
STATUS_TIMEOUT_S = 1.0

_current: Pool | None = None
_last_shutdown_notice: str | None = None


@dataclass
class WorkerHandle:
    """The kernel's view of one worker."""

    rank: int
    pid: int
    host: str
    device: str
    channel: Channel
    outstanding: int = 0
    dead: str | None = None
    memory_mb: float | None = None
    device_memory_mb: float | None = None
    status_round: int = 0

    @property
    def state(self) -> str:
        if self.dead:
            return "dead"
        return "busy" if self.outstanding else "idle"


def current_pool(start: bool = False) -> Pool | None:
    """The running pool, or None; with `start=True`, start one with default settings when none runs."""
    if _current is not None and not _current.closed:
        return _current
    if start:
        return Pool()
    return None


def require_pool() -> Pool:
    """The running pool, or a PoolError that says how to start one (and why the last one stopped)."""
    pool = current_pool()
    if pool is None:
        reason = f" {_last_shutdown_notice}" if _last_shutdown_notice else ""
        raise PoolError(f"No pool is running.{reason} Start one with %pool start [N] (or nbscale.Pool(N)).")
    return pool


def _take_shutdown_notice() -> str | None:
    """The reason the last pool stopped by itself, said once."""
    global _last_shutdown_notice
    notice, _last_shutdown_notice = _last_shutdown_notice, None
    return notice


class Pool:
    """A pool of worker processes in one torch.distributed group (parpool).

    `Pool(n=None, gpus=None, cpu=False, cluster=None, idle_timeout=30, env=None)` starts the workers and
    returns once every one has imported torch and joined the group. N defaults to the number of visible GPUs
    (one worker each) or, without GPUs, the CPU count (at most 4). `idle_timeout` is in minutes (0: never).
    `env` values are set on every worker and never shown. Use as a context manager, or call `close()`.
    Raises PoolError for bad settings or when a pool is already running.
    """

    def __init__(
        self,
        n: int | None = None,
        gpus: Iterable[int] | None = None,
        cpu: bool = False,
        cluster: str | None = None,
        idle_timeout: float = 30,
        env: dict[str, str] | None = None,
    ) -> None:
        if _current is not None and not _current.closed:
            raise PoolError(
                f"A pool of {_current.size} workers is already running. Stop it first with %pool stop "
                "(pool.close()), or get fresh workers with %pool restart."
            )
        if idle_timeout is None or idle_timeout < 0:
            raise PoolError(f"--idle-timeout must be minutes >= 0 (0 = never), not {idle_timeout!r}.")
        self.settings = {
            "n": n,
            "gpus": list(gpus) if gpus is not None else None,
            "cpu": cpu,
            "cluster": cluster,
            "idle_timeout": idle_timeout,
            "env": dict(env or {}),
        }
        _check_env(self.settings["env"])
        self.closed = False
        self._start()

    # ---- life cycle -----------------------------------------------------------------------------------------

    def _start(self) -> None:
        global _current
        settings = self.settings
        self.backend = self._make_backend(settings["cluster"])
        self.devices_plan = plan_devices(settings["n"], settings["gpus"], settings["cpu"]) if not settings["cluster"] else None
        self.workers: list[WorkerHandle] = []
        self._requests: dict[int, Request] = {}
        self._lock = threading.RLock()
        self._tasks: deque[tuple[Future[Any], p.Call, Frame]] = deque()
        self._task_events: dict[int, Callable[[int, Any], None]] = {}  # request id -> on_event of a queued task
        self._cancelled: set[int] = set()  # request ids of running tasks interrupted by cancel()
        self._foreground: Request | None = None
        self._groups: set[tuple[int, ...]] = set()
        self._status_round = 0
        self._last_activity = time.monotonic()
        self._stopping = threading.Event()
        self.rejected_connections = 0
        self.generation = secrets.token_hex(4)
        started = time.monotonic()
        secret = secrets.token_bytes(32)
        listener = ChannelListener(secret, host=self.backend.listen_host)
        try:
            configs = self._worker_configs(listener, secret)
            self.backend.start(configs)
            self._accept_workers(listener, len(configs))
        except BaseException:
            listener.close()
            self._teardown()
            raise
        listener.close()  # no connection is accepted after start
        self.closed = False
        _current = self
        threading.Thread(target=self._receive_forever, name="nbscale-pool-receiver", daemon=True).start()
        try:
            self._init_group()
        except BaseException:
            self.close()
            raise
        self.start_seconds = time.monotonic() - started
        threading.Thread(target=self._monitor, name="nbscale-pool-monitor", daemon=True).start()
        atexit.register(self.close)

    def _make_backend(self, cluster: str | None) -> Backend:
        if cluster:
            from nbscale.pool.backends.cluster import make_cluster_backend

            return make_cluster_backend(cluster, self.settings)
        from nbscale.pool.backends.local import LocalBackend

        return LocalBackend()

    def _worker_configs(self, listener: ChannelListener, secret: bytes) -> list[dict[str, Any]]:
        if self.devices_plan is None:  # cluster: the backend knows its workers
            return self.backend.plan_workers(listener, secret)  # type: ignore[attr-defined]
        world_size = len(self.devices_plan)
        cpu_threads = max(1, (os.cpu_count() or 1) // world_size)
        configs = []
        for rank, gpu in enumerate(self.devices_plan):
            env = {**self.settings["env"], "CUDA_VISIBLE_DEVICES": gpu if gpu is not None else ""}
            configs.append(
                {
                    "address": list(listener.address),
                    "secret": secret.hex(),
                    "rank": rank,
                    "world_size": world_size,
                    "device": "cuda:0" if gpu is not None else "cpu",
                    "kernel_machine_id": machine_id(),
                    "env": env,
                    "threads": None if gpu is not None else cpu_threads,
                }
            )
        return configs

    def _accept_workers(self, listener: ChannelListener, count: int) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        handles: dict[int, WorkerHandle] = {}
        while len(handles) < count:
            if time.monotonic() > deadline:
                raise PoolError(f"Only {len(handles)} of {count} workers connected within {START_TIMEOUT_S:.0f} s.")
            if not self.backend.alive():
                raise PoolError(
                    f"The workers' launcher ({self.backend.describe()}) exited before every worker connected "
                    f"({len(handles)} of {count}); see the kernel's log for its error."
                )
            try:
                channel = listener.accept(timeout=0.25)
            except TimeoutError:
                continue
            except (AuthenticationError, OSError, EOFError):
                self.rejected_connections += 1
                continue
            if not channel.connection.poll(30):
                channel.close()
                continue
            hello = channel.recv()
            channel.same_machine = hello.machine_id == machine_id()
            handles[hello.rank] = WorkerHandle(hello.rank, hello.pid, hello.host, hello.device, channel)
        self.workers = [handles[rank] for rank in sorted(handles)]

    def _init_group(self) -> None:
        backend = "cuda:nccl,cpu:gloo" if all(w.device.startswith("cuda") for w in self.workers) else "gloo"
        master = self.workers[0]
        master_addr = "127.0.0.1" if self.backend.listen_host == "127.0.0.1" else master.host
        if hasattr(self.backend, "master_address"):
            master_addr = self.backend.master_address(master)  # type: ignore[attr-defined]
        port_found: dict[str, int] = {}
        init = p.InitGroup(next_request_id(), backend, master_addr, 0, self.size)
        request = self._send(init, (0,), foreground=True, on_event=lambda rank, event: port_found.update(event))
        while "store_port" not in port_found and not request.failures:
            self._pump(request, timeout=0.05)
        if request.failures:
            self._finish(request)
            raise request.error("Joining the torch.distributed group")
        others = tuple(range(1, self.size))
        if others:
            message = p.InitGroup(init.request_id, backend, master_addr, port_found["store_port"], self.size)
            request.ranks = tuple(range(self.size))
            self._send_to(message, others, request)
        self._wait(request, what="Joining the torch.distributed group")

    def close(self) -> None:
        """Stop every worker (idempotent); takes well under a second."""
        global _current
        if self.closed:
            return
        self.closed = True
        self._stopping.set()
        for worker in self.workers:
            if not worker.dead:
                try:
                    worker.channel.send(p.Shutdown())
                except (OSError, ValueError):
                    pass
        self._teardown()
        self._fail_everything("the pool was stopped")
        if _current is self:
            _current = None
        try:
            registry.withdraw()
        except OSError:
            pass

    def _teardown(self) -> None:
        self.backend.stop()
        for worker in getattr(self, "workers", []):
            worker.channel.close()

    def restart(self) -> None:
        """Fresh processes with the same size and settings (variables on the workers are lost)."""
        self.close()
        self._start()

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- properties -----------------------------------------------------------------------------------------

    @property
    def size(self) -> int:
        return len(self.workers)

    @property
    def devices(self) -> list[str]:
        return [w.device for w in self.workers]

    @property
    def kind(self) -> str:
        return "gpu" if self.workers and all(d.startswith("cuda") for d in self.devices) else "cpu"

    def __repr__(self) -> str:
        env_keys = ", ".join(f"{key}=***" for key in self.settings["env"])
        state = "closed" if self.closed else f"{self.size} workers ({self.kind}, {self.backend.describe()})"
        return f"<nbscale.Pool {state}{'; env ' + env_keys if env_keys else ''}>"

    # ---- sending and receiving ------------------------------------------------------------------------------

    def _check_usable(self, ranks: Iterable[int]) -> None:
        if self.closed:
            notice = _last_shutdown_notice or "It was stopped."
            raise PoolError(f"This pool is no longer running. {notice} Start a new one with %pool start.")
        dead = [w for w in self.workers if w.dead and w.rank in ranks]
        if dead:
            described = "; ".join(w.dead[0].upper() + w.dead[1:] for w in dead if w.dead)
            raise WorkerError(f"{described}. Run %pool restart (pool.restart()) for fresh workers.")

    def _send(
        self,
        message: Any,
        ranks: tuple[int, ...],
        foreground: bool = False,
        on_event: Callable[[int, Any], None] | None = None,
        future: Future[Any] | None = None,
        frame: Frame | None = None,
    ) -> Request:
        request = Request(message.request_id, ranks, on_event=on_event, future=future)
        with self._lock:
            self._requests[request.request_id] = request
            if foreground:
                self._foreground = request
        self._send_to(message, ranks, request, frame)
        return request

    def _send_to(self, message: Any, ranks: tuple[int, ...], request: Request, frame: Frame | None = None) -> None:
        frame = frame or serialise(message)
        request.frame = frame
        self._last_activity = time.monotonic()
        for rank in ranks:
            worker = self.workers[rank]
            with self._lock:
                worker.outstanding += 1
            try:
                worker.channel.send_frame(frame)
            except (OSError, ValueError):
                self._worker_died(worker, "its connection closed")

    def _receive_forever(self) -> None:
        """Route every incoming message to its request; notice dead workers."""
        while not self._stopping.is_set():
            live = {w.channel.connection: w for w in self.workers if not w.dead}
            if not live:
                return
            try:
                ready = wait_for_connections(list(live), timeout=0.5)
            except (OSError, ValueError):
                continue
            for connection in ready:
                worker = live[connection]
                try:
                    message = worker.channel.recv()
                except MessageUnreadable as unreadable:
                    message = _unreadable_reply(worker.rank, unreadable)
                    if message is None:
                        continue
                except (EOFError, OSError, ValueError):
                    if not self._stopping.is_set():
                        self._worker_died(worker, self._death_description(worker))
                    continue
                self._route(worker, message)

    def _death_description(self, worker: WorkerHandle) -> str:
        fate = "closed its connection" if pid_running(worker.pid) else "died"
        return f"worker {worker.rank} (pid {worker.pid}) {fate}"

    def _route(self, worker: WorkerHandle, message: Any) -> None:
        if isinstance(message, p.Output):
            foreground = self._foreground
            if foreground is not None:
                foreground.inbox.put(message)
            else:
                _print_output(message)
            return
        if isinstance(message, p.StatusReport):
            worker.memory_mb, worker.device_memory_mb = message.memory_mb, message.device_memory_mb
            worker.status_round = message.request_id
            return
        with self._lock:
            request = self._requests.get(message.request_id)
            if isinstance(message, p.Done | p.Failed):
                worker.outstanding = max(0, worker.outstanding - 1)
                self._last_activity = time.monotonic()
        if request is None:
            return
        if request.future is not None:
            self._complete_future(request, message)
        else:
            request.inbox.put(message)
        if isinstance(message, p.Done | p.Failed):
            self._dispatch_tasks()

    def _worker_died(self, worker: WorkerHandle, description: str) -> None:
        with self._lock:
            if worker.dead:
                return
            worker.dead = description
            worker.outstanding = 0
            waiting = [r for r in self._requests.values() if worker.rank in r.waiting_for]
        worker.channel.close()
        for request in waiting:
            item = WorkerDied(worker.rank, f"{description}. Run %pool restart for fresh workers.")
            if request.future is not None:
                self._complete_future(request, item)
            else:
                request.inbox.put(item)
        self._dispatch_tasks()

    def _fail_everything(self, reason: str) -> None:
        with self._lock:
            requests, self._requests = list(self._requests.values()), {}
            tasks, self._tasks = list(self._tasks), deque()
            self._task_events.clear()
        for future, _, frame in tasks:
            frame.release()
            if future.set_running_or_notify_cancel():
                future.set_exception(PoolError(f"The task did not run: {reason}."))
        for request in requests:
            for rank in request.waiting_for:
                item = WorkerDied(rank, reason)
                if request.future is not None:
                    self._complete_future(request, item)
                else:
                    request.inbox.put(item)

    def _pump(self, request: Request, timeout: float) -> None:
        """Handle one item of a blocking request's inbox: print output, pass on events, note replies."""
        try:
            item = request.inbox.get(timeout=timeout)
        except Exception:  # queue.Empty
            return
        if isinstance(item, p.Output):
            _print_output(item)
        elif isinstance(item, p.Event):
            if request.on_event is not None:
                request.on_event(item.rank, item.payload)
        else:
            request.record(item)

    def _drain_output(self, request: Request) -> None:
        while not request.inbox.empty():
            self._pump(request, timeout=0)

    def _finish(self, request: Request) -> None:
        with self._lock:
            self._requests.pop(request.request_id, None)
            if self._foreground is request:
                self._foreground = None
        if request.frame is not None:
            request.frame.release()

    def _wait(self, request: Request, what: str = "The cell") -> list[Any]:
        """Block until every rank answered; Ctrl-C / kernel interrupt interrupts the workers."""
        try:
            while request.waiting_for:
                self._pump(request, timeout=0.25)
                if any(r in request.failures for r in request.ranks) and self._only_dead_missing(request):
                    break
            self._drain_output(request)
        except KeyboardInterrupt:
            outcome = self._interrupt(request)
            raise PoolInterrupted(outcome) from None
        finally:
            self._finish(request)
        if request.failures:
            raise request.error(what)
        return [request.replies[rank] for rank in request.ranks]

    def _only_dead_missing(self, request: Request) -> bool:
        """A worker died mid-request: the others may wait forever in a collective, so stop waiting."""
        return any(self.workers[r].dead for r in request.failures)

    def _interrupt(self, request: Request) -> str:
        """Interrupt the workers still running `request`; restart the pool if some do not stop. Says what happened."""
        pending = request.waiting_for
        for rank in pending:
            try:
                self.workers[rank].channel.send(p.Interrupt())
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + INTERRUPT_GRACE_S
        while request.waiting_for and time.monotonic() < deadline:
            try:
                self._pump(request, timeout=0.1)
            except KeyboardInterrupt:
                break
        self._drain_output(request)
        stuck = request.waiting_for
        interrupted = f"Interrupted workers {', '.join(map(str, pending))}."
        if not stuck:
            return f"{interrupted} The pool is ready for the next cell."
        self._finish(request)
        self.restart()
        return (
            f"{interrupted} {_workers(stuck)} did not stop within {INTERRUPT_GRACE_S:.0f} s "
            "(stuck in a collective?), so the pool was restarted with fresh workers; their variables are lost."
        )

    # ---- public API: run code -------------------------------------------------------------------------------

    def _targets(self, targets: Iterable[int] | None) -> tuple[int, ...]:
        if targets is None:
            return tuple(range(self.size))
        ranks = tuple(sorted(set(int(t) for t in targets)))
        bad = [r for r in ranks if not 0 <= r < self.size]
        if bad or not ranks:
            raise PoolError(
                f"--targets {', '.join(map(str, bad)) or '(empty)'} is not a worker of this pool: "
                f"ranks run from 0 to {self.size - 1}."
            )
        return ranks

    def request(
        self,
        message_factory: Callable[[int], Any],
        targets: Iterable[int] | None = None,
        on_event: Callable[[int, Any], None] | None = None,
        what: str = "The cell",
    ) -> list[Any]:
        """Send one message (built from a fresh request id) to `targets` and wait for every reply."""
        ranks = self._targets(targets)
        self._check_usable(ranks)
        busy_with_tasks = self._ranks_running_tasks(ranks)
        if busy_with_tasks:
            print(
                f"{_workers(busy_with_tasks)} still running a task from pool.submit or pool.map; this starts there "
                "once it ends (pool.cancel(future) stops a task)."
            )
        message = message_factory(next_request_id())
        try:
            frame = serialise(message)
        except Exception as error:
            raise PoolError(f"{what} could not be sent to the workers: {error}") from None
        request = self._send(message, ranks, foreground=True, on_event=on_event, frame=frame)
        return self._wait(request, what=what)

    def run(
        self,
        fn: Callable[..., Any],
        *args: Any,
        targets: Iterable[int] | None = None,
        on_event: Callable[[int, Any], None] | None = None,
        **kwargs: Any,
    ) -> list[Any]:
        """Run `fn(*args, **kwargs)` on every worker (or `targets`); a list of return values by rank.

        Worker output streams live; `on_event(rank, payload)` receives `worker_context().emit(payload)`.
        Raises WorkerError with each failing rank's traceback.
        """
        name = getattr(fn, "__name__", "the function")
        return self.request(lambda rid: p.Call(rid, fn, args, kwargs), targets, on_event, what=f"{name}()")

    def spmd(self, code: str, targets: Iterable[int] | None = None, namespace: dict[str, Any] | None = None) -> dict:
        """Run `code` on every worker as an spmd cell (the Python form of `%%spmd`); returns its Composites."""
        from nbscale.pool.spmd import run_spmd_cell

        return run_spmd_cell(self, code, targets=targets, namespace=namespace)

    def push(self, targets: Iterable[int] | None = None, **variables: Any) -> None:
        """Bind variables in every worker's namespace (sent once through shared memory locally)."""
        self.request(lambda rid: p.Push(rid, variables), targets, what="push")

    def pull(self, name: str, targets: Iterable[int] | None = None) -> list[Any]:
        """The value of `name` on every worker (or `targets`), by rank."""
        values = self.request(lambda rid: p.Pull(rid, (name,)), targets, what=f"pull({name!r})")
        return [value[name] for value in values]

    def ensure_group(self, ranks: tuple[int, ...]) -> None:
        """Create the torch.distributed subgroup over `ranks` once (every worker takes part)."""
        if ranks == tuple(range(self.size)) or ranks in self._groups:
            return
        self.request(lambda rid: p.MakeGroup(rid, ranks), what="Creating the worker subgroup")
        self._groups.add(ranks)

    def request_stop(self, future: Future[Any] | None = None) -> None:
        """Ask running code to stop at its next check of `worker_context().stop_requested`.

        With `future` (from `submit`), only the worker running that task is asked.
        """
        ranks = None if future is None else self._future_ranks(future)
        for worker in self.workers:
            if not worker.dead and (ranks is None or worker.rank in ranks):
                worker.channel.send(p.RequestStop())

    # ---- public API: futures --------------------------------------------------------------------------------

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        """Run `fn(*args, **kwargs)` on a free worker; returns a concurrent.futures.Future (parfeval)."""
        return self.submit_with_events(fn, None, *args, **kwargs)

    def submit_with_events(
        self, fn: Callable[..., Any], on_event: Callable[[int, Any], None] | None, /, *args: Any, **kwargs: Any
    ) -> Future[Any]:
        """Like `submit`; `on_event(rank, payload)` receives each `worker_context().emit(payload)` of the task.

        `on_event` runs on the pool's receiver thread: keep it short and never block in it.
        """
        self._check_usable(())
        future: Future[Any] = Future()
        message = p.Call(next_request_id(), fn, args, kwargs)
        try:
            frame = serialise(message)
        except Exception as error:
            raise PoolError(f"{getattr(fn, '__name__', 'the function')} could not be sent to the workers: {error}") from None
        with self._lock:
            self._tasks.append((future, message, frame))
            if on_event is not None:
                self._task_events[message.request_id] = on_event
        self._dispatch_tasks()
        return future

    def cancel(self, future: Future[Any]) -> bool:
        """Cancel a task from `submit`: a queued one never runs; a running one is interrupted on its worker.

        The worker is free for the next task as soon as it has stopped. A running task's future then ends with
        `concurrent.futures.CancelledError` as its exception. Returns False when the task had already finished.
        """
        if future.cancel():
            return True
        with self._lock:  # held while sending, so no next task reaches that worker before the Interrupt
            request = self._request_of(future)
            if request is None or future.done():
                return False
            self._cancelled.add(request.request_id)
            for rank in request.waiting_for:
                try:
                    self.workers[rank].channel.send(p.Interrupt(request.request_id))
                except (OSError, ValueError):
                    pass
        return True

    def _ranks_running_tasks(self, ranks: Iterable[int]) -> list[int]:
        with self._lock:
            running = {rank for r in self._requests.values() if r.future is not None for rank in r.waiting_for}
        return sorted(running.intersection(ranks))

    def _future_ranks(self, future: Future[Any]) -> list[int]:
        with self._lock:
            request = self._request_of(future)
            return request.waiting_for if request is not None else []

    def _request_of(self, future: Future[Any]) -> Request | None:
        """The running request of a task's future (None when it is queued or done); call with the lock held."""
        return next((r for r in self._requests.values() if r.future is future), None)

    def map(self, fn: Callable[..., Any], *iterables: Iterable[Any], timeout: float | None = None) -> Iterator[Any]:
        """Like `concurrent.futures.Executor.map`: results in order, computed on free workers (parfor)."""
        futures = [self.submit(fn, *args) for args in zip(*iterables, strict=False)]

        def results() -> Iterator[Any]:
            try:
                for future in futures:
                    yield future.result(timeout=timeout)
            finally:  # interrupted, failed or abandoned: queued items never run, running ones are interrupted
                for future in futures:
                    if not future.done():
                        self.cancel(future)

        return results()

    def _dispatch_tasks(self) -> None:
        with self._lock:
            while self._tasks:
                idle = [w for w in self.workers if not w.dead and w.outstanding == 0]
                if not idle:
                    return
                future, message, frame = self._tasks.popleft()
                on_event = self._task_events.pop(message.request_id, None)
                if not future.set_running_or_notify_cancel():
                    frame.release()
                    continue
                self._send(message, (idle[0].rank,), future=future, frame=frame, on_event=on_event)

    def _complete_future(self, request: Request, item: Any) -> None:
        if isinstance(item, p.Event):
            if request.on_event is not None:
                request.on_event(item.rank, item.payload)
            return
        request.record(item)
        self._finish(request)
        future = request.future
        assert future is not None
        if future.done():
            return
        if request.request_id in self._cancelled:
            self._cancelled.discard(request.request_id)
            future.set_exception(CancelledError(f"Cancelled with pool.cancel(); worker {request.ranks[0]} is free."))
        elif request.failures:
            future.set_exception(request.error("The task"))
        else:
            future.set_result(request.replies[request.ranks[0]])

    # ---- status ---------------------------------------------------------------------------------------------

    def status(self) -> Any:
        """A table of workers (rank, host, pid, device, state, memory): rich HTML in notebooks."""
        from nbscale.ui.pool_status import PoolStatus

        self._refresh_memory(wait=True)
        return PoolStatus.from_pool(self)

    def _refresh_memory(self, wait: bool) -> None:
        """Ask every live worker for its memory; with `wait`, until each answered (at most 1 s).

        Workers keep showing their last figure until the new one arrives.
        """
        alive = [w for w in self.workers if not w.dead]
        self._status_round += 1
        query = p.StatusQuery(self._status_round)
        for worker in alive:
            try:
                worker.channel.send(query)
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + STATUS_TIMEOUT_S
        while wait and time.monotonic() < deadline and any(w.status_round < query.request_id for w in alive if not w.dead):
            time.sleep(0.01)

    def state(self) -> dict[str, Any]:
        """What the pool publishes for the JupyterLab extension (no secrets, no env values)."""
        idle_left = None
        if self.settings["idle_timeout"]:
            idle_left = max(0.0, self.settings["idle_timeout"] * 60 - (time.monotonic() - self._last_activity))
        return {
            "kernel_id": _kernel_id(),
            "size": self.size,
            "kind": self.kind,
            "backend": self.backend.name,
            "idle_timeout_left_s": idle_left,
            "workers": [
                {
                    "rank": w.rank,
                    "host": w.host,
                    "pid": w.pid,
                    "device": w.device,
                    "state": w.state,
                    "memory_mb": w.memory_mb,
                    "device_memory_mb": w.device_memory_mb,
                }
                for w in self.workers
            ],
        }

    def _publish(self) -> None:
        try:
            registry.publish(self.state())
        except OSError:
            pass

    def _monitor(self) -> None:
        """Every few seconds: refresh memory, publish state, and enforce the idle timeout."""
        global _last_shutdown_notice
        self._refresh_memory(wait=True)
        self._publish()
        while not self._stopping.wait(registry.HEARTBEAT_S if not self._idle_soon() else 0.2):
            idle_minutes = self.settings["idle_timeout"]
            busy = any(w.outstanding for w in self.workers) or self._tasks
            if idle_minutes and not busy and time.monotonic() - self._last_activity > idle_minutes * 60:
                _last_shutdown_notice = f"The pool shut itself down after {idle_minutes:g} idle minutes (--idle-timeout)."
                self.close()
                return
            self._refresh_memory(wait=False)
            self._publish()

    def _idle_soon(self) -> bool:
        idle_minutes = self.settings["idle_timeout"]
        return bool(idle_minutes) and idle_minutes * 60 < 2 * registry.HEARTBEAT_S


def _workers(ranks: Iterable[int]) -> str:
    """'Worker 1' or 'Workers 0, 2'."""
    ranks = list(ranks)
    return f"Worker{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


_open_progress_line: dict[str, int] = {}  # stream name -> rank whose progress line (redrawn after "\r") is open


def _print_output(output: p.Output) -> None:
    """A worker's output, each line prefixed with its rank, also after a carriage return.

    A chunk that redraws a line after "\r" and does not end it (a tqdm bar) leaves the line open, so the notebook
    redraws it in place; other output ends an open line first.
    """
    stream = sys.stderr if output.stream == "stderr" else sys.stdout
    text = output.text
    open_rank = _open_progress_line.pop(output.stream, None)
    if open_rank is not None and not (open_rank == output.rank and text.startswith("\r")):
        stream.write("\n")
    lines = text.split("\n")
    stream.write("\n".join(_prefixed(line, output.rank) if line or i < len(lines) - 1 else line
                           for i, line in enumerate(lines)))
    if not text.endswith("\n"):
        if "\r" in text:
            _open_progress_line[output.stream] = output.rank
        else:
            stream.write("\n")
    stream.flush()


def _prefixed(line: str, rank: int) -> str:
    """`line` with its rank before it and before each redraw after a carriage return."""
    pieces = line.split("\r")
    return "\r".join(f"[{rank}] {piece}" if piece or len(pieces) == 1 else piece for piece in pieces)


def _unreadable_reply(rank: int, unreadable: MessageUnreadable) -> Any:
    """What to route in place of a worker's message the notebook cannot unpickle (None: nothing)."""
    if unreadable.kind in ("Done", "Failed") and unreadable.request_id is not None:
        return p.Failed(
            unreadable.request_id, rank, type(unreadable.error).__name__,
            f"its result could not be read in the notebook ({unreadable}). A value sent back from a worker must "
            "load here too: its class must be importable in the notebook, not only on the workers.",
            "",
        )  # fmt: skip
    if unreadable.kind == "Event":
        return p.Output(rank, "stderr", f"an event from this worker could not be read in the notebook ({unreadable})\n")
    return None


def _kernel_id() -> str | None:
    try:
        from ipykernel.connect import get_connection_file

        name = os.path.basename(get_connection_file())
    except Exception:
        return None
    return name[len("kernel-") : -len(".json")] if name.startswith("kernel-") and name.endswith(".json") else None


def _check_env(env: dict[str, str]) -> None:
    for key, value in env.items():
        if not key or not isinstance(key, str) or "=" in key or not isinstance(value, str):
            raise PoolError(f"--env takes KEY=VALUE pairs with string values; {key!r} is not one.")
