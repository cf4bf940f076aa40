"""Whether a file or folder is the user's alone: no other user (root aside, who is out of reach anyway) could have
written it, or could replace it with one of theirs before it is read."""

from __future__ import annotations

import os
import stat
from pathlib import Path


def swappable_by_others(path: Path) -> str | None:
    """Why another user could replace `path` (rename it and put their own in its place), or None.

    Looks at every folder above it, as written and with links resolved: each must belong to this user or root and
    be writable by no one else, unless it has the sticky bit (like /tmp), where others cannot rename the user's
    entries.
    """
    absolute = Path(os.path.abspath(path))
    for folder in dict.fromkeys([*absolute.parents, *absolute.resolve().parents]):
        try:
            status = os.stat(folder)
        except OSError:
            continue  # checked where it is used
        if status.st_uid not in (os.getuid(), 0):
            return f"the folder {folder} above it belongs to another user (uid {status.st_uid})"
        if status.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not status.st_mode & stat.S_ISVTX:
            return (
                f"the folder {folder} above it can be written by other users (mode "
                f"{stat.filemode(status.st_mode)}, no sticky bit)"
            )
    return None


def others_could_change(path: Path) -> str | None:
    """Why another user could have written `path` or could replace it, or None: it must belong to this user or
    root, be writable by no one else, and sit in folders `swappable_by_others` accepts."""
    status = os.stat(path)
    if status.st_uid not in (os.getuid(), 0):
        return f"it belongs to another user (uid {status.st_uid})"
    if status.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"other users can write to it (mode {stat.filemode(status.st_mode)})"
    return swappable_by_others(path)
