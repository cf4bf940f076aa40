"""Workers in a SLURM allocation: sbatch starts Ray inside it (Ray's SLURM recipe, `slurm_allocation`), and the
Ray backend starts the pool's workers there.

`plan` asks SLURM for N tasks (`cpus_per_worker` CPUs and `gpus_per_worker` GPUs each) and waits: while the job is
pending, one progress line says so, and the kernel interrupt cancels it. Once the head's address is in the job's
output (a file in the profile's shared folder), a RayBackend connects and places one actor per task. `stop`
stops the workers, disconnects from Ray and `scancel`s the job; a watchdog process (`slurm_watchdog`) does the
same when the kernel dies without stopping the pool.
"""

from __future__ import annotations

import dataclasses
import re
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import psutil

from nbscale.cluster_profiles import ClusterProfile
from nbscale.errors import PoolError, PoolInterrupted
from nbscale.pool.backends.base import Backend, WorkerSpec
from nbscale.pool.backends.cluster import DEFAULT_CONNECT_TIMEOUT_S, RayBackend, disconnect
from nbscale.pool.backends.slurm_allocation import ADDRESS_MARK, LOST_NODE_TEXT, START_ATTEMPTS
from nbscale.pool.backends.slurm_allocation import MODULE as ALLOCATION_MODULE
from nbscale.pool.backends.slurm_time_limit import TimeLimitWatch
from nbscale.pool.protocol import WorkerConfig
from nbscale.pool.settings import PoolSettings
from nbscale.slurm_commands import JobState, cancel, job_state, never_starts, submit
from nbscale.slurm_profile import SlurmProfile, shared_folder

POLL_S = 0.5


class SlurmBackend(Backend):
    """A pool's workers in one SLURM allocation, started through Ray."""

    name = "slurm"
    listen_host = "0.0.0.0"  # the nodes connect back (with the pool's secret only)

    def __init__(self, profile: ClusterProfile, connect_timeout: float | None = None) -> None:
        assert profile.slurm is not None
        self.profile = profile
        self.slurm: SlurmProfile = profile.slurm
        self.connect_timeout = connect_timeout or profile.connect_timeout or DEFAULT_CONNECT_TIMEOUT_S
        self.job_id: int | None = None
        self.ray: RayBackend | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._time_limit: TimeLimitWatch | None = None

    def plan(self, settings: PoolSettings) -> list[WorkerSpec]:
        """Get the allocation (waiting in the queue as long as SLURM keeps the job there) and plan its workers."""
        if settings.n is None:
            raise PoolError(
                f"A pool on the SLURM profile {self.profile.name!r} needs its size: %pool start N --cluster "
                f"{self.profile.name} (nbscale.Pool(N, cluster=...)) asks SLURM for N workers."
            )
        gpus = 0 if settings.cpu else self.slurm.gpus_per_worker
        output = self._submit(settings.n, gpus)
        try:
            address = self._wait_for_head(output)
            self.ray = RayBackend(
                dataclasses.replace(self.profile, backend="ray", address=address), self.connect_timeout
            )
        except KeyboardInterrupt:
            self.stop()
            raise PoolInterrupted(
                f"Starting the pool was interrupted: SLURM job {self.job_id} was cancelled (scancel), and no pool is "
                "running. Start it again with %pool start (nbscale.Pool(...))."
            ) from None
        except BaseException:
            self.stop()
            raise
        self.kernel_host = self.ray.kernel_host
        try:
            specs = self.ray.plan(settings)
        except PoolError as error:
            lost = _lost_nodes(output)
            if not lost:
                raise
            raise PoolError(f"{error} In SLURM job {self.job_id}: {'; '.join(lost)} ({output}).") from None
        if self.ray.gpus_per_worker:
            return specs
        return [dataclasses.replace(spec, threads=self.slurm.cpus_per_worker) for spec in specs]

    def _submit(self, n: int, gpus: int) -> Path:
        folder = shared_folder(self.slurm)
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise self.slurm.field_error(
                "job_folder", f"cannot create {folder} ({error.strerror})", "Name a folder you can write to."
            ) from None
        options = [
            "--job-name=nbscale-pool",
            f"--ntasks={n}",
            f"--cpus-per-task={self.slurm.cpus_per_worker}",
            *([f"--gpus-per-task={gpus}"] if gpus else []),
            f"--output={folder}/nbscale-pool-%j.out",
            f"--chdir={folder}",
        ]
        script = f"#!/bin/sh\nexec {self.slurm.node_python} -m {ALLOCATION_MODULE} head {gpus}\n"
        self.job_id = submit(self.slurm, options, script)
        _progress(_waiting_line(self.job_id, JobState("PENDING"), 0))
        self._start_watchdog()
        return folder / f"nbscale-pool-{self.job_id}.out"

    def _start_watchdog(self) -> None:
        kernel = psutil.Process()
        self._watchdog = subprocess.Popen(
            [sys.executable, "-m", "nbscale.pool.backends.slurm_watchdog"]
            + [str(kernel.pid), repr(kernel.create_time()), str(self.job_id)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a kernel interrupt or a killed process group leaves it running
        )

    def _wait_for_head(self, output: Path) -> str:
        """Wait until Ray's head runs in the job; its address for the kernel (a progress line meanwhile)."""
        started = time.monotonic()
        running_since: float | None = None
        while True:
            address = _head_address(output)
            if address is not None:
                by_client = (
                    f"; this kernel is on another machine and connects by Ray Client to {address}"
                    if address.startswith("ray://")
                    else ""
                )
                seconds = time.monotonic() - started
                _progress(f"SLURM job {self.job_id} runs: Ray started in it ({seconds:.0f} s){by_client}.\n")
                return address
            state = job_state(self.slurm, self.job_id or 0)
            if state.ended:
                raise PoolError(self._ended_before_ray(state, output))
            never = never_starts(self.slurm, self.job_id or 0, state)
            if never is not None:
                raise never  # plan() cancels the job
            if state.state == "RUNNING":
                running_since = running_since or time.monotonic()
                if time.monotonic() - running_since > self.connect_timeout:
                    raise self.slurm.field_error(
                        "connect_timeout",
                        f"Ray did not start in SLURM job {self.job_id} within {self.connect_timeout:.0f} s "
                        f"(its output: {output})",
                        "Allow longer (connect_timeout, or --connect-timeout SECONDS).",
                    )
            _progress(_waiting_line(self.job_id or 0, state, time.monotonic() - started))
            time.sleep(POLL_S)

    def _ended_before_ray(self, state: JobState, output: Path) -> str:
        last = _last_lines(output)
        if "nbscale: Ray did not start" in last:
            return (
                f"Ray did not start in SLURM job {self.job_id} ({state.state}) after {START_ATTEMPTS} attempts: "
                f"{last}. Its node may be overloaded, or the filesystem Ray loads from slow; the job's output "
                f"has Ray's messages ({output}). Start the pool again, or ask SLURM for an exclusive node "
                '(sbatch_args = ["--exclusive"]).'
            )
        return (
            f"SLURM job {self.job_id} ended ({state.state}) before Ray started in it: {last or 'it wrote nothing'} "
            f"(all of it: {output}). Check the profile's python ({self.slurm.node_python}): nbscale and Ray must be "
            "installed for it on the nodes."
        )

    def start(self, configs: Sequence[WorkerConfig]) -> None:
        assert self.ray is not None and self.job_id is not None
        self.ray.start(configs)
        self._time_limit = TimeLimitWatch(self.slurm, self.job_id)

    def stop(self) -> None:
        """Stop the workers, leave Ray, and release the allocation (idempotent)."""
        if self._time_limit is not None:
            self._time_limit.close()
            self._time_limit = None
        if self.ray is not None:
            self.ray.stop()
            disconnect()
            self.ray = None
        if self.job_id is not None:
            cancel(self.slurm, self.job_id)
        if self._watchdog is not None:
            self._watchdog.kill()
            self._watchdog.wait()
            self._watchdog = None

    def alive(self) -> bool:
        return True  # a worker that dies is noticed through its channel

    def exit_status(self, rank: int, pid: int) -> str | None:
        """Ended with the allocation (its time limit: the profile's time field), else as Ray tells it."""
        if self.job_id is not None:
            state = job_state(self.slurm, self.job_id)
            if state.state == "TIMEOUT":
                return (
                    f"went with SLURM job {self.job_id}, which reached its time limit (field time of profile "
                    f"{self.slurm.name!r}): ask for more time, and keep checkpoints (TrainingOptions.checkpoint_path)"
                )
            if state.ended:
                return f"went with SLURM job {self.job_id}, which ended ({state.state})"
        return self.ray.exit_status(rank, pid) if self.ray is not None else None

    def node(self, rank: int) -> str | None:
        return self.ray.node(rank) if self.ray is not None else None

    def address(self, rank: int) -> str:
        assert self.ray is not None
        return self.ray.address(rank)

    def status_name(self) -> str:
        if self.job_id is None:
            return "slurm"
        return f"slurm job {self.job_id} {job_state(self.slurm, self.job_id).state}"

    def describe(self) -> str:
        return f"SLURM job {self.job_id} of profile {self.profile.name}"


def _progress(line: str) -> None:
    """Redraw the one progress line (a line ending in '\\n' is the last)."""
    sys.stdout.write("\r" + line.ljust(100) if not line.endswith("\n") else "\r" + line)
    sys.stdout.flush()


def _waiting_line(job_id: int, state: JobState, seconds: float) -> str:
    if state.state == "PENDING":
        reason = f": {state.reason}" if state.reason not in ("", "None") else ""
        return (
            f"SLURM job {job_id} waits in the queue (PENDING{reason}) for {seconds:.0f} s; "
            "interrupt the kernel to cancel it"
        )
    return f"SLURM job {job_id} {state.state} on {state.nodes or '?'}: starting Ray there ({seconds:.0f} s)"


def _head_address(output: Path) -> str | None:
    """The address the kernel connects to, once the job printed its head's: the head's own (GCS) address where
    the head runs on this machine, else Ray Client's ray://HEAD:PORT (the kernel is on a login node)."""
    try:
        text = output.read_text(errors="replace")
    except OSError:
        return None
    found = re.search(rf"^{re.escape(ADDRESS_MARK)} ([^\s:]+:\d+) ([^\s:]+:\d+)", text, re.MULTILINE)
    if found is None:
        return None
    gcs, client = found.groups()
    return gcs if _is_this_machine(gcs.rpartition(":")[0]) else f"ray://{client}"


def _is_this_machine(ip: str) -> bool:
    if ip.startswith("127."):
        return True
    local = {address.address for addresses in psutil.net_if_addrs().values() for address in addresses}
    return ip in local or ip == socket.gethostbyname(socket.gethostname())


def _lost_nodes(output: Path) -> list[str]:
    """The job output's lines saying that a node's Ray never joined the head (anywhere: Ray's own lines follow)."""
    try:
        lines = output.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [line.strip() for line in lines if line.startswith(LOST_NODE_TEXT)]


def _last_lines(output: Path, count: int = 3) -> str:
    try:
        lines = [line.strip() for line in output.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return " / ".join(lines[-count:])
