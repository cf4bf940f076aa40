"""Blocking waits: the caller's thread shows a request's output and events until every rank answered, and what
happens when it does not go well: the kernel interrupt stops the workers, a rank's failure stops the ranks still
running after a grace time (a collective would wait for it forever), and workers that do not stop are replaced
(the restart policy, `Restarter`). Routing the replies to the request is routing.py's.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from nbscale.errors import PoolInterrupted
from nbscale.notices import notices
from nbscale.pool import protocol as p
from nbscale.pool.folders import missing_folder_warning
from nbscale.pool.health import collective_mismatch, process_state, stall_notice, stalled
from nbscale.pool.interrupts import HeldInterrupt
from nbscale.pool.output import end_open_lines, flush_output, print_output
from nbscale.pool.requests import Request, tells_of_a_torn_down_group
from nbscale.pool.routing import Router, workers_named

INTERRUPT_GRACE_S = 3.0
PREPARE_AFTER_S = 0.3  # workers still running this long after an interrupt: prepare their replacement meanwhile
# once a rank has failed, the others still running this long after are interrupted: a collective would wait forever
FAILED_PEER_GRACE_S = 2.0
# when the only failures so far are ranks woken by a peer that tore their group down (requests.py), the rank that
# did is still reporting its own error (on a busy machine, seconds later): it gets this long before it is interrupted
WOKEN_PEER_GRACE_S = 30.0
RESTART_NOTICE = (
    "Restarting the pool with fresh workers: interrupts are held until it is ready (a few seconds; "
    "the cell stops then)."
)


@dataclass(frozen=True)
class Restarter:
    """How `wait` replaces workers that do not stop: `prepare` begins the slow part early (while they are given
    their chance), `restart` replaces them, `cancel` drops what `prepare` began when they stopped after all."""

    restart: Callable[[], None]
    prepare: Callable[[], None] = lambda: None
    cancel: Callable[[], None] = lambda: None


def pump(request: Request, timeout: float) -> None:
    """Handle one item of a blocking request's inbox: print output, pass on events, note replies."""
    try:
        item = request.inbox.get(timeout=timeout)
    except queue.Empty:
        return
    if isinstance(item, p.Output):
        request.backlog.took(item)
        print_output(item, flush=False)
    elif isinstance(item, p.FolderMissing):
        notices.warning(missing_folder_warning(item))
    elif isinstance(item, p.Event):
        if request.on_event is not None:
            request.on_event(item.rank, item.payload)
    else:
        request.record(item)
    if request.inbox.empty():  # a burst of output is shown at once, not line by line
        flush_output()


def _drain_output(request: Request) -> None:
    while not request.inbox.empty():
        pump(request, timeout=0)


def wait(
    router: Router, request: Request, what: str, restart: Restarter | None, held: HeldInterrupt | None = None
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
            pump(request, timeout=0.25)
            if any(router.workers[r].dead for r in request.failures):
                break  # a worker died mid-request: the others may wait forever in a collective
            if request.failures and first_failure is None:
                first_failure = time.monotonic()
            grace = FAILED_PEER_GRACE_S if _has_an_origin(request) else WOKEN_PEER_GRACE_S
            past_grace = first_failure is not None and time.monotonic() > first_failure + grace
            if restart is not None and past_grace:
                note = _stop_after_failure(router, request, restart)
                break
            if not noticed:
                stuck = stalled(router.workers[rank] for rank in request.waiting_for)
                if stuck:
                    noticed = True
                    notices.warning(stall_notice(stuck))
            if not mismatch_noticed:
                mismatch = collective_mismatch(router.workers, request.ranks, request.waiting_for)
                if mismatch:
                    mismatch_noticed = True
                    notices.warning(mismatch)
        _drain_output(request)
    except KeyboardInterrupt:
        raise PoolInterrupted(_interrupt(router, request, restart)) from None
    finally:
        router.finish(request)
        end_open_lines()
    if request.failures:
        raise request.error(what, note)
    return [request.replies[rank] for rank in request.ranks]


def _has_an_origin(request: Request) -> bool:
    """Whether a failure so far is a rank's own, not only a rank woken by a peer that tore the group down."""
    return any(not tells_of_a_torn_down_group(failure) for failure in request.failures.values())


def _stop_after_failure(router: Router, request: Request, restart: Restarter) -> str:
    """Interrupt the ranks still running `request` after another rank failed (as MATLAB's spmd does: they may
    wait in a collective for it forever); restart the pool if they do not stop. Says what happened."""
    others, failed = request.waiting_for, sorted(request.failures)
    request.interrupting.update(others)
    # this request only: a worker still running a task from pool.submit keeps it, and skips this cell
    outcome = _stop_running(router, request, restart, only_this_request=True)
    one = len(others) == 1
    return (
        f"{workers_named(others)} {'was' if one else 'were'} still running {FAILED_PEER_GRACE_S:.0f} s after "
        f"rank{'' if len(failed) == 1 else 's'} {', '.join(map(str, failed))} failed (a collective waits for "
        f"every rank), so {'it was' if one else 'they were'} interrupted." + (f" {outcome}" if outcome else "")
    )


def _interrupt(router: Router, request: Request, restart: Restarter | None) -> str:
    """Interrupt the workers still running `request`; restart the pool if some do not stop. Says what happened."""
    pending = request.waiting_for
    outcome = _stop_running(router, request, restart)
    return f"Interrupted workers {', '.join(map(str, pending))}. {outcome or 'The pool is ready for the next cell.'}"


def _stop_running(
    router: Router, request: Request, restart: Restarter | None, only_this_request: bool = False
) -> str | None:
    """Interrupt the workers still running `request` (`only_this_request`: not what else they run) and give them
    INTERRUPT_GRACE_S to stop; None when they did, else the sentence saying which did not and that the pool was
    restarted (unless `restart` is None)."""
    router.tell(p.Interrupt(request.request_id if only_this_request else None), request.waiting_for)
    interrupted_at = time.monotonic()
    prepared = False
    while (
        request.waiting_for
        and time.monotonic() < interrupted_at + INTERRUPT_GRACE_S
        and not _stopped(router, request.waiting_for)
    ):
        if restart is not None and not prepared and time.monotonic() > interrupted_at + PREPARE_AFTER_S:
            restart.prepare()
            prepared = True
        try:
            pump(request, timeout=0.1)
        except KeyboardInterrupt:
            break
    _drain_output(request)
    stuck = request.waiting_for
    if not stuck:
        if prepared and restart is not None:
            restart.cancel()
        return None
    router.finish(request)
    stopped = _stopped(router, stuck)
    if stopped:
        processes = "is a stopped process" if len(stopped) == 1 else "are stopped processes"
        reason = f"{workers_named(stopped)} {processes} (SIGSTOP or a debugger)"
    else:
        reason = (
            f"{workers_named(stuck)} did not stop within {INTERRUPT_GRACE_S:.0f} s (stuck in a collective, "
            "or in native code)"
        )
    if restart is None:
        return f"{reason}."
    started = time.monotonic()
    # once begun, the restart finishes (bounded by the start timeout): interrupted, it left no pool at all
    with HeldInterrupt(notice=RESTART_NOTICE) as held:
        restart.restart()
    ignored = (
        (
            f" The {held.dropped} interrupt{'s' if held.dropped != 1 else ''} during the restart "
            f"{'were' if held.dropped != 1 else 'was'} held until it was done."
        )
        if held.dropped
        else ""
    )
    return (
        f"{reason}, so the pool was restarted with fresh workers in {time.monotonic() - started:.1f} s; "
        f"variables on the workers are lost.{ignored}"
    )


def _stopped(router: Router, ranks: Iterable[int]) -> list[int]:
    """Which of `ranks` are stopped processes (SIGSTOP): no interrupt reaches them."""
    return [rank for rank in ranks if process_state(router.workers[rank]) == "stopped"]
