"""Machine-wide GPU reservations: who holds which GPU, so that two notebooks never pick the same one by default.

A holder (a pool's kernel, or a process training on a GPU in the notebook) keeps one small file per GPU in a
folder every user of the machine shares, and holds an exclusive `flock` on it for as long as it holds the GPU.
The kernel drops a process's locks when it dies, however it dies, so a dead holder's reservation ends at once:
readers count only files whose lock is held, and the owner removes its stale files when it next reads.

Where: `NBSCALE_GPU_REGISTRY`, else `/dev/shm`, else `/tmp`. The files sit directly in that folder, which must
belong to root (or to you) and, when others can write to it, carry the sticky bit (mode 1777, as /dev/shm and
/tmp do): then only a file's owner can delete or rewrite it, so no user can remove or alter another's
reservation. A folder some other user owns is refused, since its owner could delete every file in it.
Each file is readable by everyone (0644), so each user sees who holds what. A holder's user is read from the
file's owner, never from what the file says, so nobody can make a reservation look like another user's.

Choosing GPUs and writing their files happens under an exclusive `flock` on the folder itself (which nobody
but root can delete), so two notebooks starting at the same moment cannot both take one GPU.
Reservations are advisory: they steer nbscale, and nothing stops a program that ignores them.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import re
import secrets
import stat
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from nbscale.errors import GpuError

REGISTRY_ENV = "NBSCALE_GPU_REGISTRY"
PREFIX = "nbscale-gpu."
MAX_RECORD_BYTES = 4096
LOCK_WAIT_S = 10.0
_FILE_MODE = 0o644  # others read who holds a GPU; only the owner writes or deletes (sticky folder)

Purpose = Literal["pool", "training"]


@dataclass(frozen=True)
class GpuHolder:
    """A live process holding a GPU: its user (the reservation file's owner), pid, what for ("pool" or
    "training"), the notebook it runs in where known (path, else kernel id) and since when (seconds since the
    epoch)."""

    user: str
    uid: int
    pid: int | None
    purpose: str
    notebook: str | None = None
    kernel_id: str | None = None
    since: float | None = None

    @property
    def this_process(self) -> bool:
        """Whether the holder is the process asking."""
        return self.pid == os.getpid() and self.uid == os.geteuid()

    def describe(self) -> str:
        """"alice's pool (notebook analysis.ipynb, pid 4242)"."""
        where = [f"notebook {self.notebook}" if self.notebook else None,
                 f"kernel {self.kernel_id[:8]}" if self.kernel_id and not self.notebook else None,
                 f"pid {self.pid}" if self.pid is not None else None]  # fmt: skip
        details = ", ".join(part for part in where if part)
        what = f"{self.user}'s {self.purpose}" if self.purpose in ("pool", "training") else self.user
        return f"{what} ({details})" if details else what


class GpuReservation:
    """GPUs this process holds until `release()` (or until it exits); `gpus` are their registry keys.

    Safe to release twice. A child forked from the holder does not inherit the hold, and never releases it.
    """

    def __init__(self, purpose: Purpose) -> None:
        self.purpose = purpose
        self._files: list[tuple[str, Path, int]] = []
        self._owner = os.getpid()
        self._finalizer = weakref.finalize(self, _release_files, self._files, self._owner)
        _live.add(self)

    @property
    def gpus(self) -> tuple[str, ...]:
        return tuple(key for key, _, _ in self._files)

    def release(self) -> None:
        """Give the GPUs back now (idempotent)."""
        self._finalizer()

    def _forget_in_child(self) -> None:
        """In a forked child: close the inherited descriptors; the parent's locks and files stay."""
        for _, _, descriptor in self._files:
            with contextlib.suppress(OSError):
                os.close(descriptor)
        self._files.clear()
        self._finalizer.detach()

    def __enter__(self) -> GpuReservation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"<GpuReservation {self.purpose}: {', '.join(self.gpus) or 'released'}>"


_live: weakref.WeakSet[GpuReservation] = weakref.WeakSet()


def _forget_all_in_child() -> None:
    for reservation in list(_live):
        reservation._forget_in_child()


os.register_at_fork(after_in_child=_forget_all_in_child)


def _release_files(files: list[tuple[str, Path, int]], owner: int) -> None:
    for _, path, descriptor in files:
        if os.getpid() == owner:  # unlink first: a reader then never finds an unlocked file of a live holder
            with contextlib.suppress(OSError):
                path.unlink()
        with contextlib.suppress(OSError):
            os.close(descriptor)
    files.clear()


def registry_dir() -> Path:
    """The shared folder of reservation files: `NBSCALE_GPU_REGISTRY`, else /dev/shm, else /tmp."""
    configured = os.environ.get(REGISTRY_ENV)
    if configured:
        return Path(configured)
    return Path("/dev/shm") if os.path.isdir("/dev/shm") else Path("/tmp")


def gpu_key(device_id: str) -> str:
    """The registry's name for a GPU: its CUDA_VISIBLE_DEVICES entry (UUID, else NVML index), file-name safe."""
    return re.sub(r"[^A-Za-z0-9-]", "_", device_id)


def holders() -> dict[str, tuple[GpuHolder, ...]]:
    """Every live reservation on this machine, by GPU key, oldest first; this user's stale files are removed.

    Raises GpuError when the registry folder is not safe to share (see the module's docstring).
    """
    return _holders_in(_checked_dir(registry_dir()))


def reserve(choose: Callable[[], Sequence[str]], purpose: Purpose) -> GpuReservation:
    """Hold the GPUs `choose()` returns (registry keys, see `gpu_key`) for this process.

    `choose` runs while the registry is locked, so the holders it reads (`holders()`, `nbscale.gpus()`) stay
    true until its GPUs are written; it raises to refuse. Raises GpuError for an unsafe registry folder.
    """
    folder = _checked_dir(registry_dir())
    with _registry_locked(folder):
        keys = list(choose())
        reservation = GpuReservation(purpose)
        try:
            for key in keys:
                reservation._files.append(_write_holder_file(folder, key, purpose))
        except BaseException:
            reservation.release()
            raise
    return reservation


def _checked_dir(folder: Path) -> Path:
    """The registry folder, resolved, if no other user can delete or rewrite this user's files in it."""
    real = Path(os.path.realpath(folder))
    try:
        info = os.stat(real)
    except OSError as error:
        raise GpuError(_unsafe(folder, f"it cannot be read ({error.strerror})")) from None
    if not stat.S_ISDIR(info.st_mode):
        raise GpuError(_unsafe(folder, "it is not a folder"))
    if info.st_uid not in (0, os.geteuid()):
        raise GpuError(_unsafe(folder, f"it belongs to {_user_name(info.st_uid)}, who could delete anyone's "
                                       "reservations in it"))
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX:
        raise GpuError(_unsafe(folder, "others may write to it but it lacks the sticky bit, so anyone could "
                                       "delete anyone's reservations in it"))
    return real


def _unsafe(folder: Path, why: str) -> str:
    return (
        f"The GPU registry folder {folder} cannot be used: {why}. Use a folder owned by root with mode 1777, as "
        f"/dev/shm is (an administrator creates one with `install -d -m 1777 {folder}`), or point "
        f"{REGISTRY_ENV} at one."
    )


@contextlib.contextmanager
def _registry_locked(folder: Path) -> Iterator[None]:
    """Exclusive use of the registry while GPUs are chosen and written (a flock on the folder itself)."""
    descriptor = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    locked = False
    try:
        deadline = time.monotonic() + LOCK_WAIT_S
        while not locked:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                locked = True
            except BlockingIOError:
                if time.monotonic() > deadline:
                    break  # a process that keeps the folder locked must not stop every pool: go on unlocked
                time.sleep(0.005)
        yield
    finally:
        os.close(descriptor)  # closing drops the lock


def _write_holder_file(folder: Path, key: str, purpose: Purpose) -> tuple[str, Path, int]:
    """Create, lock and fill this process's file for GPU `key`; readers see it only once it is complete."""
    if key != gpu_key(key) or not key:
        raise GpuError(f"{key!r} is not a GPU registry key (see nbscale.gpu_reservations.gpu_key).")
    token = secrets.token_hex(8)
    final = folder / f"{PREFIX}{key}.{token}"
    temporary = folder / f".{final.name}.tmp"
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    descriptor = os.open(temporary, flags, _FILE_MODE)
    try:
        os.fchmod(descriptor, _FILE_MODE)  # whatever the umask (a job runs under 077): everyone must read it
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(descriptor, json.dumps(_this_holder(purpose)).encode())
        os.rename(temporary, final)
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink()
        os.close(descriptor)
        raise
    return key, final, descriptor


def _this_holder(purpose: Purpose) -> dict[str, object]:
    from nbscale.pool.registry import kernel_id

    return {
        "pid": os.getpid(),
        "purpose": purpose,
        # Jupyter's server names the notebook of a kernel in JPY_SESSION_NAME
        "notebook": os.environ.get("JPY_SESSION_NAME") or None,
        "kernel_id": kernel_id(),
        "since": time.time(),
    }


def _holders_in(folder: Path) -> dict[str, tuple[GpuHolder, ...]]:
    found: dict[str, list[GpuHolder]] = {}
    try:
        names = [entry.name for entry in os.scandir(folder) if entry.name.startswith(PREFIX)]
    except OSError:
        return {}
    for name in names:
        key = name[len(PREFIX):].partition(".")[0]
        holder = _live_holder(folder / name)
        if key and holder is not None:
            found.setdefault(key, []).append(holder)
    return {key: tuple(sorted(held, key=lambda h: h.since or 0.0)) for key, held in found.items()}


def _live_holder(path: Path) -> GpuHolder | None:
    """The holder behind a reservation file, or None when its holder is gone (or it is no reservation file)."""
    try:  # never follow a link or block on a FIFO another user put there
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            return None
        try:
            fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            pass  # its holder's exclusive lock: alive
        else:
            if info.st_uid == os.geteuid():  # a dead holder of ours: tidy up (others' stale files stay, unread)
                with contextlib.suppress(OSError):
                    path.unlink()
            return None
        record = _record(os.read(descriptor, MAX_RECORD_BYTES))
    finally:
        os.close(descriptor)
    return GpuHolder(
        user=_user_name(info.st_uid),
        uid=info.st_uid,
        pid=_whole(record.get("pid")),
        purpose=str(record.get("purpose") or "unknown")[:40],
        notebook=_short_text(record.get("notebook")),
        kernel_id=_short_text(record.get("kernel_id")),
        since=float(since) if isinstance(since := record.get("since"), int | float) else info.st_mtime,
    )


def _record(data: bytes) -> Mapping[str, object]:
    try:
        record = json.loads(data)
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def _whole(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _short_text(value: object) -> str | None:
    return value[:200] if isinstance(value, str) and value else None


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"
