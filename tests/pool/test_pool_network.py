"""What a local pool listens on (loopback only, and no rendezvous store), and that strangers connecting stop nothing."""

from __future__ import annotations

import glob
import ipaddress
import os
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest

import nbscale


def _listening(pid: int) -> list[tuple[str, int]]:
    return [(c.laddr.ip, c.laddr.port) for c in psutil.Process(pid).net_connections("inet") if c.status == "LISTEN"]


def test_a_local_pool_listens_on_loopback_only():
    with nbscale.Pool(2, cpu=True) as pool:
        pool.spmd("total = allreduce(rank)")  # the group's store and gloo's sockets are all up
        sockets = {worker.rank: _listening(worker.pid) for worker in pool.workers}
        sockets["kernel"] = _listening(psutil.Process().pid)
    assert sockets[0], "gloo listens on every worker"
    exposed = {
        who: [(ip, port) for ip, port in found if not ipaddress.ip_address(ip).is_loopback]
        for who, found in sockets.items()
    }
    assert exposed == {0: [], 1: [], "kernel": []}, sockets


def _new_listening_port(before: set[tuple[str, int]], timeout: float = 60.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        new = set(_listening(psutil.Process().pid)) - before
        if new:
            return next(iter(new))[1]
        time.sleep(0.005)
    raise AssertionError("the pool's listener never appeared")


def test_idle_and_garbage_connections_during_start_do_not_stop_it():
    before = set(_listening(psutil.Process().pid))
    outcome: dict = {}

    def start() -> None:
        try:
            outcome["pool"] = nbscale.Pool(2, cpu=True)
        except Exception as error:  # the test reports it
            outcome["error"] = error

    starter = threading.Thread(target=start)
    starter.start()
    port = _new_listening_port(before)
    strangers = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]  # connect and say nothing
    garbage = socket.create_connection(("127.0.0.1", port))
    garbage.sendall(b"GET / HTTP/1.0\r\n\r\n")
    starter.join(90)
    for peer in [*strangers, garbage]:
        peer.close()
    pool = outcome.get("pool")
    try:
        assert "error" not in outcome, outcome.get("error")
        assert pool is not None and pool.size == 2
        assert pool.rejected_connections >= 1  # the garbage was refused as what it was
        assert pool.run(lambda: "ready") == ["ready", "ready"]
    finally:
        if pool is not None:
            pool.close()


_STORE_PROBE = """
import sys
from datetime import timedelta

import torch.distributed as dist

store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=False, timeout=timedelta(seconds=3))
store.set("planted-by-another-process", "x")
print("reached")
"""


def _answers_as_a_store(port: int) -> bool:
    """Whether another process can connect to `port` as a TCPStore client and write a key (one that is no store
    errs or never answers)."""
    try:
        probe = subprocess.run(
            [sys.executable, "-c", _STORE_PROBE, str(port)], capture_output=True, text=True, timeout=30
        )
    except subprocess.TimeoutExpired:
        return False
    return probe.stdout.strip() == "reached"


@pytest.mark.slow
def test_no_other_process_can_reach_a_local_pools_rendezvous_store():
    # torch's TCPStore has no authentication: whoever reaches it could rewrite the addresses the workers connect
    # to, then feed them pickles. A local pool meets in a private file instead, so no port answers as a store.
    # this process's own group folders only: other pools on the machine (a notebook, another test run) meet too
    ours = os.path.join(tempfile.gettempdir(), f"nbscale-group-{os.getpid()}-*")
    before = set(glob.glob(ours))
    with nbscale.Pool(3, cpu=True) as pool:
        assert pool.spmd("total = allreduce(rank)")["total"][:] == [3, 3, 3]
        ports = sorted({port for worker in pool.workers for _, port in _listening(worker.pid)})
        with ThreadPoolExecutor(len(ports)) as probes:  # a port that is no store may hang its probe to the timeout
            reached = [port for port, store in zip(ports, probes.map(_answers_as_a_store, ports), strict=True) if store]
        assert reached == [], f"the workers' ports {reached} answered as a torch.distributed store"
        (folder,) = set(glob.glob(ours)) - before
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
        assert pool.spmd("total = allreduce(rank)")["total"][:] == [3, 3, 3]  # the probe disturbed nothing
        assert pool.spmd("part = allreduce(rank)", targets=[0, 2])["part"][:] == [2, 2]  # a subgroup meets there too
    assert not os.path.exists(folder), "the store's folder outlived the pool"


_START_WITH_TMPDIR = """
import nbscale
from nbscale.errors import PoolError

try:
    nbscale.Pool(1, cpu=True).close()
    print("started")
except PoolError as error:
    print(error)
"""


@pytest.mark.slow
def test_a_pool_refuses_to_meet_in_a_tmpdir_others_could_swap(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # no sticky bit: anyone could rename the group's folder and put theirs in its place
    environment = {**os.environ, "TMPDIR": str(shared)}
    said = subprocess.run(
        [sys.executable, "-c", _START_WITH_TMPDIR],
        capture_output=True,
        text=True,
        timeout=180,
        env=environment,
        cwd=os.path.dirname(nbscale.__path__[0]),
    ).stdout
    assert said.startswith(f"The pool's workers cannot meet in {shared}/nbscale-group-"), said
    assert f"the folder {shared} above it can be written by other users" in said and "Point TMPDIR" in said
    assert os.listdir(shared) == []  # nothing left behind
    shared.chmod(0o1777)  # sticky, like /tmp: others cannot rename what is the user's
    said = subprocess.run(
        [sys.executable, "-c", _START_WITH_TMPDIR],
        capture_output=True,
        text=True,
        timeout=180,
        env=environment,
        cwd=os.path.dirname(nbscale.__path__[0]),
    ).stdout
    assert said.strip().endswith("started"), said


_KILLED_KERNEL = """
import os
import signal

import nbscale

pool = nbscale.Pool(1, cpu=True)
print(os.getpid(), flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # no close(), no atexit: as a kernel killed by the OOM killer
"""


@pytest.mark.slow
def test_the_store_folder_of_a_killed_kernels_pool_is_removed_at_the_next_pool_start(tmp_path, monkeypatch):
    # a temp folder of this test's own: a pool started elsewhere on the machine (another test process, a notebook)
    # would clean the shared one's stale folders first
    temporary = tmp_path / "tmp"
    temporary.mkdir(mode=0o700)
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    killed = subprocess.run(
        [sys.executable, "-c", _KILLED_KERNEL],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=os.path.dirname(nbscale.__path__[0]),
        env={**os.environ, "TMPDIR": str(temporary)},
    )
    (left,) = temporary.glob(f"nbscale-group-{int(killed.stdout)}-*")
    alive = tempfile.mkdtemp(prefix=f"nbscale-group-{os.getpid()}-")  # a live kernel's: kept
    link = temporary / "nbscale-group-999999999-link"  # no pid has that number; a link is no folder
    target = tmp_path / "target"
    target.mkdir()
    link.symlink_to(target)
    with nbscale.Pool(1, cpu=True):
        pass
    assert not left.exists()
    assert os.path.isdir(alive) and link.is_symlink() and target.is_dir()
