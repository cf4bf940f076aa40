"""Batch jobs on a SLURM cluster: the job's runner submitted with sbatch.

The batch script runs the runner a local job uses (`python -m nbscale.jobs.runner <job folder>`, its output
appended to the job's `log.txt`) on the node SLURM picks, with the profile's `python` (default: the kernel's).
So the job folder (the job store, `$NBSCALE_HOME/jobs` or the user's data folder, in the shared home on most HPC
systems) and the notebook's folder must be reachable from the nodes under the same paths. SLURM's own messages
about the job (a time limit reached, a cancel) go to `slurm-<id>.out` in the profile's `job_folder`, and are
appended to the job's log when the job ends without saying so itself.

What the store keeps: `slurm_job.json` in the job's folder (SLURM's job id and the profile's name). Liveness and
cancel go through SLURM (`scontrol show job`, `scancel`), not a local pid. `--env` values reach the job through
sbatch's environment (`--export=ALL`, SLURM's default), never the job store or its log.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

from nbscale.cluster_profiles import resolve_cluster
from nbscale.errors import NbscaleError
from nbscale.jobs.backends.base import JobBackend, Launch, LaunchFailed
from nbscale.jobs.files import append_text, write_atomic
from nbscale.jobs.records import JobRecord
from nbscale.slurm_commands import cancel, job_state, submit
from nbscale.slurm_profile import SlurmProfile, shared_folder

SLURM_JOB_FILE = "slurm_job.json"
LOG_TAIL_CHARS = 4000


class SlurmJobBackend(JobBackend):
    """The runner as a SLURM batch job (submit with the profile it goes to; follow and cancel from its folder)."""

    name = "slurm"

    def __init__(self, profile: SlurmProfile | None = None) -> None:
        self.profile = profile

    def launch(self, launch: Launch) -> None:
        assert self.profile is not None, "backend_for(cluster) makes the SLURM backend that launches"
        try:
            job_id = _sbatch(self.profile, launch)
        except NbscaleError as error:
            raise LaunchFailed(str(error), f"it could not be submitted to SLURM: {error}") from None
        write_atomic(
            launch.job_dir / SLURM_JOB_FILE, json.dumps({"job_id": job_id, "profile": self.profile.name}).encode()
        )
        append_text(launch.log, f"[nbscale] submitted to SLURM as job {job_id}\n")

    def vanished(self, record: JobRecord, job_dir: Path, launch_timeout_s: float) -> str | None:
        # a job waiting in SLURM's queue is PENDING there for as long as it takes
        found = _reference(job_dir)
        if found is None:
            return None
        profile, job_id = found
        state = job_state(profile, job_id)
        if not state.ended:
            return None
        slurm_output = shared_folder(profile) / f"slurm-{job_id}.out"
        try:
            said = slurm_output.read_text(errors="replace")[-LOG_TAIL_CHARS:]
        except OSError:
            said = ""
        if said.strip():
            append_text(job_dir / "log.txt", f"\n[nbscale] SLURM's output for job {job_id}:\n{said}")
        return f"the SLURM job {job_id} ended ({state.state}) before the cell ended; see the log"

    def cancel(self, record: JobRecord, job_dir: Path) -> None:
        found = _reference(job_dir)
        if found is not None:  # SLURM ends every process of the job, on whatever node runs it
            cancel(*found)

    def scheduler_state(self, job_dir: Path) -> str | None:
        found = _reference(job_dir)
        if found is None:
            return None
        state = job_state(*found)
        reason = f" ({state.reason})" if state.state == "PENDING" and state.reason not in ("", "None") else ""
        return f"SLURM {state.state}{reason}"


def slurm_profile_of(cluster: str) -> SlurmProfile | None:
    """The SLURM part of the profile `cluster` names (None for a Ray profile or an address)."""
    return resolve_cluster(cluster).slurm


def _sbatch(profile: SlurmProfile, launch: Launch) -> int:
    folder = shared_folder(profile)
    folder.mkdir(parents=True, exist_ok=True)
    workers = launch.pool or 1
    options = [
        f"--job-name=nbscale-job-{launch.job_id}",
        "--ntasks=1",
        f"--cpus-per-task={profile.cpus_per_worker * workers}",
        *([f"--gpus={profile.gpus_per_worker * workers}"] if profile.gpus_per_worker else []),
        f"--output={folder}/slurm-%j.out",
        f"--chdir={launch.cwd}",
        "--export=ALL",
    ]
    script = (
        f"#!/bin/sh\nexec {shlex.quote(profile.node_python)} -m nbscale.jobs.runner {shlex.quote(str(launch.job_dir))}"
        f" >> {shlex.quote(str(launch.log))} 2>&1\n"
    )
    environment = {
        **os.environ,
        **resolve_cluster(profile.name).env,
        **launch.env,
        "MPLBACKEND": "Agg",
        "NBSCALE_JOB_DIR": str(launch.job_dir),
        "PYTHONUNBUFFERED": "1",
        "NBSCALE_JOB_CLUSTER": "",  # the job's pool: processes on its node, inside the allocation
    }
    return submit(profile, options, script, environment)


def _reference(job_dir: Path) -> tuple[SlurmProfile, int] | None:
    """(the job's profile, SLURM's job id) for a SLURM job; None for a job that runs elsewhere."""
    try:
        fields = json.loads((job_dir / SLURM_JOB_FILE).read_text())
    except FileNotFoundError:
        return None
    name = str(fields["profile"])
    try:
        profile = slurm_profile_of(name) or SlurmProfile(name=name)
    except NbscaleError:  # the profile was removed since: SLURM's commands need none of its fields
        profile = SlurmProfile(name=name)
    return profile, int(fields["job_id"])
