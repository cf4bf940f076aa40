"""A running pool publishes its state for the JupyterLab extension, and withdraws it when stopped."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time

import nbscale
from nbscale.pool import registry


def test_pool_publishes_its_workers_and_withdraws_on_stop(tmp_path, monkeypatch):
    monkeypatch.setenv("NBSCALE_RUNTIME_DIR", str(tmp_path))
    pool = nbscale.Pool(2, cpu=True, env={"API_TOKEN": "s3cr3t"})
    try:
        deadline = time.monotonic() + 10
        while not registry.read_all() and time.monotonic() < deadline:
            time.sleep(0.1)
        (published,) = registry.read_all()
        assert published["size"] == 2 and published["pid"] == os.getpid()
        assert [w["state"] for w in published["workers"]] == ["idle", "idle"]
        own_file = registry.registry_dir() / f"{os.getpid()}.json"
        assert stat.S_IMODE(own_file.stat().st_mode) == 0o600
        assert "s3cr3t" not in own_file.read_text()
    finally:
        pool.close()
    assert registry.read_all() == []


def test_a_dead_processes_entry_is_dropped(tmp_path, monkeypatch):
    monkeypatch.setenv("NBSCALE_RUNTIME_DIR", str(tmp_path))
    folder = registry.registry_dir()
    folder.mkdir(parents=True)
    (folder / "999999.json").write_text(json.dumps({"pid": 999999, "heartbeat": time.time(), "workers": []}))
    assert registry.read_all() == []
    assert not (folder / "999999.json").exists()


def test_a_pool_outside_a_kernel_publishes_without_importing_ipython(tmp_path):
    """Asking ipykernel for the kernel id imported IPython on the monitor thread, half-imported while a failing
    worker's traceback on the main thread looked up IPython to name notebook cells: an AttributeError instead of
    the worker's error."""
    script = ("import sys, time, nbscale\n"
              "from nbscale.pool import registry\n"
              "with nbscale.Pool(1, cpu=True):\n"
              "    deadline = time.monotonic() + 10\n"
              "    while not registry.read_all() and time.monotonic() < deadline:\n"
              "        time.sleep(0.1)\n"
              "    print(len(registry.read_all()), 'IPython' in sys.modules)\n")
    env = {**os.environ, "NBSCALE_RUNTIME_DIR": str(tmp_path)}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert run.stdout.split() == ["1", "False"], run.stderr
