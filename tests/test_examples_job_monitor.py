"""examples/job_monitor.ipynb runs headless in a real kernel: a %%batch job's training shown by %jobs show, and a
long one stopped from the monitor keeping its network."""

from __future__ import annotations

import re

import pytest

from tests.kernel_session import REPO_ROOT, printed_text, run_notebook


@pytest.mark.slow
def test_job_monitor_notebook_shows_the_jobs_training_and_stops_the_long_one(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("NBSCALE_HOME", str(tmp_path / "nbscale-home"))  # its jobs go to a store of their own
    notebook = run_notebook(REPO_ROOT / "examples" / "job_monitor.ipynb", timeout=300)
    outputs = [output for cell in notebook.cells for output in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    text = printed_text(notebook)
    assert "State: Done: Max epochs completed" in text and "Iteration: 1380 of 1380" in text
    assert float(re.search(r"validation accuracy ([\d.]+)", text).group(1)) > 0.9
    assert "State: Done: Stopped from the job monitor" in text
    stopped_at = int(re.search(r"Stopped from the job monitor at iteration (\d+) of 9200", text).group(1))
    assert 0 < stopped_at < 9200 and "the saved network: Sequential" in text
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 2  # each training's final figure
    assert re.search(r"digits-monitor\s+finished", text) and re.search(r"digits-long\s+finished", text)  # %jobs
