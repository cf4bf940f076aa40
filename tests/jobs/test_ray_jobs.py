"""Batch jobs as Ray jobs, against a real Ray head (with its job server) started on loopback by this module."""

from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path

import pytest

import nbscale.jobs as jobs
from nbscale.errors import JobError
from nbscale.jobs import JobStore
from tests.jobs.test_jobs import gone
from tests.kernel_session import KernelSession
from tests.ray_head import LOOPBACK_ENV, free_port, ray_head

pytestmark = pytest.mark.slow
pytest.importorskip("ray.job_submission")

WAIT_S = 120
POOL_WAIT_S = 240  # a job that starts a pool of 2 Ray actors (each imports torch): 87 s running beside the suite


@pytest.fixture(scope="module")
def job_server():
    """A Ray head on 127.0.0.1 with 2 CPUs and its dashboard (the job server); yields the job server's URL."""
    dashboard_port = free_port()
    with ray_head(num_cpus=2, dashboard_port=dashboard_port):
        yield f"http://127.0.0.1:{dashboard_port}"


def test_ray_job_returns_its_variables_and_log_and_no_secret_reaches_the_store(job_server, job_store: JobStore):
    secret = secrets.token_hex(16)
    code = "import os\nprint('doubling', x)\ny = x * 2\nsecret_arrived = len(os.environ['NBSCALE_TEST_SECRET'])\n"
    job = jobs.submit(code, name="on ray", namespace={"x": 21}, env={"NBSCALE_TEST_SECRET": secret}, cluster=job_server)
    assert job.wait(WAIT_S), job.log()
    assert job.state == "finished", job.log()
    assert (job.result("y"), job.result("secret_arrived")) == (42, 32)
    assert "doubling 21" in job.log() and f"submitted to Ray at {job_server}" in job.log()
    assert (job.folder / "ray_job.json").stat().st_mode & 0o777 == 0o600
    for path in job_store.root.rglob("*"):
        assert not path.is_file() or secret.encode() not in path.read_bytes(), path


@pytest.mark.timeout(420)
def test_ray_job_with_a_pool_gets_ray_actors_on_the_same_cluster(job_server):
    job = jobs.submit("backend = pool.status().backend\nranks = pool.run(lambda: 1)\n", pool=2, cluster=job_server)
    assert job.wait(POOL_WAIT_S), job.log()
    assert job.state == "finished", job.log()
    assert (job.result("backend"), job.result("ranks")) == ("ray", [1, 1])


def test_cancel_stops_the_ray_job_and_its_process(job_server):
    job = jobs.submit("import time\nprint('sleeping', flush=True)\ntime.sleep(120)\n", cluster=job_server)
    deadline = time.monotonic() + WAIT_S
    while "sleeping" not in job.log():
        assert time.monotonic() < deadline and job.state in ("queued", "running"), job.log()
        time.sleep(0.1)
    pid = job.record().pid
    assert job.cancel()
    assert job.state == "cancelled" and not job.cancel()
    deadline = time.monotonic() + 30
    while not gone(pid):  # (it may exit between any two looks at it)
        assert time.monotonic() < deadline, "Ray did not stop the job's runner"
        time.sleep(0.1)
    assert "cancelled" in job.log()


def test_failing_cell_on_ray_is_failed_with_its_traceback_in_the_log(job_server):
    job = jobs.submit("a = 1\nb = a / 0\n", cluster=job_server)
    assert job.wait(WAIT_S)
    assert job.state == "failed" and job.error == "ZeroDivisionError: division by zero"
    assert 'File "<batch job' in job.log() and job.result("a") == 1


def test_ray_job_that_cannot_reach_its_folder_is_failed_with_rays_log(job_server, tmp_path: Path):
    job = jobs.submit("x = 1\n", cwd=tmp_path / "missing", cluster=job_server)
    assert job.wait(WAIT_S)
    assert job.state == "failed" and "the Ray job ended (FAILED" in job.error
    assert "Ray's log of nbscale-" in job.log() and "missing" in job.log()


def test_unreachable_job_server_is_a_clear_error_and_a_failed_job():
    started = time.monotonic()
    with pytest.raises(
        JobError, match=r"Could not submit the job to the Ray cluster's job server at http://127\.0\.0\.1:9"
    ):
        jobs.submit("x = 1\n", cluster="http://127.0.0.1:9")
    assert time.monotonic() - started < 30
    [record] = jobs.list_jobs()
    assert record["state"] == "failed" and "could not be submitted to Ray" in record["error"]


def test_batch_magic_with_a_cluster_profile_runs_a_ray_job_the_kernel_can_forget(job_server, tmp_path: Path):
    profiles = tmp_path / "profiles.toml"
    profiles.write_text(f'[profiles.lab]\nbackend = "ray"\naddress = "127.0.0.1:1"\njob_address = "{job_server}"\n')
    kernel = KernelSession(env={"NBSCALE_PROFILES": str(profiles), **LOOPBACK_ENV})
    try:
        kernel.run("%load_ext nbscale")
        kernel.run("base = 5")
        shown = kernel.run(
            "%%batch --name lab-run --cluster lab --env TOKEN=abc123\nimport os\n"
            "value = base + len(os.environ['TOKEN'])\n"
        )
        assert shown.ok, shown.text
        assert "submitted to lab" in shown.stdout and "abc123" not in shown.text
    finally:
        kernel.shutdown()  # the job goes on without its kernel
    [record] = jobs.list_jobs()
    job = jobs.get(record["id"])
    assert job.wait(WAIT_S), job.log()
    assert job.name == "lab-run" and job.state == "finished", job.log()
    assert job.result("value") == 11


def test_ray_job_whose_job_server_is_unreachable_stays_active_and_can_be_cancelled(job_store: JobStore):
    job_id = job_store.create("lost", None, os.getcwd())
    reference = {"job_address": "http://127.0.0.1:9", "submission_id": f"nbscale-{job_id}-gone"}
    (job_store.job_dir(job_id) / "ray_job.json").write_text(json.dumps(reference))
    job = jobs.get(job_id)
    assert job.state == "queued"  # an unreachable cluster says nothing about the job: it may still run
    started = time.monotonic()
    assert [record["state"] for record in jobs.list_jobs()] == ["queued"]
    assert time.monotonic() - started < 5
    assert job.cancel() and job.state == "cancelled"


def test_a_training_in_a_ray_job_is_recorded_for_the_job_monitor_and_stops_from_it(job_server):
    from tests.jobs.test_training_record import TRAIN_CELL, wait_for_iterations

    job = jobs.submit(TRAIN_CELL.replace("EPOCHS", "50"), cluster=job_server, cwd=Path(__file__).parents[2])
    wait_for_iterations(job, 5, timeout=WAIT_S)
    assert jobs.list_jobs()[-1]["training"]["iteration"] >= 5
    assert job.stop_training()
    assert job.wait(WAIT_S), job.log()
    assert job.state == "finished", job.log()
    info = job.result("info")
    assert info.stop_reason == "Stopped from the job monitor" and info.iteration[-1] < 50 * 46
    assert job.training_info().iteration == info.iteration
