"""The machine-wide GPU registry (nbscale.gpu_reservations) with real holder processes: who holds what is seen by
every reader, a killed holder releases at once, simultaneous reservations never share a GPU, a forked child
neither keeps nor drops its parent's hold, and no other user (a real second user, as root can make one) can
remove, disguise, prolong or block a hold, nor make a reservation wait."""

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
        assert registry.holders() == {}  # at once: its pid has no process
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


def _race(go: Path, racers: int) -> list[str]:
    """`racers` processes, started together, each take the first GPU no one holds; the GPUs they took."""
    keys = ["GPU-a", "GPU-b", "GPU-c", "GPU-d"][:racers]
    code = f"""
import os, sys, time
from nbscale import gpu_reservations as r
while not os.path.exists({str(go)!r}):
    time.sleep(0.001)
def first_free():
    held = r.holders()
    return [next(key for key in {keys!r} if key not in held)]
reservation = r.reserve(first_free, "pool")
print(reservation.gpus[0], flush=True)
sys.stdin.read()
"""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        for _ in range(racers)
    ]
    try:
        time.sleep(1.0)  # every racer imported nbscale and waits for the go
        go.touch()
        taken = [racer.stdout.readline().strip() for racer in processes]  # type: ignore[union-attr]
        assert {key: [h.pid for h in held] for key, held in registry.holders().items()} == {
            key: [racer.pid] for key, racer in zip(taken, processes, strict=True)
        }
        return taken
    finally:
        for racer in processes:
            racer.stdin.close()  # type: ignore[union-attr]
            racer.wait(timeout=30)


def test_reservations_made_at_the_same_moment_never_take_the_same_gpu(registry_folder):
    """Four processes, started together, each take the first GPU no one holds: four different GPUs."""
    assert sorted(_race(registry_folder.parent / "go", 4)) == ["GPU-a", "GPU-b", "GPU-c", "GPU-d"]


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
    os.geteuid() != 0 or not shutil.which("setpriv") or not shutil.which("flock"),  # CI runs as root
    reason="switching to a second user needs root, setpriv and flock",
)
NOBODY = 65534


def _as_nobody(command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "sh", "-c", command],
        capture_output=True,
        text=True,
        timeout=30,
    )


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
def _as_nobody_in_background(command: str) -> subprocess.Popen[bytes]:
    """`command` run by the shell as the second user, in its own session (kill its group to end it)."""
    return subprocess.Popen(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "sh", "-c", command],
        start_new_session=True,
    )


def _wait_until(condition, what: str, process: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline and (process is None or process.poll() is None), what
        time.sleep(0.02)


def _end(process: subprocess.Popen[bytes]) -> None:
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


@needs_root
def test_another_users_reservation_shows_its_real_owner_whatever_its_file_claims(shared_folder):
    name = shared_folder / "nbscale-gpu.GPU-b.0123456789abcdef"
    claim = json.dumps({"pid": 0, "purpose": "pool", "notebook": "yours.ipynb", "user": ME, "uid": os.geteuid()})
    claim = claim.replace('"pid": 0', "\"pid\": '$$'")  # the shell's pid, which `exec sleep` keeps
    holder = _as_nobody_in_background(f"echo '{claim}' > {name} && exec sleep 60")  # its own live process
    try:
        _wait_until(lambda: "GPU-b" in registry.holders(), "the other user's holder did not start", holder)
        [held] = registry.holders()["GPU-b"]
        assert (held.user, held.uid, held.pid, held.notebook) == ("nobody", NOBODY, holder.pid, "yours.ipynb")
        assert held.describe().startswith("nobody's pool")
    finally:
        _end(holder)
    assert registry.holders() == {} and name.exists()  # its stale file is its owner's to remove, not ours


@needs_root
def test_a_reservation_naming_a_process_of_another_user_is_no_hold(shared_folder):
    """The other user's file names this (live) process: the pid runs as root, not as the file's owner."""
    name = shared_folder / "nbscale-gpu.GPU-a.0123456789abcdef"
    claim = json.dumps({"pid": os.getpid(), "purpose": "pool", "since": time.time()})
    assert _as_nobody(f"echo '{claim}' > {name}").returncode == 0
    assert name.exists() and registry.holders() == {}


def test_a_reservation_whose_pid_a_later_process_reuses_is_no_hold(registry_folder):
    """A reused pid: the process now behind it started after the reservation (or at another time than recorded)."""
    later = subprocess.Popen(["sleep", "60"])
    try:
        for record in (
            {"pid": later.pid, "since": time.time() - 60},  # reserved a minute before it started
            {"pid": later.pid, "since": time.time(), "started": time.time() - 3600},
        ):
            stale = registry_folder / f"nbscale-gpu.GPU-a.{os.urandom(8).hex()}"
            stale.write_text(json.dumps({**record, "purpose": "pool"}))
            assert registry.holders() == {}
            assert not stale.exists()  # ours: removed as stale
    finally:
        later.kill()
        later.wait()


@needs_root
def test_another_user_flocking_a_dead_holders_file_does_not_keep_its_reservation(shared_folder):
    with gpu_holder(["GPU-a"]) as holder:
        [file] = shared_folder.iterdir()
        # a read-only descriptor is enough to flock a 0644 file
        locker = _as_nobody_in_background(f"exec 3< {file} && flock -s 3 && exec sleep 60")
        try:
            time.sleep(0.5)
            assert locker.poll() is None, "the other user could not lock the file"
            holder.send_signal(signal.SIGKILL)
            holder.wait(timeout=10)
            assert registry.holders() == {}  # at once, lock or no lock
            assert not file.exists()
        finally:
            _end(locker)


@needs_root
def test_another_user_locking_the_registry_folder_delays_nothing_and_no_gpu_is_taken_twice(shared_folder):
    locker = _as_nobody_in_background(f"exec 3< {shared_folder} && flock -x 3 && exec sleep 60")
    try:
        time.sleep(0.5)
        assert locker.poll() is None, "the other user could not lock the folder"
        started = time.monotonic()
        taken = _race(shared_folder.parent / f"go-{os.getpid()}", 3)
        assert sorted(taken) == ["GPU-a", "GPU-b", "GPU-c"]
        assert time.monotonic() - started < 8.0  # a locked folder made each wait 10 s, then go on unlocked
    finally:
        _end(locker)


@needs_root
def test_another_user_cannot_open_the_lock_that_orders_a_users_reservations(shared_folder, monkeypatch):
    home = Path(tempfile.mkdtemp(prefix="nbscale-home-", dir="/tmp"))
    try:
        home.chmod(0o755)  # others may look in: the lock file's own mode must keep them out
        monkeypatch.setenv("NBSCALE_HOME", str(home))
        registry.reserve(lambda: ["GPU-a"], "pool").release()
        lock = registry.lock_path()
        assert lock.parent == home and stat.S_IMODE(lock.stat().st_mode) == 0o600
        assert _as_nobody(f"test -r {home} && exec 3< {lock}").returncode != 0
        assert _as_nobody(f"exec 3< {home}/..").returncode == 0  # the folder is reachable: the mode is what stops it
    finally:
        shutil.rmtree(home)


def test_a_lock_file_others_may_write_is_refused_naming_it(monkeypatch, tmp_path):
    monkeypatch.setenv("NBSCALE_HOME", str(tmp_path))
    registry.reserve(lambda: ["GPU-a"], "pool").release()
    registry.lock_path().chmod(0o666)
    with pytest.raises(GpuError, match=r"lock file .*gpu-registry.lock cannot be used: .*others may write to it"):
        registry.reserve(lambda: ["GPU-a"], "pool")


@needs_root
def test_a_reservation_announced_by_another_user_while_choosing_makes_the_chooser_choose_again(shared_folder):
    """Another user's process takes GPU-a between this process's look and its write: this one sees it after
    announcing, withdraws, and takes GPU-b."""
    name = shared_folder / "nbscale-gpu.GPU-a.fedcba9876543210"
    racers: list[subprocess.Popen[bytes]] = []

    def first_free() -> list[str]:
        held = registry.holders()
        choice = next(key for key in ["GPU-a", "GPU-b"] if key not in held)
        if not racers:  # the other user announces GPU-a now, after this look
            racers.append(_as_nobody_in_background(f"echo '{{\"pid\": '$$'}}' > {name} && exec sleep 60"))
            _wait_until(name.exists, "the other user's reservation was not written", racers[0])
            time.sleep(0.1)  # its sleep has replaced its shell (same pid)
        return [choice]

    try:
        with registry.reserve(first_free, "pool") as reservation:
            assert reservation.gpus == ("GPU-b",)
            assert [h.uid for h in registry.holders()["GPU-a"]] == [NOBODY]
            assert [h.pid for h in registry.holders()["GPU-b"]] == [os.getpid()]
    finally:
        for racer in racers:
            _end(racer)


@needs_root
def test_a_folder_another_user_owns_is_refused(registry_folder):
    os.chown(registry_folder, NOBODY, NOBODY)
    with pytest.raises(GpuError, match=r"belongs to nobody, who could delete anyone's reservations"):
        registry.holders()
