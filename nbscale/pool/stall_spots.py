"""Where a worker's busy thread is and whether it moved: its CPU ticks and wake-ups, and its line in the user's
terms (for the stall notice)."""

from __future__ import annotations

import linecache
import os
from types import FrameType

from nbscale.pool.worker_output import LIBRARY_DIRS


def thread_activity(native_id: int | None) -> tuple[int, int] | None:
    """(CPU clock ticks, context switches) of one thread of this process so far; None where /proc cannot tell
    (off Linux: the stall notice then goes by the thread's position alone). Not psutil: it has no per-thread
    context switches, and its threads() reads every thread's files to give one."""
    if native_id is None:
        return None
    try:
        with open(f"/proc/self/task/{native_id}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        with open(f"/proc/self/task/{native_id}/status") as handle:
            switches = sum(
                int(line.split()[1])
                for line in handle
                if line.startswith(("voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:"))
            )
    except (OSError, IndexError, ValueError):
        return None
    return int(fields[11]) + int(fields[12]), switches  # utime + stime (stat's fields 14 and 15)


def idle_between(before: tuple[int, int], after: tuple[int, int]) -> bool:
    """Whether a thread neither computed nor woke up (more than a couple of times) between two samples."""
    return after[0] - before[0] <= 1 and after[1] - before[1] <= 2


def describe_spot(frame: FrameType, cell_file: str | None) -> str:
    """Where a thread is, in the user's terms: 'line 4 of the cell (`lock.acquire()`)' (`cell_file`: the spmd cell
    it runs, if any), and the library function it is inside, if any ('..., inside all_reduce')."""
    user: FrameType | None = frame
    while (
        user is not None
        and not user.f_code.co_filename.startswith("<")
        and user.f_code.co_filename.startswith(LIBRARY_DIRS)
    ):
        user = user.f_back
    if user is None:
        user = frame
    filename = user.f_code.co_filename
    place = "the cell" if filename == cell_file else f"{os.path.basename(filename)} ({user.f_code.co_name})"
    source = linecache.getline(filename, user.f_lineno).strip()
    described = f"line {user.f_lineno} of {place}" + (f" (`{source}`)" if source else "")
    if user is not frame:
        described += f", inside {frame.f_code.co_name}"
    return described
