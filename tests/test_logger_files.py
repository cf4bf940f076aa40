"""Loggers write only the user's own files (issue 43, items 4-5): checkpoint_path's rules for their folders and files,
and a logger that fails is dropped with one line while the run goes on, in the notebook and on a pool.

No second local user is available here: a folder another user could write is a 0777 or 1777 folder of the test,
and what such a user would plant (a link to the victim's file, a FIFO) is planted by the test itself.
"""

from __future__ import annotations

import os
import stat
import subprocess
import time
from pathlib import Path

import pytest
import torch

import nbscale
from nbscale.errors import OptionsError
from nbscale.loggers import CSVLogger, TensorBoardLogger
from tests.training.digits import digits, tiny_net


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    """A shared log folder such as /tmp: everyone may write, the sticky bit keeps each one's entries theirs."""
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(0o1777)
    return folder


def test_a_planted_link_is_refused_and_the_file_it_points_to_is_left_alone(shared: Path, tmp_path: Path) -> None:
    victim = tmp_path / "private.txt"
    victim.write_text("secret")
    victim.chmod(0o600)
    (shared / "run.csv").symlink_to(victim)
    with pytest.raises(OptionsError, match=r"CSVLogger\('.*run.csv'\) cannot write '.*run.csv': it is a symbolic link"):
        CSVLogger(shared / "run.csv")
    assert victim.read_text() == "secret"


def test_a_planted_fifo_is_refused_at_once(shared: Path) -> None:
    os.mkfifo(shared / "run.csv")
    started = time.monotonic()
    with pytest.raises(OptionsError, match=r"it is not a regular file \(a FIFO or a socket\)"):
        CSVLogger(shared / "run.csv")
    assert time.monotonic() - started < 30  # refused, not waiting for a reader


def test_folders_others_could_swap_are_refused_for_both_loggers(tmp_path: Path, shared: Path) -> None:
    open_folder = tmp_path / "open"
    open_folder.mkdir()
    open_folder.chmod(0o777)
    with pytest.raises(OptionsError, match=r"can be written by other users \(mode drwxrwxrwx, no sticky bit\)"):
        CSVLogger(open_folder / "run.csv")
    with pytest.raises(OptionsError, match=r"TensorBoardLogger\('.*open'\): .* by other users"):
        TensorBoardLogger(open_folder)
    with pytest.raises(OptionsError, match=r"TensorBoardLogger\('.*shared'\): the folder .* by other users"):
        TensorBoardLogger(shared)  # TensorBoard names its files itself: its folder must be the user's alone
    assert list(open_folder.iterdir()) == [] and list(shared.iterdir()) == []


def test_log_files_are_0600_in_0700_folders_the_loggers_create(tmp_path: Path) -> None:
    (train_x, train_y), _ = digits()
    csv_path, board = tmp_path / "logs" / "csv" / "run.csv", tmp_path / "logs" / "board"
    options = nbscale.TrainingOptions(
        "sgdm",
        max_epochs=1,
        mini_batch_size=500,
        verbose=False,
        loggers=[CSVLogger(csv_path), TensorBoardLogger(board)],
    )
    nbscale.train(tiny_net(), (train_x, train_y), options)
    folders = [tmp_path / "logs", csv_path.parent, board]
    assert [stat.S_IMODE(folder.stat().st_mode) for folder in folders] == [0o700] * 3
    files = [csv_path, *board.iterdir()]
    assert len(files) == 2 and [stat.S_IMODE(file.stat().st_mode) for file in files] == [0o600] * 2


class FailsAtStep:
    """A custom logger whose log raises at one step."""

    def __init__(self, step: int) -> None:
        self.step, self.steps, self.closed = step, [], 0

    def log(self, metrics: dict, step: int) -> None:
        if step == self.step:
            raise ValueError("the logger's own bug")
        self.steps.append(step)

    def close(self) -> None:
        self.closed += 1


@pytest.fixture
def full_folder(tmp_path: Path):
    """A 64 KiB tmpfs (mode 0700), filled: writes fail with ENOSPC, as on a full disk (creating a file still works)."""
    folder = tmp_path / "small"
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(folder)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({mounted.stderr.strip()}): run as root to test a full disk")
    try:
        (folder / "filler").write_bytes(b"\0" * (64 * 1024))
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def test_a_logger_on_a_full_disk_is_dropped_with_one_line_and_the_run_trains_on(full_folder: Path, capfd) -> None:
    (train_x, train_y), val = digits()
    net, counting = tiny_net(), FailsAtStep(step=-1)
    before = [p.detach().clone() for p in net.parameters()]
    path = full_folder / "run.csv"
    options = nbscale.TrainingOptions(
        "sgdm",
        max_epochs=4,
        mini_batch_size=100,
        verbose=False,
        validation_data=val,
        validation_frequency=10,
        loggers=[CSVLogger(path), counting],
    )
    trained, info = nbscale.train(net, (train_x, train_y), options)
    assert info.iteration[-1] == 60 and counting.steps == list(range(1, 61)) and counting.closed == 1
    assert any(not torch.equal(a, b) for a, b in zip(before, trained.parameters(), strict=True))
    lines = [line for line in capfd.readouterr().err.splitlines() if "CSVLogger" in line]
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"Warning: CSVLogger writing '{path}' failed at step ")
    assert "(OSError: [Errno 28] No space left on device)" in lines[0] and "training goes on" in lines[0]
    assert path.read_text() == ""  # nothing fitted, and the file is not left half-written


@pytest.mark.slow
def test_a_logger_that_raises_during_a_pool_run_is_dropped_and_the_weights_come_back(capfd) -> None:
    (train_x, train_y), _ = digits()
    net, failing, counting = tiny_net(), FailsAtStep(step=7), FailsAtStep(step=-1)
    before = [p.detach().clone() for p in net.parameters()]
    options = nbscale.TrainingOptions(
        "sgdm",
        max_epochs=2,
        mini_batch_size=100,
        verbose=False,
        execution_environment="parallel",
        loggers=[failing, counting],
    )
    with nbscale.Pool(1, cpu=True):
        trained, info = nbscale.train(net, (train_x, train_y), options)
    assert info.iteration[-1] == 30 and counting.steps == list(range(1, 31))
    assert failing.steps == list(range(1, 7)) and failing.closed == 0  # dropped at step 7: not closed again
    assert any(not torch.equal(a, b) for a, b in zip(before, trained.parameters(), strict=True))
    lines = [line for line in capfd.readouterr().err.splitlines() if "FailsAtStep" in line]
    assert lines == [
        "Warning: FailsAtStep failed at step 7 (ValueError: the logger's own bug). It is dropped and training goes "
        "on without it; what it logged before is in its file. Free space there (df -h) or fix the logger."
    ]
