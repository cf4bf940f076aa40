"""The zygote (nbscale/pool/zygote.py): one process per user and environment that imported torch once, from which
every local pool's forkserver is forked; each forkserver still starts as its own kernel would have started it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

import nbscale
from nbscale.pool import process_names
from tests.pool_processes import forkservers_of

pytestmark = pytest.mark.slow

ZYGOTE = process_names.ZYGOTE.decode()


@pytest.fixture
def runtime(tmp_path, monkeypatch) -> Path:
    """A runtime folder of the test's own: its zygote is the test's, and ends once the folder is removed."""
    folder = tmp_path
    monkeypatch.setenv("NBSCALE_RUNTIME_DIR", str(folder))
    yield folder
    for zygote in _zygotes(folder):
        zygote.kill()


def _zygotes(runtime: Path) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter():
        try:
            if process.name() == ZYGOTE and any(str(runtime) in part for part in process.cmdline()):
                found.append(process)
        except psutil.Error:
            continue
    return found


def _forkserver_parent(pool: nbscale.Pool) -> psutil.Process:
    [forkserver] = forkservers_of(os.getpid())
    assert forkserver == psutil.Process(pool.workers[0].pid).ppid()
    return psutil.Process(forkserver).parent()


POOL_IN_A_NEW_PROCESS = textwrap.dedent(
    """
    import os, sys, nbscale, psutil
    with nbscale.Pool(1, cpu=True) as pool:
        forkserver = psutil.Process(pool.workers[0].pid).parent()
        print(forkserver.parent().pid, pool.run(lambda: os.environ.get("NBSCALE_TEST_VALUE"))[0])
    """
)


def test_every_pool_of_the_users_processes_is_forked_from_one_zygote_that_follows_each_process(runtime):
    with nbscale.Pool(2, cpu=True) as pool:
        zygote = _forkserver_parent(pool)
        assert zygote.name() == ZYGOTE
        assert pool.run(lambda: "torch" in sys.modules) == [True, True]  # imported once, up there
    # a second process of the user's (a second kernel) gets its forkserver from the same zygote, with its own
    # environment: a variable the zygote never had reaches its workers
    shown = subprocess.run(
        [sys.executable, "-c", POOL_IN_A_NEW_PROCESS],
        env={**os.environ, "NBSCALE_TEST_VALUE": "second kernel's"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.split(maxsplit=1) == [str(zygote.pid), "second kernel's\n"]
    # and a process the notebook changes after the zygote started: its os.environ now, not the zygote's
    os.environ["NBSCALE_TEST_VALUE"] = "changed in the notebook"
    try:
        with nbscale.Pool(1, cpu=True) as pool:
            assert _forkserver_parent(pool).pid == zygote.pid
            assert pool.run(lambda: os.environ.get("NBSCALE_TEST_VALUE")) == ["changed in the notebook"]
    finally:
        del os.environ["NBSCALE_TEST_VALUE"]


def test_a_variable_read_when_torch_starts_gets_a_zygote_started_with_it(runtime, monkeypatch):
    with nbscale.Pool(1, cpu=True) as pool:
        first = _forkserver_parent(pool).pid
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # read by torch's thread pool as it starts: a fork cannot change it
    with nbscale.Pool(1, cpu=True) as pool:
        second = _forkserver_parent(pool)
        assert second.name() == ZYGOTE and second.pid != first
        assert pool.run(lambda: os.environ["OMP_NUM_THREADS"]) == ["3"]


def test_two_processes_starting_pools_at_once_start_one_zygote(runtime):
    starts = [
        subprocess.Popen([sys.executable, "-c", POOL_IN_A_NEW_PROCESS], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outputs = [start.communicate(timeout=180)[0] for start in starts]
    assert [start.returncode for start in starts] == [0, 0]
    assert len({output.split()[0] for output in outputs}) == 1, outputs


def test_the_zygote_ends_once_its_folder_is_removed(runtime):
    with nbscale.Pool(1, cpu=True) as pool:
        zygote = _forkserver_parent(pool)
    for path in sorted(runtime.rglob("*"), reverse=True):  # as the suite's private folders go at its end
        path.rmdir() if path.is_dir() else path.unlink()
    zygote.wait(timeout=30)  # it looks every few seconds


def test_a_runtime_folder_others_can_write_gets_no_zygote_and_the_pool_starts_all_the_same(runtime):
    (runtime / "zygotes").mkdir(parents=True)
    (runtime / "zygotes").chmod(0o777)  # another user could plant a socket there: nothing there is used
    with nbscale.Pool(1, cpu=True) as pool:
        parent = _forkserver_parent(pool)
        assert parent.pid == os.getpid()  # started by this process itself, as `python -m nbscale.pool.forkserver`
        assert pool.run(lambda: 1 + 1) == [2]
    assert not list((runtime / "zygotes").iterdir()) and _zygotes(runtime) == []


def test_a_pool_starts_without_a_zygote_where_nbscale_zygote_is_0(runtime, monkeypatch):
    monkeypatch.setenv("NBSCALE_ZYGOTE", "0")
    with nbscale.Pool(2, cpu=True) as pool:
        assert _forkserver_parent(pool).pid == os.getpid()
        assert pool.run(lambda: 1 + 1) == [2, 2]
    assert _zygotes(runtime) == []


def test_a_zygote_killed_between_pools_is_replaced(runtime):
    with nbscale.Pool(1, cpu=True) as pool:
        first = _forkserver_parent(pool)
    first.kill()
    first.wait(timeout=10)  # its socket file stays behind
    with nbscale.Pool(1, cpu=True) as pool:
        second = _forkserver_parent(pool)
        assert second.name() == ZYGOTE and second.pid != first.pid
        assert pool.run(lambda: 2 * 21) == [42]
