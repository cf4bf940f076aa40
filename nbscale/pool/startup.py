"""Starting a pool: plan its workers, launch them through the backend, accept their authenticated connections,
and join them into one torch.distributed group.

The kernel listens on a fresh port with a fresh 256-bit secret; every worker gets both in its WorkerConfig (on a
pipe), connects back, proves it holds the secret, and says hello (rank, pid, host, device). The listener closes
once every worker has connected. Then the workers meet in the group's store: a file in a fresh 0700 folder when
they all run on this machine, else a TCPStore that rank 0 opens on the address its backend names.
"""

from __future__ import annotations

import os
import secrets
import shutil
import stat
import sys
import tempfile
import time
from pathlib import Path

from nbscale.cluster_profiles import resolve_cluster
from nbscale.errors import PoolError, WorkerError
from nbscale.pool import protocol as p
from nbscale.pool.backends.base import Backend
from nbscale.pool.channel import Channel, ChannelListener, machine_id
from nbscale.pool.handles import WorkerHandle
from nbscale.pool.requests import Request, next_request_id
from nbscale.pool.routing import Router
from nbscale.pool.settings import PoolSettings
from nbscale.pool.waiting import pump, wait
from nbscale.processes import pid_running
from nbscale.trust import swappable_by_others

HELLO_TIMEOUT_S = 30.0
JOINING = "Joining the torch.distributed group"
# once a rank failed to join, the others wait for it until torch's own timeout (minutes): what else fails within
# this long is reported with it, then the start gives up
JOIN_FAILURE_GRACE_S = 1.0
GROUP_FOLDER_PREFIX = "nbscale-group-"  # + the kernel's pid + "-" + mkdtemp's random part, under $TMPDIR


def require_fork() -> None:
    """Pools need a POSIX system: workers are forked from a server process, and find each other through
    POSIX-only calls. Windows has none of it."""
    if not hasattr(os, "fork"):
        raise PoolError(
            f"Pools need Linux or macOS: this platform ({sys.platform}) cannot fork worker processes. Train in the "
            "notebook instead (%%train, nbscale.train), or run the notebook on Linux (WSL on Windows)."
        )


def make_backend(settings: PoolSettings) -> Backend:
    """The backend that starts this pool's workers: a Ray cluster (or a SLURM allocation running one) for
    `cluster`, else processes here."""
    if settings.cluster is not None and resolve_cluster(settings.cluster).backend == "slurm":
        from nbscale.pool.backends.slurm import SlurmBackend  # imports ray only for cluster pools

        return SlurmBackend(resolve_cluster(settings.cluster), settings.connect_timeout)
    if settings.cluster is not None:
        from nbscale.pool.backends.cluster import make_cluster_backend  # imports ray only for cluster pools

        return make_cluster_backend(settings.cluster, settings.connect_timeout)
    from nbscale.pool.backends.local import LocalBackend

    return LocalBackend()


def launch_workers(backend: Backend, settings: PoolSettings) -> tuple[list[WorkerHandle], int]:
    """Start the workers and wait until each connected: (handles by rank, connections refused meanwhile).

    Raises PoolError when the launcher exits or the backend's start_timeout passes first; the caller stops the
    backend.
    """
    secret = secrets.token_bytes(32)
    listener = ChannelListener(secret, host=backend.listen_host)
    try:
        specs = backend.plan(settings)
        configs = [
            p.WorkerConfig(
                kernel_address=(backend.kernel_host, listener.address[1]),
                secret=secret.hex(),
                rank=rank,
                world_size=len(specs),
                device=spec.device,
                kernel_machine_id=machine_id(),
                env=spec.env,
                threads=spec.threads,
            )
            for rank, spec in enumerate(specs)
        ]
        backend.start(configs)
        workers = _accept_workers(listener, backend, len(configs))
        for worker in workers:  # on a cluster, which node: several nodes may share one host name
            node = backend.node(worker.rank)
            if node:
                worker.host = f"{worker.host} ({node})"
        return workers, len(listener.refused)
    finally:
        listener.close()  # no connection is accepted after start


def _accept_workers(listener: ChannelListener, backend: Backend, count: int) -> list[WorkerHandle]:
    deadline = time.monotonic() + backend.start_timeout
    handles: dict[int, WorkerHandle] = {}
    while len(handles) < count:
        if time.monotonic() > deadline:
            raise PoolError(
                f"Only {len(handles)} of {count} workers connected within {backend.start_timeout:.0f} s."
                f"{_refused_note(listener)}"
            )
        if not backend.alive():
            raise PoolError(
                f"The workers' launcher ({backend.describe()}) exited before every worker connected "
                f"({len(handles)} of {count}); its error is on this process's stderr (the Jupyter server's log for "
                f"a kernel, job.log() for a batch job).{_refused_note(listener)}"
            )
        try:
            channel = listener.next_channel(timeout=0.25)
        except TimeoutError:
            continue
        handle = _hello(channel, count)
        if handle is None or handle.rank in handles:
            channel.close()
            continue
        handles[handle.rank] = handle
    return [handles[rank] for rank in sorted(handles)]


def _hello(channel: Channel, count: int) -> WorkerHandle | None:
    """The worker behind an authenticated channel, from its Hello (None: no valid Hello in time)."""
    if not channel.connection.poll(HELLO_TIMEOUT_S):
        return None
    try:
        hello = channel.recv()
    except Exception:  # a peer with the secret that sent no Hello: not one of ours
        return None
    if not isinstance(hello, p.Hello) or not 0 <= hello.rank < count:
        return None
    channel.same_machine = hello.machine_id == machine_id()
    return WorkerHandle(hello.rank, hello.pid, hello.host, hello.device, channel)


def _refused_note(listener: ChannelListener) -> str:
    refused = list(listener.refused)
    if not refused:
        return ""
    plural = len(refused) > 1
    return (
        f" Meanwhile {len(refused)} connection{'s' if plural else ''} to the pool's port {listener.address[1]} "
        f"{'were' if plural else 'was'} refused, not being from a worker ({refused[-1]}): another program connected "
        "to it."
    )


def remove_stale_group_folders() -> list[Path]:
    """Remove the store folders of this user's local pools whose kernel is gone (killed before it could); returns
    those removed. Only this user's own folders (no link followed) named with a pid that no process has."""
    removed = []
    for path in Path(tempfile.gettempdir()).glob(f"{GROUP_FOLDER_PREFIX}*-*"):
        pid = path.name[len(GROUP_FOLDER_PREFIX) :].partition("-")[0]
        try:
            status = os.lstat(path)
        except OSError:
            continue
        if (
            not pid.isdigit()
            or pid_running(int(pid))
            or not stat.S_ISDIR(status.st_mode)
            or status.st_uid != os.getuid()
        ):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def join_group(router: Router, backend: Backend) -> Path | None:
    """Form the torch.distributed group: NCCL (and gloo for CPU tensors) on GPU workers, gloo on CPU workers.

    Workers all on this machine meet through a store file in a fresh 0700 folder, returned: the caller removes
    it once the pool stops (the group's later subgroups meet there too). A cluster's workers meet at rank 0's
    TCPStore (None returned): torch gives that store no authentication, so docs/cluster.md asks for a private
    network.
    """
    workers = router.workers
    size = len(workers)
    group_backend = "cuda:nccl,cpu:gloo" if all(w.device.startswith("cuda") for w in workers) else "gloo"
    master_addr = backend.address(0)
    if all(worker.channel.same_machine for worker in workers):
        folder = Path(tempfile.mkdtemp(prefix=f"{GROUP_FOLDER_PREFIX}{os.getpid()}-"))  # 0700, a fresh random name
        try:
            swappable = swappable_by_others(folder)
            if swappable:  # they could swap the store, and so choose whom the workers connect to
                raise PoolError(
                    f"The pool's workers cannot meet in {folder}: {swappable}, who could replace the "
                    "group's store. Point TMPDIR (in the environment that starts the kernel) at a folder "
                    "only you can write to, or a sticky one like /tmp."
                )
            init = p.InitGroup(next_request_id(), group_backend, master_addr, 0, size, str(folder / "store"))
            request = router.send(init, tuple(range(size)), foreground=True)
            _wait_joined(router, request, group_backend)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        return folder
    found: dict[str, int] = {}
    init = p.InitGroup(next_request_id(), group_backend, master_addr, 0, size)
    request = router.send(init, (0,), foreground=True, on_event=lambda rank, event: found.update(event))
    while "store_port" not in found and not request.failures:
        pump(request, timeout=0.05)
    if request.failures:
        router.finish(request)
        raise _join_error(request.failures, group_backend)
    if size > 1:
        request.ranks = tuple(range(size))
        join = p.InitGroup(init.request_id, group_backend, master_addr, found["store_port"], size)
        router.send_to(join, range(1, size), request)
    _wait_joined(router, request, group_backend)
    return None


def _wait_joined(router: Router, request: Request, group_backend: str) -> None:
    """Wait for every rank of `request` (an InitGroup) to join; PoolError naming each rank's cause otherwise."""
    while request.waiting_for and not request.failures:
        pump(request, timeout=0.05)
    if request.failures:
        given_up_at = time.monotonic() + JOIN_FAILURE_GRACE_S
        while request.waiting_for and time.monotonic() < given_up_at:
            pump(request, timeout=0.05)
        router.finish(request)
        raise _join_error(request.failures, group_backend)
    try:
        wait(router, request, what=JOINING, restart=None)
    except WorkerError as error:
        raise _join_error(error.failures, group_backend) from None


def _join_error(failures: dict[int, str], group_backend: str) -> PoolError:
    """One line per distinct failure, naming its ranks: torch.distributed's own frames say nothing to the user,
    and the usual cause is the environment (a network interface named wrongly)."""
    ranks_by_cause: dict[str, list[int]] = {}
    for rank, text in sorted(failures.items()):
        ranks_by_cause.setdefault(text.strip().splitlines()[-1], []).append(rank)
    causes = "; ".join(
        f"rank{'s' if len(r) > 1 else ''} {', '.join(map(str, r))}: {cause}" for cause, r in ranks_by_cause.items()
    )
    return PoolError(
        f"{JOINING} ({group_backend}) failed, so no pool started. {causes}. If you set GLOO_SOCKET_IFNAME or "
        "NCCL_SOCKET_IFNAME (with --env, env=, or in the environment of the process starting the pool), check it "
        "names a network interface every worker's machine has."
    )
