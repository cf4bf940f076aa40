"""Foreground requests: what `run`, `spmd`, `push` and `pull` send to chosen ranks (`targets=`, `--targets`) and
the caller's thread waits for (waiting.py), showing the workers' output live.

A message that cannot be pickled is named before anything is sent. An interrupt while it goes out is held and lands
in the wait, which then stops the request on the workers. While a request is waited for, the code it runs can be
sent messages (`worker_context().next_message()`).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from nbscale.errors import PoolError, PoolInterrupted, UnsendableError, WorkerError
from nbscale.notices import notices
from nbscale.pool import protocol as p
from nbscale.pool.interrupts import HeldInterrupt
from nbscale.pool.requests import Request, next_request_id
from nbscale.pool.routing import Router, workers_named
from nbscale.pool.tasks import TaskQueue
from nbscale.pool.transport import Frame, serialise
from nbscale.pool.unsendable import interrupted_while_pickling
from nbscale.pool.waiting import Restarter, wait


def target_ranks(targets: Iterable[int] | int | None, size: int) -> tuple[int, ...]:
    """The ranks `targets` names (one rank, or several; None: every worker), checked against a pool of `size`."""
    if targets is None:
        return tuple(range(size))
    given = [targets] if not isinstance(targets, Iterable) or isinstance(targets, str) else targets
    try:
        ranks = tuple(sorted({operator.index(target) for target in given}))
    except TypeError:
        raise PoolError(
            f"targets={targets!r}: give worker ranks as whole numbers, such as targets=[0, 2] (--targets 0,2)."
        ) from None
    bad = [rank for rank in ranks if not 0 <= rank < size]
    if bad or not ranks:
        raise PoolError(
            f"--targets {', '.join(map(str, bad)) or '(empty)'} is not a worker of this pool: "
            f"ranks run from 0 to {size - 1}."
        )
    return ranks


@dataclass(frozen=True)
class Foreground:
    """Where one start of a pool sends its foreground requests: its router, its task queue (a running task delays
    a request on its worker) and how a wait restarts workers that do not stop."""

    router: Router
    tasks: TaskQueue
    restarter: Restarter

    def request(
        self,
        message_factory: Callable[[int], Any],
        ranks: tuple[int, ...],
        *,
        what: str,
        on_event: Callable[[int, Any], None] | None = None,
        unsendable: Callable[[Exception], UnsendableError] | None = None,
        on_failure: Callable[[Request], None] | None = None,
    ) -> list[Any]:
        """Send one message (built from a fresh request id) to `ranks` and wait for every reply, by rank.

        Raises UnsendableError when the message cannot be serialised (`unsendable(error)` names what could not be),
        WorkerError when a worker fails and PoolInterrupted when the kernel is interrupted (either after calling
        `on_failure` with the request, which holds what each rank replied).
        """
        self._note_running_tasks(ranks)
        message = message_factory(next_request_id())
        frame = _frame(message, what, unsendable)
        held = HeldInterrupt(deliver_later=True)
        with held:  # an interrupt while the request goes out lands in `wait`, which then stops it on the workers
            request = self.router.send(message, ranks, foreground=True, on_event=on_event, frame=frame)
        try:
            return wait(self.router, request, what, self.restarter, held)
        except (WorkerError, PoolInterrupted):
            if on_failure is not None:
                on_failure(request)
            raise

    def message_running_request(self, payload: Any) -> None:
        """Send `payload` to the workers running the request the caller's thread waits for; nothing when none is."""
        request = self.router.foreground
        if request is not None:
            self.router.tell(p.RequestMessage(request.request_id, payload), request.ranks)

    def _note_running_tasks(self, ranks: tuple[int, ...]) -> None:
        busy_with_tasks = self.tasks.ranks_running_tasks(ranks)
        if busy_with_tasks:
            notices.info(
                f"{workers_named(busy_with_tasks)} still running a task from pool.submit or pool.map; this starts "
                "there once it ends (pool.cancel(future) stops a task)."
            )


def _frame(message: Any, what: str, unsendable: Callable[[Exception], UnsendableError] | None) -> Frame:
    """`message` serialised, or the error that names what could not be (`unsendable`, else `what`)."""
    try:
        return serialise(message)
    except KeyboardInterrupt:
        raise interrupted_while_pickling() from None
    except Exception as error:
        if unsendable is not None:
            raise unsendable(error) from None
        raise UnsendableError(f"{what} could not be sent to the workers: {error}") from None
