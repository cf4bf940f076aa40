"""Bad pool settings are refused with one clear message; start, stop and idle timeout."""

from __future__ import annotations

import time

import pytest

import nbscale
from nbscale.errors import PoolError
from nbscale.pool.devices import plan_devices


def test_zero_workers_is_refused():
    with pytest.raises(PoolError, match="at least one worker.*N >= 1"):
        nbscale.Pool(0)


def test_a_gpu_that_does_not_exist_is_named():
    with pytest.raises(PoolError, match="GPU 7 does not exist.*--cpu"):
        plan_devices(None, [7], cpu=False)


def test_cpu_and_gpus_together_is_refused():
    with pytest.raises(PoolError, match="contradict"):
        nbscale.Pool(gpus=[0], cpu=True)


def test_default_size_without_gpus_is_cpu_count_at_most_4():
    import os

    assert plan_devices(None, None, cpu=True) == [None] * min(os.cpu_count() or 1, 4)


def test_env_must_be_strings():
    with pytest.raises(PoolError, match="KEY=VALUE"):
        nbscale.Pool(1, cpu=True, env={"A": 1})


def test_idle_timeout_stops_the_pool_and_says_so_on_next_use():
    pool = nbscale.Pool(1, cpu=True, idle_timeout=0.02)  # 1.2 s
    try:
        deadline = time.monotonic() + 30
        while not pool.closed and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pool.closed
        assert nbscale.current_pool() is None
        with pytest.raises(PoolError, match="shut itself down after 0.02 idle minutes"):
            pool.run(print)
    finally:
        pool.close()


def test_stop_leaves_no_process():
    import subprocess

    pool = nbscale.Pool(2, cpu=True)
    pids = [w.pid for w in pool.workers]
    pool.close()
    alive = subprocess.run(["ps", "-o", "pid=", "-p", ",".join(map(str, pids))], capture_output=True, text=True)
    assert alive.stdout.strip() == ""
