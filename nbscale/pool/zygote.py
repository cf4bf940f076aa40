"""The zygote: a process that imported torch once and forks a forkserver for each local pool of the user's kernels.

A local pool's forkserver (nbscale/pool/forkserver.py) must import torch before it can fork workers: seconds of
CPU. The first local pool starts a zygote (`python -m nbscale.pool.zygote SOCKET`), which pays that import; every
pool after it, in that kernel or another of the user's, gets its forkserver forked from here in milliseconds. Like
the forkserver, the zygote is never a fork of a kernel and never touches CUDA, so its children start as clean as a
fresh interpreter would.

It serves one socket in the user's private runtime folder, named after everything a fresh interpreter would take
from its starter and a fork cannot change afterwards (backends/forkserver_process.py's `zygote_socket`: the Python
executable, the variables read when Python or torch start, the control group, namespaces and resource limits), so a
kernel only ever reaches a zygote that started as its own forkserver would have. Only the user's processes reach it
(the folder is theirs alone, and each connection's peer credentials are checked).

Protocol, per connection: the kernel sends one message per forkserver, a JSON object {"id": N, "kernel": pid,
"cwd": folder, "env": {...}} with four file descriptors: the read end of the forkserver's request pipe, the write
end of its report pipe, and the kernel's stdout and stderr; the zygote forks the forkserver, which takes the kernel's
folder, environment and output, and answers {"id": N, "pid": P}. The kernel then watches the forkserver itself (a
pidfd) and reaches it through the pipes, exactly as one it started.

The zygote exits when its socket is removed or replaced, once no kernel has been connected for NO_KERNEL_EXIT_S
with none of its forkservers running, and once IDLE_EXIT_S passed with none running and no request (its memory,
about 300 MB after importing torch, goes back; the next pool starts a new one). Its forkservers do not depend on
it: each watches its own pipe from its kernel.
"""

from __future__ import annotations

import fcntl
import json
import os
import selectors
import signal
import socket
import struct
import sys
import time
import traceback
from pathlib import Path
from typing import Any, cast

from nbscale.pool import process_names
from nbscale.pool.process_names import set_process_name
from nbscale.processes import pid_running

IDLE_EXIT_S = 600.0  # this long without a forkserver running or asked for, the zygote exits
NO_KERNEL_EXIT_S = 60.0  # this long without a connected kernel and with no forkserver running, it exits
CHECK_EVERY_S = 5.0
MAX_MESSAGE = 1 << 20  # one request: the kernel's environment and folder
BOUND = b"1"  # what the zygote tells its starter once its socket is bound


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a kernel interrupt is the kernel's
    path = Path(sys.argv[1])
    bound_read, bound_write = os.pipe()
    if os.fork():  # the starter waits for this first process, which ends once the zygote listens (or cannot)
        os.close(bound_write)
        told = os.read(bound_read, 1)
        os._exit(0 if told == BOUND else 1)
    os.close(bound_read)
    set_process_name(process_names.ZYGOTE)
    bound = _bind(path)
    os.write(bound_write, BOUND)  # a zygote listens: this one, or one that started a moment before
    os.close(bound_write)
    if bound is None:
        os._exit(0)
    listener, inode = bound
    import torch  # noqa: F401 - the expensive import, paid once for every forkserver

    import nbscale.pool.forkserver  # and the code of the forkserver and the worker
    import nbscale.pool.worker  # noqa: F401

    try:
        _serve(listener, path, inode)
    finally:
        try:
            if os.stat(path).st_ino == inode:  # not a later zygote's
                path.unlink()
        except OSError:
            pass


def _bind(path: Path) -> tuple[socket.socket, int] | None:
    """A listening socket at `path` and the path's inode, or None when a zygote already listens there (under the
    folder's lock, so two kernels starting at once start one zygote)."""
    with open(os.open(path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o600)) as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            probe.connect(str(path))
            return None
        except OSError:
            pass
        finally:
            probe.close()
        path.unlink(missing_ok=True)  # a zygote that ended without removing it
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        listener.bind(str(path))
        os.chmod(path, 0o600)
        listener.listen(16)
        return listener, os.stat(path).st_ino


def _serve(listener: socket.socket, path: Path, bound: int) -> None:
    started_in = os.getcwd()
    forkservers: set[int] = set()

    def reap(*_: object) -> None:  # each forkserver as it ends (its kernel watches it through a pidfd, not here)
        try:
            while (ended := os.waitpid(-1, os.WNOHANG)[0]) > 0:
                forkservers.discard(ended)
        except ChildProcessError:
            forkservers.clear()

    signal.signal(signal.SIGCHLD, reap)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    kernels: set[socket.socket] = set()
    last_request = last_kernel = time.monotonic()
    while True:
        for key, _ in selector.select(CHECK_EVERY_S):
            if key.fileobj is listener:
                connection, _ = listener.accept()
                if _peer_uid(connection) != os.getuid():  # the folder is the user's; this is a second lock
                    connection.close()
                    continue
                kernels.add(connection)
                selector.register(connection, selectors.EVENT_READ)
                continue
            connection = cast(socket.socket, key.fileobj)
            try:
                message, descriptors, _, _ = socket.recv_fds(connection, MAX_MESSAGE, 4)
            except OSError:
                message, descriptors = b"", []
            if not message:  # the kernel closed its end, or is gone
                selector.unregister(connection)
                kernels.discard(connection)
                connection.close()
                continue
            last_request = time.monotonic()
            reply = _answer(message, descriptors, started_in, listener, kernels, forkservers)
            try:
                connection.sendall(json.dumps(reply).encode())
            except OSError:
                pass  # gone meanwhile: its forkserver sees its pipe close
        now = time.monotonic()
        reap()
        forkservers.intersection_update([pid for pid in forkservers if pid_running(pid)])  # ended before added
        if kernels or forkservers:
            last_kernel = now
        try:
            if os.stat(path).st_ino != bound:
                return
        except OSError:
            return
        if not forkservers and (now - last_kernel > NO_KERNEL_EXIT_S or now - last_request > IDLE_EXIT_S):
            return


def _answer(
    message: bytes,
    descriptors: list[int],
    started_in: str,
    listener: socket.socket,
    kernels: set[socket.socket],
    forkservers: set[int],
) -> dict[str, Any]:
    request: dict[str, Any] = {}
    try:
        request = json.loads(message)
        pid = _fork_forkserver(request, descriptors, started_in, [listener, *kernels])
        forkservers.add(pid)
        return {"id": request.get("id"), "pid": pid}
    except Exception as error:  # a request this zygote cannot serve: the kernel starts a forkserver itself
        return {"id": request.get("id"), "error": f"{type(error).__name__}: {error}"}
    finally:
        for descriptor in descriptors:
            os.close(descriptor)


def _fork_forkserver(
    request: dict[str, Any], descriptors: list[int], started_in: str, sockets: list[socket.socket]
) -> int:
    kernel, folder, environment = int(request["kernel"]), str(request["cwd"]), dict(request["env"])
    requests, status, stdout, stderr = descriptors
    pid = os.fork()
    if pid:
        return pid
    try:
        for each in sockets:  # the other kernels' connections are not this forkserver's
            each.close()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the forkserver waits for its workers itself, its own way
        os.setsid()  # a session of its own, as a forkserver the kernel starts has
        set_process_name(process_names.FORKSERVER)
        os.dup2(requests, 0)  # its workers replace fd 0 with /dev/null: none keeps the kernel's pipe
        os.dup2(stdout, 1)  # what it and its workers print goes where the kernel's own output goes
        os.dup2(stderr, 2)
        for descriptor in (requests, stdout, stderr):
            os.close(descriptor)
        os.environ.clear()
        os.environ.update(environment)
        os.chdir(folder)
        if sys.path and sys.path[0] == started_in:  # `python -m` put its folder first (unless PYTHONSAFEPATH)
            sys.path[0] = folder  # where a forkserver started from the kernel's folder would look first
        from nbscale.pool.forkserver import serve

        serve(open(0, closefd=False), kernel, status)  # fd 0 is the process's, closed at its exit
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    os._exit(0)


def _peer_uid(connection: socket.socket) -> int:
    credentials = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", credentials)[1])


if __name__ == "__main__":
    main()
