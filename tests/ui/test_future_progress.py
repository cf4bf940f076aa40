"""`nbscale.show(future)`, a list's bar and `pool.map(..., progress=True)` outside a notebook: nothing to update
later, and no error when the tasks end."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.slow
def test_show_of_a_future_in_a_script_leaves_no_error_when_the_task_ends() -> None:
    script = (
        "import nbscale\nwith nbscale.Pool(1, cpu=True) as pool:\n    future = pool.submit(pow, 2, 3)\n"
        "    nbscale.show(future)\n    print('result', future.result())\n"
        "    nbscale.show([pool.submit(abs, -1)])\n    print('map', list(pool.map(abs, [-2, -3], progress=True)))\n"
    )
    ran = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert "result 8" in ran.stdout and "map [2, 3]" in ran.stdout
    assert "exception calling callback" not in ran.stderr and "AttributeError" not in ran.stderr, ran.stderr
