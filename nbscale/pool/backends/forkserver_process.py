"""A local pool's forkserver as the kernel holds it: forked by the user's zygote where one can run (Linux, with
pidfds), else started as `python -m nbscale.pool.forkserver`. Either way the kernel writes its request on a pipe,
learns of its workers' ends on another, and can tell whether it runs, wait for it and kill it.

The zygote (nbscale/pool/zygote.py) imported torch once, so a forkserver forked from it is ready in milliseconds
instead of seconds. `zygote_socket` names the one for this process: a socket in the user's private runtime folder,
keyed by everything a fresh interpreter would take from this process that a fork could not change afterwards (the
Python and the nbscale and torch files, the variables read as Python or torch start (ZYGOTE_STALE_PREFIXES), the
control group, namespaces, resource limits and umask). The first pool with that key starts it; `_Zygote` keeps
this process's connection to it.
"""

from __future__ import annotations

import atexit
import hashlib
import importlib.util
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import IO

from nbscale.pool.registry import runtime_dir
from nbscale.trust import others_could_change

# variables read when Python, the C library, torch or its thread pools start: a zygote started with other values
# would give forkservers what a fresh interpreter would not
ZYGOTE_STALE_PREFIXES = ("PYTHON", "LD_", "GLIBC_", "MALLOC_", "OMP_", "KMP_", "MKL_", "OPENBLAS_", "TORCH", "PYTORCH")
ZYGOTE_START_TIMEOUT_S = 120.0  # importing torch on a loaded machine; a zygote this slow is given up for a spawn
MAX_SOCKET_PATH = 104  # a Unix socket's path is at most 108 bytes on Linux (104 on some systems)


class ForkserverProcess:
    """One forkserver: its request pipe, and how to watch and end it."""

    def __init__(self, pid: int, requests: IO[bytes]) -> None:
        self.pid = pid
        self._requests = requests

    def send(self, text: str) -> None:
        """Write `text` on its request pipe (OSError when it is gone, or the pipe was closed)."""
        if self._requests.closed:
            raise BrokenPipeError("the forkserver's request pipe is closed")
        self._requests.write(text.encode())
        self._requests.flush()

    def close_requests(self) -> None:
        """Close its request pipe: it kills its workers and exits."""
        try:
            self._requests.close()
        except OSError:
            pass  # it is gone already

    def running(self) -> bool:
        raise NotImplementedError

    def wait(self, timeout: float) -> bool:
        """Whether it ended within `timeout` seconds."""
        raise NotImplementedError

    def kill(self) -> None:
        raise NotImplementedError


class SpawnedForkserver(ForkserverProcess):
    """A forkserver this process started (`python -m nbscale.pool.forkserver`): its child."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        assert process.stdin is not None
        super().__init__(process.pid, process.stdin)
        self._process = process

    def running(self) -> bool:
        return self._process.poll() is None

    def wait(self, timeout: float) -> bool:
        try:
            self._process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def kill(self) -> None:
        self._process.kill()
        self._process.wait()


class ForkedForkserver(ForkserverProcess):
    """A forkserver the zygote forked: watched through a pidfd (its pid cannot be reused while that is open)."""

    def __init__(self, pid: int, pidfd: int, requests: IO[bytes]) -> None:
        super().__init__(pid, requests)
        self._pidfd = pidfd

    def running(self) -> bool:
        return not self.wait(0)

    def wait(self, timeout: float) -> bool:
        if self._pidfd < 0:
            return True
        readable, _, _ = select.select([self._pidfd], [], [], timeout)
        if readable:
            os.close(self._pidfd)
            self._pidfd = -1
        return bool(readable)

    def kill(self) -> None:
        if self._pidfd >= 0:
            try:
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.wait(10.0)


def start_forkserver(status_fd: int) -> ForkserverProcess:
    """A new forkserver that reports its workers' ends on `status_fd` (a pipe's write end, still the caller's)."""
    environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
    environment.pop("CUDA_VISIBLE_DEVICES", None)  # each worker sets its own; the kernel's may be narrowed
    if _zygotes_work():
        forked = _ZYGOTE.fork(environment, status_fd)
        if forked is not None:
            return forked
    return SpawnedForkserver(
        subprocess.Popen(
            [sys.executable, "-m", "nbscale.pool.forkserver", str(status_fd)],
            stdin=subprocess.PIPE,
            env=environment,
            close_fds=True,
            pass_fds=(status_fd,),
            # its own session: Jupyter ends a kernel (shutdown, restart) with SIGKILL to the kernel's process
            # group, which would kill the forkserver before it could take its workers' children along; it
            # learns the kernel is gone from its stdin instead (and ignores SIGINT, the kernel interrupt)
            start_new_session=True,
        )
    )


def _zygotes_work() -> bool:
    return (
        sys.platform == "linux"
        and hasattr(os, "pidfd_open")
        and hasattr(socket, "send_fds")
        and os.environ.get("NBSCALE_ZYGOTE", "1") != "0"
    )


def zygote_socket(environment: Mapping[str, str]) -> Path | None:
    """Where the zygote for a forkserver with `environment` listens: in the user's private runtime folder, named
    after all a fork inherits that a fresh interpreter would take from its starter (None: no safe place)."""
    folder = runtime_dir() / "zygotes"
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        if others_could_change(folder) is not None:
            return None
    except OSError:
        return None
    inherited = {
        "python": sys.executable,
        "code": _code_fingerprint(),
        "env": sorted((name, value) for name, value in environment.items() if name.startswith(ZYGOTE_STALE_PREFIXES)),
        "cgroup": _read("/proc/self/cgroup"),
        "namespaces": [_link(f"/proc/self/ns/{name}") for name in ("pid", "mnt", "net", "user", "ipc", "uts")],
        "limits": _read("/proc/self/limits"),
        "umask": _umask_line(),
    }
    key = hashlib.sha256(json.dumps(inherited).encode()).hexdigest()[:16]
    path = folder / f"{key}.sock"
    return path if len(os.fsencode(path)) < MAX_SOCKET_PATH else None


def _code_fingerprint() -> list[tuple[str, int]]:
    """nbscale's and torch's files as installed now: a zygote that imported older ones (an upgrade, or an edited
    editable install since) is not used."""
    files = sorted(Path(__file__).resolve().parents[2].rglob("*.py"))
    torch = importlib.util.find_spec("torch")
    if torch is not None and torch.origin is not None:
        files.append(Path(torch.origin))
    found = []
    for file in files:
        try:
            found.append((str(file), os.stat(file).st_mtime_ns))
        except OSError:
            continue
    return found


def _read(path: str) -> str:
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return ""


def _link(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


def _umask_line() -> str:
    """This process's umask as Linux states it (read, not set and set back: os.umask would change it for every
    thread a moment)."""
    return next((line for line in _read("/proc/self/status").splitlines() if line.startswith("Umask:")), "")


class _Zygote:
    """This process's connection to the user's zygote for its environment, started where none runs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._channel: socket.socket | None = None
        self._path: Path | None = None
        self._requests_sent = 0

    def fork(self, environment: Mapping[str, str], status_fd: int) -> ForkedForkserver | None:
        """A forkserver forked by the zygote, or None when no zygote can serve (the caller starts one itself)."""
        path = zygote_socket(environment)
        if path is None:
            return None
        with self._lock:
            if self._path != path:
                self.disconnect()
            for _ in range(2):  # a zygote that exited (idle) since the last pool is replaced once
                if self._channel is None and not self._connect(path, environment):
                    return None
                forked = self._request(environment, status_fd)
                if forked is not None:
                    return forked
                self.disconnect()
            return None

    def _connect(self, path: Path, environment: Mapping[str, str]) -> bool:
        """Connect to the zygote at `path`, starting one where none listens; whether it worked."""
        channel = _connected(path)
        if channel is None:
            try:  # it listens once this returns 0; its first process ends then (it runs on in a session of its own)
                started = subprocess.run(
                    [sys.executable, "-m", "nbscale.pool.zygote", str(path)],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,  # it outlives this process: it holds none of its pipes
                    stderr=subprocess.DEVNULL,
                    env=dict(environment),
                    close_fds=True,
                    start_new_session=True,  # as a forkserver: Jupyter's SIGKILL to the kernel's group is not for it
                    timeout=ZYGOTE_START_TIMEOUT_S,
                    check=False,
                )
            except (OSError, subprocess.SubprocessError):
                return False
            channel = _connected(path) if started.returncode == 0 else None
        self._channel, self._path = channel, path
        return channel is not None

    def _request(self, environment: Mapping[str, str], status_fd: int) -> ForkedForkserver | None:
        assert self._channel is not None
        self._requests_sent += 1
        number = self._requests_sent
        message = {"id": number, "kernel": os.getpid(), "cwd": os.getcwd(), "env": dict(environment)}
        requests_read, requests_write = os.pipe()
        try:
            self._channel.settimeout(ZYGOTE_START_TIMEOUT_S)  # a new zygote answers once it imported torch
            descriptors = [requests_read, status_fd, 1, 2]  # its output goes where this process's fds 1 and 2 go
            socket.send_fds(self._channel, [json.dumps(message).encode()], descriptors)
            reply: dict[str, object] = {}
            while reply.get("id") != number:  # an interrupted request's answer comes first (its forkserver, given
                reply = json.loads(self._channel.recv(1 << 16) or b'{"id": null}')  # no pipe, ended)
                if reply.get("id") is None:
                    break
            pid = reply.get("pid")
            if not isinstance(pid, int):  # the zygote is gone, or could not fork: the caller decides
                os.close(requests_write)
                return None
            pidfd = os.pidfd_open(pid)
        except (OSError, ValueError):  # gone, too slow, or its forkserver ended at once
            os.close(requests_write)
            return None
        except BaseException:  # interrupted: the forkserver, if forked, ends at its pipe's end; the zygote stays
            os.close(requests_write)
            raise
        finally:
            os.close(requests_read)
        return ForkedForkserver(pid, pidfd, open(requests_write, "wb"))  # it holds it

    def disconnect(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None


def _connected(path: Path) -> socket.socket | None:
    """A connection to the zygote listening at `path`, checked to be the user's own process (None: none listens)."""
    channel = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        channel.connect(str(path))
        credentials = channel.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        if struct.unpack("3i", credentials)[1] != os.getuid():
            raise PermissionError(f"{path} is served by another user's process")
    except OSError:
        channel.close()
        return None
    return channel


_ZYGOTE = _Zygote()
atexit.register(_ZYGOTE.disconnect)  # at this process's end, quietly (the zygote sees its end either way)
