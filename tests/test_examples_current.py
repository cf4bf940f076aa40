"""The example notebooks are committed with their outputs, and those outputs are of their current code."""

from __future__ import annotations

import sys

import nbformat
import pytest

from tests.kernel_session import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "examples"))
from run_notebook import code_hash

EXAMPLES = sorted((REPO_ROOT / "examples").glob("*.ipynb"))
EXAMPLES = [path for path in EXAMPLES if not path.name.endswith(".executed.ipynb")]


@pytest.mark.parametrize("path", EXAMPLES, ids=[path.stem for path in EXAMPLES])
def test_the_example_is_committed_with_the_outputs_of_its_code(path) -> None:
    notebook = nbformat.read(path, as_version=4)
    saved = notebook.metadata.get("nbscale", {}).get("outputs_of_code")
    rerun = f"re-run it: .venv/bin/python examples/run_notebook.py --save {path.relative_to(REPO_ROOT)}"
    assert saved == code_hash(notebook), f"{path.name}: its outputs are not those of its code; {rerun}"
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert any(cell.get("outputs") for cell in code), f"{path.name} has no outputs; {rerun}"
    errors = [o for cell in code for o in cell.get("outputs", []) if o.output_type == "error"]
    assert not errors, f"{path.name} was saved with an error: {errors[0].get('evalue')}"
