"""Private, crash-safe files: folders 0700, files 0600, writes that land whole or not at all."""

from __future__ import annotations

import os
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: Path) -> Path:
    """Create `path` (and parents) if needed and make it readable by the user only."""
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    os.chmod(path, DIR_MODE)  # mkdir's mode is cut by the umask, and an existing folder keeps its own
    return path


def open_private(path: Path, append: bool = False) -> int:
    """Open `path` for writing as a 0600 file (created if missing); returns the descriptor."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    descriptor = os.open(path, flags, FILE_MODE)
    os.fchmod(descriptor, FILE_MODE)
    return descriptor


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file and os.replace: a crash leaves the old file or the new one."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    descriptor = open_private(temporary)
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def append_text(path: Path, text: str) -> None:
    """Append `text` to a private file (the job's log)."""
    with os.fdopen(open_private(path, append=True), "a", encoding="utf-8") as file:
        file.write(text)
