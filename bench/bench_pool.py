"""Pool benchmarks, side by side with ipyparallel in one run: start, round trip, 64 MiB push, stop.

Run: `python bench/bench_pool.py` (prints a markdown section). `bench/run_all.py` collects `run()`.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

import torch

import nbscale

WORKERS = 4
ROUND_TRIPS = 200
PUSH_REPEATS = 5
PUSH_BYTES = 64 * 2**20


def _seconds(action) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def _median_seconds(action, repeats: int) -> float:
    return statistics.median(_seconds(action) for _ in range(repeats))


def import_torch_seconds() -> float:
    return statistics.median(
        _seconds(lambda: subprocess.run([sys.executable, "-c", "import torch"], check=True)) for _ in range(3)
    )


def memcpy_bytes_per_second() -> float:
    source = torch.empty(PUSH_BYTES, dtype=torch.uint8).random_()
    target = torch.empty_like(source)
    return PUSH_BYTES / _median_seconds(lambda: target.copy_(source), 10)


def measure_nbscale(payload: torch.Tensor) -> dict[str, float]:
    figures: dict[str, float] = {}
    started = time.perf_counter()
    pool = nbscale.Pool(WORKERS, cpu=True)
    figures["start"] = time.perf_counter() - started
    pool.spmd("pass")
    figures["round_trip"] = _median_seconds(lambda: pool.spmd("pass"), ROUND_TRIPS)
    figures["run_round_trip"] = _median_seconds(lambda: pool.run(int), ROUND_TRIPS)
    figures["push"] = _median_seconds(lambda: pool.push(payload=payload), PUSH_REPEATS)
    figures["stop"] = _seconds(pool.close)
    return figures


def measure_ipyparallel(payload: torch.Tensor) -> dict[str, float]:
    import ipyparallel

    figures: dict[str, float] = {}
    started = time.perf_counter()
    cluster = ipyparallel.Cluster(n=WORKERS, log_level=40)
    client = cluster.start_and_connect_sync()
    client.wait_for_engines(WORKERS, timeout=120)
    figures["start_only"] = time.perf_counter() - started
    view = client[:]
    view.execute("import torch", block=True)
    figures["start"] = time.perf_counter() - started
    view.execute("pass", block=True)
    figures["round_trip"] = _median_seconds(lambda: view.execute("pass", block=True), ROUND_TRIPS // 4)
    array = payload.numpy()
    figures["push"] = _median_seconds(lambda: view.push({"payload": array}, block=True), PUSH_REPEATS)
    figures["stop"] = _seconds(cluster.stop_cluster_sync)
    client.close()
    return figures


def run() -> str:
    """Measure both and return the markdown section with ratios."""
    payload = torch.randn(PUSH_BYTES // 4)
    torch_import = import_torch_seconds()
    memcpy = memcpy_bytes_per_second()
    ours = measure_nbscale(payload)
    peer = measure_ipyparallel(payload)
    push_bandwidth = WORKERS * PUSH_BYTES / ours["push"]
    rows = [
        ("`%pool start 4` (CPU) until torch imported + group joined", f"{ours['start']:.2f} s",
         f"{peer['start']:.2f} s ({peer['start_only']:.2f} s start + import torch)",
         f"{ours['start'] / torch_import:.2f}x one `python -c \"import torch\"` ({torch_import:.2f} s); target <= 1.3x; "
         f"{peer['start'] / ours['start']:.1f}x faster than ipyparallel"),
        ("empty spmd round trip, 4 workers, blocking (median)", f"{ours['round_trip'] * 1e3:.2f} ms",
         f"{peer['round_trip'] * 1e3:.2f} ms (`execute('pass')`)",
         f"{ours['round_trip'] / peer['round_trip']:.3f}x ipyparallel; target <= 0.1x"),
        ("`pool.run(int)` round trip, 4 workers (median)", f"{ours['run_round_trip'] * 1e3:.2f} ms", "-", ""),
        ("push 64 MiB tensor to 4 workers (median)", f"{ours['push'] * 1e3:.1f} ms", f"{peer['push'] * 1e3:.1f} ms",
         f"{peer['push'] / ours['push']:.1f}x faster than ipyparallel (target >= 5x); "
         f"{push_bandwidth / 1e9:.1f} GB/s over 4 copies = {push_bandwidth / memcpy:.0%} of memcpy "
         f"({memcpy / 1e9:.1f} GB/s; target >= 25%)"),
        ("`%pool stop`", f"{ours['stop'] * 1e3:.0f} ms", f"{peer['stop'] * 1e3:.0f} ms", "target < 1 s"),
    ]  # fmt: skip
    lines = [
        "## Pool (issue 2): nbscale vs ipyparallel, same run",
        "",
        "| measure | nbscale | ipyparallel | ratio / target |",
        "| --- | --- | --- | --- |",
        *(f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows),
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(run())
