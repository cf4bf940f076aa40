"""Jobs as processes on this machine: how a job's process is started, told apart from a dead one, and killed.

A job runs as `python -m nbscale.jobs.runner <job folder>` in a new session (`start_new_session=True`): its own
process group, no controlling terminal, so neither the kernel's death, a restart, nor a Ctrl-C in a terminal
reaches it. Everything it starts (a pool's forkserver, subprocesses of the cell) stays in that group, which is
what `cancel` kills. Secrets given with `env` travel in the process environment only, never on the command line
or in a file. A pid alone can be reused after the process dies, so liveness also compares the process's start
time, recorded at spawn.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from nbscale.jobs.backends.base import JobBackend, Launch, LaunchFailed
from nbscale.jobs.files import open_private
from nbscale.jobs.records import JobRecord


class LocalJobBackend(JobBackend):
    """The runner as a detached process here; the store follows it by pid and start time."""

    name = "local"

    def launch(self, launch: Launch) -> tuple[int, float | None]:
        try:
            log = open_private(launch.log, append=True)
        except OSError as error:
            raise LaunchFailed(
                f"Job {launch.job_id} could not open its log {launch.log}: {error}.",
                f"its log could not be opened: {error}",
            ) from None
        try:
            return spawn_runner(launch.job_dir, log, launch.cwd, launch.env)
        except OSError as error:
            raise LaunchFailed(
                f"Job {launch.job_id} could not start its process: {error}. Check that {launch.cwd} exists.",
                f"its process could not start: {error}",
            ) from None
        finally:
            os.close(log)

    def vanished(self, record: JobRecord, job_dir: Path, launch_timeout_s: float) -> str | None:
        if record.pid is not None:
            if alive(record.pid, record.pid_started):
                return None
            # it may have written its end state between the store's read and this check: the store's
            # state change is conditional on the job still being active
            return "process died (killed, or the machine restarted) before the cell ended; see the log"
        if time.time() - record.submitted > launch_timeout_s:
            return "its process never started"
        return None

    def cancel(self, record: JobRecord, job_dir: Path) -> None:
        if record.pid is not None:  # no pid: the submitter was still starting it, and the runner sees "cancelled"
            kill_group(record.pid, record.pid_started)


def spawn_runner(job_dir: Path, log_descriptor: int, cwd: str, env: dict[str, str]) -> tuple[int, float | None]:
    """Start the runner for `job_dir` detached, output to the log; returns (pid, process start time)."""
    environment = {key: value for key, value in os.environ.items() if not key.startswith("JPY_")}
    environment["MPLBACKEND"] = "Agg"  # the kernel's inline backend means nothing without a kernel
    environment.update(env)
    environment["NBSCALE_JOB_DIR"] = str(job_dir)
    environment["PYTHONUNBUFFERED"] = "1"  # the log shows output as it happens
    process = subprocess.Popen(
        [sys.executable, "-m", "nbscale.jobs.runner", str(job_dir)],
        stdin=subprocess.DEVNULL,
        stdout=log_descriptor,
        stderr=subprocess.STDOUT,
        cwd=cwd,
        env=environment,
        start_new_session=True,
        close_fds=True,
    )
    # reap it when it ends, so it never lingers as a zombie (which would look alive) in this process
    threading.Thread(target=process.wait, name=f"nbscale-job-reaper-{process.pid}", daemon=True).start()
    return process.pid, start_time(process.pid)


def start_time(pid: int) -> float | None:
    """The process's start time (seconds since the epoch), or None when unknown."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def alive(pid: int, started: float | None) -> bool:
    """Whether process `pid` still runs and is the one that started at `started` (not a reused pid)."""
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        return started is None or abs(process.create_time() - started) < 1.0
    except psutil.Error:
        return False


def kill_group(pid: int, started: float | None, grace_s: float = 3.0) -> None:
    """SIGTERM the job's process group, wait up to `grace_s` for its leader, then SIGKILL whatever is left."""
    if not alive(pid, started):
        _signal_group(pid, signal.SIGKILL)  # the leader is gone; its children may not be
        return
    _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while alive(pid, started) and time.monotonic() < deadline:
        time.sleep(0.05)
    _signal_group(pid, signal.SIGKILL)


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass
