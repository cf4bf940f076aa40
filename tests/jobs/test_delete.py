"""Deleting jobs: job.delete(), nbscale.jobs.delete(*ids, older_than=...), and %jobs delete in a real kernel."""

from __future__ import annotations

import re
import time
from datetime import timedelta

import pytest

import nbscale.jobs as jobs
from nbscale.errors import JobError
from nbscale.jobs import JobStore
from tests.kernel_session import KernelSession

WAIT_S = 60
SLEEPER = "import time\ntime.sleep(600)\n"


def _ended(code: str = "value = 41 + 1\nprint('ran')\n", name: str | None = None) -> jobs.Job:
    job = jobs.submit(code, name=name)
    assert job.wait(WAIT_S), job.log()
    return job


def _running() -> jobs.Job:
    job = jobs.submit(SLEEPER, name="sleeper")
    deadline = time.monotonic() + WAIT_S
    while job.state != "running":
        assert time.monotonic() < deadline, job.log()
        time.sleep(0.05)
    return job


def test_delete_removes_the_record_and_the_folder_and_the_id_is_never_given_again(job_store: JobStore) -> None:
    first, second = _ended(name="first"), _ended(name="second")
    folder = second.folder
    assert (folder / "results" / "value.pkl").is_file()
    second.delete()
    assert not folder.exists() and [job.id for job in jobs.list()] == [first.id]
    with pytest.raises(JobError, match=f"There is no job {second.id} in the job store"):
        jobs.get(second.id)
    assert not [p for p in job_store.root.iterdir() if p.name.startswith(".deleted-")]
    assert jobs.submit("value = 3\n").id == second.id + 1  # ids are never reused, also past a deleted last job
    assert first.result("value") == 42


def test_a_running_job_is_refused_until_cancelled_and_nothing_of_a_refused_call_is_deleted() -> None:
    ended, running = _ended(), _running()
    with pytest.raises(JobError) as refused:
        running.delete()
    assert f"Job {running.id} is still running, so it is not deleted: cancel it first (job.cancel()" in str(
        refused.value
    )
    with pytest.raises(JobError) as refused:
        jobs.delete(ended.id, running.id)
    assert f"Job {running.id} (running) is still active, so nothing was deleted" in str(refused.value)
    assert [job.id for job in jobs.list()] == [ended.id, running.id] and ended.folder.is_dir()
    assert running.cancel()
    assert jobs.delete(ended.id, str(running.id)) == [ended.id, running.id] and jobs.list() == []


def test_delete_older_than_removes_ended_jobs_past_the_age_and_leaves_running_ones() -> None:
    ended, failed, running = _ended(), _ended("raise ValueError('boom')\n"), _running()
    assert failed.state == "failed"
    assert jobs.delete(older_than="1h") == [] and len(jobs.list()) == 3
    assert jobs.delete(older_than=timedelta(0)) == [ended.id, failed.id]
    assert [(job.id, job.state) for job in jobs.list()] == [(running.id, "running")]


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda: jobs.delete(), "takes job ids (delete(3, 4)) or an age (delete(older_than='7d')), one of them"),
        (lambda: jobs.delete(1, older_than="7d"), "one of them"),
        (lambda: jobs.delete(older_than="7 days"), "older_than takes an age such as '7d'"),
        (lambda: jobs.delete(older_than=7), "older_than takes an age such as '7d'"),
        (lambda: jobs.delete(older_than=timedelta(days=-1)), "an age of 0 or more"),
        (lambda: jobs.delete(999), "There is no job 999"),
        (lambda: jobs.delete("net"), "A job id is a number"),
    ],
)
def test_delete_refuses_wrong_arguments_with_one_clear_error(call, words: str) -> None:
    with pytest.raises(JobError, match=re.escape(words)):
        call()


@pytest.mark.slow
def test_jobs_delete_and_cancel_magics_in_a_real_kernel(kernel: KernelSession) -> None:
    old, kept, running = _ended(), _ended(), _running()
    assert kernel.run("%load_ext nbscale").ok
    refused = kernel.run(f"%jobs delete {running.id}")
    assert not refused.ok and f"Job {running.id} (running) is still active" in refused.text
    deleted = kernel.run(f"%jobs delete {old.id}")
    assert deleted.ok and deleted.stdout.strip() == f"Deleted job {old.id}.", deleted.text
    cancelled = kernel.run(f"%jobs cancel {running.id}")
    assert cancelled.ok and cancelled.stdout.strip() == f"Job {running.id} cancelled.", cancelled.text
    assert kernel.run(f"%jobs cancel {running.id}").stdout.strip() == f"Job {running.id} had already ended (cancelled)."
    nothing = kernel.run("%jobs delete --older-than 7d")
    assert nothing.stdout.strip() == "No ended job is older than 7d: nothing deleted.", nothing.text
    everything = kernel.run("%jobs delete --older-than 0s")
    assert everything.stdout.strip() == f"Deleted jobs {kept.id}, {running.id}.", everything.text
    assert jobs.list() == []
