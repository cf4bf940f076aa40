"""Run a notebook headless in a real kernel (nbclient), save the executed copy, and print what it showed."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient


def main(path: str) -> int:
    source = Path(path).resolve()
    notebook = nbformat.read(source, as_version=4)
    started = time.monotonic()
    NotebookClient(notebook, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(source.parent)}}).execute()
    executed = source.with_name(source.stem + ".executed.ipynb")
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
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "examples/quickstart.ipynb"))
