"""Releases a pool's SLURM allocation when its kernel dies: `python -m nbscale.pool.backends.slurm_watchdog
KERNEL_PID KERNEL_START_TIME JOB_ID`.

A kernel killed outright (SIGKILL, out of memory) cannot scancel its allocation itself, and the Ray cluster inside
keeps running without it. The pool starts this small process in a session of its own beside the kernel; it
`scancel`s the job once the kernel's process is gone (the start time tells it from a later process given the same
pid), and exits by itself when the pool released the job first (the pool also ends it at stop).
"""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

POLL_S = 0.5
JOB_CHECK_EVERY = 20  # polls between two looks at whether SLURM still knows the job


def _kernel_alive(pid: int, start_time: float) -> bool:
    try:
        return abs(psutil.Process(pid).create_time() - start_time) < 1 and psutil.Process(pid).status() != "zombie"
    except psutil.Error:
        return False


def _job_active(job_id: str) -> bool:
    result = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, timeout=30)
    return result.returncode == 0 and bool(result.stdout.strip())


def watch(pid: int, start_time: float, job_id: str) -> None:
    polls = 0
    while _kernel_alive(pid, start_time):
        time.sleep(POLL_S)
        polls += 1
        if polls % JOB_CHECK_EVERY == 0 and not _job_active(job_id):
            return
    subprocess.run(["scancel", job_id], capture_output=True, timeout=30)


if __name__ == "__main__":
    watch(int(sys.argv[1]), float(sys.argv[2]), sys.argv[3])
