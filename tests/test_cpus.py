"""The CPUs nbscale sizes its workers and threads by: affinity (taskset), the cgroup's quota, SLURM_CPUS_PER_TASK.

The cgroup tests read a fake cgroup tree in tmp_path (the same files Linux mounts at /sys/fs/cgroup); the
affinity test runs a real `taskset` and asks nbscale's pool what it would start.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from nbscale.cpus import available_cpus, cgroup_quota_cpus
from tests.kernel_session import REPO_ROOT


def _cgroup(tmp_path: Path, proc_line: str, files: dict[str, str]) -> tuple[Path, Path]:
    """A fake cgroup root holding `files` (path -> content) and a /proc/self/cgroup holding `proc_line`."""
    root = tmp_path / "cgroup"
    for name, content in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(content)
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text(proc_line + "\n")
    return root, proc


def test_a_cgroup_v2_quota_is_rounded_up_to_whole_cpus(tmp_path: Path) -> None:
    root, proc = _cgroup(
        tmp_path, "0::/kubepods/pod1", {"cpu.max": "max 100000", "kubepods/pod1/cpu.max": "150000 100000"}
    )
    assert cgroup_quota_cpus(root, proc) == 2


def test_the_tightest_quota_of_the_cgroup_and_its_parents_counts(tmp_path: Path) -> None:
    root, proc = _cgroup(
        tmp_path, "0::/a/b", {"a/cpu.max": "50000 100000", "a/b/cpu.max": "400000 100000", "cpu.max": "max 100000"}
    )
    assert cgroup_quota_cpus(root, proc) == 1
    assert available_cpus(root, proc, environ={}) == 1  # below any machine's affinity


def test_a_cgroup_v1_cfs_quota_counts_and_minus_one_means_no_limit(tmp_path: Path) -> None:
    limited = {"cpu/docker/c1/cpu.cfs_quota_us": "300000", "cpu/docker/c1/cpu.cfs_period_us": "100000"}
    root, proc = _cgroup(tmp_path, "4:cpu,cpuacct:/docker/c1", limited)
    assert cgroup_quota_cpus(root, proc) == 3
    free = {"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"}
    root, proc = _cgroup(tmp_path / "free", "4:cpu,cpuacct:/", free)
    assert cgroup_quota_cpus(root, proc) is None
    assert available_cpus(root, proc, environ={}) == len(os.sched_getaffinity(0))


def test_no_cgroup_files_means_no_quota(tmp_path: Path) -> None:
    assert cgroup_quota_cpus(tmp_path / "none", tmp_path / "no-proc-file") is None


def test_slurm_cpus_per_task_limits_the_count_and_a_malformed_value_is_ignored(tmp_path: Path) -> None:
    root, proc = _cgroup(tmp_path, "0::/", {})
    assert available_cpus(root, proc, environ={"SLURM_CPUS_PER_TASK": "1"}) == 1
    assert available_cpus(root, proc, environ={"SLURM_CPUS_PER_TASK": "two"}) == len(os.sched_getaffinity(0))


def test_under_taskset_one_core_the_pool_plans_one_cpu_worker_of_one_thread() -> None:
    code = (
        "from nbscale.cpus import available_cpus\n"
        "from nbscale.pool.backends.local import LocalBackend\n"
        "from nbscale.pool.settings import PoolSettings\n"
        "specs = LocalBackend().plan(PoolSettings(n=None, cpu=True))\n"
        "print(available_cpus(), len(specs), specs[0].threads)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    env.pop("SLURM_CPUS_PER_TASK", None)
    ran = subprocess.run(
        ["taskset", "-c", "0", sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["1", "1", "1"]
