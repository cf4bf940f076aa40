"""Finding a pool's processes from a test: the forkservers a kernel (or this test process) started.

A forkserver is forked from the user's zygote (nbscale/pool/zygote.py), not from the kernel, and named
"nbscale-forksrv" in /proc/PID/comm; one started as `python -m nbscale.pool.forkserver` (no zygote) says so on its
command line (its workers, forked from it, are named "nbscale-worker"). Either belongs to the kernel that holds the
read end of its report pipe, which the kernel keeps until the forkserver has ended.
"""

from __future__ import annotations

import os

import psutil

from nbscale.pool import process_names


def is_forkserver(process: psutil.Process) -> bool:
    try:
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        name = process.name()
        if name == process_names.FORKSERVER.decode():
            return True
        return name != process_names.WORKER.decode() and "nbscale.pool.forkserver" in process.cmdline()
    except psutil.Error:
        return False


def forkservers_of(pid: int) -> list[int]:
    """The pids of the running forkservers process `pid` started."""
    held = _pipes(pid, first=0)
    return [
        process.pid
        for process in psutil.process_iter()
        if is_forkserver(process) and _pipes(process.pid, first=3) & held  # past stdio: its report pipe
    ]


def _pipes(pid: int, first: int) -> set[str]:
    """The pipes process `pid` holds open at descriptors `first` and above."""
    found = set()
    try:
        descriptors = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return found
    for descriptor in descriptors:
        if int(descriptor) < first:
            continue
        try:
            target = os.readlink(f"/proc/{pid}/fd/{descriptor}")
        except OSError:
            continue
        if target.startswith("pipe:"):
            found.add(target)
    return found
