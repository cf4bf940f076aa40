"""A SLURM cluster of 2 CPUs for tests: munged, slurmctld and slurmd configured in a folder of their own; one node
of 2 CPUs, or two nodes of 1 CPU each, each node its own slurmd on this machine (`slurmd -N NAME`, a port apiece).

Debian's `slurmctld`, `slurmd`, `munge` and `slurm-client` packages provide the programs (`make test` installs
them, as it does Chromium). Everything the cluster keeps (its configuration, munge's key and socket, state, spool,
logs) is in one temporary folder, its daemons listen on ports of their own, and it is stopped by ending exactly the
processes it started and the ones SLURM started for its jobs (found by that folder in their environment or command
line), never with `scontrol shutdown` of another cluster.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from nbscale.ports import free_ports

PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo")
NODE = "nbscale-node"  # the one node; with two, NODE1 and NODE2
CPUS = 2
READY_TIMEOUT_S = 60.0
STOP_WAIT_S = 10.0


def missing_programs() -> list[str]:
    """The SLURM and munge programs not found on PATH (or in /usr/sbin, where Debian puts the daemons)."""
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    return [name for name in PROGRAMS if shutil.which(name, path=path) is None]


def node_names(nodes: int) -> list[str]:
    """The cluster's node names: NODE alone, or NODE1, NODE2, ..."""
    return [NODE] if nodes == 1 else [f"{NODE}{index}" for index in range(1, nodes + 1)]


def _configuration(folder: Path, munge_socket: Path, nodes: int) -> str:
    host = socket.gethostname()
    controller_port, node_port, *node_ports = free_ports(2 + nodes)
    node_lines = "".join(
        f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} CPUs={CPUS // nodes} "
        "RealMemory=1000 State=UNKNOWN\n"
        for name, port in zip(node_names(nodes), node_ports, strict=True)
    )
    user = os.environ.get("USER") or psutil.Process().username()
    return f"""
ClusterName=nbscale{os.getpid()}
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={controller_port}
SlurmdPort={node_port}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
AuthInfo=socket={munge_socket}
CredType=cred/munge
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool-%n
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd-%n.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
SchedulerParameters=sched_interval=1
MinJobAge=30
KillWait=2
SlurmdParameters=config_overrides
{node_lines}PartitionName=debug Nodes={",".join(node_names(nodes))} Default=YES MaxTime=INFINITE State=UP
"""


def _processes_of(folder: Path) -> list[psutil.Process]:
    """The cluster's processes: its daemons (their command lines name the folder) and every process of its jobs
    (their environment names the folder through SLURM_CONF), with their descendants."""
    mark = str(folder)
    found: dict[int, psutil.Process] = {}
    for process in psutil.process_iter(["cmdline"]):
        if process.pid == os.getpid():
            continue
        try:
            named = any(mark in part for part in process.info["cmdline"] or ())
            # slurmstepd (its cwd is the spool folder) and the jobs' processes (SLURM_CONF names the folder)
            named = named or process.cwd().startswith(mark) or mark in process.environ().get("SLURM_CONF", "")
            if named:
                found.update({each.pid: each for each in [process, *process.children(recursive=True)]})
        except psutil.Error:
            continue
    found.pop(os.getpid(), None)
    return list(found.values())


def _wait_until_idle_nodes(env: dict[str, str], folder: Path, nodes: int) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    state = ""
    while time.monotonic() < deadline:
        result = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], env=env, capture_output=True, text=True)
        state = result.stdout.strip() + result.stderr.strip()
        states = state.split()
        if len(states) == nodes and set(states) <= {"idle", "mixed", "allocated"}:
            return
        time.sleep(0.2)
    logs = "\n".join(path.read_text()[-2000:] for path in folder.glob("*.log"))
    raise RuntimeError(f"The test SLURM cluster did not come up within {READY_TIMEOUT_S:.0f} s ({state!r}):\n{logs}")


@contextmanager
def slurm_cluster(nodes: int = 1) -> Iterator[dict[str, str]]:
    """Start munged, slurmctld and a slurmd per node (`nodes`: 1 or 2, CPUS between them); yield the environment its
    clients need (SLURM_CONF, PATH with the daemons' folder); stop every process of the cluster and its jobs
    afterwards."""
    # munge's socket path must stay short (at most 107 characters): a folder under /tmp, not pytest's tmp_path
    folder = Path(tempfile.mkdtemp(prefix="slurm-", dir="/tmp"))
    for name in ("state", "munge", *(f"spool-{node}" for node in node_names(nodes))):
        (folder / name).mkdir(mode=0o700)
    key = folder / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    munge_socket = folder / "munge" / "socket"
    conf = folder / "slurm.conf"
    conf.write_text(_configuration(folder, munge_socket, nodes))
    env = {**os.environ, "SLURM_CONF": str(conf), "PATH": os.environ.get("PATH", "") + ":/usr/sbin:/sbin"}
    try:
        subprocess.run(
            [
                "munged",
                "--force",
                f"--socket={munge_socket}",
                f"--key-file={key}",
                f"--pid-file={folder}/munge/munged.pid",
                f"--log-file={folder}/munge/munged.log",
                f"--seed-file={folder}/munge/seed",
            ],
            env=env,
            check=True,
            capture_output=True,
            timeout=30,
        )
        subprocess.run(["slurmctld", "-i", "-f", str(conf)], env=env, check=True, capture_output=True, timeout=30)
        for node in node_names(nodes):
            subprocess.run(
                ["slurmd", "-N", node, "-f", str(conf)], env=env, check=True, capture_output=True, timeout=30
            )
        _wait_until_idle_nodes(env, folder, nodes)
        yield env
    finally:
        processes = _processes_of(folder)
        for process in processes:
            with contextlib.suppress(psutil.Error):
                process.kill()
        psutil.wait_procs(processes, timeout=STOP_WAIT_S)
        shutil.rmtree(folder, ignore_errors=True)


def queue(env: dict[str, str]) -> list[str]:
    """squeue's lines for every job of the cluster ("ID STATE NAME")."""
    result = subprocess.run(
        ["squeue", "-h", "-o", "%i %T %j"], env=env, check=True, capture_output=True, text=True, timeout=30
    )
    return result.stdout.strip().splitlines()


@contextmanager
def running_cluster(nodes: int = 1) -> Iterator[dict[str, str]]:
    """slurm_cluster(), or the test skipped, saying why, where SLURM is not installed (make test installs it)."""
    missing = missing_programs()
    if missing:
        pytest.skip(f"SLURM is not installed here ({', '.join(missing)} not found): make test installs it with apt")
    with slurm_cluster(nodes) as env:
        yield env
