"""Shared memory that is full, and shared-memory files left by processes killed mid-transfer.

The pool's shared-memory folder is pointed (NBSCALE_SHM_DIR) at a 1 MiB tmpfs mounted for the test, so /dev/shm
itself is never filled. Where mounting is not permitted (no root), the test says so and does not run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import nbscale
from nbscale.pool.transport import SHARED_MEMORY_DIR_VARIABLE
from tests.kernel_session import KernelSession

pytestmark = pytest.mark.faults  # fault injection: in make test, not in make test-fast

SMALL_TMPFS_BYTES = 1 << 20


@pytest.fixture
def small_shm(tmp_path, monkeypatch):
    """A 1 MiB tmpfs as the pool's shared-memory folder (writes past 1 MiB fail with ENOSPC, as in a full /dev/shm)."""
    folder = tmp_path / "shm"
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={SMALL_TMPFS_BYTES},mode=1777", "tmpfs", str(folder)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({mounted.stderr.strip()}): run as root to test a full /dev/shm")
    monkeypatch.setenv(SHARED_MEMORY_DIR_VARIABLE, str(folder))
    try:
        yield folder
    finally:
        pool = nbscale.current_pool()
        if pool is not None:
            pool.close()
        subprocess.run(["umount", "-l", str(folder)], check=False)


def _dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    return ended.pid


def _stale_file(folder: Path, pid: int, size: int) -> Path:
    path = folder / f"nbscale-{pid}-{os.urandom(8).hex()}"
    path.write_bytes(b"\0" * size)
    return path


def test_a_full_shared_memory_sends_large_values_on_the_socket_names_the_cause_once_and_kills_no_worker(
    small_shm, capfd
):
    with nbscale.Pool(2, cpu=True) as pool:
        big = torch.arange(1 << 20, dtype=torch.float32)  # 4 MiB: more than the whole tmpfs holds
        pool.push(big=big)
        sums = pool.spmd("total = big.sum().item()\nback = big * 2")  # the workers' own 4 MiB replies below
        assert sums["total"][:] == [float(big.sum())] * 2
        for doubled in pool.pull("back"):  # each reply falls back to the socket on its worker too
            assert torch.equal(doubled, big * 2)
        pool.push(big=big + 1)  # and a second full push says nothing more
        assert [w.state for w in pool.workers] == ["idle", "idle"]
    captured = capfd.readouterr()
    warnings = [line for line in captured.err.splitlines() if "could not write" in line]
    assert len(warnings) == 1, captured.err
    assert f"transfer to shared memory in {small_shm} (No space left on device)" in warnings[0]
    assert "large values go through the pool's sockets instead" in warnings[0]
    assert list(small_shm.iterdir()) == []  # no partial file left behind


def test_a_full_shared_memory_is_first_cleared_of_the_users_stale_files(small_shm, capfd):
    with nbscale.Pool(1, cpu=True) as pool:
        stale = _stale_file(small_shm, _dead_pid(), 900 * 1024)  # left by a kernel killed mid-transfer
        value = torch.ones(128 * 1024)  # 512 KiB: fits only once the stale file is gone
        pool.push(value=value)
        assert pool.pull("value")[0].sum().item() == 128 * 1024
    assert not stale.exists()
    assert "could not write" not in capfd.readouterr().err  # shared memory was used after all


def test_a_pool_start_removes_only_the_users_own_files_of_processes_that_are_gone(small_shm):
    dead = _dead_pid()
    stale = _stale_file(small_shm, dead, 10)
    of_a_running_process = _stale_file(small_shm, os.getpid(), 10)
    of_another_user = _stale_file(small_shm, dead, 10)
    os.chown(of_another_user, 65534, 65534)
    not_ours = small_shm / f"other-{dead}-{os.urandom(8).hex()}"
    not_ours.write_bytes(b"x")
    link = small_shm / f"nbscale-{dead}-{os.urandom(8).hex()}"
    link.symlink_to(not_ours)
    with nbscale.Pool(1, cpu=True):
        pass
    assert not stale.exists()
    assert of_a_running_process.exists() and of_another_user.exists() and not_ours.exists() and link.is_symlink()


@pytest.mark.slow
def test_files_of_a_kernel_killed_mid_request_are_removed_once_its_pool_sees_it_gone(small_shm):
    session = KernelSession(env={SHARED_MEMORY_DIR_VARIABLE: str(small_shm)})
    try:
        session.run("%load_ext nbscale\nimport nbscale, os, signal, torch")
        session.run("%pool start 1 --cpu")
        session.run("os.kill(nbscale.current_pool().workers[0].pid, signal.SIGSTOP)")
        kernel_pid = session.pid
        session.client.execute("nbscale.current_pool().push(x=torch.ones(64 * 1024))")  # 256 KiB, never answered
        deadline = time.monotonic() + 30
        while not list(small_shm.glob(f"nbscale-{kernel_pid}-*")) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = list(small_shm.glob(f"nbscale-{kernel_pid}-*"))
        assert left, "the push never reached shared memory"
        session.kill()
    finally:
        session.shutdown()
    deadline = time.monotonic() + 60
    while any(path.exists() for path in left):  # the forkserver sees the kernel's pipe close (issue 43.2)
        assert time.monotonic() < deadline, [path for path in left if path.exists()]
        time.sleep(0.05)
