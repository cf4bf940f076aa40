"""Workers follow the notebook's folder, as MATLAB's pools do: each cell, call and task runs in the notebook's
current folder at the time it was sent (so relative paths mean the same on the workers as in the notebook).

The kernel names its folder in each request (`current_folder`); the worker changes to it before the request runs
(`enter_folder`). Where that folder does not exist on the worker (a cluster node, or a folder deleted since), the
request runs in the folder the worker started in, and the kernel warns once per pool and folder
(`missing_folder_warning`).

Modules in the notebook's folder are importable on the workers as in the kernel (IPython puts '' on the kernel's
sys.path): whenever the folder changes, the kernel names it to each worker (`NotebookFolder`) before the request,
and the worker puts it first on its sys.path in place of the one before (`ImportableFolder`).
"""

from __future__ import annotations

import os
import sys

from nbscale.pool import protocol as p


def current_folder() -> str | None:
    """This process's current folder (the notebook's: where the workers run its requests; a worker's own).

    A folder deleted since the process entered it is still named (`os.getcwd` cannot, but Linux's /proc can): the
    workers then cannot enter it either, and say so. None only where the system cannot name it at all.
    """
    try:
        return os.getcwd()
    except OSError:
        pass
    try:
        return os.readlink("/proc/self/cwd").removesuffix(" (deleted)")
    except OSError:
        return None


def enter_folder(folder: str | None, fallback: str) -> str | None:
    """Change to `folder`, or, when it cannot be entered, to `fallback`; why `folder` could not be entered (None
    when it was, or when `folder` is None)."""
    if folder is not None:
        try:
            os.chdir(folder)
            return None
        except OSError as error:
            reason = error.strerror or str(error)
    else:
        reason = None
    try:
        os.chdir(fallback)
    except OSError:  # the worker's own folder is gone too: it stays where it is
        pass
    return reason


def missing_folder_warning(message: p.FolderMissing) -> str:
    """What the notebook says the first time workers cannot enter its folder."""
    return (
        f"Warning: workers cannot change to the notebook's current folder {message.folder!r} (worker {message.rank} "
        f"on {message.host}: {message.reason}), so what the pool runs from that folder runs in each worker's own "
        f"folder instead ({message.fallback!r} on worker {message.rank}), where relative paths are read. Create the "
        "folder on the workers' machines, or use absolute paths. This is said once per pool and folder."
    )


class ImportableFolder:
    """The notebook's current folder, kept first on this worker's sys.path (the one it replaces is taken off, unless
    it was on sys.path before, as the folder the worker started in is)."""

    def __init__(self) -> None:
        self._added: str | None = None

    def follow(self, folder: str) -> None:
        if folder == self._added:
            return
        if self._added is not None and self._added in sys.path:
            sys.path.remove(self._added)
        self._added = None
        if folder not in sys.path:
            sys.path.insert(0, folder)
            self._added = folder
