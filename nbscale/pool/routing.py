"""Message routing: every reply a worker sends reaches the request it answers.

One receiver thread reads every worker's channel. Output goes to the blocking request in the foreground (whose
caller prints it) or straight to the notebook; replies of a blocking request go to its inbox, which the caller's
thread reads in waiting.py's `wait`; replies of a task (`pool.submit`) go to the task queue. A worker whose
channel closes is marked dead, and every request waiting for it learns so at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_for_connections
from typing import Any, cast

from nbscale.notices import notices
from nbscale.pool import protocol as p
from nbscale.pool.channel import MessageUnreadable
from nbscale.pool.folders import missing_folder_warning
from nbscale.pool.handles import WorkerHandle
from nbscale.pool.health import process_state
from nbscale.pool.interrupts import HeldInterrupt
from nbscale.pool.output import OutputBacklog, flush_output, print_output
from nbscale.pool.requests import Request, WorkerDied
from nbscale.pool.transport import Frame, serialise


class Router:
    """Sends requests to workers and routes what comes back (waiting.py's `wait` blocks a caller until its
    request ends).

    `secrets`: the pool's --env values, kept out of workers' error texts. `exit_status(worker)`: how a worker's
    process ended, from its backend (None: unknown, or it still runs). `on_task_reply(request, item)`: a task's
    event or reply (or its worker's death) arrived, for the task queue; `on_worker_free()`: a worker may have
    become free. Both run on the receiver thread.
    """

    def __init__(
        self,
        workers: list[WorkerHandle],
        secrets: tuple[str, ...] = (),
        exit_status: Callable[[WorkerHandle], str | None] = lambda worker: None,
        on_task_reply: Callable[[Request, Any], None] = lambda request, item: None,
        on_worker_free: Callable[[], None] = lambda: None,
    ) -> None:
        self.workers = workers
        self.requests: dict[int, Request] = {}
        self.lock = threading.RLock()
        self.foreground: Request | None = None
        self.background_output = OutputBacklog()  # output of tasks (pool.submit), shown by the receiver thread
        self.last_activity = time.monotonic()
        self.stopping = threading.Event()
        self.secrets = secrets
        self.exit_status = exit_status
        self.on_task_reply = on_task_reply
        self.on_worker_free = on_worker_free
        self.missing_folders: set[str] = set()  # notebook folders some worker could not enter: warned once each

    def start(self) -> None:
        threading.Thread(target=self._receive_forever, name="nbscale-pool-receiver", daemon=True).start()

    # ---- sending ------------------------------------------------------------------------------------------------

    def send(
        self,
        message: Any,
        ranks: tuple[int, ...],
        foreground: bool = False,
        on_event: Callable[[int, Any], None] | None = None,
        future: Future[Any] | None = None,
        frame: Frame | None = None,
    ) -> Request:
        """Send `message` to `ranks` as a new request (`foreground`: its caller will `wait` for it)."""
        request = Request(message.request_id, ranks, on_event=on_event, future=future, secrets=self.secrets)
        with self.lock:
            self.requests[request.request_id] = request
            if foreground:
                self.foreground = request
        self.send_to(message, ranks, request, frame)
        return request

    def send_to(self, message: object, ranks: Iterable[int], request: Request, frame: Frame | None = None) -> None:
        """Send (more of) a request to `ranks`: to every one of them, whole, even when the kernel is interrupted
        meanwhile (the interrupt lands once it is sent: a rank left without a request the others run would leave
        them waiting for it in their collectives)."""
        with HeldInterrupt():
            self._send_to(message, ranks, request, frame)

    def _send_to(self, message: object, ranks: Iterable[int], request: Request, frame: Frame | None) -> None:
        frame = frame or serialise(message)
        request.frame = frame
        self.last_activity = time.monotonic()
        ranks = list(ranks)
        folder = getattr(message, "cwd", None)  # the notebook's folder a RunCell or Call runs in
        if all(self.workers[rank].channel.same_machine for rank in ranks) and frame.to_shared_memory():
            frame.buffers = []  # no receiver needs them on the socket: free the copies (a GPU tensor's, say) now
        for rank in ranks:
            worker = self.workers[rank]
            with self.lock:
                worker.outstanding += 1
                # a spot from the last request says nothing of this one
                worker.where, worker.still_s, worker.collective = "", 0.0, ""
            # a large message keeps the worker's receiver thread reading instead of answering the heartbeat: its
            # transfer time does not count as silence
            worker.transferring, began = True, time.monotonic()
            try:
                if folder is not None and folder != worker.folder_told:  # read before the request's own pickles
                    worker.channel.send(p.NotebookFolder(folder))
                    worker.folder_told = folder
                worker.channel.send_frame(frame)
            except (OSError, ValueError):
                # a worker found dead between the caller's check and this send (its end of the connection closed,
                # and the receiver failed the requests of that moment) fails this request too: else it waits for
                # that rank forever
                if not self.worker_died(worker, "its connection closed"):
                    with self.lock:
                        worker.outstanding = 0
                    self._deliver(request, _died(worker))
            except KeyboardInterrupt:  # a second interrupt, part-way through: the worker cannot tell where the next
                # message begins, so it is given up (and exits once it reads the end of its connection)
                self.worker_died(
                    worker,
                    f"worker {rank} was cut off part-way through a message it was sent (a second "
                    "interrupt while it was sent)",
                )
                raise
            finally:
                worker.transferring = False
                worker.last_heard = max(worker.last_heard, began)

    def tell(self, message: object, ranks: Iterable[int] | None = None) -> None:
        """Send a control message (no reply expected) to the live workers among `ranks` (default: all)."""
        wanted = None if ranks is None else set(ranks)
        for worker in self.workers:
            if wanted is None or worker.rank in wanted:
                worker.send_quietly(message)

    # ---- receiving ----------------------------------------------------------------------------------------------

    def _receive_forever(self) -> None:
        """Route every incoming message to its request; notice dead workers."""
        while not self.stopping.is_set():
            live = {w.channel.connection: w for w in self.workers if not w.dead}
            if not live:
                return
            try:
                # wait returns some of the connections it was given
                ready = cast(list[Connection], wait_for_connections(list(live), timeout=0.5))
            except (OSError, ValueError):
                continue
            for connection in ready:
                worker = live[connection]
                worker.transferring = True  # as in send_to: a large message's transfer time is not silence
                try:
                    message = worker.channel.recv()
                except MessageUnreadable as unreadable:
                    message = _unreadable_reply(worker.rank, unreadable)
                    if message is None:
                        continue
                except (EOFError, OSError, ValueError):
                    if not self.stopping.is_set():
                        self.worker_died(worker, self.death_description(worker))
                    continue
                finally:
                    worker.transferring = False
                    worker.last_heard = time.monotonic()
                self._route(worker, message)
                if isinstance(message, p.Output) and not _more_waiting(connection):
                    flush_output()  # the end of a burst of tasks' output: shown now, not line by line

    def _route(self, worker: WorkerHandle, message: Any) -> None:
        if isinstance(message, p.Output):
            foreground = self.foreground
            if foreground is not None:
                for item in foreground.backlog.admit(message):
                    foreground.inbox.put(item)
            else:
                for item in self.background_output.admit(message):
                    self._show_task_output(item, flush=False)  # flushed at the end of the burst (_receive_forever)
            return
        if isinstance(message, p.StatusReport):
            worker.memory_mb, worker.device_memory_mb = message.memory_mb, message.device_memory_mb
            worker.where, worker.still_s, worker.collective = message.where, message.still_s, message.collective
            worker.status_round = message.request_id
            return
        if isinstance(message, p.FolderMissing):
            self._warn_missing_folder(message)
            return
        with self.lock:
            request = self.requests.get(message.request_id)
            if isinstance(message, p.Done | p.Failed):
                worker.outstanding = max(0, worker.outstanding - 1)
                self.last_activity = time.monotonic()
        if request is None:
            return
        self._say_output_left_out(request, worker.rank, message)
        self._deliver(request, message)
        if isinstance(message, p.Done | p.Failed):
            self.on_worker_free()

    def _say_output_left_out(self, request: Request, rank: int, reply: object) -> None:
        """Say how much of `rank`'s output was left out, before `reply` to `request` is handed on: the one place
        that decides where that notice goes. A blocking request's output waits in its inbox for its caller, so its
        notice goes there too, ahead of each reply (the last one said before the request ends). A task's output
        (pool.submit) is printed by this thread as it comes, so its notice is printed here, when the task ends."""
        say: Callable[[p.Output], None]
        if request.future is None:
            backlog, say = request.backlog, request.inbox.put
        elif isinstance(reply, p.Done | p.Failed):
            backlog, say = self.background_output, self._show_task_output
        else:
            return
        notice = backlog.notice(rank)
        if notice is not None:
            say(notice)

    def _show_task_output(self, output: p.Output, flush: bool = True) -> None:
        """Print output that came while no caller waits for a request (tasks' output), from this thread."""
        print_output(output, flush=flush)
        self.background_output.took(output)

    def _warn_missing_folder(self, message: p.FolderMissing) -> None:
        """Say once per folder that workers run where they are: in the cell's output when the cell waits for it."""
        with self.lock:
            if message.folder in self.missing_folders:
                return
            self.missing_folders.add(message.folder)
        foreground = self.foreground
        if foreground is not None and foreground.request_id == message.request_id:
            foreground.inbox.put(message)
        else:
            notices.warning(missing_folder_warning(message))

    def death_description(self, worker: WorkerHandle) -> str:
        """How a worker whose connection closed ended: its exit status from the backend where it knows it."""
        who = f"worker {worker.rank} (pid {worker.pid})"
        try:
            status = self.exit_status(worker)
        except Exception:  # the backend could not tell: say what the kernel saw
            status = None
        if status is not None:
            return f"{who} died: it {status}"
        state = process_state(worker)
        if state == "running":
            return f"{who} closed its connection"
        return f"{who} died"

    def worker_died(self, worker: WorkerHandle, description: str) -> bool:
        """Mark `worker` dead and fail every request waiting for it; False when it was marked dead before (those
        requests were failed then)."""
        with self.lock:
            if worker.dead:
                return False
            worker.dead = description
            worker.outstanding = 0
            waiting = [r for r in self.requests.values() if worker.rank in r.waiting_for]
        worker.channel.close()
        for request in waiting:
            self._deliver(request, _died(worker))
        self.on_worker_free()
        return True

    def fail_everything(self, reason: str) -> None:
        """End every request in flight with `reason` (the pool stopped)."""
        with self.lock:
            requests, self.requests = list(self.requests.values()), {}
        for request in requests:
            for rank in request.waiting_for:
                self._deliver(request, WorkerDied(rank, reason))

    def _deliver(self, request: Request, item: object) -> None:
        if request.future is not None:
            self.on_task_reply(request, item)
        else:
            request.inbox.put(item)

    @property
    def busy(self) -> bool:
        """Whether any worker is running a request."""
        return any(w.outstanding for w in self.workers)

    def finish(self, request: Request) -> None:
        """Forget a request that ended (its shared-memory files go too)."""
        with self.lock:
            self.requests.pop(request.request_id, None)
            if self.foreground is request:
                self.foreground = None
        if request.frame is not None:
            request.frame.release()


def workers_named(ranks: Iterable[int]) -> str:
    """'Worker 1' or 'Workers 0, 2'."""
    ranks = list(ranks)
    return f"Worker{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def _more_waiting(connection: Connection) -> bool:
    """Whether the worker has sent more that is not read yet."""
    try:
        return connection.poll(0)
    except (OSError, ValueError):  # closed meanwhile
        return False


def _unreadable_reply(rank: int, unreadable: MessageUnreadable) -> object:
    """What to route in place of a worker's message the notebook cannot unpickle (None: nothing)."""
    if unreadable.kind in ("Done", "Failed") and unreadable.request_id is not None:
        return p.Failed(
            unreadable.request_id,
            rank,
            type(unreadable.error).__name__,
            f"its result could not be read where the pool was started ({unreadable}). A value sent back from a "
            "worker must load there too: its class must be importable in the notebook or job that started the pool, "
            "not only on the workers.",
            "",
        )
    if unreadable.kind == "Event":
        return p.Output(
            rank, "stderr", f"an event from this worker could not be read where the pool was started ({unreadable})\n"
        )
    return None


def _died(worker: WorkerHandle) -> WorkerDied:
    """What a request waiting for dead `worker` is told."""
    return WorkerDied(worker.rank, f"{worker.dead}. Run %pool restart (pool.restart()) for fresh workers.")
