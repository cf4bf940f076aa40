"""A real process that holds GPUs in the machine-wide registry (nbscale.gpu_reservations) until it is stopped or
killed: another notebook, as the process asking sees it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from tests.kernel_session import REPO_ROOT

_HOLD = """
import sys
from nbscale.gpu_reservations import reserve
keys, purpose = sys.argv[1].split(","), sys.argv[2]
reservation = reserve(lambda: keys, purpose)
print("held", flush=True)
sys.stdin.read()  # until the test closes stdin (or kills this process)
"""


@contextmanager
def gpu_holder(
    keys: Sequence[str], purpose: str = "pool", notebook: str | None = None, umask: int | None = None
) -> Iterator[subprocess.Popen[str]]:
    """A process holding `keys` (registry keys such as "GPU-aaaa0-1111") once this yields; stopped afterwards.

    It reserves in the registry this process's environment names (NBSCALE_GPU_REGISTRY); `notebook` becomes its
    JPY_SESSION_NAME, as Jupyter's server sets it for a kernel.
    """
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("JPY_SESSION_NAME", None)
    if notebook is not None:
        env["JPY_SESSION_NAME"] = notebook
    process = subprocess.Popen(
        [sys.executable, "-c", _HOLD, ",".join(keys), purpose],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=str(REPO_ROOT),
        preexec_fn=(lambda: os.umask(umask)) if umask is not None else None,
    )
    try:
        assert process.stdout is not None and process.stdout.readline() == "held\n", "the holder did not start"
        yield process
    finally:
        if process.poll() is None:
            assert process.stdin is not None
            process.stdin.close()
            process.wait(timeout=30)
