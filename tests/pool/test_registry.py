"""A running pool publishes its state for the JupyterLab extension, and withdraws it when stopped."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

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


@pytest.mark.slow
def test_a_pool_stopped_as_soon_as_it_started_leaves_nothing_published(tmp_path, monkeypatch):
    """The monitor's first beat asks the workers for their memory before it publishes: a pool stopped meanwhile
    published its state after withdrawing it, a stale entry for a pool that no longer runs."""
    from nbscale.pool.monitor import STATUS_TIMEOUT_S

    monkeypatch.setenv("NBSCALE_RUNTIME_DIR", str(tmp_path))
    for _ in range(3):
        with nbscale.Pool(1, cpu=True):
            pass
    time.sleep(STATUS_TIMEOUT_S + 1)  # past the first beat's wait for the workers' answers
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
    script = (
        "import sys, time, nbscale\n"
        "from nbscale.pool import registry\n"
        "with nbscale.Pool(1, cpu=True):\n"
        "    deadline = time.monotonic() + 10\n"
        "    while not registry.read_all() and time.monotonic() < deadline:\n"
        "        time.sleep(0.1)\n"
        "    print(len(registry.read_all()), 'IPython' in sys.modules)\n"
    )
    env = {**os.environ, "NBSCALE_RUNTIME_DIR": str(tmp_path)}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert run.stdout.split() == ["1", "False"], run.stderr


# --- another user (`nobody`, which only root can become) plants files in a registry folder they can write ---------

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"), reason="playing a second user needs root and setpriv"
)
NOBODY = 65534


def _as_nobody(command: str) -> None:
    done = subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "sh", "-c", command],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr


@pytest.fixture
def others_folder():
    folder = Path(tempfile.mkdtemp(prefix="nbscale-runtime-", dir="/tmp"))
    folder.chmod(0o777)
    yield folder
    shutil.rmtree(folder)


@needs_root
def test_a_pool_writes_nothing_through_a_link_in_a_registry_folder_of_another_user(
    others_folder, tmp_path, monkeypatch
):
    precious = tmp_path / "precious.txt"
    precious.write_text("the user's own file")
    # the other user made the folder NBSCALE_RUNTIME_DIR names, and a link where the pool's file is first written
    _as_nobody(f"mkdir -m 777 {others_folder}/pools && ln -s {precious} {others_folder}/pools/.{os.getpid()}.json.tmp")
    monkeypatch.setenv("NBSCALE_RUNTIME_DIR", str(others_folder))
    with pytest.raises(registry.RegistryUnsafe, match=r"belongs to another user \(uid 65534\).*NBSCALE_RUNTIME_DIR"):
        registry.publish({"size": 1, "workers": []})
    assert precious.read_text() == "the user's own file"
    with pytest.raises(registry.RegistryUnsafe):
        registry.read_all()  # nor is anything read from there: the other user could fake a pool


@needs_root
def test_a_fifo_planted_in_a_writable_registry_folder_hangs_no_reader(others_folder, monkeypatch):
    monkeypatch.setenv("NBSCALE_RUNTIME_DIR", str(others_folder))
    folder = registry.registry_dir()
    folder.mkdir(mode=0o700)
    folder.chmod(0o777)  # the user's own folder, but anyone may write to it
    _as_nobody(f"mkfifo {folder}/4242.json")
    outcome: list[object] = []
    reader = threading.Thread(target=lambda: outcome.append(_outcome(registry.read_all)), daemon=True)
    reader.start()
    reader.join(20)
    try:
        assert not reader.is_alive(), "reading the registry hung on another user's FIFO (so would the Jupyter server)"
        (refused,) = outcome
        assert isinstance(refused, registry.RegistryUnsafe), refused
        assert "can be written by other users (mode drwxrwxrwx)" in str(refused) and "chmod 700" in str(refused)
    finally:
        if reader.is_alive():  # let the hung reader go: a writer that opens and closes the FIFO ends its read
            os.close(os.open(folder / "4242.json", os.O_WRONLY | os.O_NONBLOCK))


def _outcome(read: Callable[[], object]) -> object:
    try:
        return read()
    except Exception as error:  # the test looks at it
        return error


@pytest.mark.slow
def test_a_pool_in_a_registry_folder_others_can_write_works_and_says_once_why_the_panel_lacks_it(
    tmp_path, monkeypatch, capfd
):
    monkeypatch.setenv("NBSCALE_RUNTIME_DIR", str(tmp_path))
    registry.registry_dir().mkdir(mode=0o700)
    registry.registry_dir().chmod(0o770)
    with nbscale.Pool(1, cpu=True) as pool:
        time.sleep(2 * registry.HEARTBEAT_S)  # several heartbeats
        assert pool.run(lambda: "works") == ["works"]
    said = capfd.readouterr().err
    assert said.count("can be written by other users (mode drwxrwx---)") == 1, said
    assert os.listdir(registry.registry_dir()) == []
