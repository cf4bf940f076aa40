"""Warnings that point at the user's code, so that a notebook shows the cell line that led to them.

`warnings.warn`'s `stacklevel` counts frames from the call, but how many nbscale frames stand between a user's
call and a warning differs from path to path (the notebook, a pool, a sweep), and a fixed count points at an
nbscale line on most of them. `warn_user` skips the frames of nbscale, torch, installed packages and the standard
library instead (Python 3.12's `skip_file_prefixes` does the same; nbscale runs on 3.11): a `%%train` cell's
warning names the cell's first line, not IPython's that runs the magic. Where no frame is left (on a pool worker),
the warning is located at "nbscale:0", so the cell shows `nbscale:0: RuntimeWarning: ...` and no library line.
"""

from __future__ import annotations

import contextlib
import os
import sys
import sysconfig
import warnings
from types import FrameType


def _library_dirs() -> tuple[str, ...]:
    """nbscale's folder, torch's, and those of installed packages and the standard library (IPython running a
    `%%train` cell is not the user's code)."""
    torch = sys.modules.get("torch")
    torch_dir = os.path.dirname(torch.__file__) + os.sep if torch is not None and torch.__file__ else None
    installed = {
        os.path.join(path, "")
        for key in ("stdlib", "platstdlib", "purelib", "platlib")
        if (path := sysconfig.get_paths().get(key))
    }
    return (os.path.dirname(__file__) + os.sep, *([torch_dir] if torch_dir else []), *sorted(installed))


def warn_user(message: str, category: type[Warning] = UserWarning) -> None:
    """Warn with `message`, attributed to the first caller outside nbscale, torch, installed packages and the
    standard library."""
    libraries = _library_dirs()
    frame: FrameType | None = sys._getframe(1)
    level = 2  # stacklevel 2: warn_user's caller
    # "<frozen runpy>" and the like: Python's own start-up frames, the only others on a pool worker
    while frame is not None and (
        frame.f_code.co_filename.startswith(libraries)
        or frame.f_code.co_filename == contextlib.__file__
        or frame.f_code.co_filename.startswith("<frozen ")
    ):
        frame, level = frame.f_back, level + 1
    if frame is None:  # no user code on the stack (a pool worker): nbscale's, with no line of it
        warnings.warn_explicit(message, category, "nbscale", 0)
        return
    warnings.warn(message, category, stacklevel=level)
