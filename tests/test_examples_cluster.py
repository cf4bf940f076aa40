"""examples/cluster.ipynb runs top to bottom in a real kernel: a pool on a local Ray cluster stand-in (loopback)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.kernel_session import REPO_ROOT, printed_text, run_notebook

pytestmark = pytest.mark.slow
pytest.importorskip("ray")


def test_cluster_notebook_runs_a_pool_on_a_local_ray_stand_in(monkeypatch):
    # the stand-in is a new cluster even where another is running on the machine (another test's head, another test
    # run's): ray.init() with no address would join the one named in Ray's address file
    monkeypatch.setenv("RAY_ADDRESS", "local")
    token_file = Path.home() / ".ray" / "auth_token"
    had_token = token_file.exists()
    printed = printed_text(run_notebook(REPO_ROOT / "examples" / "cluster.ipynb", timeout=300))
    assert "Ray cluster stand-in at 127.0.0.1:" in printed
    assert "(ray;" in printed and "rank  host" in printed  # %pool status: the backend and each worker's node
    assert "ray at 127.0.0.1:" in printed  # the pool's repr names the cluster
    assert "[1] rank 1 of 2" in printed and "total=3.0" in printed
    assert "squares: [0, 1, 4, 9, 16, 25]" in printed
    assert printed.rstrip().endswith("stopped")
    assert had_token or not token_file.exists()  # the stand-in leaves no token behind for later Ray heads
