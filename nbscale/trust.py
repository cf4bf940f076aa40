"""Whether a file or folder is the user's alone: no other user (root aside, who is out of reach anyway) could have
written it, or could replace it with one of theirs before it is read.

These checks read POSIX owners and mode bits. Windows has neither (`os.getuid` is missing, `st_uid` is 0 and the
mode says only "read-only"): who may write a file there is in its ACL, which a check would read with the Win32
security API (GetNamedSecurityInfo: the owner's SID and every DACL entry granting write to another SID), through
pywin32, not a dependency. nbscale's folders there sit in the user's profile (%LOCALAPPDATA%, platformdirs), which
Windows makes private to the user by default, so off POSIX the checks accept every path (`posix_owners()`), and
docs/security.md says so.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path


def posix_owners() -> bool:
    """Whether files here have POSIX owners and permission bits these checks can read (not on Windows)."""
    return sys.platform != "win32" and hasattr(os, "getuid")


def swappable_by_others(path: Path) -> str | None:
    """Why another user could replace `path` (rename it and put their own in its place), or None.

    Looks at every folder above it, as written and with links resolved: each must belong to this user or root and
    be writable by no one else, unless it has the sticky bit (like /tmp), where others cannot rename the user's
    entries.
    """
    if not posix_owners():
        return None
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
    if not posix_owners():
        return None
    status = os.stat(path)
    if status.st_uid not in (os.getuid(), 0):
        return f"it belongs to another user (uid {status.st_uid})"
    if status.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"other users can write to it (mode {stat.filemode(status.st_mode)})"
    return swappable_by_others(path)
