"""Where batch jobs run: a process on this machine (`local.py`), a Ray job on a cluster (`cluster.py`) or a SLURM
batch job (`slurm.py`), each implementing `base.JobBackend`."""

from __future__ import annotations

from pathlib import Path

from nbscale.jobs.backends import cluster, local, slurm
from nbscale.jobs.backends.base import JobBackend, Launch, LaunchFailed

__all__ = ["JobBackend", "Launch", "LaunchFailed", "backend_for", "backend_of"]


def backend_for(cluster_name: str | None) -> JobBackend:
    """The backend a new job runs on: SLURM for a slurm profile, Ray's job server for another cluster (profile name or
    address), else this machine."""
    if cluster_name is None:
        return local.LocalJobBackend()
    profile = slurm.slurm_profile_of(cluster_name)
    return slurm.SlurmJobBackend(profile) if profile is not None else cluster.RayJobBackend(cluster_name)


def backend_of(job_dir: Path) -> JobBackend:
    """The backend that runs the job in `job_dir`: SLURM or Ray where the job folder holds their reference, else
    local."""
    if (job_dir / slurm.SLURM_JOB_FILE).exists():
        return slurm.SlurmJobBackend()
    return cluster.RayJobBackend() if (job_dir / cluster.RAY_JOB_FILE).exists() else local.LocalJobBackend()
