"""The job store holds up to crashes: an interrupted transaction or file write leaves the last good state."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nbscale.errors import JobError
from nbscale.jobs import JobStore
from nbscale.jobs.files import write_atomic

_CRASH_MID_TRANSACTION = """
import os, signal, sys
from nbscale.errors import JobError
from nbscale.jobs import JobStore
store = JobStore(sys.argv[1])
with store._transaction() as connection:
    connection.execute("UPDATE jobs SET state = 'finished', name = 'half-written' WHERE id = ?", (int(sys.argv[2]),))
    os.kill(os.getpid(), signal.SIGKILL)  # dies holding the write lock, before COMMIT
"""


def test_store_survives_a_process_killed_mid_transaction(job_store: JobStore) -> None:
    job_id = job_store.create("intact", None, os.getcwd())
    crashed = subprocess.run([sys.executable, "-c", _CRASH_MID_TRANSACTION, str(job_store.root), str(job_id)])
    assert crashed.returncode == -9
    record = job_store._read("WHERE id = ?", (job_id,))[0]
    assert (record.name, record.state) == ("intact", "queued")  # rolled back
    assert job_store.mark_cancelled(job_id)  # and the store is writable again
    assert job_store.get(job_id).state == "cancelled"


def test_atomic_write_interrupted_before_replace_keeps_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "results"
    folder.mkdir()
    target = folder / "net.pkl"
    write_atomic(target, b"old")

    def crash(*args: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        write_atomic(target, b"new")
    assert target.read_bytes() == b"old"
    assert [p.name for p in folder.iterdir()] == ["net.pkl"]  # no temporary left behind


def test_queued_job_whose_process_never_started_is_failed(job_store: JobStore, monkeypatch: pytest.MonkeyPatch) -> None:
    job_id = job_store.create(None, None, os.getcwd())
    monkeypatch.setattr("nbscale.jobs.store.NEVER_STARTED_S", 0.0)
    record = job_store.get(job_id)
    assert record.state == "failed" and "never started" in (record.error or "")


@pytest.mark.parametrize("fault", [KeyboardInterrupt, OSError])
def test_a_submission_cut_off_while_its_folder_is_written_leaves_a_failed_job_not_a_queued_one(
    job_store: JobStore, monkeypatch: pytest.MonkeyPatch, fault: type[BaseException]
) -> None:
    submitting = sys.modules["nbscale.jobs.submit"]  # the module (nbscale.jobs.submit is also its function's name)

    def cut_off(path: Path, data: bytes) -> None:
        if path.name == "inputs.pkl":  # an interrupt (or a full disk) while a large input is written
            raise fault(28, "No space left on device") if fault is OSError else fault()
        write_atomic(path, data)

    monkeypatch.setattr(submitting, "write_atomic", cut_off)
    with pytest.raises(KeyboardInterrupt if fault is KeyboardInterrupt else JobError) as raised:
        submitting.submit("y = x + 1", namespace={"x": 1}, store=job_store)
    [record] = job_store._read()
    assert record.state == "failed"
    if fault is KeyboardInterrupt:
        assert "submission was interrupted" in (record.error or "")
    else:
        assert "No space left on device" in str(raised.value) and str(job_store.job_dir(record.id)) in str(raised.value)
        assert "could not be written" in (record.error or "")
