"""Cluster benchmarks, in one run: a pool on a 4-CPU local Ray cluster vs the local pool vs plain Ray actors.

Measures the empty spmd round trip and a 64 MiB broadcast (`pool.push` of a tensor) on
- nbscale's Ray backend: `nbscale.Pool(4, cpu=True, cluster=...)` on a `ray start --head --num-cpus=4` on loopback,
- nbscale's local backend: `nbscale.Pool(4, cpu=True)`,
- plain Ray: 4 actors, a method call on each (round trip), and `ray.put` of the array + each actor getting it.
Plain Ray on one node hands the array over through its shared-memory object store (one copy in, mapped by each
actor), while nbscale sends it over its channel to each worker, on Ray as locally.

Run: `python bench/bench_cluster.py` (prints a markdown section). `bench/run_all.py` collects `run()`.
"""

from __future__ import annotations

import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # the local cluster stays on 127.0.0.1

import torch

import nbscale

WORKERS = 4
ROUND_TRIPS = 100
PUSH_REPEATS = 5
PUSH_BYTES = 64 * 2**20


def _seconds(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def _median_seconds(action: Callable[[], object], repeats: int) -> float:
    return statistics.median(_seconds(action) for _ in range(repeats))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _ray_cli() -> str:
    return shutil.which("ray", path=str(Path(sys.executable).parent)) or "ray"


def start_ray_head() -> str:
    """`ray start --head` with 4 CPUs on 127.0.0.1; returns its address."""
    port = _free_port()
    command = [
        _ray_cli(),
        "start",
        "--head",
        f"--port={port}",
        f"--num-cpus={WORKERS}",
        "--node-ip-address=127.0.0.1",
        "--include-dashboard=false",
        "--disable-usage-stats",
    ]
    subprocess.run(command, check=True, capture_output=True, timeout=180)
    return f"127.0.0.1:{port}"


def stop_ray_head() -> None:
    subprocess.run([_ray_cli(), "stop", "--force"], capture_output=True, timeout=60)


def measure_pool(payload: torch.Tensor, cluster: str | None) -> dict[str, float]:
    figures: dict[str, float] = {}
    started = time.perf_counter()
    pool = nbscale.Pool(WORKERS, cpu=True, cluster=cluster)
    try:
        figures["start"] = time.perf_counter() - started
        pool.spmd("pass")
        figures["round_trip"] = _median_seconds(lambda: pool.spmd("pass"), ROUND_TRIPS)
        figures["run_round_trip"] = _median_seconds(lambda: pool.run(int), ROUND_TRIPS)
        pool.push(payload=payload)
        figures["push"] = _median_seconds(lambda: pool.push(payload=payload), PUSH_REPEATS)
    finally:
        pool.close()
    return figures


class _Holder:
    """A plain Ray actor: an empty method, and one that receives an array."""

    def ping(self) -> None:
        return None

    def take(self, array) -> int:
        return int(array.nbytes)


def measure_plain_ray(payload: torch.Tensor) -> dict[str, float]:
    import ray

    figures: dict[str, float] = {}
    actor_class = ray.remote(num_cpus=1)(_Holder)
    started = time.perf_counter()
    actors = [actor_class.remote() for _ in range(WORKERS)]
    ray.get([actor.ping.remote() for actor in actors])
    figures["start"] = time.perf_counter() - started
    figures["round_trip"] = _median_seconds(lambda: ray.get([actor.ping.remote() for actor in actors]), ROUND_TRIPS)
    array = payload.numpy()

    def broadcast() -> None:
        reference = ray.put(array)
        ray.get([actor.take.remote(reference) for actor in actors])

    broadcast()
    figures["push"] = _median_seconds(broadcast, PUSH_REPEATS)
    for actor in actors:
        ray.kill(actor)
    return figures


def run() -> str:
    """Measure the three side by side and return the markdown section with ratios."""
    import ray

    payload = torch.randn(PUSH_BYTES // 4)
    address = start_ray_head()
    try:
        on_ray = measure_pool(payload, cluster=address)  # connects this process to the cluster as its driver
        plain = measure_plain_ray(payload)
    finally:
        ray.shutdown()
        stop_ray_head()
    local = measure_pool(payload, cluster=None)

    def ms(seconds: float) -> str:
        return f"{seconds * 1e3:.2f} ms"

    rows = [
        (
            "start 4 workers (until ready)",
            f"{on_ray['start']:.2f} s",
            f"{local['start']:.2f} s",
            f"{plain['start']:.2f} s (4 actors, no torch)",
            f"Ray pool {on_ray['start'] / local['start']:.1f}x local pool",
        ),
        (
            "empty spmd round trip, 4 workers (median)",
            ms(on_ray["round_trip"]),
            ms(local["round_trip"]),
            f"{ms(plain['round_trip'])} (a method call on each)",
            f"Ray pool {on_ray['round_trip'] / local['round_trip']:.2f}x local pool, "
            f"{on_ray['round_trip'] / plain['round_trip']:.2f}x plain Ray",
        ),
        (
            "`pool.run(int)` round trip, 4 workers (median)",
            ms(on_ray["run_round_trip"]),
            ms(local["run_round_trip"]),
            "-",
            f"Ray pool {on_ray['run_round_trip'] / local['run_round_trip']:.2f}x local pool",
        ),
        (
            "64 MiB broadcast to 4 workers (median)",
            ms(on_ray["push"]),
            ms(local["push"]),
            f"{ms(plain['push'])} (`ray.put` + 4 actors get it)",
            f"Ray pool {on_ray['push'] / local['push']:.2f}x local pool, "
            f"{on_ray['push'] / plain['push']:.2f}x plain Ray; "
            f"Ray pool {WORKERS * PUSH_BYTES / on_ray['push'] / 1e9:.1f} GB/s over 4 copies",
        ),
    ]
    lines = [
        "## Cluster (issue 6): pool on a 4-CPU local Ray cluster vs local pool vs plain Ray actors, same run",
        "",
        "| measure | nbscale pool on Ray | nbscale local pool | plain Ray actors | ratio |",
        "| --- | --- | --- | --- | --- |",
        *(f"| {a} | {b} | {c} | {d} | {e} |" for a, b, c, d, e in rows),
        "",
        "All three run their workers on this machine (loopback, the Ray head's own processes sharing the cores). "
        "Plain Ray copies the array once into its shared-memory object store and each actor maps it; nbscale "
        "sends it over its channel to each worker, on Ray as locally.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(run())
