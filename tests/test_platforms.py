"""nbscale off Linux: `import nbscale` needs nothing POSIX-only (Windows has no fcntl, pwd or fork hooks), and
what needs them says so clearly. Run in a fresh interpreter in which those modules cannot be imported."""

from __future__ import annotations

import os
import subprocess
import sys

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


def test_nbscale_imports_and_builds_training_options_without_fcntl_or_pwd():
    result = _run("import nbscale\nprint(nbscale.TrainingOptions(max_epochs=2).max_epochs)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "2"


def test_reserving_a_gpu_without_fcntl_says_the_platform_cannot():
    result = _run("""
from nbscale import gpu_reservations
from nbscale.errors import GpuError
try:
    gpu_reservations.reserve(lambda: ["GPU-a"], "pool")
except GpuError as error:
    print(error)
""")
    assert result.returncode == 0, result.stderr
    assert "GPU reservations need fcntl's file locks (Linux or macOS)" in result.stdout


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
