"""Workers as processes on this machine, forked from a forkserver that imported torch once.

Everything a local pool listens on is bound to loopback: the kernel's listener, rank 0's torch.distributed store,
and gloo's and NCCL's own sockets (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME name the loopback interface unless the
user set them).
"""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Mapping, Sequence

from nbscale.cpus import available_cpus
from nbscale.gpu_reservations import GpuReservation
from nbscale.pool.backends.base import Backend, WorkerSpec
from nbscale.pool.backends.forkserver_process import ForkserverProcess, start_forkserver
from nbscale.pool.devices import reserve_devices
from nbscale.pool.forkserver import CLOSE
from nbscale.pool.health import exit_description
from nbscale.pool.protocol import WorkerConfig
from nbscale.pool.settings import PoolSettings

LOOPBACK = "127.0.0.1"
EXIT_REPORT_WAIT_S = 3.0  # a worker's connection closes a moment before the forkserver reaps it (longer when busy)


class LocalBackend(Backend):
    """Starts a forkserver (backends/forkserver_process.py) and hands it every worker's config on its pipe."""

    name = "local"
    listen_host = LOOPBACK
    kernel_host = LOOPBACK

    def __init__(self) -> None:
        self._forkserver: ForkserverProcess | None = None
        self._gpus: GpuReservation | None = None  # held from plan() until stop()
        self._exits: dict[int, int] = {}  # pid -> wait status, as the forkserver reports them
        self._exits_changed = threading.Condition()
        self._started = False  # whether the forkserver has its workers' configs

    def plan(self, settings: PoolSettings) -> list[WorkerSpec]:
        plan = reserve_devices(settings.n, settings.gpus, settings.cpu, settings.force)
        self._gpus, devices = plan.reservation, plan.devices
        cpu_threads = max(1, available_cpus() // len(devices))
        loopback = _loopback_sockets_env(settings.env)
        return [
            WorkerSpec(
                device="cuda:0" if gpu is not None else "cpu",
                env={**loopback, **settings.env, "CUDA_VISIBLE_DEVICES": gpu if gpu is not None else ""},
                threads=None if gpu is not None else cpu_threads,
            )
            for gpu in devices
        ]

    def prepare(self) -> None:
        """Start the forkserver (forked from the zygote, or importing torch while the kernel gets on); its workers
        come with `start`."""
        if self._forkserver is not None:
            return
        status_read, status_write = os.pipe()
        try:
            self._forkserver = start_forkserver(status_write)
        except BaseException:
            os.close(status_read)
            raise
        finally:
            os.close(status_write)  # the forkserver holds its own copy
        threading.Thread(
            target=self._read_exits, args=(status_read,), name="nbscale-forkserver-exits", daemon=True
        ).start()

    def start(self, configs: Sequence[WorkerConfig]) -> None:
        self.prepare()
        assert self._forkserver is not None
        # configs hold the pool secret and --env values: they travel on the pipe, never on a command line
        self._forkserver.send(json.dumps({"workers": [config.to_json() for config in configs]}) + "\n")
        self._started = True

    def _read_exits(self, descriptor: int) -> None:
        """Collect the forkserver's reports of ended workers until it exits."""
        with open(descriptor, "rb") as reports:
            for line in reports:
                try:
                    report = json.loads(line)
                    pid, status = int(report["pid"]), int(report["status"])
                except (ValueError, KeyError, TypeError):
                    continue
                with self._exits_changed:
                    self._exits[pid] = status
                    self._exits_changed.notify_all()

    def exit_status(self, rank: int, pid: int) -> str | None:
        with self._exits_changed:
            self._exits_changed.wait_for(lambda: pid in self._exits, timeout=EXIT_REPORT_WAIT_S)
            status = self._exits.get(pid)
        return None if status is None else exit_description(status)

    def stop(self) -> None:
        try:
            self._stop_forkserver()
        finally:  # the GPUs are free once the workers on them are gone
            if self._gpus is not None:
                self._gpus.release()

    def _stop_forkserver(self) -> None:
        if self._forkserver is None:
            return
        if not self._started:  # prepared but never used: no worker to take down with it
            self._forkserver.kill()
        if self._started:  # said, so it does not wait for this kernel's end to remove its files
            try:
                self._forkserver.send(CLOSE)
            except OSError:
                pass  # it is gone already
        self._forkserver.close_requests()  # the forkserver kills its workers and exits
        if not self._forkserver.wait(timeout=2):
            self._forkserver.kill()
        self._forkserver = None

    def alive(self) -> bool:
        return self._forkserver is not None and self._forkserver.running()

    def address(self, rank: int) -> str:
        return LOOPBACK


def _loopback_sockets_env(user_env: Mapping[str, str]) -> dict[str, str]:
    """GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME naming the loopback interface, where neither the user's --env
    nor the kernel's environment sets them (gloo otherwise binds the address the host name resolves to)."""
    interface = next((name for _, name in socket.if_nameindex() if name in ("lo", "lo0")), None)
    if interface is None:
        return {}
    return {
        variable: interface
        for variable in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
        if variable not in user_env and variable not in os.environ
    }
