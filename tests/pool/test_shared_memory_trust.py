"""`NBSCALE_SHM_DIR` naming a folder another user could write: large values never pass through it."""

from __future__ import annotations

import os

import pytest
import torch

import nbscale
from nbscale.pool.transport import SHARED_MEMORY_DIR_VARIABLE

pytestmark = pytest.mark.faults  # fault injection: in make test, not in make test-fast


def _push_and_check(pool: nbscale.Pool) -> None:
    big = torch.arange(1 << 20, dtype=torch.float32)  # 4 MiB: out of band
    pool.push(big=big)
    assert [float(value.sum()) for value in pool.pull("big")] == [float(big.sum())] * 2


@pytest.mark.parametrize("mode", [0o777, 0o775])
def test_a_shm_folder_others_can_write_is_not_used_and_the_kernel_says_why_once(tmp_path, monkeypatch, capfd, mode):
    folder = tmp_path / "shared"
    folder.mkdir()
    os.chmod(folder, mode)  # others (or the group) could rename a transfer and put their own in its place
    monkeypatch.setenv(SHARED_MEMORY_DIR_VARIABLE, str(folder))
    with nbscale.Pool(2, cpu=True) as pool:
        _push_and_check(pool)
        pool.push(again=torch.ones(1 << 20))
        assert [w.state for w in pool.workers] == ["idle", "idle"]
    assert list(folder.iterdir()) == []  # nothing was ever written there
    warnings = [line for line in capfd.readouterr().err.splitlines() if SHARED_MEMORY_DIR_VARIABLE in line]
    assert len(warnings) == 1, warnings
    assert f"does not use {SHARED_MEMORY_DIR_VARIABLE}={folder}" in warnings[0]
    assert "can be written by other users" in warnings[0] and "no sticky bit" in warnings[0]
    assert "pool's sockets" in warnings[0]


def test_a_shm_folder_of_another_user_is_not_used(tmp_path, monkeypatch, capfd):
    folder = tmp_path / "theirs"
    folder.mkdir(mode=0o700)
    os.chown(folder, 65534, 65534)  # nobody's: they could replace any file in it
    monkeypatch.setenv(SHARED_MEMORY_DIR_VARIABLE, str(folder))
    with nbscale.Pool(2, cpu=True) as pool:
        _push_and_check(pool)
    assert list(folder.iterdir()) == []
    assert "belongs to another user (uid 65534)" in capfd.readouterr().err


def test_a_sticky_shm_folder_is_used_as_dev_shm_is(tmp_path, monkeypatch, capfd):
    folder = tmp_path / "sticky"
    folder.mkdir()
    os.chmod(folder, 0o1777)  # others may add files but not rename or remove the user's
    monkeypatch.setenv(SHARED_MEMORY_DIR_VARIABLE, str(folder))
    with nbscale.Pool(2, cpu=True) as pool:
        _push_and_check(pool)
    assert SHARED_MEMORY_DIR_VARIABLE not in capfd.readouterr().err
