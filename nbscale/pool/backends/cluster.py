"""Workers on a Ray cluster: one Ray actor per worker (holding its GPU), each running the normal worker.

The actor only launches `python -m nbscale.pool.worker` beside itself (with the GPU Ray gave it) and watches
it; the worker connects back to the kernel's authenticated listener exactly as a local worker does, so
spmd cells, futures and training behave the same. Ray kills the actors when the kernel (the driver) exits,
and each worker exits when its channel to the kernel closes.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from typing import Any

from nbscale.errors import PoolError
from nbscale.pool.backends.base import Backend
from nbscale.pool.channel import ChannelListener, machine_id
from nbscale.pool.devices import MAX_DEFAULT_CPU_WORKERS
from nbscale.pool.profiles import ClusterProfile, resolve_cluster

CONNECT_TIMEOUT_S = 30.0


def make_cluster_backend(cluster: str, settings: dict[str, Any]) -> Backend:
    """The backend a --cluster value names (a profile or an address)."""
    profile = resolve_cluster(cluster)
    return RayBackend(profile, settings)


class _Launcher:
    """Ray actor body: starts one worker process and reports where it runs."""

    def __init__(self) -> None:
        self.process: Any = None

    def launch(self, config: dict[str, Any]) -> tuple[str, int]:
        import subprocess
        import sys

        import ray

        environment = {**os.environ, **config.pop("env", {}), "PYTHONUNBUFFERED": "1"}
        if config["device"] == "cpu":
            environment["CUDA_VISIBLE_DEVICES"] = ""
        self.process = subprocess.Popen([sys.executable, "-m", "nbscale.pool.worker"], stdin=subprocess.PIPE, env=environment)
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(config).encode() + b"\n")
        self.process.stdin.close()
        return ray.util.get_node_ip_address(), self.process.pid

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


class RayBackend(Backend):
    """Starts workers as Ray actors on the cluster at `profile.address`."""

    name = "ray"

    def __init__(self, profile: ClusterProfile, settings: dict[str, Any]) -> None:
        self.profile = profile
        self.settings = settings
        self.actors: list[Any] = []
        self.node_addresses: list[str] = []
        self._connect()
        self.kernel_address = self._kernel_address()
        self.listen_host = "127.0.0.1" if self.kernel_address.startswith("127.") else "0.0.0.0"

    def _connect(self) -> None:
        import ray

        if ray.is_initialized():
            return
        outcome: dict[str, Any] = {}

        def initialise() -> None:
            try:
                ray.init(
                    address=self.profile.address,
                    runtime_env=self.profile.runtime_env or None,
                    log_to_driver=False,
                    logging_level="ERROR",
                )
            except Exception as error:  # noqa: BLE001 - reported below
                outcome["error"] = error

        thread = threading.Thread(target=initialise, daemon=True)
        thread.start()
        thread.join(CONNECT_TIMEOUT_S)
        if thread.is_alive() or "error" in outcome:
            reason = f": {outcome['error']}" if "error" in outcome else f" within {CONNECT_TIMEOUT_S:.0f} s"
            raise PoolError(
                f"Could not reach the Ray cluster at {self.profile.address}{reason}. Check that its head is running "
                "(`ray status` there) and that this machine can reach the address."
            )

    def _kernel_address(self) -> str:
        import ray

        return ray.util.get_node_ip_address()

    def _worker_count_and_gpus(self) -> tuple[int, float]:
        import ray

        resources = ray.cluster_resources()
        gpus_per_worker = self.profile.gpus_per_worker
        if self.settings.get("cpu"):
            gpus_per_worker = 0
        elif not gpus_per_worker and resources.get("GPU", 0) >= 1:
            gpus_per_worker = 1
        n = self.settings.get("n")
        if n is None:
            n = int(resources.get("GPU", 0) // gpus_per_worker) if gpus_per_worker else MAX_DEFAULT_CPU_WORKERS
        if n < 1:
            raise PoolError(f"A pool needs at least one worker, not {n!r}: use %pool start N with N >= 1.")
        if gpus_per_worker and n * gpus_per_worker > resources.get("GPU", 0):
            raise PoolError(
                f"{n} workers with {gpus_per_worker:g} GPU each need {n * gpus_per_worker:g} GPUs, but the Ray cluster at "
                f"{self.profile.address} has {resources.get('GPU', 0):g}. Ask for fewer workers, or add --cpu."
            )
        if n > resources.get("CPU", 0):
            raise PoolError(
                f"{n} workers need {n} CPUs, but the Ray cluster at {self.profile.address} has "
                f"{resources.get('CPU', 0):g}. Ask for fewer workers."
            )
        return n, gpus_per_worker

    def plan_workers(self, listener: ChannelListener, secret: bytes) -> list[dict[str, Any]]:
        """One worker config per actor; they connect to the kernel's address as seen from the cluster."""
        n, gpus_per_worker = self._worker_count_and_gpus()
        self.gpus_per_worker = gpus_per_worker
        env = {**self.profile.env, **self.settings.get("env", {})}
        return [
            {
                "address": [self.kernel_address, listener.address[1]],
                "secret": secret.hex(),
                "rank": rank,
                "world_size": n,
                "device": "cuda:0" if gpus_per_worker else "cpu",
                "kernel_machine_id": machine_id(),
                "env": env,
                "threads": None if gpus_per_worker else 1,
            }
            for rank in range(n)
        ]

    def start(self, worker_configs: list[dict[str, Any]]) -> None:
        import ray

        actor_class = ray.remote(num_cpus=1, num_gpus=self.gpus_per_worker)(_Launcher)
        self.actors = [actor_class.remote() for _ in worker_configs]
        launched = [actor.launch.remote(dict(config)) for actor, config in zip(self.actors, worker_configs, strict=True)]
        ready, _ = ray.wait(launched, num_returns=len(launched), timeout=CONNECT_TIMEOUT_S)
        if len(ready) < len(launched):
            self.stop()
            raise PoolError(
                f"Only {len(ready)} of {len(launched)} Ray actors started within {CONNECT_TIMEOUT_S:.0f} s: the cluster "
                "may lack free CPUs/GPUs for them. See `ray status`."
            )
        self.node_addresses = [address for address, _pid in ray.get(launched)]

    def stop(self) -> None:
        import ray

        if not self.actors or not ray.is_initialized():
            return
        try:
            ray.get([actor.kill.remote() for actor in self.actors], timeout=5)
        except Exception:  # noqa: BLE001 - an actor already gone is fine
            pass
        for actor in self.actors:
            ray.kill(actor)
        self.actors = []

    def alive(self) -> bool:
        return True  # a worker that dies is noticed through its channel

    def kill_worker(self, rank: int, pid: int) -> None:
        import ray

        if rank < len(self.actors):
            ray.get(self.actors[rank].kill.remote(), timeout=5)

    def master_address(self, master: Any) -> str:
        """rank 0's node address, which every worker can reach for the torch.distributed store."""
        return self.node_addresses[master.rank] if self.node_addresses else socket.gethostbyname(master.host)

    def describe(self) -> str:
        return f"ray at {self.profile.address}"
