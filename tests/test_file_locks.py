"""nbscale.file_locks where fcntl is missing (as on Windows): the O_EXCL lock file waits for its holder, is taken
over when its holder died, and goes when the block ends."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

from nbscale import file_locks


@pytest.fixture
def no_fcntl(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "fcntl", None)  # importing it raises ImportError
    assert not file_locks.has_flock()


@pytest.fixture
def lock_file(tmp_path: Path) -> Path:
    path = tmp_path / "registry.lock"
    path.touch()
    return path


def test_without_fcntl_a_second_holder_waits_until_the_first_leaves(no_fcntl: None, lock_file: Path) -> None:
    held = lock_file.with_name("registry.lock.held")
    order: list[str] = []
    descriptor = os.open(lock_file, os.O_RDWR)
    try:
        with file_locks.exclusive(descriptor, lock_file):
            assert held.exists()
            waiter = threading.Thread(target=_hold_once, args=(lock_file, order))
            waiter.start()
            time.sleep(0.2)
            order.append("first leaves")
        waiter.join(10)
    finally:
        os.close(descriptor)
    assert order == ["first leaves", "second holds"] and not held.exists()


def test_without_fcntl_a_lock_file_its_holder_left_behind_is_taken_over(no_fcntl: None, lock_file: Path) -> None:
    held = lock_file.with_name("registry.lock.held")
    held.touch()
    os.utime(held, (time.time() - 60, time.time() - 60))  # a holder died inside its block a minute ago
    started = time.monotonic()
    _hold_once(lock_file, [])
    assert time.monotonic() - started < 5 and not held.exists()


def test_without_fcntl_a_writer_takes_no_lock_and_try_lock_always_succeeds(no_fcntl: None, lock_file: Path) -> None:
    descriptor = os.open(lock_file, os.O_RDWR)
    try:
        file_locks.hold_while_open(descriptor)
        assert file_locks.try_lock(descriptor)
    finally:
        os.close(descriptor)


def _hold_once(path: Path, order: list[str]) -> None:
    descriptor = os.open(path, os.O_RDWR)
    try:
        with file_locks.exclusive(descriptor, path, stale_after_s=30.0):
            order.append("second holds")
    finally:
        os.close(descriptor)
