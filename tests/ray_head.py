"""A Ray head on 127.0.0.1 for tests (Ray uses loopback as node address: see conftest.py)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def ray_head(num_cpus: int, dashboard_port: int | None = None) -> Iterator[str]:
    """Start `ray start --head` on loopback (with its dashboard/job server on `dashboard_port` if given),
    yield the head's address HOST:PORT, and stop it (`ray stop --force`) afterwards."""
    ray_cli = shutil.which("ray", path=str(Path(sys.executable).parent))
    port = free_port()
    env = {**os.environ, **LOOPBACK_ENV}
    command = [
        ray_cli,
        "start",
        "--head",
        f"--port={port}",
        f"--num-cpus={num_cpus}",
        "--node-ip-address=127.0.0.1",
        "--disable-usage-stats",
    ]
    if dashboard_port is None:
        command.append("--include-dashboard=false")
    else:
        command += ["--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard_port}"]
    try:
        subprocess.run(command, check=True, env=env, capture_output=True, timeout=180)
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([ray_cli, "stop", "--force"], env=env, capture_output=True, timeout=60)
