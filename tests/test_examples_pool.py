"""The pool's example notebooks run top to bottom in a real kernel, as `make demo` runs them."""

from __future__ import annotations

import pytest

from tests.kernel_session import REPO_ROOT, printed_text, run_notebook

pytestmark = pytest.mark.slow


def test_quickstart_notebook_runs():
    printed = printed_text(run_notebook(REPO_ROOT / "examples" / "quickstart.ipynb"))
    assert "Started 2 CPU workers" in printed
    assert "sum over workers: 3.0" in printed
    for where in ("In the notebook", "On the pool (2 workers"):
        line = next(line for line in printed.splitlines() if line.startswith(where))
        assert float(line.rsplit(" ", 1)[1]) > 0.85, line


def test_spmd_notebook_runs():
    printed = printed_text(run_notebook(REPO_ROOT / "examples" / "spmd.ipynb"))
    assert "[1] rank 1 of 2 on cpu: total=[0.0, 0.75, 1.5, 2.25, 3.0]" in printed
    assert "ValueError: rank 1 is unhappy" in printed and "line 4" in printed
    assert "[0, 1, 4, 9, 16, 25]" in printed
