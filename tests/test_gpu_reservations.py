"""The machine-wide GPU registry (nbscale.gpu_reservations) with real processes holding real flocks: who holds
what is seen by every reader, a killed holder releases at once, simultaneous reservations never share a GPU, a
forked child neither keeps nor drops its parent's hold, and no user can remove or disguise another's hold."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from nbscale import gpu_reservations as registry
from nbscale.errors import GpuError
from tests.gpu_holder import gpu_holder
from tests.kernel_session import REPO_ROOT

ME = pwd.getpwuid(os.geteuid()).pw_name


@pytest.fixture(autouse=True)
def registry_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "gpu-registry"
    folder.mkdir()
    monkeypatch.setenv(registry.REGISTRY_ENV, str(folder))
    return folder


def test_a_holder_is_seen_with_its_user_notebook_and_pid_and_a_killed_holder_releases_at_once(registry_folder):
    with gpu_holder(["GPU-a"], notebook="analysis.ipynb") as holder:
        [seen] = registry.holders()["GPU-a"]
        assert (seen.user, seen.pid, seen.purpose, seen.notebook) == (ME, holder.pid, "pool", "analysis.ipynb")
        assert seen.describe() == f"{ME}'s pool (notebook analysis.ipynb, pid {holder.pid})"
        assert not seen.this_process
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
        assert registry.holders() == {}  # at once: the kernel dropped the dead process's lock
    assert list(registry_folder.iterdir()) == []  # and the owner's next read removed its stale file


def test_a_holder_that_stops_removes_its_reservation(registry_folder):
    with gpu_holder(["GPU-a", "GPU-b"], purpose="training"):
        assert sorted(registry.holders()) == ["GPU-a", "GPU-b"]
        assert registry.holders()["GPU-b"][0].purpose == "training"
    assert registry.holders() == {} and list(registry_folder.iterdir()) == []


def test_reservation_files_are_readable_by_everyone_and_writable_by_their_owner_only(registry_folder):
    with gpu_holder(["GPU-a"], umask=0o077):  # a batch job runs under umask 077: others must still see it
        [file] = registry_folder.iterdir()
        info = file.stat()
        assert stat.S_IMODE(info.st_mode) == 0o644 and info.st_uid == os.geteuid()
        assert file.name.startswith("nbscale-gpu.GPU-a.")


def test_reservations_made_at_the_same_moment_never_take_the_same_gpu(registry_folder):
    """Four processes, started together, each take the first GPU no one holds: four different GPUs."""
    go = registry_folder.parent / "go"
    code = f"""
import os, sys, time
from nbscale import gpu_reservations as r
while not os.path.exists({str(go)!r}):
    time.sleep(0.001)
def first_free():
    held = r.holders()
    return [next(key for key in ["GPU-a", "GPU-b", "GPU-c", "GPU-d"] if key not in held)]
reservation = r.reserve(first_free, "pool")
print(reservation.gpus[0], flush=True)
sys.stdin.read()
"""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    racers = [subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True, env=env) for _ in range(4)]  # fmt: skip
    try:
        time.sleep(1.0)  # every racer imported nbscale and waits for the go
        go.touch()
        taken = [racer.stdout.readline().strip() for racer in racers]  # type: ignore[union-attr]
        assert sorted(taken) == ["GPU-a", "GPU-b", "GPU-c", "GPU-d"]
        assert {key: [h.pid for h in held] for key, held in registry.holders().items()} == {
            key: [racer.pid] for key, racer in zip(taken, racers, strict=True)
        }
    finally:
        for racer in racers:
            racer.stdin.close()  # type: ignore[union-attr]
            racer.wait(timeout=30)


def test_a_forked_child_neither_keeps_nor_releases_its_parents_reservation():
    reservation = registry.reserve(lambda: ["GPU-a"], "training")
    try:
        child = os.fork()
        if child == 0:  # the child: releasing here must not touch the parent's hold
            reservation.release()
            os._exit(0)
        os.waitpid(child, 0)
        [held] = registry.holders()["GPU-a"]
        assert held.this_process
        reader, writer = os.pipe()
        child = os.fork()
        if child == 0:  # a child that outlives the hold (a DataLoader worker, say) must not prolong it
            os.close(writer)
            os.read(reader, 1)
            os._exit(0)
        os.close(reader)
        reservation.release()
        assert registry.holders() == {}
        os.write(writer, b"x")
        os.close(writer)
        os.waitpid(child, 0)
    finally:
        reservation.release()


def test_choose_refusing_reserves_nothing(registry_folder):
    def refuse() -> list[str]:
        raise GpuError("no")

    with pytest.raises(GpuError, match="no"):
        registry.reserve(refuse, "pool")
    assert list(registry_folder.iterdir()) == []


def test_the_default_registry_is_the_machine_wide_dev_shm(monkeypatch):
    monkeypatch.delenv(registry.REGISTRY_ENV)
    expected = Path("/dev/shm") if os.path.isdir("/dev/shm") else Path("/tmp")
    assert registry.registry_dir() == expected
    registry.holders()  # root-owned and sticky: accepted


def test_a_folder_anyone_may_write_without_the_sticky_bit_is_refused(registry_folder):
    registry_folder.chmod(0o777)
    with pytest.raises(GpuError, match=r"lacks the sticky bit.*install -d -m 1777"):
        registry.reserve(lambda: ["GPU-a"], "pool")
    registry_folder.chmod(0o1777)
    registry.reserve(lambda: ["GPU-a"], "pool").release()


# --- two users (the second is `nobody`, which only root can become) ----------------------------------------------

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv") or not shutil.which("flock"),
    reason="switching to a second user needs root, setpriv and flock",
)
NOBODY = 65534


def _as_nobody(command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "sh", "-c", command],
                          capture_output=True, text=True, timeout=30)  # fmt: skip


@pytest.fixture
def shared_folder(monkeypatch):
    """A registry folder as /dev/shm is: owned by root, mode 1777, reachable by every user."""
    folder = Path(tempfile.mkdtemp(prefix="nbscale-gpu-registry-", dir="/tmp"))
    folder.chmod(0o1777)
    monkeypatch.setenv(registry.REGISTRY_ENV, str(folder))
    yield folder
    shutil.rmtree(folder)


@needs_root
def test_another_user_can_neither_remove_nor_rewrite_a_reservation(shared_folder):
    with gpu_holder(["GPU-a"], notebook="mine.ipynb") as holder:
        [file] = shared_folder.iterdir()
        removed = _as_nobody(f"rm -f {file}")
        rewritten = _as_nobody(f"echo '{{}}' > {file}")
        assert removed.returncode != 0 and rewritten.returncode != 0
        [held] = registry.holders()["GPU-a"]
        assert (held.user, held.pid, held.notebook) == (ME, holder.pid, "mine.ipynb")


@needs_root
def test_another_users_reservation_shows_its_real_owner_whatever_its_file_claims(shared_folder):
    claim = json.dumps({"pid": 1, "purpose": "pool", "notebook": "yours.ipynb", "user": ME, "uid": os.geteuid()})
    name = shared_folder / "nbscale-gpu.GPU-b.0123456789abcdef"
    holder = subprocess.Popen(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "sh", "-c",
                               f"echo '{claim}' > {name} && exec flock --close {name} sleep 60"],
                              start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while "GPU-b" not in registry.holders():
            assert time.monotonic() < deadline and holder.poll() is None, "the other user's holder did not start"
            time.sleep(0.05)
        [held] = registry.holders()["GPU-b"]
        assert (held.user, held.uid, held.notebook) == ("nobody", NOBODY, "yours.ipynb")
        assert held.describe().startswith("nobody's pool")
    finally:
        os.killpg(holder.pid, signal.SIGKILL)  # flock (the holder) and its sleep
        holder.wait()
    assert registry.holders() == {} and name.exists()  # its stale file is its owner's to remove, not ours


@needs_root
def test_a_folder_another_user_owns_is_refused(registry_folder):
    os.chown(registry_folder, NOBODY, NOBODY)
    with pytest.raises(GpuError, match=r"belongs to nobody, who could delete anyone's reservations"):
        registry.holders()
