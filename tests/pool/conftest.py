"""Fixtures the pool tests share: a private shared-memory folder whose files a test can count."""

from __future__ import annotations

from pathlib import Path

import pytest

from nbscale.pool.transport import SHARED_MEMORY_DIR_VARIABLE


@pytest.fixture
def shm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The pool's shared-memory folder for this test (NBSCALE_SHM_DIR): a fresh 0700 folder in its tmp_path."""
    folder = tmp_path / "shm"
    folder.mkdir(mode=0o700)
    monkeypatch.setenv(SHARED_MEMORY_DIR_VARIABLE, str(folder))
    return folder
