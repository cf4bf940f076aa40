"""Workers as processes on this machine, forked from a forkserver that imported torch once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

from nbscale.pool.backends.base import Backend


class LocalBackend(Backend):
    """Starts `python -m nbscale.pool.forkserver` and hands it every worker's config on stdin."""

    name = "local"
    listen_host = "127.0.0.1"

    def __init__(self) -> None:
        self._forkserver: subprocess.Popen[bytes] | None = None

    def start(self, worker_configs: list[dict[str, Any]]) -> None:
        environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
        environment.pop("CUDA_VISIBLE_DEVICES", None)  # each worker sets its own; the kernel's may be narrowed
        self._forkserver = subprocess.Popen(
            [sys.executable, "-m", "nbscale.pool.forkserver"],
            stdin=subprocess.PIPE,
            env=environment,
            close_fds=True,
        )
        assert self._forkserver.stdin is not None
        # configs hold the pool secret and --env values: they travel on the pipe, never on a command line
        self._forkserver.stdin.write(json.dumps({"workers": worker_configs}).encode() + b"\n")
        self._forkserver.stdin.flush()

    def stop(self) -> None:
        if self._forkserver is None:
            return
        if self._forkserver.stdin is not None and not self._forkserver.stdin.closed:
            try:
                self._forkserver.stdin.close()  # the forkserver kills its workers and exits
            except OSError:
                pass
        try:
            self._forkserver.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self._forkserver.kill()
            self._forkserver.wait()
        self._forkserver = None

    def alive(self) -> bool:
        return self._forkserver is not None and self._forkserver.poll() is None

    def kill_worker(self, rank: int, pid: int) -> None:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
