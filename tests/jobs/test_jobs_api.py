"""nbscale.jobs.list() and get(name=...), and every bad argument to the jobs API: one clear JobError each."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest

import nbscale.jobs as jobs
from nbscale.errors import JobError
from nbscale.jobs import Job, JobStore
from nbscale.ui.jobs_table import JobsTable

WAIT_S = 60


def test_list_gives_job_objects_oldest_first_and_get_finds_the_newest_of_a_name() -> None:
    first = jobs.submit("value = 1\n", name="run")
    other = jobs.submit("value = 2\n", name="other")
    again = jobs.submit("value = 3\n", name="run")
    for job in (first, other, again):
        assert job.wait(WAIT_S)
    listed = jobs.list()
    assert all(isinstance(job, Job) for job in listed)
    assert [(job.id, job.name, job.state) for job in listed] == [
        (first.id, "run", "finished"),
        (other.id, "other", "finished"),
        (again.id, "run", "finished"),
    ]
    assert jobs.get(name="run") == again and jobs.get(name="run").result("value") == 3
    assert jobs.get(first.id) == first and jobs.get(str(first.id)) == first and jobs.get(np.int64(first.id)) == first
    with pytest.raises(JobError, match=r"no job named 'rn'.*Did you mean 'run'"):
        jobs.get(name="rn")


def test_list_is_the_apis_name_for_all_jobs_and_the_module_defines_no_list(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NBSCALE_HOME", str(tmp_path))
    assert jobs.list is jobs.all_jobs and jobs.list() == []
    assert "list" not in vars(jobs)  # Python's list stays itself inside the module
    with pytest.raises(AttributeError, match="no attribute 'lst'"):
        jobs.lst  # noqa: B018 (the lookup is the test)


def test_the_jobs_table_is_the_same_from_jobs_or_from_dicts(job_store: JobStore) -> None:
    job = jobs.submit("value = 1\n", name="tabled")
    job.wait(WAIT_S)
    from_dicts = JobsTable.from_jobs(jobs.list_jobs(), str(job_store.root))
    from_jobs = JobsTable.from_jobs(jobs.list(), str(job_store.root))
    assert repr(from_jobs) == repr(from_dicts) and from_jobs._repr_html_() == from_dicts._repr_html_()
    assert "tabled" in repr(from_dicts) and "finished" in repr(from_dicts)


BAD_CALLS = [
    (lambda: jobs.get(10**30), "There is no job 1000000000000000000000000000000: job ids are the numbers"),
    (lambda: jobs.get("9" * 5000), "There is no job '99999"),
    (lambda: jobs.get(-1), "There is no job -1"),
    (lambda: jobs.get(0), "There is no job 0"),
    (lambda: jobs.get(True), "A job id is a number as %jobs shows it (like 3), not bool True"),
    (lambda: jobs.get(3.7), "not float 3.7"),
    (lambda: jobs.get("first run"), "To find a job by its name, use nbscale.jobs.get(name='first run')"),
    (lambda: jobs.get("３"), "not '３'"),
    (lambda: jobs.get(None), "takes a job id (get(3)) or a name (get(name='long run')), one of them"),
    (lambda: jobs.get(1, name="x"), "one of them"),
    (lambda: jobs.get(name=5), "A job's name is a string (as given to %%batch --name), not int 5"),
    (lambda: jobs.get(name="nothing"), "There is no job named 'nothing'"),
    (lambda: jobs.get(999), "There is no job 999 in the job store"),
    (lambda: jobs.cancel("abc"), "A job id is a number"),
    (lambda: jobs.submit(123), "submit() takes the cell's code as a string, not int 123"),
    (lambda: jobs.submit(b"x = 1"), "not bytes"),
    (lambda: jobs.submit("x = '\x00'"), "holds a NUL character"),
    (lambda: jobs.submit("x = 1", name=5), "A job's name is a string"),
    (
        lambda: jobs.submit("x = 1", namespace=[("x", 1)]),
        "takes the notebook's variables as a dict (globals()), not list",
    ),
    (lambda: jobs.submit("x = 1", cwd=123), "submit(cwd=...) takes a folder path, not int 123"),
    (lambda: jobs.submit("x = 1", cwd="/no/such/folder"), "submit(cwd='/no/such/folder'): that folder does not exist"),
    (lambda: jobs.submit("x = 1", env=["A=1"]), "takes a dict of environment variables"),
    (lambda: jobs.submit("x = 1", env={"A": "a\x00b"}), "--env A: an environment variable cannot hold a NUL"),
    (lambda: jobs.submit("x = 1", env={"A": 1}), "--env takes KEY=VALUE pairs with string values"),
    (lambda: jobs.submit("x = 1", pool=0), "--pool takes a number of workers >= 1, not 0"),
    (lambda: jobs.submit("x = 1", pool="2"), "--pool takes a number of workers >= 1, not '2'"),
    (lambda: jobs.submit("x = 1", cluster=5), "submit(cluster=...) takes a profile name or an address, not int"),
    (lambda: jobs.submit("x = (1"), "The batch cell has a syntax error on line 1"),
    (
        lambda: jobs.submit("x = 1", cluster="nosuchprofile"),  # a typo: no failed job left in %jobs
        "--cluster 'nosuchprofile' is neither an address (ray://HOST:PORT) nor a profile",
    ),
]


@pytest.mark.parametrize(("call", "words"), BAD_CALLS, ids=range(len(BAD_CALLS)))
def test_a_bad_argument_is_one_clear_job_error_and_no_job(job_store: JobStore, call, words) -> None:
    with pytest.raises(JobError) as caught:
        call()
    message = str(caught.value)
    assert words in message and "\n" not in message and len(message) < 400, message
    assert jobs.list_jobs() == []


def test_bad_arguments_to_a_job_are_clear_errors() -> None:
    job = jobs.submit("value = 1\n")
    assert job.wait(WAIT_S)
    for call, words in [
        (lambda: job.result(["value"]), "takes a variable's name as a string"),
        (lambda: job.result("../../inputs"), "did not assign '../../inputs'"),
        (lambda: job.wait("soon"), "takes seconds (a number) or None"),
        (lambda: job.wait(math.nan), "not nan"),
        (lambda: job.log(tail=-1), "takes a number of characters (>= 0) or None, not -1"),
    ]:
        with pytest.raises(JobError) as caught:
            call()
        assert words in str(caught.value)
    assert job.wait(math.inf) and job.wait(-1)


def test_result_with_no_name_gives_every_saved_variable_as_matlabs_fetch_outputs_does() -> None:
    done = jobs.submit("value = 1\nwords = ['a', 'b']\n")
    failed = jobs.submit("raise ValueError('boom')\n")
    running = jobs.submit("import time\ntime.sleep(60)\n")
    try:
        with pytest.raises(JobError, match=r"is still (queued|running).*then call job.result\(\) again"):
            running.result()
    finally:
        running.cancel()
    assert done.wait(WAIT_S) and failed.wait(WAIT_S)
    assert done.result() == {"value": 1, "words": ["a", "b"]}
    with pytest.raises(JobError, match=r"saved no variable\. It failed \(ValueError: boom\)"):
        failed.result()


def test_a_result_name_in_a_record_cannot_reach_outside_the_job_folder(job_store: JobStore) -> None:
    import sqlite3

    job = jobs.submit("value = 1\n")
    assert job.wait(WAIT_S)
    with sqlite3.connect(job_store.index_path) as connection:
        connection.execute("UPDATE jobs SET results = '[\"../../inputs\"]'")
    with pytest.raises(JobError, match="is damaged: .*results is"):
        job.result("../../inputs")
    job_store.index_path.rename(f"{job_store.index_path}.damaged")  # the way back the message gives


@pytest.mark.skipif(os.getuid() != 0, reason="giving a folder to another user takes root")
def test_a_job_store_of_another_user_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "theirs"
    folder.mkdir(mode=0o700)
    os.chown(folder, 65534, -1)
    with pytest.raises(JobError, match=f"The job store folder {folder} belongs to another user \\(uid 65534\\)"):
        JobStore(folder)


def test_a_job_store_in_a_folder_others_can_write_is_refused_unless_it_is_sticky(tmp_path: Path) -> None:
    # whoever can write the folder above the store can rename the store away and put theirs, with pickles that
    # run as the user when a job starts or a result is read, in its place between any check and that read
    team = tmp_path / "team"
    team.mkdir()
    team.chmod(0o777)
    with pytest.raises(
        JobError,
        match=f"The job store folder {team / 'jobs'} cannot be trusted: the folder {team} "
        r"above it can be written by other users \(mode drwxrwxrwx, no sticky bit\)"
        ".*Point NBSCALE_HOME at a folder only you can write to",
    ):
        JobStore(team / "jobs")
    team.chmod(0o1777)  # as /tmp: others cannot rename what is the user's
    assert JobStore(team / "jobs").all() == []


def test_a_store_folder_that_is_a_file_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(JobError, match="cannot be used .*point NBSCALE_HOME at a folder"):
        JobStore(tmp_path / "file")
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "jobs.sqlite").mkdir()
    with pytest.raises(JobError, match=r"index .*jobs.sqlite cannot be read \(Is a directory\)"):
        JobStore(tmp_path / "store")
