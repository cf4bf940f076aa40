"""A damaged job index is refused with the file and the way back, and no job id or folder is ever reused."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import time
from pathlib import Path

import pytest

import nbscale.jobs as jobs
from nbscale.errors import JobError
from nbscale.jobs import Job, JobStore

pytestmark = pytest.mark.faults  # fault injection: in make test, not in make test-fast

WAIT_S = 60


@pytest.fixture
def first(job_store: JobStore) -> Job:
    """A real job that ran and saved a variable: the files a damaged index must never let a new job overwrite."""
    job = jobs.submit("value = 'first'\nprint('first ran')\n", name="first")
    assert job.wait(WAIT_S) and job.state == "finished", job.log()
    return job


def _files(job: Job) -> dict[str, bytes]:
    return {str(p.relative_to(job.folder)): p.read_bytes() for p in sorted(job.folder.rglob("*")) if p.is_file()}


def _refused_everywhere(store: JobStore, words: str) -> None:
    """list, get, list_jobs and submit each refuse the index with one message naming it and the way back."""
    for action in (jobs.list, jobs.list_jobs, lambda: jobs.get(1), lambda: jobs.submit("value = 'second'\n")):
        with pytest.raises(JobError) as caught:
            action()
        message = str(caught.value)
        assert f"The job store index {store.index_path} is damaged: {words}" in message, message
        assert f"mv '{store.index_path}' '{store.index_path}.damaged'" in message
        assert "cannot be written" not in message


def _rows(store: JobStore, statement: str) -> None:
    with sqlite3.connect(store.index_path) as connection:
        connection.execute(statement)


def test_an_index_truncated_to_nothing_is_refused_and_job_1_is_never_overwritten(
    job_store: JobStore, first: Job
) -> None:
    before = _files(first)
    job_store.index_path.write_bytes(b"")  # truncated, as a full disk or a crash mid-copy leaves it
    _refused_everywhere(job_store, "it is empty (0 bytes) while job folder 1 exists beside it")
    assert _files(first) == before and sorted(p.name for p in job_store.root.iterdir()) == ["1", "jobs.sqlite"]

    job_store.index_path.rename(f"{job_store.index_path}.damaged")  # the way back the message gives
    [rebuilt] = jobs.list()
    assert (rebuilt.id, rebuilt.name, rebuilt.state, rebuilt.result("value")) == (1, "first", "finished", "first")
    second = jobs.submit("value = 'second'\n", name="second")
    assert second.id == 2 and second.wait(WAIT_S) and second.result("value") == "second"
    assert _files(first) == before


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        (
            lambda path: path.write_bytes(b"\x00garbage" * 512),
            "it is not an SQLite database (it starts with b'\\x00garbage",
        ),
        (lambda path: path.write_text('[{"id": 1}]'), "it is not an SQLite database (it starts with b'[{\"id\": 1}]'"),
        (lambda path: os.truncate(path, 4096), "database disk image is malformed"),
        (lambda path: _rows_of(path, "ALTER TABLE jobs DROP COLUMN unpicklable"), "its jobs table has the columns"),
        (
            lambda path: _rows_of(path, "UPDATE jobs SET results = '{\"value\": 1}'"),
            "the row of job 1 is not one nbscale wrote (results is '{\"value\": 1}', not a JSON list of variable "
            "names)",
        ),
        (lambda path: _rows_of(path, "UPDATE jobs SET results = 'not json'"), "(results is 'not json', not JSON text)"),
        (lambda path: _rows_of(path, "UPDATE jobs SET unpicklable = '[1, 2]'"), "unpicklable is '[1, 2]'"),
        (
            lambda path: _rows_of(path, "UPDATE jobs SET pool = 'many'"),
            "pool is 'many' (str), which the store never writes",
        ),
        (lambda path: _rows_of(path, "UPDATE jobs SET state = 'exploded'"), "state is 'exploded', not one of queued"),
        (lambda path: _rows_of(path, "UPDATE jobs SET name = x'00ff'"), "name is b'\\x00\\xff' (bytes)"),
        (lambda path: _rows_of(path, "UPDATE jobs SET submitted = 'yesterday'"), "submitted is 'yesterday' (str)"),
        (lambda path: _rows_of(path, "UPDATE jobs SET pid = 1.5"), "pid is 1.5 (float)"),
    ],
)
def test_a_damaged_index_is_refused_naming_what_is_wrong(job_store: JobStore, first: Job, damage, words) -> None:
    before = _files(first)
    damage(job_store.index_path)
    _refused_everywhere(job_store, "")
    with pytest.raises(JobError, match="is damaged: .*" + _escaped(words)):
        jobs.list()
    assert _files(first) == before and sorted(p.name for p in job_store.root.iterdir()) == ["1", "jobs.sqlite"]
    job_store.index_path.rename(f"{job_store.index_path}.damaged")  # the way back the message gives
    assert [(j.id, j.name, j.state) for j in jobs.list()] == [(1, "first", "finished")]
    assert jobs.submit("value = 'second'\n").id == 2


def _rows_of(path: Path, statement: str) -> None:
    with sqlite3.connect(path) as connection:
        connection.execute(statement)


def _escaped(text: str) -> str:
    import re

    return re.escape(text)


def test_a_lost_index_is_rebuilt_from_the_job_folders(job_store: JobStore, first: Job) -> None:
    failing = jobs.submit("value = 2\nraise ValueError('boom')\n", name="failing")
    assert failing.wait(WAIT_S)
    earlier = job_store.root / "7"  # a job folder of an earlier nbscale: no record.json
    shutil.copytree(first.folder, earlier)
    (earlier / "record.json").unlink()
    job_store.index_path.unlink()

    listed = [(j.id, j.name, j.state) for j in jobs.list()]
    assert listed == [(1, "first", "finished"), (2, "failing", "failed"), (7, None, "failed")]
    assert jobs.get(2).error == "ValueError: boom" and jobs.get(7).result("value") == "first"
    assert "record was lost with the job index" in jobs.get(7).error
    assert jobs.submit("value = 3\n").id == 8


def test_an_existing_folder_is_never_handed_out_as_a_new_job(job_store: JobStore, first: Job) -> None:
    stray = job_store.root / "2"  # left by a store whose index was replaced, or made by hand
    stray.mkdir()
    (stray / "log.txt").write_text("someone else's log\n")
    job = jobs.submit("value = 'new'\n")
    assert job.id == 3 and job.wait(WAIT_S) and job.result("value") == "new"
    assert (stray / "log.txt").read_text() == "someone else's log\n"
    _rows(job_store, "DELETE FROM jobs")  # rows gone: their ids are still never given again
    assert jobs.submit("value = 'newer'\n").id == 4


def test_a_store_is_created_from_nothing_and_an_empty_index_without_folders_is_new(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "fresh")
    assert store.index_path.stat().st_size > 0 and store.all() == []
    empty = tmp_path / "emptied"
    empty.mkdir()
    (empty / "jobs.sqlite").write_bytes(b"")  # as a store that was created but never written leaves it
    assert JobStore(empty).all() == []


def _running_job_waiting_for(go: Path) -> Job:
    job = jobs.submit(
        f"import pathlib, time\nwhile not pathlib.Path({str(go)!r}).exists():\n    time.sleep(0.1)\nvalue = 'done'\n",
        name="waits",
    )
    deadline = time.monotonic() + WAIT_S
    while job.state != "running" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert job.state == "running", job.log()
    return job


def _failed_for_its_deleted_folder(job: Job) -> None:
    assert job.wait(WAIT_S) and job.state == "failed"
    assert job.error.startswith(f"its folder {job.folder} was deleted while the job was active"), job.error
    with pytest.raises(JobError, match="was deleted while the job was active"):
        job.result("value")
    assert job.log() == ""
    assert [(listed.id, listed.state) for listed in jobs.list()] == [(job.id, "failed")]  # %jobs still reads the store
    second = jobs.submit("value = 'second'\n", name="second")
    assert second.id == job.id + 1 and second.wait(WAIT_S) and second.result("value") == "second"


def test_a_job_whose_folder_is_deleted_while_it_runs_ends_failed_saying_so_and_the_store_stays_usable(
    job_store: JobStore, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    job = _running_job_waiting_for(go)
    shutil.rmtree(job.folder)
    go.touch()  # the cell ends: the runner finds nowhere to save its variables
    _failed_for_its_deleted_folder(job)


def test_a_killed_job_whose_folder_was_deleted_is_noticed_as_failed_saying_so_and_the_store_stays_usable(
    job_store: JobStore, tmp_path: Path
) -> None:
    job = _running_job_waiting_for(tmp_path / "never")
    pid = job.record().pid
    shutil.rmtree(job.folder)
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.1)
    _failed_for_its_deleted_folder(job)
