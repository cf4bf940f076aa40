"""nbscale off Linux: `import nbscale` needs nothing POSIX-only (Windows has no fcntl, pwd or fork hooks), and
what needs them says so clearly. Run in a fresh interpreter in which those modules cannot be imported."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kernel_session import REPO_ROOT

_WITHOUT_POSIX = """
import sys
for name in ("fcntl", "pwd", "grp", "termios"):
    sys.modules[name] = None  # as on Windows: importing them raises ImportError
"""


def _run(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(
        [sys.executable, "-c", _WITHOUT_POSIX + code], capture_output=True, text=True, env=env, timeout=300
    )


@pytest.mark.slow
def test_nbscale_imports_and_builds_training_options_without_fcntl_or_pwd():
    result = _run("import nbscale\nprint(nbscale.TrainingOptions(max_epochs=2).max_epochs)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "2"


# trains, resumes, cleans a killed run's partial checkpoint, and runs a job; argv[1] is the checkpoint folder
_TRAIN_RESUME_AND_RUN_A_JOB = """
import os, sys
assert sys.modules["fcntl"] is None
import torch
import nbscale
folder = sys.argv[1]
os.mkdir(folder, 0o700)
partial = os.path.join(folder, ".partial-nbscale_checkpoint_epoch0009.pt")  # a write whose run was killed
open(partial, "wb").close()
os.utime(partial, (1e9, 1e9))
torch.manual_seed(0)
data = (torch.randn(64, 8), torch.randint(0, 3, (64,)))
def run(epochs, resume_from=None):
    options = nbscale.TrainingOptions(max_epochs=epochs, mini_batch_size=16, verbose=False, checkpoint_path=folder)
    return nbscale.train(torch.nn.Linear(8, 3), data, options, resume_from=resume_from)[1]
first, resumed = run(1), run(2, resume_from=folder)
print("files:", sorted(os.listdir(folder)))
print("epochs:", resumed.epoch, resumed.training_loss[:4] == first.training_loss)  # epoch 1 as the first run trained it
job = nbscale.jobs.submit("import sys\\nblocked = sys.modules['fcntl'] is None\\nprint('done')\\n", name="posixless")
assert job.wait(120), job.log()
found = nbscale.jobs.get(name="posixless")
print("job:", job.state, job.result("blocked"), "\\ndone\\n" in job.log(), found.id == job.id)
"""
_PRINTED = ("files", "epochs", "job")


@pytest.mark.slow
def test_training_checkpoints_resume_and_a_jobs_files_work_without_fcntl(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(_WITHOUT_POSIX)  # the job's own interpreter has no fcntl either
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO_ROOT)]), "NBSCALE_HOME": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-c", _TRAIN_RESUME_AND_RUN_A_JOB, str(tmp_path / "checkpoints")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    printed = dict(line.split(": ", 1) for line in result.stdout.splitlines() if line.split(":")[0] in _PRINTED)
    files, epochs, job = (printed[name] for name in _PRINTED)  # between them, the job's start and end lines
    assert files == str(["nbscale_checkpoint_epoch0001.pt", "nbscale_checkpoint_epoch0002.pt"])  # partial removed
    assert epochs == "[1, 1, 1, 1, 2, 2, 2, 2] True"  # the resumed run trained epoch 2 only
    assert job == "finished True True True"


def test_gpu_reservations_without_fcntl_take_an_o_excl_lock_file(tmp_path: Path) -> None:
    result = _run(
        f"""
import os
os.environ.update(NBSCALE_HOME={str(tmp_path / "home")!r}, NBSCALE_GPU_REGISTRY={str(tmp_path)!r})
from nbscale import gpu_reservations
with gpu_reservations.reserve(lambda: ["GPU-a"], "pool") as reservation:
    holder, = gpu_reservations.holders()["GPU-a"]
    print(reservation.gpus, holder.this_process, holder.purpose)
print(gpu_reservations.holders(), sorted(os.listdir({str(tmp_path / "home")!r})))
"""
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["('GPU-a',) True pool", "{} ['gpu-registry.lock']"]  # the lock file went


def test_training_off_posix_reserves_no_gpu_and_stays_on_the_current_one() -> None:
    result = _run("""
import os
del os.geteuid  # as on Windows: no registry
from nbscale import gpu
print(gpu.training_gpu(1), gpu._training_reservations)
""")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "1 {}"


def test_starting_a_pool_where_processes_cannot_fork_says_pools_need_linux_or_macos():
    result = _run("""
import os
import nbscale
from nbscale.errors import PoolError
del os.fork  # as on Windows
try:
    nbscale.Pool(2, cpu=True)
except PoolError as error:
    print(error)
""")
    assert result.returncode == 0, result.stderr
    assert "Pools need Linux or macOS" in result.stdout and "Train in the notebook instead" in result.stdout


# Windows' files have no POSIX owners or write bits: after import (torch reads sys.platform as it loads), the
# platform reads "win32" and os has no getuid/geteuid, as there. argv[1] is a folder anyone could write on POSIX.
_AS_WINDOWS_AFTER_IMPORT = """
import os, stat, sys
import torch
import nbscale
from nbscale.jobs import JobStore
from nbscale.trust import others_could_change
folder = sys.argv[1]
print("posix refuses:", others_could_change(folder) is not None)
sys.platform = "win32"
del os.getuid, os.geteuid
print("windows refuses:", others_could_change(folder) is not None)
checkpoints = os.path.join(folder, "checkpoints")
torch.manual_seed(0)
data = (torch.randn(32, 4), torch.randint(0, 2, (32,)))
def run(epochs, resume_from=None):
    options = nbscale.TrainingOptions(max_epochs=epochs, mini_batch_size=16, verbose=False, checkpoint_path=checkpoints)
    return nbscale.train(torch.nn.Linear(4, 2), data, options, resume_from=resume_from)[1]
first = run(1)
print("resumed epochs:", run(2, resume_from=checkpoints).epoch)
print("job store:", JobStore(os.path.join(folder, "jobs")).root.name)
"""


@pytest.mark.slow
def test_as_on_windows_trust_checks_leave_acls_to_windows_and_checkpoints_resume(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # on POSIX: others could plant a checkpoint here; on Windows the mode says nothing
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    ran = subprocess.run(
        [sys.executable, "-c", _WITHOUT_POSIX + _AS_WINDOWS_AFTER_IMPORT, str(shared)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert lines[:2] == ["posix refuses: True", "windows refuses: False"], ran.stdout
    assert lines[2:] == ["resumed epochs: [1, 1, 2, 2]", "job store: jobs"], ran.stdout
