"""The Ray backend against a real Ray head started on loopback by the test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

import nbscale
from nbscale.errors import PoolError, WorkerError
from tests.machine_load import scaled
from tests.ray_head import LOOPBACK_ENV, free_port
from tests.ray_head import ray_head as start_ray_head

pytestmark = pytest.mark.slow
ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def ray_head_and_client_port():
    """The module's head: its address HOST:PORT, and the port of its Ray Client server."""
    client_port = free_port()
    with start_ray_head(num_cpus=3, client_port=client_port) as address:
        yield address, client_port
        pool = nbscale.current_pool()
        if pool is not None:
            pool.close()
        ray.shutdown()


@pytest.fixture
def ray_head(ray_head_and_client_port):
    return ray_head_and_client_port[0]


def test_spmd_and_futures_on_ray_actors(ray_head):
    with nbscale.Pool(2, cluster=ray_head) as pool:
        assert pool.status().backend == "ray" and pool.size == 2
        namespace = {"offset": 10}
        pool.spmd("import os\nvalue = allreduce(rank + offset)\npid = os.getpid()", namespace=namespace)
        assert namespace["value"][:] == [21, 21]
        assert list(pool.map(pow, [2, 3], [2, 2])) == [4, 9]
        assert "ray at 127.0.0.1" in repr(pool)
        assert "local" not in repr(pool.status()).split("\n")[0]

        os.kill(namespace["pid"][1], signal.SIGKILL)
        time.sleep(0.5)
        with pytest.raises(WorkerError, match=r"[Ww]orker 1 \(pid \d+\) died: it was killed by SIGKILL"):
            pool.spmd("print(rank)")
        pool.restart()
        assert pool.run(lambda: "back") == ["back", "back"]


def test_parallel_training_on_digits_runs_on_ray_actors(ray_head):
    from tests.training.digits import digits, tiny_net

    (train_x, train_y), validation = digits()
    options = nbscale.TrainingOptions(
        "sgdm",
        initial_learn_rate=0.1,
        mini_batch_size=64,
        max_epochs=8,
        validation_data=validation,
        execution_environment="parallel",
        plots="none",
        verbose=False,
    )
    with nbscale.Pool(2, cluster=ray_head):
        net, info = nbscale.train(tiny_net(), (train_x, train_y), options)
    assert "2 workers" in info.hardware
    assert info.final_validation_accuracy > 0.85


def test_more_gpus_than_the_cluster_has_is_refused(ray_head, tmp_path, monkeypatch):
    profiles = tmp_path / "profiles.toml"
    profiles.write_text(f'[profiles.gpu_lab]\nbackend = "ray"\naddress = "{ray_head}"\ngpus_per_worker = 1\n')
    monkeypatch.setenv("NBSCALE_PROFILES", str(profiles))
    started = time.monotonic()
    with pytest.raises(PoolError, match="need 2 GPUs, but the Ray cluster.*has 0"):
        nbscale.Pool(2, cluster="gpu_lab")
    assert time.monotonic() - started < 30


def test_a_ray_client_address_gives_the_same_pool(ray_head_and_client_port):
    """ray://HOST:PORT, Ray Client: how a notebook outside the cluster reaches it (API.md's profile example), and how
    a kernel on a SLURM login node reaches its allocation's head."""
    address = f"ray://127.0.0.1:{ray_head_and_client_port[1]}"
    with nbscale.Pool(2, cluster=address) as pool:
        assert pool.status().backend == "ray" and pool.size == 2
        assert f"ray at {address}" in repr(pool)
        namespace = {"offset": 10}
        pool.spmd("value = allreduce(rank + offset)", namespace=namespace)
        assert namespace["value"][:] == [21, 21]
        assert list(pool.map(pow, [2, 3], [2, 2])) == [4, 9]
        assert pool.submit(sum, [1, 2, 3]).result(timeout=60) == 6


def test_unknown_profile_names_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("NBSCALE_PROFILES", str(tmp_path / "profiles.toml"))
    with pytest.raises(PoolError, match="neither an address.*profiles.toml"):
        nbscale.Pool(2, cluster="nowhere")


def test_an_address_where_nothing_listens_answers_at_once():
    code = (
        "import nbscale\ntry:\n    nbscale.Pool(2, cluster='127.0.0.1:9')\nexcept nbscale.PoolError as e:\n    print(e)"
    )
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env={**os.environ, **LOOPBACK_ENV}
    )
    # the interpreter's start and imports (20 s on a quiet 2-core machine); the refusal itself is instant
    assert time.monotonic() - started < scaled(20)
    assert "Could not reach the Ray cluster at 127.0.0.1:9: Connection refused" in result.stdout


def test_a_cluster_that_answers_too_slowly_fails_after_the_connect_timeout_naming_the_option():
    import socket

    silent = socket.create_server(("127.0.0.1", 0))  # accepts TCP, never speaks Ray: a head too busy to answer
    port = silent.getsockname()[1]
    code = (
        f"import nbscale\ntry:\n    nbscale.Pool(2, cluster='127.0.0.1:{port}', connect_timeout=5)\n"
        "except nbscale.PoolError as e:\n    print(e)"
    )
    started = time.monotonic()
    try:
        result = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env={**os.environ, **LOOPBACK_ENV}
        )
    finally:
        silent.close()
    assert time.monotonic() - started < 25
    assert f"Could not reach the Ray cluster at 127.0.0.1:{port} within 5 s" in result.stdout
    assert "--connect-timeout SECONDS (connect_timeout in the profile)" in result.stdout
