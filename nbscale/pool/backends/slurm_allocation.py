"""What runs inside a SLURM allocation for a pool: Ray's SLURM recipe, as a batch script's body.

`python -m nbscale.pool.backends.slurm_allocation head GPUS_PER_WORKER` is the batch script (it runs on the first
node): it starts `ray start --head --block` there with as many Ray CPUs as the allocation has tasks on that node
(one per pool worker; GPUS_PER_WORKER GPUs each), and `srun --overlap` starts `... worker HEAD` on each other
node, which joins that head. Once the head runs and every other node's Ray has joined it (or given up), it prints
one line, `ADDRESS_MARK ip:port ip:client_port`, to the job's output, where the kernel reads it: the cluster the
kernel connects to then has the whole allocation's CPUs and GPUs. Ray's processes stay children of this script,
so `scancel` (SIGTERM to the job's processes) ends them all; the script also ends its Ray processes itself on
SIGTERM, and removes Ray's session folder. Every port is picked free on its node: two allocations may share a node.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from types import FrameType

import psutil

from nbscale.pool.backends.ray_start import RAY_COMMAND
from nbscale.ports import free_ports

ADDRESS_MARK = "nbscale-ray-head:"
MODULE = "nbscale.pool.backends.slurm_allocation"  # what `-m` runs: run as the batch script, __name__ is "__main__"
READY_TEXT = "Ray runtime started"
LOST_NODE_TEXT = "nbscale: Ray did not start on node"
START_ATTEMPTS = 3
# ports whose defaults are fixed numbers, which a second Ray on the node (another allocation) would find taken
_FIXED_DEFAULT_PORTS = (
    "dashboard-agent-listen-port",
    "dashboard-agent-grpc-port",
    "metrics-export-port",
    "runtime-env-agent-port",
)


def tasks_per_node(text: str) -> list[int]:
    """SLURM_TASKS_PER_NODE ("2(x3),1") as one count per node ([2, 2, 2, 1])."""
    counts: list[int] = []
    for part in text.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if match:
            counts += [int(match[1])] * int(match[2] or 1)
    return counts


def _fixed_ports() -> list[tuple[str, int]]:
    """A distinct free port for each of Ray's fixed defaults (two Ray nodes on one host would clash on them)."""
    return list(zip(_FIXED_DEFAULT_PORTS, free_ports(len(_FIXED_DEFAULT_PORTS), ""), strict=True))


def _ray_start(session: str, cpus: int, gpus: int, *arguments: str) -> list[str]:
    return [
        *RAY_COMMAND,
        "start",
        "--block",
        f"--num-cpus={cpus}",
        f"--num-gpus={gpus}",
        f"--node-ip-address={socket.gethostbyname(socket.gethostname())}",
        "--disable-usage-stats",
        "--include-log-monitor=false",  # the pool's workers send their output over their own channels
        f"--temp-dir={session}",
        *(f"--{name}={port}" for name, port in _fixed_ports()),
        *arguments,
    ]


def _end_children(session: str) -> None:
    """SIGKILL every process this script started (Ray's), and remove Ray's session folder."""
    children = psutil.Process().children(recursive=True)
    for child in children:
        try:
            child.kill()
        except psutil.Error:
            continue
    psutil.wait_procs(children, timeout=10)
    shutil.rmtree(session, ignore_errors=True)


_output_lock = threading.Lock()


def _say(line: str) -> None:
    """Write `line` to the job's output as one whole line: the head's own lines and every joining node's echo come
    from threads of their own, and `print` writes a line's text and its newline apart, so another thread's line
    could land between them (the kernel then read the head's address line with Ray's words glued to it)."""
    with _output_lock:
        sys.stdout.write(line if line.endswith("\n") else line + "\n")
        sys.stdout.flush()


def _run(start: Callable[[str], list[str]], announce: str | None, joined: Callable[[], None] = lambda: None) -> int:
    """Run `ray start --block` (the command `start` makes for a session folder), echo its output, print `announce`
    once Ray runs and `joined()` returned; end it all on SIGTERM. A start that fails before Ray runs (a node still
    too slow, see ray_start) is tried again, up to START_ATTEMPTS times."""
    session = ""

    def stop(signum: int, frame: FrameType | None) -> None:
        _end_children(session)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    code = 1
    for attempt in range(1, START_ATTEMPTS + 1):
        session = tempfile.mkdtemp(prefix="ray-slurm-", dir="/tmp")  # Ray's socket paths must stay short
        ray = subprocess.Popen(start(session), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert ray.stdout is not None
        for line in ray.stdout:
            _say(line)
            if announce is not None and READY_TEXT in line:
                joined()
                _say(announce)
                announce = None
        code = ray.wait()
        _end_children(session)
        if announce is None:  # Ray ran, then ended: that is the allocation's end, not a failed start
            return code
        _say(f"nbscale: Ray did not start (attempt {attempt} of {START_ATTEMPTS})")
    return code


def head(gpus_per_worker: int) -> int:
    """The batch script: Ray's head here, a Ray worker node on every other node of the allocation."""
    tasks = tasks_per_node(os.environ.get("SLURM_TASKS_PER_NODE", "1"))
    nodes = subprocess.run(
        ["scontrol", "show", "hostnames", os.environ.get("SLURM_JOB_NODELIST", "")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    ip, (port, client_port) = socket.gethostbyname(socket.gethostname()), free_ports(2, "")

    def start(session: str) -> list[str]:
        return _ray_start(
            session,
            tasks[0],
            tasks[0] * gpus_per_worker,
            "--head",
            f"--port={port}",
            f"--ray-client-server-port={client_port}",
            "--include-dashboard=false",
        )

    joining = [
        _JoiningNode(node, [f"{ip}:{port}", str(count), str(count * gpus_per_worker)])
        for node, count in zip(nodes[1:], tasks[1:], strict=False)
    ]

    def all_joined() -> None:
        for node in joining:
            node.wait()

    return _run(start, f"{ADDRESS_MARK} {ip}:{port} {ip}:{client_port}", all_joined)


class _JoiningNode:
    """`srun --overlap` of `... worker HEAD` on another node of the allocation, its output echoed to the job's;
    `wait()` returns once its Ray runs or it ended (its output says why)."""

    def __init__(self, node: str, arguments: list[str]) -> None:
        self.node = node
        self.ready = threading.Event()
        self.process = subprocess.Popen(
            ["srun", "--overlap", "--nodes=1", "--ntasks=1", "-w", node, sys.executable, "-m", MODULE, "worker"]
            + arguments,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._echoing = threading.Thread(target=self._echo, daemon=True)
        self._echoing.start()

    def _echo(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            _say(line)
            if READY_TEXT in line:
                self.ready.set()

    def wait(self) -> None:
        while not self.ready.wait(0.5) and self.process.poll() is None:
            continue
        if not self.ready.is_set():
            self._echoing.join(timeout=10)  # its last lines (Ray's "started", or why not) are read and echoed first
        if not self.ready.is_set():
            _say(f"{LOST_NODE_TEXT} {self.node} (its output is above)")


def worker(address: str, cpus: int, gpus: int) -> int:
    """A Ray worker node joining the head at `address` (one srun step on one node)."""
    return _run(lambda session: _ray_start(session, cpus, gpus, f"--address={address}"), None)


if __name__ == "__main__":
    # an allocation is a cluster: where this is "0" (Ray's default on macOS and Windows, or set for a loopback-only
    # Ray), the head listens on loopback alone and `ray start --address` refuses to join another node
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "1"
    if sys.argv[1] == "head":
        sys.exit(head(int(sys.argv[2])))
    sys.exit(worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
