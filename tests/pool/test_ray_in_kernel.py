"""A cluster pool used from a real kernel as a notebook user would, against a real Ray head on loopback: what must
work the same as on a local pool (interrupts, cancel, default size) and moving from one cluster to another.

Ray takes ~15 s to start a head here, so one head serves the module and each test checks several things in turn."""

from __future__ import annotations

import os
import time

import pytest

import nbscale
from nbscale.errors import PoolError
from tests.kernel_session import KernelSession
from tests.ray_head import ray_head as start_ray_head

# a cluster pool's interrupt and cancel take ~2 min on a quiet 2-core machine, over 4 beside the whole suite
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
ray = pytest.importorskip("ray")

CLUSTER_CPUS = 3


@pytest.fixture(scope="module")
def ray_head():
    with start_ray_head(num_cpus=CLUSTER_CPUS) as address:
        yield address
        ray.shutdown()


@pytest.fixture
def cluster_kernel(ray_head, tmp_path):
    """A real kernel whose ~/.config/nbscale/profiles.toml names the head as profile `lab`."""
    (tmp_path / "nbscale").mkdir()
    (tmp_path / "nbscale" / "profiles.toml").write_text(f'[profiles.lab]\nbackend = "ray"\naddress = "{ray_head}"\n')
    environment = {key: value for key, value in os.environ.items() if key != "NBSCALE_PROFILES"}
    session = KernelSession(env={**environment, "XDG_CONFIG_HOME": str(tmp_path)})
    session.run("%load_ext nbscale\nimport time, nbscale")
    yield session
    session.close(timeout=60)


def test_a_cluster_pool_is_interrupted_and_cancelled_like_a_local_one_and_keeps_its_variables(cluster_kernel):
    started = cluster_kernel.run("%pool start --cluster lab", timeout=300)
    # N defaults to the cluster's CPU count (at most 4), as a local pool's does to this machine's
    assert started.ok and f"Started {CLUSTER_CPUS} CPU workers" in started.stdout, started.text

    # the kernel interrupt stops a sleeping cell on every worker: no restart, the variables stay
    assert cluster_kernel.run("%%spmd\nkept = rank * 100").ok
    interrupted = cluster_kernel.run("%%spmd\ntime.sleep(60)", interrupt_after=4, timeout=60)
    assert interrupted.error_name == "PoolInterrupted", interrupted.text
    assert "The pool is ready for the next cell" in interrupted.text and "restarted" not in interrupted.text
    assert cluster_kernel.run("print(kept[:])").stdout.strip() == "[0, 100, 200]"

    # pool.cancel interrupts a running task on its worker, which is free again at once
    cancelled = cluster_kernel.run(
        "pool = nbscale.current_pool()\nfuture = pool.submit(time.sleep, 60)\ntime.sleep(1)\nwhen = time.monotonic()\n"
        "pool.cancel(future)\ntry:\n    future.result(timeout=30)\nexcept BaseException as error:\n"
        "    print(type(error).__name__, round(time.monotonic() - when))\nprint(pool.run(lambda: 'free'))",
        timeout=90,
    )
    assert "CancelledError 0" in cancelled.stdout and "['free', 'free', 'free']" in cancelled.stdout, cancelled.text


def test_a_pool_starts_on_the_cluster_it_names_after_a_pool_on_another_one(cluster_kernel, ray_head):
    assert cluster_kernel.run("%pool start 2 --cluster lab\n%pool stop", timeout=300).ok
    # the kernel is still connected to the first cluster: a pool elsewhere must not land there
    started = time.monotonic()
    nowhere = cluster_kernel.run("%pool start 2 --cluster 127.0.0.1:9", timeout=120)
    assert nowhere.error_name == "PoolError" and "Could not reach the Ray cluster at 127.0.0.1:9" in nowhere.text
    assert time.monotonic() - started < 20
    assert "No pool is running" in cluster_kernel.run("%pool").stdout

    by_address = cluster_kernel.run(f"%pool start 2 --cluster {ray_head}\nprint(nbscale.current_pool())", timeout=300)
    assert by_address.ok and f"ray at {ray_head}" in by_address.stdout, by_address.text

    # in this process: a pool, then the notebook's own ray.init after a ray.shutdown(). A pool on that cluster uses
    # that connection; while the kernel's pool holds 2 of the 3 CPUs, a pool of 2 cannot start, and says how much of the
    # cluster is free; a pool elsewhere is refused rather than closing the notebook's connection
    with nbscale.Pool(1, cluster=ray_head) as pool:
        assert pool.run(lambda: "one") == ["one"]
    ray.shutdown()
    ray.init(address=ray_head, log_to_driver=False)
    # the closed pool's actor gives its CPU back a moment later (longer on a busy machine): wait for the 1 CPU the
    # kernel's pool leaves, so the count below is the one the message states
    deadline = time.monotonic() + 60
    while ray.available_resources().get("CPU", 0) < CLUSTER_CPUS - 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    # (the one actor the free CPU allows may itself take over 5 s to start on a busy machine: "Only 0 of 2")
    with pytest.raises(PoolError, match=r"Only [01] of 2 Ray actors started within 5 s .*0 of its 3 CPUs free"):
        nbscale.Pool(2, cluster=ray_head, connect_timeout=5)
    with pytest.raises(PoolError, match="already connected to a Ray cluster .*ray.shutdown"):
        nbscale.Pool(2, cluster="127.0.0.1:9")
