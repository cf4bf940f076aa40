"""Jobs on a full disk, for real: the job store lives on a 2 MiB tmpfs mounted for each test (root can mount one;
elsewhere the test says so and does not run, as the pool's and the checkpoints' full-disk tests do)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import nbscale.jobs as jobs
from nbscale.errors import JobError
from tests.kernel_session import KernelSession

WAIT_S = 60
TMPFS_BYTES = 2 * 2**20


@pytest.fixture
def small_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """NBSCALE_HOME on a 2 MiB tmpfs; yields the mount point."""
    folder = tmp_path / "small"
    folder.mkdir(mode=0o700)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES},mode=0700", "tmpfs", str(folder)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({mounted.stderr.strip()}): run as root to test a full disk")
    monkeypatch.setenv("NBSCALE_HOME", str(folder / "home"))
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def _fill(folder: Path) -> Path:
    """Write a file until the disk refuses more; returns it."""
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as file:
        try:
            while True:
                file.write(b"\0" * 65536)
        except OSError as error:
            assert error.errno == 28, error  # ENOSPC
    with open(filler, "ab", buffering=0) as file:  # the last few bytes too
        try:
            while True:
                file.write(b"\0")
        except OSError:
            pass
    return filler


def test_a_result_that_does_not_fit_fails_the_job_naming_it_and_every_other_result_is_saved(small_store: Path) -> None:
    code = "first = b'1' * 1000\nhuge = bytes(3 * 2**20)\nlast = b'3' * 1000\nprint('assigned all three')\n"
    job = jobs.submit(code, name="full disk")
    assert job.wait(WAIT_S), job.log()
    assert (job.state, job.error) == ("failed", "could not save huge: No space left on device"), job.log()
    assert job.result_names == ("first", "last")
    assert job.result("first") == b"1" * 1000 and job.result("last") == b"3" * 1000
    with pytest.raises(JobError) as refused:
        job.result("huge")
    assert "Job 1 assigned 'huge', but it could not be saved: its file could not be written" in str(refused.value)
    assert "No space left on device. Free space where the job store is" in str(refused.value)
    log = job.log()
    assert "assigned all three" in log and "[nbscale] result 'huge' not saved" in log
    assert "process died" not in log
    assert sorted(p.name for p in (job.folder / "results").iterdir()) == ["first.pkl", "last.pkl"]  # no partial file
    assert jobs.list_jobs()[0]["error"] == "could not save huge: No space left on device"


@pytest.mark.slow
def test_a_dead_job_on_a_full_store_disk_reads_as_failed_everywhere_and_writes_name_the_full_disk(
    small_store: Path,
) -> None:
    job = jobs.submit("import time\nprint('sleeping', flush=True)\ntime.sleep(600)\n", name="sleeper")
    deadline = time.monotonic() + WAIT_S
    while "sleeping" not in job.log():
        assert time.monotonic() < deadline, job.log()
        time.sleep(0.1)
    filler = _fill(small_store)
    os.killpg(job.record().pid, signal.SIGKILL)  # dies without a word, on a disk where nothing can be written
    time.sleep(0.5)

    for state in (jobs.list_jobs()[0]["state"], jobs.list()[0].state, jobs.get(job.id).state, job.state):
        assert state == "failed"
    assert job.error.startswith("process died") and jobs.list_jobs()[0]["error"] == job.error
    assert "the job store's disk is full, so it may have ended without being able to record it" in job.error
    assert "sleeping" in job.log() and "sleeping" in job.log(tail=100)
    assert job.wait(1)
    kernel = KernelSession()  # NBSCALE_HOME is the full store's: %jobs reads it as the kernel's own
    try:
        table = kernel.run("%load_ext nbscale\n%jobs")
        assert table.ok, table.text
        assert "sleeper" in table.displays[0]["text/plain"] and "failed" in table.displays[0]["text/plain"]
    finally:
        kernel.shutdown()
    with pytest.raises(JobError) as refused:  # a write: the disk's own error, never "cannot rollback"
        jobs.submit("value = 1\n")
    assert "cannot be written: database or disk is full" in str(refused.value), refused.value
    assert "rollback" not in str(refused.value)
    assert [p.name for p in jobs.JobStore().root.iterdir() if p.name.isdigit()] == ["1"]  # no orphan job folder

    filler.unlink()  # room again: the next read writes the death it noticed
    assert job.state == "failed"
    with sqlite3.connect(jobs.JobStore().index_path) as index:
        assert index.execute("SELECT state FROM jobs WHERE id = ?", (job.id,)).fetchone() == ("failed",)


def test_a_job_that_fills_the_store_disk_itself_reads_as_failed_naming_the_full_disk(small_store: Path) -> None:
    code = (
        f"value = 1\nfor size in (65536, 1):\n    with open({str(small_store / 'filler')!r}, 'ab', buffering=0) as f:\n"
        "        try:\n            while True:\n                f.write(bytes(size))\n"
        "        except OSError:\n            pass\nprint('filled')\n"
    )
    job = jobs.submit(code, name="filler")
    assert job.wait(WAIT_S), job.log()
    assert job.state == "failed" and "the job store's disk is full" in job.error, (job.error, job.log())
    assert jobs.list_jobs()[0]["state"] == "failed"
