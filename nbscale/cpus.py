"""How many CPUs this process may use: the one count nbscale sizes its CPU workers and threads by.

`os.cpu_count()` counts the machine's cores and ignores every limit put on the process. The count here is the
smallest of: the cores the process may run on (its affinity: taskset, a cpuset), its cgroup's CPU quota (Docker's
`--cpus`, Kubernetes' limits: cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`, rounded up to
whole CPUs), and `SLURM_CPUS_PER_TASK` where SLURM sets it. Never below 1.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_SELF_CGROUP = Path("/proc/self/cgroup")


def available_cpus(
    cgroup_root: Path = CGROUP_ROOT,
    proc_cgroup: Path = PROC_SELF_CGROUP,
    environ: Mapping[str, str] | None = None,
) -> int:
    """The CPUs this process may use (see the module's docstring); the arguments exist for tests."""
    limits = [_affinity_cpus()]
    quota = cgroup_quota_cpus(cgroup_root, proc_cgroup)
    if quota is not None:
        limits.append(quota)
    slurm = _slurm_cpus(os.environ if environ is None else environ)
    if slurm is not None:
        limits.append(slurm)
    return max(1, min(limits))


def _affinity_cpus() -> int:
    """The cores the scheduler lets this process run on (all the machine's where affinity is unknown: macOS)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def cgroup_quota_cpus(cgroup_root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_SELF_CGROUP) -> int | None:
    """The tightest CPU quota of this process's cgroup and its parents, in whole CPUs (rounded up); None if none."""
    quotas = [quota for folder in _cgroup_folders(cgroup_root, proc_cgroup) if (quota := _quota(folder)) is not None]
    return math.ceil(min(quotas)) if quotas else None


def _cgroup_folders(cgroup_root: Path, proc_cgroup: Path) -> list[Path]:
    """The folders that may hold this process's CPU quota: its own cgroup's and each parent's (v2 and v1)."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        lines = []
    folders: list[Path] = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # cgroup v2: one unified tree
            base = cgroup_root
        elif "cpu" in controllers.split(","):  # cgroup v1: the cpu controller's tree
            base = cgroup_root / "cpu"
        else:
            continue
        own = base / path.lstrip("/")
        folders += [own, *(parent for parent in own.parents if parent.is_relative_to(base))]
    return folders + [cgroup_root, cgroup_root / "cpu"]  # a container sees its own cgroup at the root


def _quota(folder: Path) -> float | None:
    """The CPUs a cgroup folder's quota allows, or None (no quota file there, or no limit)."""
    try:
        if (folder / "cpu.max").is_file():
            quota, period = (folder / "cpu.max").read_text().split()[:2]
            return None if quota == "max" else int(quota) / int(period)
        if (folder / "cpu.cfs_quota_us").is_file():
            quota = (folder / "cpu.cfs_quota_us").read_text().strip()
            period = (folder / "cpu.cfs_period_us").read_text().strip()
            return None if int(quota) <= 0 else int(quota) / int(period)
    except (OSError, ValueError):  # unreadable or malformed: no limit nbscale can honour
        return None
    return None


def _slurm_cpus(environ: Mapping[str, str]) -> int | None:
    value = environ.get("SLURM_CPUS_PER_TASK", "")
    return int(value) if value.isdigit() and int(value) > 0 else None
