"""Batch jobs through sbatch on the real one-node SLURM cluster of tests/slurm_cluster.py: a job's result, log and
secrets; a %%batch training followed by `%jobs show`, its checkpoints in the shared job folder resumed in the
notebook; SLURM's state in %jobs while it waits in the queue; cancel is scancel."""

from __future__ import annotations

import secrets
import subprocess
import time

import pytest
import torch

import nbscale
import nbscale.jobs as jobs
from nbscale.jobs import JobStore
from nbscale.training.checkpoint import load_checkpoint
from nbscale.ui.jobs_table import JobsTable
from tests.jobs.test_batch_magic import submitted_id
from tests.kernel_session import KernelSession
from tests.slurm_cluster import queue, running_cluster
from tests.training.digits import digits, tiny_net

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


TRAIN_CELL = """%%batch --cluster hpc --name digits
import nbscale
from tests.training.digits import digits, tiny_net
(x, y), val = digits()
opts = nbscale.TrainingOptions("sgdm", max_epochs=2, mini_batch_size=100, validation_data=val, verbose=False,
                               checkpoint_path=nbscale.jobs.current_job_dir() / "checkpoints")
net, info = nbscale.train(tiny_net(), (x, y), opts)
"""


def test_a_slurm_jobs_training_is_shown_and_its_checkpoints_in_the_shared_folder_resume_it(hpc):
    kernel = KernelSession()  # NBSCALE_HOME, NBSCALE_PROFILES and SLURM_CONF as this process has them
    try:
        assert kernel.run("%load_ext nbscale").ok
        submitted = kernel.run(TRAIN_CELL)
        assert submitted.ok, submitted.text
        job = jobs.get(submitted_id(submitted.stdout))
        shown = kernel.run(f"%jobs show {job.id} --wait", timeout=2 * WAIT_S)
        assert shown.ok, shown.text
    finally:
        kernel.shutdown()
    panels = [d["text/plain"] for d in shown.displays if d.get("text/plain", "").startswith("Job:")]
    assert panels and "State: Done: Max epochs completed" in panels[-1] and "Epoch: 2 of 2" in panels[-1], panels
    assert any("image/png" in d for d in shown.displays)
    assert job.wait(WAIT_S) and job.state == "finished", job.log()
    checkpoints = sorted((job.folder / "checkpoints").iterdir())
    assert [path.name for path in checkpoints] == [f"nbscale_checkpoint_epoch000{n}.pt" for n in (1, 2)]
    saved = load_checkpoint(checkpoints[-1])["model"]
    assert all(torch.equal(saved[name], value) for name, value in job.result("net").state_dict().items())

    # resumed here, on the notebook's machine, for one more epoch: the same run trained 3 epochs in one go
    (x, y), val = digits()
    options = nbscale.TrainingOptions("sgdm", max_epochs=3, mini_batch_size=100, validation_data=val, verbose=False)
    resumed, info = nbscale.train(tiny_net(), (x, y), options, resume_from=job.folder / "checkpoints")
    straight, _ = nbscale.train(tiny_net(), (x, y), options)
    assert info.epoch[0] == 1 and info.epoch[-1] == 3  # the history goes on from the checkpoint's
    for a, b in zip(resumed.parameters(), straight.parameters(), strict=True):
        torch.testing.assert_close(a, b)


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
