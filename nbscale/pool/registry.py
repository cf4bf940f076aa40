"""Where running pools publish their state for the Jupyter server extension (and anyone else on the machine).

Each pool writes one JSON file, `<jupyter runtime dir>/nbscale/pools/<kernel pid>.json`, readable by the user
only, and rewrites it at least every `HEARTBEAT_S` seconds. Readers drop files whose process is gone or whose
heartbeat is older than `STALE_AFTER_S`, so a pool that died leaves no stale entry.

The folder must be the user's alone (owned by them, not writable by group or others): another user who could
write there could plant a link where a pool writes, a FIFO that hangs the Jupyter server's reader, or a fake
pool. Writers and readers refuse any other folder (RegistryUnsafe) and work through the opened folder's
descriptor, so a folder swapped after the check is never used.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nbscale.errors import PoolError
from nbscale.processes import pid_running

HEARTBEAT_S = 3.0
STALE_AFTER_S = 10.0
MAX_FILE_BYTES = 1 << 20  # a pool's state is a few KB; a larger file is no pool's


class RegistryUnsafe(PoolError):
    """The registry folder belongs to another user or others can write to it: nothing is read from or written to
    it (a file planted there could redirect a write through a link, hang a reader on a FIFO, or fake a pool)."""


def runtime_dir() -> Path:
    """nbscale's folder in Jupyter's runtime folder (pool files, zygote sockets). `NBSCALE_RUNTIME_DIR` overrides it."""
    override = os.environ.get("NBSCALE_RUNTIME_DIR")
    if override:
        return Path(override)
    from jupyter_core.paths import jupyter_runtime_dir

    return Path(jupyter_runtime_dir()) / "nbscale"


def registry_dir() -> Path:
    """The folder of pool files (created 0700 on first publish)."""
    return runtime_dir() / "pools"


@contextlib.contextmanager
def _folder(create: bool) -> Iterator[int | None]:
    """The registry folder, opened (a descriptor every file operation goes through, so a folder renamed or swapped
    after the check is never used), once checked to be the user's alone; None when it does not exist and `create`
    is false. Raises RegistryUnsafe for a folder another user owns or can write to."""
    folder = registry_dir()
    if create:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        descriptor = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        if create:
            raise
        yield None
        return
    try:
        status = os.fstat(descriptor)
        if status.st_uid != os.getuid():
            raise RegistryUnsafe(
                f"The pool registry folder {folder} belongs to another user (uid {status.st_uid}): nbscale neither "
                "writes nor reads pool files there. Point NBSCALE_RUNTIME_DIR (or Jupyter's runtime folder) at a "
                "folder of your own."
            )
        if status.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise RegistryUnsafe(
                f"The pool registry folder {folder} can be written by other users (mode "
                f"{stat.filemode(status.st_mode)}): nbscale neither writes nor reads pool files there. Make it yours "
                f"alone (chmod 700 {str(folder)!r}) or point NBSCALE_RUNTIME_DIR at a folder of your own."
            )
        yield descriptor
    finally:
        os.close(descriptor)


def _own_name() -> str:
    return f"{os.getpid()}.json"


def publish(state: dict[str, Any]) -> None:
    """Atomically write this process's pool state (plus pid and heartbeat time).

    Raises ValueError for a number JSON cannot hold (NaN, infinity): readers never see one; RegistryUnsafe for a
    folder that is not the user's alone.
    """
    record = {**state, "pid": os.getpid(), "heartbeat": time.time()}
    text = json.dumps(record, allow_nan=False)
    with _folder(create=True) as folder:
        assert folder is not None  # created
        temporary = f".{os.getpid()}.{secrets.token_hex(8)}.json.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        descriptor = os.open(temporary, flags, 0o600, dir_fd=folder)
        try:
            with os.fdopen(descriptor, "w") as handle:
                handle.write(text)
            os.replace(temporary, _own_name(), src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary, dir_fd=folder)
            raise


def withdraw() -> None:
    """Remove this process's pool file (the pool stopped)."""
    with _folder(create=False) as folder:
        if folder is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(_own_name(), dir_fd=folder)


def _refuse_non_finite(constant: str) -> object:
    raise ValueError(f"{constant} is not a JSON number")


def read_all(stale_after_s: float = STALE_AFTER_S) -> list[dict[str, Any]]:
    """Every live pool's state; files of dead processes or stale heartbeats are removed on the way.

    Reads only this user's regular files (no link followed, no FIFO waited on, at most MAX_FILE_BYTES each).
    Raises RegistryUnsafe for a folder that is not the user's alone.
    """
    pools = []
    now = time.time()
    with _folder(create=False) as folder:
        if folder is None:
            return []
        for name in sorted(os.listdir(folder)):
            if not name.endswith(".json") or name.startswith("."):
                continue
            record = _read_record(folder, name)
            if record is None:
                continue
            fresh = now - float(record.get("heartbeat", 0)) <= stale_after_s
            if fresh and pid_running(int(record.get("pid", -1))):
                pools.append(record)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=folder)
    return pools


def _read_record(folder: int, name: str) -> dict[str, Any] | None:
    """The JSON object in `name`, or None where it is no pool file of this user's."""
    try:
        descriptor = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder)
    except OSError:
        return None
    with os.fdopen(descriptor, "rb") as handle:
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode) or status.st_uid != os.getuid():
            return None
        try:
            record = json.loads(handle.read(MAX_FILE_BYTES + 1), parse_constant=_refuse_non_finite)
        except (OSError, ValueError):
            return None
    return record if isinstance(record, dict) else None
