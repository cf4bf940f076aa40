"""What a local pool listens on (loopback only), and that strangers connecting during start stop nothing."""

from __future__ import annotations

import ipaddress
import socket
import threading
import time

import psutil

import nbscale


def _listening(pid: int) -> list[tuple[str, int]]:
    return [(c.laddr.ip, c.laddr.port) for c in psutil.Process(pid).net_connections("inet") if c.status == "LISTEN"]


def test_a_local_pool_listens_on_loopback_only():
    with nbscale.Pool(2, cpu=True) as pool:
        pool.spmd("total = allreduce(rank)")  # the group's store and gloo's sockets are all up
        sockets = {worker.rank: _listening(worker.pid) for worker in pool.workers}
        sockets["kernel"] = _listening(psutil.Process().pid)
    assert sockets[0], "rank 0 serves the torch.distributed store"
    exposed = {who: [(ip, port) for ip, port in found if not ipaddress.ip_address(ip).is_loopback]
               for who, found in sockets.items()}
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
        except Exception as error:  # noqa: BLE001 - the test reports it
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
