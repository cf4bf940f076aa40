"""examples/transfer_learning.ipynb runs headless in a real kernel and shows what it promises."""

from __future__ import annotations

import re

import pytest

from tests.kernel_session import REPO_ROOT, run_notebook


@pytest.mark.slow
def test_transfer_learning_notebook_runs_and_transfer_improves_accuracy() -> None:
    notebook = run_notebook(REPO_ROOT / "examples" / "transfer_learning.ipynb", timeout=300)
    outputs = [output for cell in notebook.cells for output in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    text = "\n".join(str(o.get("text") or o.get("data", {}).get("text/plain", "")) for o in outputs)
    before = float(re.search(r"before training the new layer: ([\d.]+)", text).group(1))
    after = float(re.search(r"after training it on \d+ images: ([\d.]+)", text).group(1))
    assert after > before + 0.2
    assert "accuracy on held-out 0-4" in text and "true \\ predicted" in text
    assert any("image/png" in o.get("data", {}) for o in outputs)  # the preview montage and the confusion chart
