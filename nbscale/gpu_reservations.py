"""Machine-wide GPU reservations: who holds which GPU, so that two notebooks never pick the same one by default.

A holder (a pool's kernel, or a process training on a GPU in the notebook) writes one small file per GPU in a
folder every user of the machine shares, naming its pid, its process's start time and when it reserved. A file
counts only while its holder lives: a process with that pid exists, runs as the file's owner and is the same
process (its start time, psutil's create_time, matches and precedes the reservation), so a dead holder's
reservation ends at once, a reused pid does not revive it, and no other user can keep it alive or claim it. The
owner removes its stale files when it next reads. (Processes that share the folder must see each other's pids:
one registry per machine, or per pid namespace.)

Where: `NBSCALE_GPU_REGISTRY`, else `/dev/shm`, else `/tmp`. The files sit directly in that folder, which must
belong to root (or to you) and, when others can write to it, carry the sticky bit (mode 1777, as /dev/shm and
/tmp do): then only a file's owner can delete or rewrite it, so no user can remove or alter another's
reservation. A folder some other user owns is refused, since its owner could delete every file in it.
Each file is readable by everyone (0644), so each user sees who holds what. A holder's user is read from the
file's owner, never from what the file says, so nobody can make a reservation look like another user's.

Two notebooks starting at the same moment never take one GPU, and no other user can stop or delay that:
- a user's own processes choose one at a time, under a `flock` on a lock file in that user's own folder
  (`$NBSCALE_HOME`, else the user's data folder; 0600 in a folder only the user can write), which no other user
  can open (where fcntl is missing, an O_EXCL lock file beside it: nbscale.file_locks);
- across users, a reservation is announced, then checked: a process writes its files, then looks again, and
  when a live holder it had not seen has appeared on one of its GPUs since it chose, it withdraws and chooses
  again after a short random pause. Of two racers, the one that announced last always sees the other.
Reservations are advisory: they steer nbscale, and nothing stops a program that ignores them. They need a POSIX
system (Linux, macOS); elsewhere reserving raises GpuError, training in the notebook reserves nothing
(nbscale.gpu.training_gpu) and `nbscale.gpus()` lists no holders.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
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
from nbscale.file_locks import exclusive

REGISTRY_ENV = "NBSCALE_GPU_REGISTRY"
PREFIX = "nbscale-gpu."
MAX_RECORD_BYTES = 4096
LOCK_FILE = "gpu-registry.lock"
ANNOUNCE_ATTEMPTS = 20  # tries to announce without a new holder on the same GPU appearing (then keep the last)
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
        """ "alice's pool (notebook analysis.ipynb, pid 4242)"."""
        where = [
            f"notebook {self.notebook}" if self.notebook else None,
            f"kernel {self.kernel_id[:8]}" if self.kernel_id and not self.notebook else None,
            f"pid {self.pid}" if self.pid is not None else None,
        ]
        details = ", ".join(part for part in where if part)
        what = f"{self.user}'s {self.purpose}" if self.purpose in ("pool", "training") else self.user
        return f"{what} ({details})" if details else what


class GpuReservation:
    """GPUs this process holds until `release()` (or until it exits); `gpus` are their registry keys.

    Safe to release twice. A child forked from the holder does not inherit the hold, and never releases it.
    """

    def __init__(self, purpose: Purpose) -> None:
        self.purpose = purpose
        self._files: list[tuple[str, Path]] = []
        self._owner = os.getpid()
        self._finalizer = weakref.finalize(self, _release_files, self._files, self._owner)
        _live.add(self)

    @property
    def gpus(self) -> tuple[str, ...]:
        return tuple(key for key, _ in self._files)

    def release(self) -> None:
        """Give the GPUs back now (idempotent)."""
        self._finalizer()

    def _forget_in_child(self) -> None:
        """In a forked child: forget the parent's files (they stay the parent's)."""
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


if hasattr(os, "register_at_fork"):  # not on Windows, where nothing forks
    os.register_at_fork(after_in_child=_forget_all_in_child)


def _release_files(files: list[tuple[str, Path]], owner: int) -> None:
    if os.getpid() == owner:
        for _, path in files:
            with contextlib.suppress(OSError):
                path.unlink()
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

    Raises GpuError when the registry folder is not safe to share (see the module's docstring), or off POSIX.
    """
    return _holders_in(_checked_dir(registry_dir()))


def reserve(choose: Callable[[], Sequence[str]], purpose: Purpose) -> GpuReservation:
    """Hold the GPUs `choose()` returns (registry keys, see `gpu_key`) for this process.

    `choose` runs while no other process of this user chooses, and is run again when another user's process
    announced a reservation of one of its GPUs meanwhile (see the module's docstring), so the holders it reads
    (`holders()`, `nbscale.gpus()`) hold when its GPUs are written; it raises to refuse. Raises GpuError for an
    unsafe registry folder or lock file, or off POSIX.
    """
    folder = _checked_dir(registry_dir())
    with _user_lock():
        for attempt in range(ANNOUNCE_ATTEMPTS):
            seen = _live_files(folder)
            keys = list(choose())
            reservation = GpuReservation(purpose)
            try:
                for key in keys:
                    reservation._files.append(_write_holder_file(folder, key, purpose))
                mine = {path.name for _, path in reservation._files}
                appeared = {
                    name
                    for name, key in _live_files(folder).items()
                    if key in keys and name not in seen and name not in mine
                }
            except BaseException:
                reservation.release()
                raise
            if not appeared or attempt == ANNOUNCE_ATTEMPTS - 1:
                return reservation
            reservation.release()  # announced at the same moment as another user's process: choose again
            time.sleep(random.uniform(0.0, 0.01 * (attempt + 1)))
    raise AssertionError("unreachable")


def can_reserve() -> bool:
    """Whether this platform has the registry: POSIX users and processes (Linux, macOS), not Windows."""
    return hasattr(os, "geteuid")


def _posix() -> None:
    if not can_reserve():
        raise GpuError(
            "GPU reservations need a POSIX system (Linux or macOS); on this platform nbscale cannot "
            "reserve GPUs machine-wide. Train in the notebook on the GPU you choose (%gpu N), or use "
            "Linux (WSL on Windows) for pools."
        )


def _checked_dir(folder: Path) -> Path:
    """The registry folder, resolved, if no other user can delete or rewrite this user's files in it."""
    _posix()
    real = Path(os.path.realpath(folder))
    try:
        info = os.stat(real)
    except OSError as error:
        raise GpuError(_unsafe(folder, f"it cannot be read ({error.strerror})")) from None
    if not stat.S_ISDIR(info.st_mode):
        raise GpuError(_unsafe(folder, "it is not a folder"))
    if info.st_uid not in (0, os.geteuid()):
        raise GpuError(
            _unsafe(folder, f"it belongs to {_user_name(info.st_uid)}, who could delete anyone's reservations in it")
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX:
        raise GpuError(
            _unsafe(
                folder,
                "others may write to it but it lacks the sticky bit, so anyone could "
                "delete anyone's reservations in it",
            )
        )
    return real


def _unsafe(folder: Path, why: str) -> str:
    return (
        f"The GPU registry folder {folder} cannot be used: {why}. Use a folder owned by root with mode 1777, as "
        f"/dev/shm is (an administrator creates one with `install -d -m 1777 {folder}`), or point "
        f"{REGISTRY_ENV} at one."
    )


def lock_path() -> Path:
    """This user's lock file for choosing GPUs: `$NBSCALE_HOME/gpu-registry.lock`, else in the user's data
    folder for nbscale."""
    home = os.environ.get("NBSCALE_HOME")
    if home:
        return Path(home).expanduser() / LOCK_FILE
    from platformdirs import user_data_dir

    return Path(user_data_dir("nbscale", appauthor=False)) / LOCK_FILE


@contextlib.contextmanager
def _user_lock() -> Iterator[None]:
    """Exclusive use of the registry among this user's processes while GPUs are chosen and written: a flock on
    a 0600 file in the user's own folder, which no other user can open, so none can hold it or make us wait.
    Without fcntl (Windows), an O_EXCL lock file beside it (nbscale.file_locks.exclusive)."""
    from nbscale.trust import swappable_by_others

    path = lock_path()
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as error:
        raise GpuError(
            f"The GPU registry's lock file {path} cannot be opened ({error.strerror}). Point "
            "NBSCALE_HOME at a folder of yours that you can write."
        ) from None
    try:
        info = os.fstat(descriptor)
        why = swappable_by_others(path)
        if info.st_uid != os.geteuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            why = f"it belongs to {_user_name(info.st_uid)} or others may write to it"
        if why or not stat.S_ISREG(info.st_mode):
            raise GpuError(
                f"The GPU registry's lock file {path} cannot be used: {why or 'it is no file'}, so "
                "another user could hold it and stop you reserving GPUs. Point NBSCALE_HOME at a folder "
                "only you can write (mode 0700), or remove the file."
            )
        with exclusive(descriptor, path):  # only this user's processes can hold it, each for a moment
            yield
    finally:
        os.close(descriptor)  # closing drops the lock


def _write_holder_file(folder: Path, key: str, purpose: Purpose) -> tuple[str, Path]:
    """Create and fill this process's file for GPU `key`; readers see it only once it is complete."""
    if key != gpu_key(key) or not key:
        raise GpuError(f"{key!r} is not a GPU registry key (see nbscale.gpu_reservations.gpu_key).")
    token = secrets.token_hex(8)
    final = folder / f"{PREFIX}{key}.{token}"
    temporary = folder / f".{final.name}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    descriptor = os.open(temporary, flags, _FILE_MODE)
    try:
        os.fchmod(descriptor, _FILE_MODE)  # whatever the umask (a job runs under 077): everyone must read it
        os.write(descriptor, json.dumps(_this_holder(purpose)).encode())
        os.rename(temporary, final)
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise
    finally:
        os.close(descriptor)
    return key, final


def _this_holder(purpose: Purpose) -> dict[str, object]:
    from nbscale.processes import kernel_id, start_time

    return {
        "pid": os.getpid(),
        "started": start_time(os.getpid()),
        "purpose": purpose,
        # Jupyter's server names the notebook of a kernel in JPY_SESSION_NAME
        "notebook": os.environ.get("JPY_SESSION_NAME") or None,
        "kernel_id": kernel_id(),
        "since": time.time(),
    }


def _live_files(folder: Path) -> dict[str, str]:
    """The names of the live holders' files in `folder`, with their GPU keys."""
    try:
        names = [entry.name for entry in os.scandir(folder) if entry.name.startswith(PREFIX)]
    except OSError:
        return {}
    live = {}
    for name in names:
        key = name[len(PREFIX) :].partition(".")[0]
        if key and _live_holder(folder / name) is not None:
            live[name] = key
    return live


def _holders_in(folder: Path) -> dict[str, tuple[GpuHolder, ...]]:
    found: dict[str, list[GpuHolder]] = {}
    try:
        names = [entry.name for entry in os.scandir(folder) if entry.name.startswith(PREFIX)]
    except OSError:
        return {}
    for name in names:
        key = name[len(PREFIX) :].partition(".")[0]
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
        record = _record(os.read(descriptor, MAX_RECORD_BYTES))
    except OSError:
        return None
    finally:
        os.close(descriptor)
    pid = _whole(record.get("pid"))
    since = record.get("since")
    since = float(since) if isinstance(since, int | float) and not isinstance(since, bool) else info.st_mtime
    if pid is None or not _holder_alive(pid, info.st_uid, since, record.get("started")):
        if info.st_uid == os.geteuid():  # a dead holder of ours: tidy up (others' stale files stay, unread)
            with contextlib.suppress(OSError):
                path.unlink()
        return None
    return GpuHolder(
        user=_user_name(info.st_uid),
        uid=info.st_uid,
        pid=pid,
        purpose=str(record.get("purpose") or "unknown")[:40],
        notebook=_short_text(record.get("notebook")),
        kernel_id=_short_text(record.get("kernel_id")),
        since=since,
    )


def _holder_alive(pid: int, owner: int, since: float, started: object) -> bool:
    """Whether process `pid` is the live holder a file owned by `owner` names: it runs as that user, and started
    before the reservation (at the recorded start time, where the file gives one), so a pid reused by a later
    process (anyone's) does not count."""
    import psutil

    from nbscale.processes import START_TIME_SLACK_S

    try:
        process = psutil.Process(pid)
        with process.oneshot():
            if process.status() == psutil.STATUS_ZOMBIE:
                return False
            uids = process.uids()
            created = process.create_time()
    except (psutil.Error, ValueError, OverflowError):
        return False
    if owner not in (uids.real, uids.effective):
        return False
    if isinstance(started, int | float) and not isinstance(started, bool) and abs(created - started) > 0.01:
        return False
    return created <= since + START_TIME_SLACK_S


def _record(data: bytes) -> Mapping[str, object]:
    try:
        record = json.loads(data)
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def _whole(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _short_text(value: object) -> str | None:
    return value[:200] if isinstance(value, str) and value else None


def _user_name(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return f"uid {uid}"
