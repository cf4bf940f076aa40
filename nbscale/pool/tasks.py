"""The futures queue (parfeval): tasks from `pool.submit` wait for an idle worker, run there, and complete
their `concurrent.futures.Future`.

A task is serialised once when submitted, and one that must wait for a worker copies its large values out of the
notebook's memory at once (to shared memory on one machine), so it runs on its arguments as they were at submit.
A queued task can be cancelled and never runs; a running one is
interrupted on its worker (`pool.cancel`), which is then free for the next task. Either way its future is
cancelled at once, as concurrent.futures cancels a pending one: `cancelled()` and `done()` are True and `result()`
raises CancelledError (concurrent.futures itself cannot cancel a running future; see `_cancel_running`).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, InvalidStateError
from concurrent.futures._base import CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED
from typing import Any

from nbscale.errors import PoolError
from nbscale.pool import protocol as p
from nbscale.pool.folders import current_folder
from nbscale.pool.handles import WorkerHandle
from nbscale.pool.interrupts import HeldInterrupt
from nbscale.pool.requests import Request, next_request_id
from nbscale.pool.routing import Router
from nbscale.pool.transport import Frame, serialise
from nbscale.pool.unsendable import call_error, interrupted_while_pickling

REINTERRUPT_S = 2.0  # a cancelled task's worker stops within milliseconds; one still running it is told again
REINTERRUPT_TRIES = 60


class TaskQueue:
    """Tasks waiting for a free worker, and the futures of the ones running."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self.lock = router.lock
        self.queued: deque[tuple[Future[Any], p.Call, Frame]] = deque()
        self._events: dict[int, Callable[[int, Any], None]] = {}  # request id -> on_event of a queued task
        self._cancelled: set[int] = set()  # request ids of running tasks interrupted by cancel()
        self._what: weakref.WeakKeyDictionary[Future[Any], str] = weakref.WeakKeyDictionary()  # other than "The task"

    def submit(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        on_event: Callable[[int, Any], None] | None,
        what: str = "The task",
    ) -> Future[Any]:
        """Queue `fn(*args, **kwargs)`; raises UnsendableError when it cannot be serialised. `what` names the task in
        its error ("The task failed on rank 1")."""
        future: Future[Any] = Future()
        if what != "The task":
            self._what[future] = what
        message = p.Call(next_request_id(), fn, args, kwargs, current_folder())  # where it runs, once it does
        try:
            frame = serialise(message)
        except KeyboardInterrupt:
            raise interrupted_while_pickling() from None
        except Exception as error:
            raise call_error(fn, args, kwargs, error) from None
        with self.lock:  # held until the task is either sent or holds its own copy of its values
            self.queued.append((future, message, frame))
            if on_event is not None:
                self._events[message.request_id] = on_event
            self.dispatch()
            if any(queued is frame for _, _, queued in self.queued):  # it waits: the notebook may change its values
                frame.hold_values(all(w.channel.same_machine for w in self.router.workers))
        return future

    def dispatch(self) -> None:
        """Start queued tasks on idle workers (every one that can start, even when the kernel is interrupted
        meanwhile: the interrupt lands once they are sent)."""
        with HeldInterrupt(), self.lock:
            stranded = False
            while self.queued:
                if all(w.dead for w in self.router.workers):
                    stranded = True
                    break
                idle = [w for w in self.router.workers if not w.dead and w.outstanding == 0]
                if not idle:
                    return
                future, message, frame = self.queued.popleft()
                on_event = self._events.pop(message.request_id, None)
                if not future.set_running_or_notify_cancel():
                    frame.release()
                    continue
                self.router.send(message, (idle[0].rank,), future=future, frame=frame, on_event=on_event)
        if stranded:  # no worker is left to run them: they fail now rather than wait forever
            self.fail_queued(
                f"every worker of the pool has died ({_deaths(self.router.workers)}). Run %pool restart "
                "(pool.restart()) for fresh workers"
            )

    def cancel(self, future: Future[Any]) -> bool:
        """Cancel a queued task, or interrupt a running one (its future is cancelled now, its worker free once the
        task stopped); False when it had already finished."""
        if future.cancel():
            return True
        with self.lock:  # held while sending, so no next task reaches that worker before the Interrupt
            request = self._request_of(future)
            if request is None or (future.done() and not future.cancelled()):
                return False
            if request.request_id in self._cancelled:  # interrupted already, and stopping
                return True
            self._cancelled.add(request.request_id)
            self.router.tell(p.Interrupt(request.request_id), request.waiting_for)
        threading.Thread(target=self._interrupt_again, args=(request,), name="nbscale-cancel", daemon=True).start()
        return _cancel_running(future)

    def _interrupt_again(self, request: Request) -> None:
        """Send a cancelled task's Interrupt again every REINTERRUPT_S while its worker still runs it: one that
        reaches the worker as the task starts, or while a busy machine delays it, must not leave the worker
        running a cancelled task (an endless training) that every later call waits behind."""
        for _ in range(REINTERRUPT_TRIES):
            time.sleep(REINTERRUPT_S)
            with self.lock:
                if request.request_id not in self._cancelled or self.router.stopping.is_set():
                    return  # it stopped (complete() forgets it), or the pool did
                self.router.tell(p.Interrupt(request.request_id), request.waiting_for)

    def ranks_running_tasks(self, ranks: Iterable[int]) -> list[int]:
        """Which of `ranks` are running a task."""
        with self.lock:
            running = {rank for r in self.router.requests.values() if r.future is not None for rank in r.waiting_for}
        return sorted(running.intersection(ranks))

    def ranks_of(self, future: Future[Any]) -> list[int]:
        """The worker running a task (empty while it is queued or once it ended)."""
        with self.lock:
            request = self._request_of(future)
            return request.waiting_for if request is not None else []

    def fail_queued(self, reason: str) -> None:
        """Fail every task still waiting for a worker (the pool stopped)."""
        with self.lock:
            tasks, self.queued = list(self.queued), deque()
            self._events.clear()
        for future, _, frame in tasks:
            frame.release()
            if future.set_running_or_notify_cancel():
                future.set_exception(PoolError(f"The task did not run: {reason}."))

    def _request_of(self, future: Future[Any]) -> Request | None:
        """The running request of a task's future (None when it is queued or done); call with the lock held."""
        return next((r for r in self.router.requests.values() if r.future is future), None)

    def complete(self, request: Request, item: object) -> None:
        """A task's event, reply, or its worker's death (the router calls it on its receiver thread)."""
        if isinstance(item, p.Event):
            if request.on_event is not None:
                request.on_event(item.rank, item.payload)
            return
        request.record(item)
        self.router.finish(request)
        future = request.future
        assert future is not None
        if request.request_id in self._cancelled:  # its future was cancelled when it was interrupted
            self._cancelled.discard(request.request_id)
            return
        try:
            if request.failures:
                future.set_exception(request.error(self._what.get(future, "The task")))
            else:
                future.set_result(request.replies[request.ranks[0]])
        except InvalidStateError:  # done already: the pool stopped meanwhile and failed it
            pass


def _cancel_running(future: Future[Any]) -> bool:
    """Cancel a running future, as `Future.cancel` does a pending one (waiters and callbacks told, `result()`
    raises CancelledError); False when it had finished. concurrent.futures has no public way: its cancel()
    refuses running futures, since an executor cannot stop a thread, but a pool interrupts its worker. Uses the
    internals cancel() itself uses, unchanged since Python 3.8."""
    with future._condition:
        state = future._state
        if state in (CANCELLED, CANCELLED_AND_NOTIFIED):
            return True
        if state == FINISHED:
            return False
        future._state = CANCELLED_AND_NOTIFIED
        for waiter in future._waiters:  # concurrent.futures.wait, as_completed
            waiter.add_cancelled(future)
        future._condition.notify_all()
    future._invoke_callbacks()  # type: ignore[attr-defined]
    return True


def _deaths(workers: Iterable[WorkerHandle]) -> str:
    """How each dead worker went, as one clause: 'worker 0: it was killed by SIGKILL; worker 1: ...'."""
    return "; ".join(f"worker {w.rank}: {w.dead}" for w in workers if w.dead)
