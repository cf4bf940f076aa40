"""The suite's kernels, forked from a process that imported ipykernel and torch once (a test process's own).

A real kernel is `python -m ipykernel_launcher -f CONNECTION_FILE`: seconds of imports, and `import torch` in its
first cell seconds more (6-8 CPU-seconds in all on the project's 2-core machine), and the suite starts ~300. This
launcher imports them once per test process and forks each kernel from itself; the child then runs
`ipykernel_launcher` exactly as `python -m` would, in the kernel's own session, folder, environment and output.
It is the same kernel code in a process that merely has those modules imported already (as a user's kernel has
after its first `import torch`); nothing of nbscale is imported ahead.

Used only where a fresh interpreter would have started the same: this test process's Python, and the same values
of the variables read as Python or torch start (a kernel given a PYTHONPATH, another Python or OMP_NUM_THREADS starts
the usual way). `NBSCALE_TEST_KERNEL_LAUNCHER=0` turns it off.

Protocol (a socket pair; the launcher exits when the test process's end closes): a JSON request {"cmd": [...],
"env": {...}, "cwd": folder} with the test process's stdout and stderr; the answer {"pid": P}.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from nbscale.pool.backends.forkserver_process import ZYGOTE_STALE_PREFIXES

START_TIMEOUT_S = 120.0


class ForkedKernel:
    """A kernel the launcher forked, as jupyter_client's provisioner uses a Popen (watched through a pidfd)."""

    stdin = stdout = stderr = None

    def __init__(self, pid: int, pidfd: int) -> None:
        self.pid = pid
        self._pidfd = pidfd
        self.returncode: int | None = None
        self._signalled: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self._pidfd], [], [], 0)[0]:
            os.close(self._pidfd)
            # its parent (the launcher) reaped it: a signal sent here says how it ended, else a clean exit is assumed
            self.returncode = -self._signalled if self._signalled else 0
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not select.select([self._pidfd], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired("kernel", timeout or 0)
        returncode = self.poll()
        assert returncode is not None
        return returncode

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            try:
                signal.pidfd_send_signal(self._pidfd, signum)
            except ProcessLookupError:
                return
            if signum in (signal.SIGKILL, signal.SIGTERM):
                self._signalled = signum

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class _Launcher:
    """This test process's launcher, started at its first kernel."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._channel: socket.socket | None = None
        self._environment: dict[str, str] = {}

    def fork(self, command: Sequence[str], environment: Mapping[str, str], folder: str) -> ForkedKernel | None:
        """The kernel `command` would start, forked; None where this launcher cannot start it as that would."""
        if not self._serves(command, environment):
            return None
        with self._lock:
            if self._process is not None and self._process.poll() is not None:
                self._process = None
            if self._process is None:
                self._start()
            assert self._channel is not None
            # as jupyter_client's launch_kernel sets it: the kernel then does not print how to connect to it
            environment = {**environment, "JPY_PARENT_PID": str(os.getpid())}
            request = {"cmd": list(command), "env": environment, "cwd": folder}
            try:
                socket.send_fds(self._channel, [json.dumps(request).encode()], [1, 2])
                reply = json.loads(self._channel.recv(1 << 16) or b"{}")
                return ForkedKernel(int(reply["pid"]), os.pidfd_open(int(reply["pid"])))
            except (OSError, ValueError, KeyError):
                self._channel.close()
                self._process = self._channel = None
                return None

    def _serves(self, command: Sequence[str], environment: Mapping[str, str]) -> bool:
        if os.environ.get("NBSCALE_TEST_KERNEL_LAUNCHER", "1") == "0" or not hasattr(os, "pidfd_open"):
            return False
        if list(command[:3]) != [sys.executable, "-m", "ipykernel_launcher"]:
            return False
        started_with = self._environment if self._process is not None else os.environ
        names = set(environment) | set(started_with)
        return not any(
            name.startswith(ZYGOTE_STALE_PREFIXES) and environment.get(name) != started_with.get(name) for name in names
        )

    def _start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "tests.kernel_launcher", str(theirs.fileno())],
                stdin=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,
            )
        finally:
            theirs.close()
        ours.settimeout(START_TIMEOUT_S)  # its first answer comes once it imported torch
        self._channel, self._environment = ours, dict(os.environ)

    def close(self) -> None:
        """Close its channel (it exits then) and reap it."""
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        if self._process is not None:
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()
            self._process = None


LAUNCHER = _Launcher()
atexit.register(LAUNCHER.close)


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # what every kernel imports, once, and what nearly every test kernel's first cell imports
    import IPython  # noqa: F401
    import numpy  # noqa: F401
    import torch  # noqa: F401

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # kernels are reaped as they end
    channel = socket.socket(fileno=int(sys.argv[1]))
    started_in = sys.path[0]
    while True:
        message, descriptors, _, _ = socket.recv_fds(channel, 1 << 20, 2)
        if not message:  # the test process is gone
            return
        pid = os.fork()
        if pid == 0:
            channel.close()
            _run_kernel(json.loads(message), descriptors, started_in)
        for descriptor in descriptors:
            os.close(descriptor)
        channel.sendall(json.dumps({"pid": pid}).encode())


def _run_kernel(request: dict[str, Any], descriptors: list[int], started_in: str) -> None:
    code = 1
    try:
        os.setsid()  # as jupyter_client starts a kernel: its own process group, which an interrupt signals
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(descriptors[0], 1)
        os.dup2(descriptors[1], 2)
        for descriptor in (null, *descriptors):
            os.close(descriptor)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        if sys.path and sys.path[0] == started_in:
            sys.path[0] = request["cwd"]  # where `python -m` started in the kernel's folder looks first
        sys.argv = ["ipykernel_launcher", *request["cmd"][3:]]
        runpy.run_module("ipykernel_launcher", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exit:
        code = exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    main()
