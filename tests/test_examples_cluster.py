"""examples/cluster.ipynb runs top to bottom in a real kernel: a pool on a local Ray cluster stand-in (loopback)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.kernel_session import REPO_ROOT, printed_text, run_notebook

# alone: the notebook starts its Ray node inside the kernel (ray.init), whose raylet waits a fixed 15 s for its
# agents (Python processes) to start, which they miss on 2 cores beside the rest of the suite; Ray heads started with
# `ray start` (the other Ray tests') do not wait (nbscale.pool.backends.ray_start), this one cannot be told
pytestmark = [pytest.mark.slow, pytest.mark.alone]
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
