"""File locks on every platform: fcntl's flock where it exists (Linux, macOS), a weaker stand-in where not (Windows).

A flock belongs to the kernel: it goes when its holder closes the file or dies, even by SIGKILL. Without fcntl:
- `hold_while_open` takes no lock, and `try_lock` always succeeds: a writer's partial file is told from an abandoned
  one by its age alone (callers only take files not written for a while; Windows also refuses to delete a file a
  process has open);
- `exclusive` is a lock file created with O_EXCL beside the file named: held until the block ends, waited for while
  another process holds it, and taken over once it is `stale_after_s` old (its holder died inside the block).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

HELD_SUFFIX = ".held"  # the O_EXCL lock file beside the file named, where there is no fcntl
_POLL_S = 0.01


def _fcntl() -> ModuleType | None:
    """fcntl, or None where the platform has none (looked up each call, so a test can take it away)."""
    try:
        import fcntl
    except ImportError:
        return None
    return fcntl


def has_flock() -> bool:
    """Whether this platform has flock (fcntl): locks that the kernel drops when their holder dies."""
    return _fcntl() is not None


def hold_while_open(descriptor: int) -> None:
    """Lock the open file `descriptor` exclusively until it is closed (waiting for another holder); without fcntl
    nothing is locked."""
    fcntl = _fcntl()
    if fcntl is not None:
        fcntl.flock(descriptor, fcntl.LOCK_EX)


def try_lock(descriptor: int) -> bool:
    """Take the exclusive lock of the open file `descriptor` if no process holds it; True when taken. Without fcntl,
    always True: the caller's other checks (a file's age) must tell a live holder apart."""
    fcntl = _fcntl()
    if fcntl is None:
        return True
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextlib.contextmanager
def exclusive(descriptor: int, path: Path, stale_after_s: float = 30.0) -> Iterator[None]:
    """Hold an exclusive lock for the block among processes that lock `path` (open as `descriptor`) here.

    With fcntl: a flock on `descriptor`, dropped when it is closed. Without: the lock file `path` + '.held', created
    with O_EXCL (0600) and removed when the block ends; one older than `stale_after_s` is taken over (so keep the
    block short). OSError when the lock file cannot be created.
    """
    if has_flock():
        hold_while_open(descriptor)
        yield
        return
    held = path.with_name(path.name + HELD_SUFFIX)
    _create_lock_file(held, stale_after_s)
    try:
        yield
    finally:
        held.unlink(missing_ok=True)


def _create_lock_file(held: Path, stale_after_s: float) -> None:
    """Create `held` exclusively, waiting while a live holder has it; one older than `stale_after_s` is removed."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    while True:
        try:
            os.close(os.open(held, flags, 0o600))
            return
        except FileExistsError:
            pass
        with contextlib.suppress(FileNotFoundError):  # its holder may remove it meanwhile
            if time.time() - held.lstat().st_mtime > stale_after_s:
                held.unlink()
                continue
        time.sleep(_POLL_S)
