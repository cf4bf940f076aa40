"""Bad pool settings are refused with one clear message; start, stop and idle timeout."""

from __future__ import annotations

import os
import time

import pytest

import nbscale
from nbscale.errors import PoolError
from nbscale.pool.devices import plan_devices
from nbscale.pool.settings import PoolSettings
from tests.pool_processes import forkservers_of


def test_zero_workers_is_refused():
    with pytest.raises(PoolError, match="at least one worker.*N >= 1"):
        nbscale.Pool(0)


def test_a_gpu_that_does_not_exist_is_named():
    with pytest.raises(PoolError, match="GPU 7 does not exist.*--cpu"):
        plan_devices(None, [7], cpu=False)
    with pytest.raises(PoolError, match="GPUs 7, 8 do not exist: this machine shows"):
        plan_devices(None, [7, 8], cpu=False)


def test_cpu_and_gpus_together_is_refused():
    with pytest.raises(PoolError, match="contradict"):
        nbscale.Pool(gpus=[0], cpu=True)


def test_default_size_without_gpus_is_cpu_count_at_most_4():
    from nbscale.cpus import available_cpus

    assert plan_devices(None, None, cpu=True) == [None] * min(available_cpus(), 4)


def test_the_contracts_pool_call_with_every_keyword_starts_a_default_pool() -> None:
    expected = len(plan_devices(None, None, cpu=False))  # one per free GPU, else the CPU count, at most 4
    # API.md's line, word for word: each keyword is the contract's name, each value its default
    pool = nbscale.Pool(n=None, gpus=None, cpu=False, cluster=None, idle_timeout=30, env=None)
    try:
        status = pool.status()
        assert nbscale.current_pool() is pool and status.size == pool.size >= 1
        assert pool.size == expected and [w.state for w in status.workers] == ["idle"] * expected
        assert "idle shutdown in 30 min" in repr(status)
    finally:
        pool.close()


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


def test_status_says_under_a_minute_when_less_than_a_minute_of_idle_time_is_left():
    with nbscale.Pool(1, cpu=True, idle_timeout=0.5) as pool:  # 30 s
        assert "Pool: 1 CPU worker (local; idle shutdown in under a minute)" in repr(pool.status())  # one: "worker"
        assert repr(pool).startswith("<nbscale.Pool 1 worker (cpu, ")
        with pytest.raises(PoolError, match="A pool of 1 worker is already running"):
            nbscale.Pool(1, cpu=True)


@pytest.mark.slow
def test_a_pool_opened_after_an_idle_shutdown_has_the_settings_of_the_one_that_shut_down():
    pool = nbscale.Pool(1, cpu=True, idle_timeout=0.02, env={"GREETING": "hi"})  # 1.2 s
    deadline = time.monotonic() + 30
    while not pool.closed and time.monotonic() < deadline:
        time.sleep(0.1)
    again = nbscale.current_pool(start=True)  # as "parallel" training and %%spmd open one
    try:
        assert again is not None and again.settings == pool.settings
        assert again.run(lambda: __import__("os").environ["GREETING"]) == ["hi"]
    finally:
        again.close()
    fresh = nbscale.current_pool(start=True)  # the settings are kept for one reopening only
    try:
        assert fresh.settings == PoolSettings()  # the defaults again
    finally:
        fresh.close()


def test_stop_leaves_no_process():
    import subprocess

    pool = nbscale.Pool(2, cpu=True)
    pids = [w.pid for w in pool.workers]
    pool.close()
    alive = subprocess.run(["ps", "-o", "pid=", "-p", ",".join(map(str, pids))], capture_output=True, text=True)
    assert alive.stdout.strip() == ""
    with pytest.raises(PoolError, match=r"This pool is no longer running\. It was stopped\. Start a new one"):
        pool.status()  # not a table of workers that are gone, still called idle


def test_a_group_that_cannot_form_is_one_clear_error_and_leaves_no_process():
    def forkservers() -> set[int]:
        return set(forkservers_of(os.getpid()))

    earlier = forkservers()  # an earlier test's, ending a moment after its pool closed: not this pool's
    with pytest.raises(PoolError) as caught:
        nbscale.Pool(2, cpu=True, env={"GLOO_SOCKET_IFNAME": "nosuchif0"})
    message = str(caught.value)
    assert message.startswith("Joining the torch.distributed group (gloo) failed, so no pool started. rank")
    assert "Unable to find address for: ***" in message and "check it names a network interface" in message
    assert "nosuchif0" not in message  # an --env value is never shown, even where torch quotes it
    assert "site-packages" not in message and "Traceback" not in message
    assert nbscale.current_pool() is None
    deadline = time.monotonic() + 10  # the launcher ends a moment after its workers: a busy machine saw it linger
    while left := forkservers() - earlier:
        assert time.monotonic() < deadline, left
        time.sleep(0.1)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {"idle_timeout": "x"},
            r"idle_timeout \(--idle-timeout\) must be a number of minutes, such as 30 \(0 = never\), not 'x'",
        ),
        ({"idle_timeout": float("nan")}, r"idle_timeout \(--idle-timeout\) must be a number of minutes"),
        (
            {"idle_timeout": float("inf")},
            r"between 0 and 525,600 minutes \(a year\), not inf: use 0 for a pool that never",
        ),
        ({"idle_timeout": 1e300}, r"between 0 and 525,600 minutes"),
        ({"idle_timeout": -1}, r"between 0 and 525,600 minutes"),
        ({"gpus": "0"}, r"gpus must be a list of GPU indices such as \[0, 2\] \(--gpus 0,2\), not '0'"),
        ({"gpus": [0.5]}, r"gpus must list GPU indices"),
        ({"gpus": []}, r"--gpus lists no GPU: give indices such as --gpus 0,2 \(see %gpu\), or --cpu"),
        ({"gpus": [0, 0]}, r"--gpus lists GPU 0 twice"),
        (
            {"cluster": 123},
            r"cluster \(--cluster\) must be a profile name or an address such as 'ray://head:10001', not 123",
        ),
        ({"n": 2.5}, r"N \(the number of workers\) must be a whole number such as 4, not 2.5"),
        ({"n": True}, r"N \(the number of workers\) must be a whole number"),
        ({"n": 100_000}, r"100,000 workers is more than a pool can hold \(512\): ask for at most 512"),
        ({"env": {"TOKEN": "ab\0cd"}}, r"--env TOKEN: the variable's name or value holds a NUL byte"),
        ({"env": ["A=1"]}, r"env must be a dict of KEY: VALUE strings"),
        (
            {"cluster": "ray://head:10001", "connect_timeout": 0},
            r"connect_timeout must be a number of seconds from 1 to 3600, such as 120, not 0",
        ),
        ({"cluster": "ray://head:10001", "connect_timeout": float("inf")}, r"connect_timeout must be .*, not inf"),
        ({"cluster": "ray://head:10001", "connect_timeout": "60"}, r"connect_timeout must be .*, not '60'"),
        ({"connect_timeout": 60}, r"connect_timeout \(--connect-timeout\) is for cluster pools"),
        ({"cluster": "127.0.0.1:1", "gpus": [0]}, r"--gpus picks GPUs of this machine; on a cluster pool Ray places"),
        ({"n": 2, "cluster": "127.0.0.1:1", "gpus": [0]}, r"--gpus picks GPUs of this machine"),  # not "N is 2"
    ],
)
def test_each_bad_setting_is_one_clear_error_naming_it_before_anything_starts(settings, message):
    with pytest.raises(PoolError, match=message):
        nbscale.Pool(**settings)
    assert nbscale.current_pool() is None


def test_more_cpu_workers_than_four_per_core_are_refused_with_the_limit():
    from nbscale.cpus import available_cpus

    cores = available_cpus()
    with pytest.raises(PoolError, match=rf"{4 * cores + 1} CPU workers on {cores} CPU cores: at most {4 * cores}"):
        nbscale.Pool(4 * cores + 1, cpu=True)


def test_a_published_state_never_holds_a_number_json_cannot(tmp_path, monkeypatch):
    import json
    import os

    from nbscale.pool import registry

    monkeypatch.setenv("NBSCALE_RUNTIME_DIR", str(tmp_path))
    with pytest.raises(ValueError):
        registry.publish({"idle_timeout_left_s": float("inf")})
    folder = registry.registry_dir()
    folder.mkdir(parents=True, exist_ok=True)
    written_by_hand = f'{{"pid": {os.getpid()}, "heartbeat": {time.time()}, "idle_timeout_left_s": Infinity}}'
    (folder / f"{os.getpid()}.json").write_text(written_by_hand)
    assert registry.read_all() == []  # a file another version wrote with Infinity is never served
    registry.publish({"idle_timeout_left_s": 60.0})
    assert json.loads((folder / f"{os.getpid()}.json").read_text())["idle_timeout_left_s"] == 60.0


def test_the_settings_never_show_env_values():
    from nbscale.pool.settings import PoolSettings

    settings = PoolSettings(1, cpu=True, env={"API_TOKEN": "s3cret-value"})
    assert "s3cret-value" not in repr(settings) and "s3cret-value" not in str(settings)


def test_from_settings_starts_the_pool_those_settings_describe_and_open_pool_reuses_it():
    from nbscale.pool.pool import open_pool

    settings = PoolSettings(1, cpu=True, env={"GREETING": "hello"})
    with nbscale.Pool.from_settings(settings) as pool:
        assert pool.settings == settings and pool.size == 1
        assert open_pool(PoolSettings(2, cpu=True)) is pool  # the running pool, whatever settings are asked for
        with pytest.raises(PoolError, match="already running"):
            nbscale.Pool.from_settings(settings)
    assert nbscale.current_pool() is None
