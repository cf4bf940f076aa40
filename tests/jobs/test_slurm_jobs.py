"""Batch jobs through sbatch on the real one-node SLURM cluster of tests/slurm_cluster.py: a job's result, log and
secrets; SLURM's state in %jobs while it waits in the queue; cancel is scancel."""

from __future__ import annotations

import secrets
import subprocess
import time

import pytest

import nbscale.jobs as jobs
from nbscale.jobs import JobStore
from nbscale.ui.jobs_table import JobsTable
from tests.slurm_cluster import queue, running_cluster

pytestmark = pytest.mark.slow

WAIT_S = 120


@pytest.fixture(scope="module")
def slurm():
    """The module's SLURM cluster: the environment its clients need."""
    with running_cluster() as env:
        yield env


@pytest.fixture
def hpc(slurm, tmp_path, monkeypatch):
    """Profile `hpc` (backend slurm) whose shared folder is in tmp_path; SLURM_CONF names the test cluster."""
    monkeypatch.setenv("SLURM_CONF", slurm["SLURM_CONF"])
    profiles = tmp_path / "profiles.toml"
    profiles.write_text(f'[profiles.hpc]\nbackend = "slurm"\ntime = "5"\njob_folder = "{tmp_path}/shared"\n')
    profiles.chmod(0o600)
    monkeypatch.setenv("NBSCALE_PROFILES", str(profiles))
    return "hpc"


def test_a_slurm_job_returns_its_variables_and_log_and_no_secret_reaches_the_store(hpc, job_store: JobStore):
    secret = secrets.token_hex(16)
    code = "import os\nprint('doubling', x)\ny = x * 2\nsecret_arrived = len(os.environ['NBSCALE_TEST_SECRET'])\n"
    job = jobs.submit(code, namespace={"x": 21}, env={"NBSCALE_TEST_SECRET": secret}, cluster=hpc)
    assert job.wait(WAIT_S), job.log()
    assert job.state == "finished", job.log()
    assert (job.result("y"), job.result("secret_arrived")) == (42, 32)
    assert "doubling 21" in job.log() and "submitted to SLURM as job" in job.log()
    for path in job_store.root.rglob("*"):
        assert not path.is_file() or secret.encode() not in path.read_bytes(), path


def test_a_queued_slurm_job_shows_slurms_state_and_cancel_is_scancel(slurm, hpc):
    blocker = subprocess.run(
        ["sbatch", "--parsable", "--ntasks=2", "--output=/dev/null", "--wrap", "sleep 600"],
        env=slurm,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    try:
        job = jobs.submit("y = 1\n", name="waits", cluster=hpc)
        deadline = time.monotonic() + WAIT_S
        while "SLURM PENDING" not in repr(JobsTable.from_jobs(jobs.list_jobs(), "store")):
            assert time.monotonic() < deadline, repr(JobsTable.from_jobs(jobs.list_jobs(), "store"))
            time.sleep(0.2)
        assert job.state == "queued"
        assert job.cancel()
        assert job.state == "cancelled"
        deadline = time.monotonic() + 30  # scancel returns before slurmctld has ended the job on a busy machine
        while [line for line in queue(slurm) if "nbscale-job" in line]:
            assert time.monotonic() < deadline, queue(slurm)
            time.sleep(0.2)
    finally:
        subprocess.run(["scancel", blocker], env=slurm, check=True)
