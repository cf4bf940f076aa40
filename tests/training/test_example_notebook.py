"""examples/train_digits.ipynb runs headless and keeps its training-progress figures as PNGs."""

from __future__ import annotations

import pytest

from tests.kernel_session import REPO_ROOT, run_notebook

pytestmark = pytest.mark.slow


def test_train_digits_notebook_runs_and_keeps_the_figures() -> None:
    notebook = run_notebook(REPO_ROOT / "examples" / "train_digits.ipynb", timeout=120)
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    pngs = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(pngs) >= 3  # in the process, on the pool, and %%train
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "2 workers (cpu, cpu; gloo)" in text


def test_pytorch_user_notebook_trains_a_dataloader_with_factories_and_fscore_on_a_pool_and_a_monitored_loop() -> None:
    notebook = run_notebook(REPO_ROOT / "examples" / "pytorch_user.ipynb", timeout=300)
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "2 workers (cpu, cpu; gloo): validation F-score" in text
    assert "4 validations, the last loss" in text
    assert len([o for o in outputs if "image/png" in o.get("data", {})]) >= 2  # the pool's run and the own loop
