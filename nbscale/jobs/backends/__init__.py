"""Where batch jobs run: a process on this machine (`local.py`) or a Ray job on a cluster (`cluster.py`), each
implementing `base.JobBackend`."""

from __future__ import annotations

from pathlib import Path

from nbscale.jobs.backends import cluster, local
from nbscale.jobs.backends.base import JobBackend, Launch, LaunchFailed

__all__ = ["JobBackend", "Launch", "LaunchFailed", "backend_for", "backend_of"]


def backend_for(cluster_name: str | None) -> JobBackend:
    """The backend a new job runs on: Ray's job server for a cluster (profile name or address), else this machine."""
    return cluster.RayJobBackend(cluster_name) if cluster_name is not None else local.LocalJobBackend()


def backend_of(job_dir: Path) -> JobBackend:
    """The backend that runs the job in `job_dir`: Ray where the job folder holds Ray's reference, else local."""
    return cluster.RayJobBackend() if (job_dir / cluster.RAY_JOB_FILE).exists() else local.LocalJobBackend()
