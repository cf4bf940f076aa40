"""Worker health as the kernel sees it: a worker that stopped answering, one stuck at one spot, how one ended.

Every worker's receiver thread answers the monitor's heartbeat (a StatusQuery every registry.HEARTBEAT_S) even
while its main thread runs user code, and says where that main thread is and for how long it has not moved.
So two cases read differently:
- no answer at all for UNRESPONSIVE_S: the process is stopped (SIGSTOP, a debugger), frozen in native code that
  holds Python's lock, or its machine is gone. The worker is given up (its requests fail naming it) and
  `%pool restart` replaces it.
- answering, but its main thread has stayed at one spot for STALL_NOTICE_S: waiting on a lock, in a collective
  a peer never reached, or in one long operation. It may still finish, so nothing fails; the waiting cell says
  once where it is and that interrupting the kernel stops it (restarting workers that do not stop).
- ranks waiting in different spmd collectives (allreduce on one, broadcast on another), or in one that a rank
  which already finished the request never called: none of them can return. Named at the first heartbeat that
  finds ranks in the same call of different kinds, else once the ranks have not moved for MISMATCH_STILL_S
  (a heartbeat later), without waiting for STALL_NOTICE_S.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable

import psutil

from nbscale.pool.handles import WorkerHandle

UNRESPONSIVE_S = 20.0
STALL_NOTICE_S = 20.0
MISMATCH_STILL_S = 2.0  # ranks in mismatched collectives this long without moving: named (a heartbeat apart)
_SAME_KIND = {"gather": "allgather"}  # gather is allgather underneath: the two meet


def unresponsive(worker: WorkerHandle, now: float | None = None) -> bool:
    """True when a live worker has sent nothing for UNRESPONSIVE_S (a message arriving counts as an answer)."""
    now = time.monotonic() if now is None else now
    return not worker.dead and not worker.transferring and now - worker.last_heard > UNRESPONSIVE_S


def process_state(worker: WorkerHandle) -> str | None:
    """The kernel's view of a worker's process on this machine: "stopped", "gone" or "running" (None: on
    another machine, or unknown). A later process reusing the pid reads as "gone" (its start time differs)."""
    if not worker.channel.same_machine:
        return None
    try:
        process = psutil.Process(worker.pid)
        started = process.create_time()
        status = process.status()
    except psutil.NoSuchProcess:
        return "gone"
    except psutil.Error:
        return None
    if worker.started is None:
        worker.started = started
    elif abs(started - worker.started) > 0.01:
        return "gone"
    if status in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP):
        return "stopped"
    return "gone" if status in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD) else "running"


def unresponsive_description(worker: WorkerHandle) -> str:
    """Why a worker counts as lost when it stopped answering, as precisely as the kernel can tell."""
    state = process_state(worker)
    if state == "stopped":
        cause = "its process is stopped (SIGSTOP or a debugger)"
    elif state == "gone":
        cause = "its process is gone"
    else:
        cause = (
            "its process is stopped, frozen in native code that holds Python's lock, or its machine is down or "
            "out of memory"
        )
    silent_s = time.monotonic() - worker.last_heard
    return f"worker {worker.rank} (pid {worker.pid}) stopped answering for {silent_s:.0f} s: {cause}"


def stalled(workers: Iterable[WorkerHandle]) -> list[WorkerHandle]:
    """The live workers whose main thread has stayed at one spot for STALL_NOTICE_S or more."""
    return [w for w in workers if not w.dead and w.still_s >= STALL_NOTICE_S]


def stall_notice(workers: list[WorkerHandle]) -> str:
    """One line saying where stuck-looking workers are and what the user can do."""
    places = "; ".join(f"worker {w.rank} at {w.where or 'one spot'}" for w in workers)
    longest = max(w.still_s for w in workers)
    return (
        f"Note: no progress for {longest:.0f} s on {places}. If it is stuck (a lock, or a collective another worker "
        "never reached), interrupt the kernel (cancel it, in a batch job): the workers are interrupted, and the "
        "pool is restarted if they do not stop."
    )


def collective_mismatch(workers: list[WorkerHandle], ranks: Iterable[int], waiting: Iterable[int]) -> str | None:
    """One line naming the ranks of a request (`ranks`, those still running it: `waiting`) that wait in collectives
    that never meet, and in which; None when there is no such mismatch (or it is not yet sure)."""
    running = [workers[rank] for rank in waiting]
    finished = [rank for rank in ranks if rank not in {w.rank for w in running}]
    if not running or any(w.dead or not w.collective for w in running):
        return None
    calls = {w.rank: w.collective.partition("#") for w in running}
    kinds = {(_SAME_KIND.get(name, name), number) for name, _, number in calls.values()}
    if len(kinds) == 1 and not finished:
        return None
    # the same call number in two kinds can never meet: sure at once; other differences may be a rank on its way
    sure = len({number for _, number in kinds}) == 1 and len(kinds) > 1
    if not sure and any(w.still_s < MISMATCH_STILL_S for w in running):
        return None
    each = "; ".join(
        f"rank {rank} in {name} (its collective {number} of this cell)" for rank, (name, _, number) in calls.items()
    )
    if finished:
        ended = ", ".join(map(str, finished))
        each += f"; rank{'s' if len(finished) > 1 else ''} {ended} finished the cell without it"
    return (
        f"Collective mismatch, the ranks wait for each other forever: {each}. Every rank must call the same "
        "collectives in the same order. Interrupt the kernel to stop them (the pool is restarted if they do not "
        "stop)."
    )


def exit_description(status: int) -> str:
    """A wait status (os.waitpid's) in words: 'was killed by SIGKILL ...' or 'exited with code 1'."""
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        extra = " (kill -9, or the system's out-of-memory killer)" if number == signal.SIGKILL else ""
        return f"was killed by {name}{extra}"
    if os.WIFEXITED(status):
        return f"exited with code {os.WEXITSTATUS(status)}"
    return f"ended (wait status {status})"


def returncode_description(returncode: int) -> str:
    """A subprocess returncode (negative: the signal that killed it) in the words of exit_description."""
    if returncode < 0:
        return exit_description(-returncode)  # WIFSIGNALED reads the low 7 bits: the signal number itself
    return exit_description(returncode << 8)
