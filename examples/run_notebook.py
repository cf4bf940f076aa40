"""Run a notebook headless in a real kernel (nbclient), save the executed copy, and print what it showed.

`--save` writes the outputs into the notebook itself (what the examples are committed with), with the hash of
the code they came from in its metadata: tests/test_examples_current.py checks each example's outputs are those
of its code (`make examples` re-runs them all).
"""

from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient


def code_hash(notebook: nbformat.NotebookNode) -> str:
    """The sha256 of the notebook's code cells' sources: what its committed outputs were made from."""
    code = "\n\x00".join(cell.source for cell in notebook.cells if cell.cell_type == "code")
    return hashlib.sha256(code.encode()).hexdigest()


def main(path: str, save: bool = False) -> int:
    source = Path(path).resolve()
    notebook = nbformat.read(source, as_version=4)
    started = time.monotonic()
    NotebookClient(
        notebook, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(source.parent)}}
    ).execute()
    executed = source if save else source.with_name(source.stem + ".executed.ipynb")
    if save:
        notebook.metadata["nbscale"] = {"outputs_of_code": code_hash(notebook)}
    nbformat.write(notebook, executed)
    print(f"Ran {source.name} in {time.monotonic() - started:.1f} s. What it printed:")
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            text = output.get("text") or output.get("data", {}).get("text/plain", "")
            if text:
                print("  " + "\n  ".join(str(text).rstrip().splitlines()))
    print(f"Executed notebook: {executed}")
    return 0


if __name__ == "__main__":
    arguments = [a for a in sys.argv[1:] if a != "--save"]
    sys.exit(main(arguments[0] if arguments else "examples/quickstart.ipynb", save="--save" in sys.argv))
