"""Where loggers write: checkpoint_path's rules (nbscale.trust) for their folders and files.

A logger's folder must not be one another user could swap: each folder above it belongs to this user or root and
is writable by no one else unless sticky (like /tmp). Folders a logger creates are 0700. Its files are opened with
`O_NOFOLLOW | O_NONBLOCK` (a planted link is refused, not followed; a planted FIFO does not hang training), must be
regular files of this user, and are created 0600. A TensorBoard folder, whose file names TensorBoard picks, must
itself be writable by this user alone (sticky or not). Each refusal is an OptionsError naming the logger, the path
and the fix.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import IO

from nbscale.errors import OptionsError
from nbscale.trust import swappable_by_others


def prepare_folder(folder: Path, owner: str, own_folder: bool = False) -> None:
    """Create `folder` (and any missing folder above it) with mode 0700, then refuse it when another user could
    swap what is written there; `own_folder`: the folder itself must be writable by this user alone."""
    missing = [f for f in [folder, *folder.parents] if not f.exists()]
    try:
        for created in reversed(missing):
            created.mkdir(mode=0o700, exist_ok=True)
    except OSError as error:
        raise OptionsError(
            f"{owner}: the folder {str(folder)!r} cannot be created ({error.strerror or error}). "
            "Give a folder you can write to."
        ) from None
    reason = swappable_by_others(folder / "log")
    if reason is None and own_folder:
        reason = _others_can_write(folder)
    if reason is not None:
        raise OptionsError(
            f"{owner}: {reason}, so another user could plant or swap its log files. "
            "Log into a folder of your own (mode 0700, such as one under your home folder)."
        )


def open_file(path: Path, owner: str, append: bool = False) -> IO[str]:
    """Open `path` for writing text (created 0600; emptied unless `append`) when it is this user's regular file."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | (os.O_APPEND if append else 0)
    try:
        descriptor = os.open(path, flags, 0o600)
    except OSError as error:
        why = _WHY.get(error.errno or 0, error.strerror or str(error))
        raise OptionsError(f"{owner} cannot write {str(path)!r}: {why}. {_FIX}") from None
    try:
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode):
            raise OptionsError(
                f"{owner} cannot write {str(path)!r}: it is not a regular file "
                f"({stat.filemode(status.st_mode)}). {_FIX}"
            )
        if status.st_uid != os.getuid():
            raise OptionsError(
                f"{owner} cannot write {str(path)!r}: it belongs to another user (uid {status.st_uid}). {_FIX}"
            )
        os.set_blocking(descriptor, True)
        if not append:
            os.ftruncate(descriptor, 0)
        return os.fdopen(descriptor, "a" if append else "w", newline="")
    except BaseException:
        os.close(descriptor)
        raise


def make_private(path: Path) -> None:
    """Mode 0600 for a file another library created in a folder `prepare_folder` accepted (TensorBoard's)."""
    try:
        if path.is_file() and not path.is_symlink() and path.stat().st_uid == os.getuid():
            path.chmod(0o600)
    except OSError:
        pass


_WHY = {errno.ELOOP: "it is a symbolic link", errno.ENXIO: "it is not a regular file (a FIFO or a socket)"}
_FIX = "Give a file name of your own in a folder of your own, or remove what is there."


def _others_can_write(folder: Path) -> str | None:
    status = os.stat(folder)
    if status.st_uid not in (os.getuid(), 0):
        return f"the folder {folder} belongs to another user (uid {status.st_uid})"
    if status.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"the folder {folder} can be written by other users (mode {stat.filemode(status.st_mode)})"
    return None
