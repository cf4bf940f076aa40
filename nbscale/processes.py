"""Whether a process still runs, by pid (pool registry, pool workers, batch jobs, GPU reservations), through psutil:
portable, and able to tell a process from a later one that reuses its pid (by its start time); and which Jupyter
kernel this process is."""

from __future__ import annotations

import os
import sys

import psutil

# psutil derives a start time from the boot time, which Linux gives in whole seconds: two readings of one process's
# start time agree exactly, but one compared with a clock reading may be off by up to a second
START_TIME_SLACK_S = 1.0


def start_time(pid: int) -> float | None:
    """When the process `pid` started (seconds since the epoch, psutil's create_time), or None if there is none."""
    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.Error, ValueError, OverflowError):
        return None


def pid_running(pid: int, started: float | None = None) -> bool:
    """True while a process with this pid exists (one of another user's counts; a zombie does not).

    With `started` (a start time `start_time` gave for it earlier), a later process that reuses the pid does not
    count.
    """
    if pid <= 0:
        return False
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        return started is None or abs(process.create_time() - started) < 0.01
    except (psutil.Error, ValueError, OverflowError):
        return False


def kernel_id() -> str | None:
    """The Jupyter kernel id of this process (from its connection file), or None outside a kernel."""
    if "ipykernel.kernelapp" not in sys.modules:
        # not a kernel: importing ipykernel here, on the monitor thread, would import IPython under the feet of
        # the main thread, which reads sys.modules["IPython"] to name notebook cells in a worker's traceback
        return None
    try:
        from ipykernel.connect import get_connection_file

        name = os.path.basename(get_connection_file())
    except Exception:  # not a kernel, or ipykernel cannot tell
        return None
    return name[len("kernel-") : -len(".json")] if name.startswith("kernel-") and name.endswith(".json") else None
