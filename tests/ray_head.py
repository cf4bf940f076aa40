"""A Ray head on 127.0.0.1 for tests (Ray uses loopback as node address: see conftest.py).

Each head keeps its session in a temporary folder of its own (`--temp-dir`), and is stopped by ending exactly its
processes (found by that folder and its address in their command lines): `ray stop` would end every Ray process of the
user on the machine, another test run's or a notebook's too.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

from nbscale.pool.backends.ray_start import RAY_COMMAND
from nbscale.ports import free_ports

LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
# Ray gives its dashboard (the job server) 60 s to start, which a loaded 2-core machine exceeded (CI)
SLOW_MACHINE_ENV = {"RAY_DASHBOARD_STARTUP_TIMEOUT_S": "300"}
STOP_WAIT_S = 10.0
START_ATTEMPTS = 3
_FIXED_DEFAULT_PORTS = (
    "ray-client-server-port",
    "dashboard-agent-listen-port",
    "dashboard-agent-grpc-port",
    "metrics-export-port",
    "runtime-env-agent-port",
)


def free_port() -> int:
    return free_ports(1)[0]


def _processes_of(*marks: str) -> list[psutil.Process]:
    """The head's processes: this user's whose command line names one of `marks` (its session folder, its address),
    and their descendants (some rename themselves, as `ray::DashboardAgent`)."""
    found: dict[int, psutil.Process] = {}
    for process in psutil.process_iter(["cmdline", "uids"]):
        try:
            named = any(mark in part for part in process.info["cmdline"] or () for mark in marks)
            if named and process.info["uids"].real == os.getuid() and process.pid != os.getpid():
                found.update({each.pid: each for each in [process, *process.children(recursive=True)]})
        except psutil.Error:
            continue
    return list(found.values())


def _stop_processes_of(*marks: str) -> None:
    """SIGKILL each of the head's processes, as `ray stop --force` does."""
    processes = _processes_of(*marks)
    for process in processes:
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(processes, timeout=STOP_WAIT_S)


@contextmanager
def ray_head(num_cpus: int, dashboard_port: int | None = None, client_port: int | None = None) -> Iterator[str]:
    """Start `ray start --head` on loopback (with its dashboard/job server on `dashboard_port` if given, its Ray
    Client server, which ray://127.0.0.1:PORT reaches, on `client_port` if given), yield the head's address
    HOST:PORT, and stop its processes (only this head's) afterwards."""
    given = [port for port in (dashboard_port, client_port) if port is not None]
    port, *picked = free_ports(1 + len(_FIXED_DEFAULT_PORTS), taken=given)
    ports = dict(zip(_FIXED_DEFAULT_PORTS, picked, strict=True))
    if client_port is not None:
        ports["ray-client-server-port"] = client_port
    env = {**os.environ, **LOOPBACK_ENV, **SLOW_MACHINE_ENV}
    # Ray puts its sockets in the session folder: keep the path short (a socket path has at most 107 characters)
    session_folder = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    command = [
        *RAY_COMMAND,
        "start",
        "--head",
        f"--port={port}",
        f"--num-cpus={num_cpus}",
        "--node-ip-address=127.0.0.1",
        "--disable-usage-stats",
        f"--temp-dir={session_folder}",
        # ports whose defaults are fixed numbers, which a second head on the machine would find taken
        *(f"--{name}={number}" for name, number in ports.items()),
    ]
    if dashboard_port is None:
        command.append("--include-dashboard=false")
    else:
        command += ["--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard_port}"]
    try:
        _start_head(command, env, session_folder)
        yield f"127.0.0.1:{port}"
    finally:
        # the session folder names most of them; the client server, whose parent `ray start` has exited, only the
        # head's address
        _stop_processes_of(session_folder, f"127.0.0.1:{port}")
        forget_cluster_address(f"127.0.0.1:{port}")
        time.sleep(0.1)
        shutil.rmtree(session_folder, ignore_errors=True)


def _start_head(command: list[str], env: dict[str, str], session_folder: str) -> None:
    """Run `ray start --head` (through nbscale's ray_start, as SLURM allocations do: its raylet does not wait 15 s
    for the dashboard agent), again if it failed: Ray waits a fixed 30 s for the node to register, and a loaded
    machine can exceed that too."""
    for attempt in range(1, START_ATTEMPTS + 1):
        try:
            subprocess.run(command, check=True, env=env, capture_output=True, timeout=420)
            return
        except subprocess.CalledProcessError as error:
            if attempt == START_ATTEMPTS:
                said = (error.stderr + error.stdout).decode(errors="replace").splitlines()
                errors = [line for line in said if "Error" in line or "Exception" in line or "Failed" in line]
                raise RuntimeError("ray start failed:\n" + "\n".join(errors[-20:] or said[-20:])) from None
            _stop_processes_of(session_folder)


def forget_cluster_address(address: str) -> None:
    """Remove Ray's address file (which `ray.init()` with no address joins) where it names `address`, a cluster the
    test stopped, as `ray stop` does."""
    from ray._private.utils import get_ray_address_file

    with contextlib.suppress(OSError):
        path = Path(get_ray_address_file(None))
        if path.read_text().strip() == address:
            path.unlink()
