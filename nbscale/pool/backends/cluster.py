"""Workers on a Ray cluster: one Ray actor per worker (holding its GPU), each running the normal worker.

The actor only launches `python -m nbscale.pool.worker` beside itself (with the GPU Ray gave it) and watches
it; the worker connects back to the kernel's authenticated listener exactly as a local worker does, so
spmd cells, futures and training behave the same. Ray kills the actors when the kernel (the driver) exits;
each worker exits when its channel to the kernel closes, and dies with its actor (a node lost takes its workers
along, and the kernel learns how from the actor: `exit_status`).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from nbscale.cluster_profiles import ClusterProfile, resolve_cluster
from nbscale.errors import PoolError
from nbscale.pool.backends.base import Backend, WorkerSpec
from nbscale.pool.devices import MAX_DEFAULT_CPU_WORKERS
from nbscale.pool.health import returncode_description
from nbscale.pool.protocol import WorkerConfig
from nbscale.pool.settings import PoolSettings

# Reaching a cluster (Ray client's handshake, a fresh server process on the head) takes well over 30 s on a loaded
# machine; an address that cannot answer still fails at once or within this bound.
DEFAULT_CONNECT_TIMEOUT_S = 120.0
EXIT_STATUS_TIMEOUT_S = 3.0
REACHABLE_TIMEOUT_S = 10.0  # the TCP handshake with the head: the OS answers it even when the head is busy


@dataclass
class _Connection:
    """The Ray connection nbscale made in this process: (the address it was given, _connection_id()). A later pool
    on the same cluster reuses it, a pool on another cluster replaces it (Ray holds one connection per process); the
    id tells it from a connection the notebook made itself after a ray.shutdown()."""

    made: tuple[str, tuple[str | None, str | None]] | None = None


_connection = _Connection()


def make_cluster_backend(cluster: str, connect_timeout: float | None = None) -> Backend:
    """The backend a --cluster value names (a profile or an address); `connect_timeout` (seconds) overrides the
    profile's, which overrides DEFAULT_CONNECT_TIMEOUT_S."""
    profile = resolve_cluster(cluster)
    return RayBackend(profile, connect_timeout or profile.connect_timeout or DEFAULT_CONNECT_TIMEOUT_S)


class _Launcher:
    """Ray actor body: starts one worker process and reports where it runs."""

    def __init__(self) -> None:
        self.process: Any = None

    def launch(self, config: dict[str, Any]) -> tuple[str, int, str]:
        """Start the worker with `config` (a WorkerConfig's JSON) on its stdin; returns (node address, pid, node id)."""
        import subprocess
        import sys

        import ray

        environment = {**os.environ, **config["env"], "PYTHONUNBUFFERED": "1"}
        if config["device"] == "cpu":
            environment["CUDA_VISIBLE_DEVICES"] = ""
        self.process = subprocess.Popen(
            [sys.executable, "-m", "nbscale.pool.worker"], stdin=subprocess.PIPE, env=environment
        )
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(config).encode() + b"\n")
        self.process.stdin.close()
        return ray.util.get_node_ip_address(), self.process.pid, ray.get_runtime_context().get_node_id()

    def exit_status(self) -> int | None:
        """The worker's returncode (negative: the signal that killed it), None while it runs."""
        import subprocess

        if self.process is None:
            return None
        try:
            return cast(int, self.process.wait(timeout=1))
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


class RayBackend(Backend):
    """Starts workers as Ray actors on the cluster at `profile.address`."""

    name = "ray"

    def __init__(self, profile: ClusterProfile, connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S) -> None:
        self.profile = profile
        self.connect_timeout = connect_timeout
        self.start_timeout = max(self.start_timeout, connect_timeout)  # --connect-timeout covers the actors' start
        self.actors: list[Any] = []
        self.node_addresses: list[str] = []
        self.node_ids: list[str] = []
        self.gpus_per_worker: float = 0
        self._connect()
        self.kernel_host = self._kernel_address()
        # the kernel's listener must be reachable from the cluster's nodes (it only accepts peers with the secret)
        self.listen_host = "127.0.0.1" if self.kernel_host.startswith("127.") else "0.0.0.0"

    def _connect(self) -> None:
        import ray

        if ray.is_initialized():
            made = _connection.made
            made_here = made[0] if made is not None and made[1] == _connection_id() else None
            if self.profile.address in (_gcs_address(), made_here):
                return
            if made_here is None:
                raise PoolError(
                    "This process is already connected to a Ray cluster (a ray.init before the pool), so a pool "
                    f"cannot start on {self.profile.address}. Pass that cluster's address to --cluster, or call "
                    "ray.shutdown() first."
                )
            ray.shutdown()  # the last pool's cluster: only one pool runs at a time, and it has stopped
            _connection.made = None
        self._check_reachable()
        outcome: dict[str, Any] = {}
        deadline = time.monotonic() + self.connect_timeout

        def initialise() -> None:
            while True:
                try:
                    ray.init(
                        address=self.profile.address,
                        runtime_env=self.profile.runtime_env or None,
                        log_to_driver=False,
                        logging_level=logging.ERROR,
                    )
                    return
                except ConnectionError as error:  # Ray client gave up its own retries (about 30 s): try again in time
                    if time.monotonic() > deadline - 5:
                        outcome["error"] = error
                        return
                except Exception as error:  # reported below
                    outcome["error"] = error
                    return

        thread = threading.Thread(target=initialise, daemon=True)
        thread.start()
        thread.join(self.connect_timeout)
        if thread.is_alive() or "error" in outcome:
            reason = f": {outcome['error']}" if "error" in outcome else f" within {self.connect_timeout:.0f} s"
            raise PoolError(
                f"Could not reach the Ray cluster at {self.profile.address}{reason}. Check that its head is running "
                "(`ray status` there) and that this machine can reach the address; on a slow or loaded network allow "
                "longer with --connect-timeout SECONDS (connect_timeout in the profile)."
            )
        _connection.made = (self.profile.address, _connection_id())

    def _check_reachable(self) -> None:
        """Fail at once where nothing listens at the address (Ray itself would retry until the timeout)."""
        address = self.profile.address.removeprefix("ray://")
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            return  # "auto", or a form Ray resolves itself
        try:
            socket.create_connection(
                (host.strip("[]"), int(port)), timeout=min(REACHABLE_TIMEOUT_S, self.connect_timeout)
            ).close()
        except OSError as error:
            raise PoolError(
                f"Could not reach the Ray cluster at {self.profile.address}: {error.strerror or error}. Check that its "
                "head is running (`ray status` there) and that this machine can reach the address and port."
            ) from None

    def _kernel_address(self) -> str:
        import ray

        return cast(str, ray.util.get_node_ip_address())

    def _worker_count_and_gpus(self, settings: PoolSettings) -> tuple[int, float]:
        import ray

        resources = ray.cluster_resources()
        gpus_per_worker = self.profile.gpus_per_worker
        if settings.cpu:
            gpus_per_worker = 0
        elif not gpus_per_worker and resources.get("GPU", 0) >= 1:
            gpus_per_worker = 1
        n = settings.n
        if n is None:
            cpu_workers = min(int(resources.get("CPU", 0)), MAX_DEFAULT_CPU_WORKERS)  # as a local pool: at most 4
            n = int(resources.get("GPU", 0) // gpus_per_worker) if gpus_per_worker else cpu_workers
        if n < 1:
            raise PoolError(f"A pool needs at least one worker, not {n!r}: use %pool start N with N >= 1.")
        if gpus_per_worker and n * gpus_per_worker > resources.get("GPU", 0):
            raise PoolError(
                f"{n} workers with {gpus_per_worker:g} GPU each need {n * gpus_per_worker:g} GPUs, but the Ray "
                f"cluster at {self.profile.address} has {resources.get('GPU', 0):g}. Ask for fewer workers, or add "
                "--cpu."
            )
        if n > resources.get("CPU", 0):
            raise PoolError(
                f"{n} workers need {n} CPUs, but the Ray cluster at {self.profile.address} has "
                f"{resources.get('CPU', 0):g}. Ask for fewer workers."
            )
        return n, gpus_per_worker

    def plan(self, settings: PoolSettings) -> list[WorkerSpec]:
        """One worker per Ray actor, with the profile's env under the pool's own --env (PoolSettings refused
        --gpus for a cluster pool already)."""
        n, self.gpus_per_worker = self._worker_count_and_gpus(settings)
        env = {**self.profile.env, **settings.env}
        device = "cuda:0" if self.gpus_per_worker else "cpu"
        return [WorkerSpec(device=device, env=env, threads=None if self.gpus_per_worker else 1) for _ in range(n)]

    def start(self, configs: Sequence[WorkerConfig]) -> None:
        import ray

        actor_class = ray.remote(num_cpus=1, num_gpus=self.gpus_per_worker)(_Launcher)
        self.actors = [actor_class.remote() for _ in configs]
        launched = [actor.launch.remote(config.to_json()) for actor, config in zip(self.actors, configs, strict=True)]
        ready, _ = ray.wait(launched, num_returns=len(launched), timeout=self.connect_timeout)
        if len(ready) < len(launched):
            free = _free_resources(self.gpus_per_worker)  # before stop() gives back what the started actors hold
            self.stop()
            raise PoolError(
                f"Only {len(ready)} of {len(launched)} Ray actors started within {self.connect_timeout:.0f} s "
                f"(--connect-timeout): {free} besides them. Another pool or Ray job may hold the "
                "rest (see `ray status`): wait for it, or ask for fewer workers."
            )
        placed = ray.get(launched)
        self.node_addresses = [address for address, _pid, _node in placed]
        self.node_ids = [node for _address, _pid, node in placed]

    def stop(self) -> None:
        import ray

        if not self.actors or not ray.is_initialized():
            return
        try:
            ray.get([actor.kill.remote() for actor in self.actors], timeout=5)
        except Exception:  # an actor already gone is fine
            pass
        for actor in self.actors:
            ray.kill(actor)
        self.actors = []

    def alive(self) -> bool:
        return True  # a worker that dies is noticed through its channel

    def exit_status(self, rank: int, pid: int) -> str | None:
        """From the worker's actor: its process's exit, or that the actor itself (its node) is gone."""
        import ray

        if rank >= len(self.actors):
            return None
        try:
            returncode = ray.get(self.actors[rank].exit_status.remote(), timeout=EXIT_STATUS_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            return None
        except ray.exceptions.ActorUnavailableError:
            return f"went with its Ray actor, which cannot be reached: its {self.node(rank)} is down or unreachable"
        except ray.exceptions.RayActorError as error:
            return f"went with its Ray actor on {self.node(rank)}, which died ({_first_line(error)})"
        return None if returncode is None else returncode_description(returncode)

    def node(self, rank: int) -> str | None:
        if rank >= len(self.node_ids):
            return None
        return f"node {self.node_ids[rank][:8]} at {self.node_addresses[rank]}"

    def address(self, rank: int) -> str:
        """The node address of worker `rank` (as Ray reports it), which every worker can reach."""
        return self.node_addresses[rank]

    def describe(self) -> str:
        return f"ray at {self.profile.address}"


def disconnect() -> None:
    """End this process's Ray connection (before its cluster goes away: a driver whose cluster vanished is ended by
    Ray after a while)."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    _connection.made = None


def _free_resources(gpus_per_worker: float) -> str:
    """'the Ray cluster has 1 of its 3 CPUs free' (and its GPUs, for GPU workers), as Ray counts them now."""
    import ray

    total, free = ray.cluster_resources(), ray.available_resources()
    kinds = ("CPU", "GPU") if gpus_per_worker else ("CPU",)
    return "the Ray cluster has " + " and ".join(
        f"{free.get(kind, 0):g} of its {total.get(kind, 0):g} {kind}s free" for kind in kinds
    )


def _connection_id() -> tuple[str | None, str | None]:
    """(GCS address, Ray's job id) of this process's Ray connection: every ray.init gets a new job id from its
    cluster. None for what Ray does not say (then connections are told apart by what it does)."""
    import ray

    try:
        job_id: str | None = ray.get_runtime_context().get_job_id()
    except Exception:  # an older or client connection may not say
        job_id = None
    return _gcs_address(), job_id


def _gcs_address() -> str | None:
    """HOST:PORT of the cluster a driver connection (not a ray:// client) goes to; None where Ray does not say."""
    import ray

    try:
        return cast("str | None", ray.get_runtime_context().gcs_address)
    except Exception:  # a Ray client connection has no GCS address here
        return None


def _first_line(error: BaseException) -> str:
    """Ray's actor errors run to many lines; the first says what happened."""
    text = str(getattr(error, "error_msg", "") or error).strip()
    return text.splitlines()[0] if text else type(error).__name__
