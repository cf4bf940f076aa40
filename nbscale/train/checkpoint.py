"""Checkpoints: everything needed to continue a run exactly, written atomically.

A checkpoint holds the network and optimizer state, the schedule position (epoch, iteration), the shuffle
seed, the RNG state, the best-validation bookkeeping and the history so far. It is written to a temporary
file in the same folder, flushed to disk, then renamed over the final name, so a crash mid-write (or a worker
dying) never leaves a half-written checkpoint under a real name.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from nbscale.errors import OptionsError

_PATTERN = "nbscale_checkpoint_epoch*.pt"


def checkpoint_file(folder: str | os.PathLike[str], epoch: int) -> Path:
    return Path(folder) / f"nbscale_checkpoint_epoch{epoch:04d}.pt"


def save_checkpoint(folder: str | os.PathLike[str], epoch: int, state: dict[str, Any]) -> Path:
    """Write `state` as the checkpoint of `epoch` in `folder` (created if needed); returns its path."""
    target = checkpoint_file(folder, epoch)
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=".partial-", suffix=".pt", dir=target.parent)
    try:
        with os.fdopen(handle, "wb") as stream:
            torch.save(state, stream)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return target


def latest_checkpoint(folder: str | os.PathLike[str]) -> Path | None:
    """The newest checkpoint in `folder`, or None."""
    found = sorted(Path(folder).glob(_PATTERN))
    return found[-1] if found else None


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a checkpoint file, or the newest one in a folder; OptionsError when there is none."""
    path = Path(path)
    if path.is_dir():
        newest = latest_checkpoint(path)
        if newest is None:
            raise OptionsError(f"resume_from={str(path)!r} holds no checkpoint ({_PATTERN}): pass a checkpoint "
                               "file or the checkpoint_path of an earlier run.")
        path = newest
    if not path.exists():
        raise OptionsError(f"resume_from={str(path)!r} does not exist: pass a checkpoint file or folder.")
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as error:
        raise OptionsError(f"resume_from={str(path)!r} cannot be read as a checkpoint ({type(error).__name__}: "
                           f"{error}): pass a file nbscale wrote ({_PATTERN}) or its folder.") from None
    if not isinstance(state, dict) or not {"model", "optimizer", "epoch", "history"} <= state.keys():
        raise OptionsError(f"resume_from={str(path)!r} is not an nbscale training checkpoint: pass a file that "
                           f"checkpoint_path received ({_PATTERN}), or its folder. (A file of weights alone "
                           "loads with model.load_state_dict(torch.load(path)).)")
    return state


def prepare_folder(folder: str | os.PathLike[str]) -> None:
    """Create the checkpoint folder if needed; OptionsError when it cannot hold checkpoints (before training
    starts, rather than at the end of the first epoch)."""
    path = Path(folder)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise OptionsError(f"checkpoint_path={str(folder)!r} cannot be used as a folder ({error.strerror or error}): "
                           "give a folder that exists or can be created, and that you can write to.") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise OptionsError(f"checkpoint_path={str(folder)!r} is not writable: give a folder you can write to.")
