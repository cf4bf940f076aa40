"""Message routing and blocking waits: every reply a worker sends reaches the request it answers.

One receiver thread reads every worker's channel. Output goes to the blocking request in the foreground (whose
caller prints it) or straight to the notebook; replies of a blocking request go to its inbox, which the caller's
thread reads in `wait`; replies of a task (`pool.submit`) go to the task queue. A worker whose channel closes is
marked dead, and every request waiting for it learns so at once.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_for_connections
from typing import Any, cast

from nbscale.errors import PoolInterrupted
from nbscale.pool import protocol as p
from nbscale.pool.channel import MessageUnreadable
from nbscale.pool.folders import missing_folder_warning
from nbscale.pool.handles import WorkerHandle
from nbscale.pool.health import collective_mismatch, process_state, stall_notice, stalled
from nbscale.pool.interrupts import HeldInterrupt
from nbscale.pool.output import OutputBacklog, end_open_lines, flush_output, print_output
from nbscale.pool.requests import Request, WorkerDied
from nbscale.pool.transport import Frame, serialise

INTERRUPT_GRACE_S = 3.0
PREPARE_AFTER_S = 0.3  # workers still running this long after an interrupt: prepare their replacement meanwhile
# once a rank has failed, the others still running this long after are interrupted: a collective would wait forever
FAILED_PEER_GRACE_S = 2.0
RESTART_NOTICE = ("Restarting the pool with fresh workers: interrupts are held until it is ready (a few seconds; "
                  "the cell stops then).")


@dataclass(frozen=True)
class Restarter:
    """How `wait` replaces workers that do not stop: `prepare` begins the slow part early (while they are given
    their chance), `restart` replaces them, `cancel` drops what `prepare` began when they stopped after all."""

    restart: Callable[[], None]
    prepare: Callable[[], None] = lambda: None
    cancel: Callable[[], None] = lambda: None


class Router:
    """Sends requests to workers and routes what comes back; `wait` blocks the caller until a request ends."""

    def __init__(self, workers: list[WorkerHandle]) -> None:
        self.workers = workers
        self.requests: dict[int, Request] = {}
        self.lock = threading.RLock()
        self.foreground: Request | None = None
        self.background_output = OutputBacklog()  # output of tasks (pool.submit), shown by the receiver thread
        self.last_activity = time.monotonic()
        self.stopping = threading.Event()
        # set by the task queue: a reply of a task arrived; a worker may have become free
        self.on_task_reply: Callable[[Request, Any], None] = lambda request, item: None
        self.on_worker_free: Callable[[], None] = lambda: None
        # set by the pool: how a worker's process ended, from its backend (None: unknown, or it still runs)
        self.exit_status: Callable[[WorkerHandle], str | None] = lambda worker: None
        self.secrets: tuple[str, ...] = ()  # set by the pool: its --env values, kept out of workers' error texts
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
                self.worker_died(worker, "its connection closed")
            except KeyboardInterrupt:  # a second interrupt, part-way through: the worker cannot tell where the next
                # message begins, so it is given up (and exits once it reads the end of its connection)
                self.worker_died(worker, f"worker {rank} was cut off part-way through a message it was sent (a second "
                                 "interrupt while it was sent)")
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
                    print_output(item, flush=False)  # flushed at the end of the burst (see _receive_forever)
                    self.background_output.took(item)
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
        if request.future is not None:
            self.on_task_reply(request, message)
        else:
            notice = request.backlog.notice(worker.rank)  # output left out: said before the request ends
            if notice is not None:
                request.inbox.put(notice)
            request.inbox.put(message)
        if isinstance(message, p.Done | p.Failed):
            self.on_worker_free()

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
            print(missing_folder_warning(message), file=sys.stderr, flush=True)

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

    def worker_died(self, worker: WorkerHandle, description: str) -> None:
        """Mark `worker` dead and fail every request waiting for it."""
        with self.lock:
            if worker.dead:
                return
            worker.dead = description
            worker.outstanding = 0
            waiting = [r for r in self.requests.values() if worker.rank in r.waiting_for]
        worker.channel.close()
        for request in waiting:
            self._deliver(request, WorkerDied(worker.rank, f"{description}. Run %pool restart (pool.restart()) for fresh workers."))
        self.on_worker_free()

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

    # ---- blocking requests --------------------------------------------------------------------------------------

    def pump(self, request: Request, timeout: float) -> None:
        """Handle one item of a blocking request's inbox: print output, pass on events, note replies."""
        try:
            item = request.inbox.get(timeout=timeout)
        except queue.Empty:
            return
        if isinstance(item, p.Output):
            request.backlog.took(item)
            print_output(item, flush=False)
        elif isinstance(item, p.FolderMissing):
            print(missing_folder_warning(item), file=sys.stderr, flush=True)
        elif isinstance(item, p.Event):
            if request.on_event is not None:
                request.on_event(item.rank, item.payload)
        else:
            request.record(item)
        if request.inbox.empty():  # a burst of output is shown at once, not line by line
            flush_output()

    def _drain_output(self, request: Request) -> None:
        while not request.inbox.empty():
            self.pump(request, timeout=0)

    def finish(self, request: Request) -> None:
        """Forget a request that ended (its shared-memory files go too)."""
        with self.lock:
            self.requests.pop(request.request_id, None)
            if self.foreground is request:
                self.foreground = None
        if request.frame is not None:
            request.frame.release()

    def wait(
        self, request: Request, what: str, restart: Restarter | None, held: HeldInterrupt | None = None
    ) -> list[Any]:
        """Block until every rank answered; replies by rank. Raises the workers' WorkerError.

        A worker that stops answering fails the request (the monitor gives it up); one whose main thread has not
        moved for a while gets one note saying where it is. Ctrl-C / the kernel interrupt interrupts the workers
        and raises PoolInterrupted; workers that do not stop within INTERRUPT_GRACE_S (or are stopped processes)
        are replaced by calling `restart` (None: the caller stops the pool). Once a rank has failed, the ranks still
        running FAILED_PEER_GRACE_S later are stopped the same way (with `restart` only: not while the group forms).
        `held`: an interrupt held off while the request was sent lands here, and stops it as any other does.
        """
        noticed = mismatch_noticed = False
        first_failure: float | None = None
        note = ""
        try:
            if held is not None:
                held.deliver()
            while request.waiting_for:
                self.pump(request, timeout=0.25)
                if any(self.workers[r].dead for r in request.failures):
                    break  # a worker died mid-request: the others may wait forever in a collective
                if request.failures and first_failure is None:
                    first_failure = time.monotonic()
                if restart is not None and first_failure is not None and time.monotonic() > first_failure + FAILED_PEER_GRACE_S:
                    note = self._stop_after_failure(request, restart)
                    break
                if not noticed:
                    stuck = stalled(self.workers[rank] for rank in request.waiting_for)
                    if stuck:
                        noticed = True
                        print(stall_notice(stuck), file=sys.stderr, flush=True)
                if not mismatch_noticed:
                    mismatch = collective_mismatch(self.workers, request.ranks, request.waiting_for)
                    if mismatch:
                        mismatch_noticed = True
                        print(mismatch, file=sys.stderr, flush=True)
            self._drain_output(request)
        except KeyboardInterrupt:
            raise PoolInterrupted(self._interrupt(request, restart)) from None
        finally:
            self.finish(request)
            end_open_lines()
        if request.failures:
            raise request.error(what, note)
        return [request.replies[rank] for rank in request.ranks]

    def _stop_after_failure(self, request: Request, restart: Restarter) -> str:
        """Interrupt the ranks still running `request` after another rank failed (as MATLAB's spmd does: they may
        wait in a collective for it forever); restart the pool if they do not stop. Says what happened."""
        others, failed = request.waiting_for, sorted(request.failures)
        request.interrupting.update(others)
        # this request only: a worker still running a task from pool.submit keeps it, and skips this cell
        outcome = self._stop_running(request, restart, only_this_request=True)
        one = len(others) == 1
        return (f"{workers_named(others)} {'was' if one else 'were'} still running {FAILED_PEER_GRACE_S:.0f} s after "
                f"rank{'' if len(failed) == 1 else 's'} {', '.join(map(str, failed))} failed (a collective waits for "
                f"every rank), so {'it was' if one else 'they were'} interrupted." + (f" {outcome}" if outcome else ""))

    def _interrupt(self, request: Request, restart: Restarter | None) -> str:
        """Interrupt the workers still running `request`; restart the pool if some do not stop. Says what happened."""
        pending = request.waiting_for
        outcome = self._stop_running(request, restart)
        return f"Interrupted workers {', '.join(map(str, pending))}. {outcome or 'The pool is ready for the next cell.'}"

    def _stop_running(self, request: Request, restart: Restarter | None, only_this_request: bool = False) -> str | None:
        """Interrupt the workers still running `request` (`only_this_request`: not what else they run) and give them
        INTERRUPT_GRACE_S to stop; None when they did, else the sentence saying which did not and that the pool was
        restarted (unless `restart` is None)."""
        self.tell(p.Interrupt(request.request_id if only_this_request else None), request.waiting_for)
        interrupted_at = time.monotonic()
        prepared = False
        while (request.waiting_for and time.monotonic() < interrupted_at + INTERRUPT_GRACE_S
               and not self._stopped(request.waiting_for)):
            if restart is not None and not prepared and time.monotonic() > interrupted_at + PREPARE_AFTER_S:
                restart.prepare()
                prepared = True
            try:
                self.pump(request, timeout=0.1)
            except KeyboardInterrupt:
                break
        self._drain_output(request)
        stuck = request.waiting_for
        if not stuck:
            if prepared and restart is not None:
                restart.cancel()
            return None
        self.finish(request)
        stopped = self._stopped(stuck)
        if stopped:
            processes = "is a stopped process" if len(stopped) == 1 else "are stopped processes"
            reason = f"{workers_named(stopped)} {processes} (SIGSTOP or a debugger)"
        else:
            reason = (f"{workers_named(stuck)} did not stop within {INTERRUPT_GRACE_S:.0f} s (stuck in a collective, "
                      "or in native code)")
        if restart is None:
            return f"{reason}."
        started = time.monotonic()
        # once begun, the restart finishes (bounded by the start timeout): interrupted, it left no pool at all
        with HeldInterrupt(notice=RESTART_NOTICE) as held:
            restart.restart()
        ignored = (f" The {held.dropped} interrupt{'s' if held.dropped != 1 else ''} during the restart "
                   f"{'were' if held.dropped != 1 else 'was'} held until it was done.") if held.dropped else ""
        return (f"{reason}, so the pool was restarted with fresh workers in {time.monotonic() - started:.1f} s; "
                f"variables on the workers are lost.{ignored}")

    def _stopped(self, ranks: Iterable[int]) -> list[int]:
        """Which of `ranks` are stopped processes (SIGSTOP): no interrupt reaches them."""
        return [rank for rank in ranks if process_state(self.workers[rank]) == "stopped"]


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
            unreadable.request_id, rank, type(unreadable.error).__name__,
            f"its result could not be read where the pool was started ({unreadable}). A value sent back from a "
            "worker must load there too: its class must be importable in the notebook or job that started the pool, "
            "not only on the workers.",
            "",
        )
    if unreadable.kind == "Event":
        return p.Output(rank, "stderr", f"an event from this worker could not be read where the pool was started ({unreadable})\n")
    return None
