"""The live figure drawn in the browser (issue 42), in a real JupyterLab and Notebook 7 in Chromium: while a fast
loop trains, the figure is a canvas that changes between screenshots a second apart; Stop leaves the final PNG in
its place, and the saved notebook holds that PNG alone (no widget a reopened notebook could not show)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kernel_session import needs_clicks_mid_cell
from tests.labextension.jupyter_server import ARTIFACTS, Server, jupyter_server, notebook_page, run_cell

pytestmark = pytest.mark.slow

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
SCREENSHOTS = 4
# a fast loop with validation (one torch thread: two wait on each other on a busy 2-core machine), until its Stop
CELLS = [
    "%load_ext nbscale",
    """import torch, nbscale
from torch import nn
from sklearn.datasets import load_digits
torch.set_num_threads(1)
digits = load_digits()
x = torch.tensor(digits.data, dtype=torch.float32) / 16; y = torch.tensor(digits.target)
opts = nbscale.TrainingOptions("sgdm", max_epochs=1_000, mini_batch_size=16, plots="training-progress",
                               verbose=False, validation_data=(x[1500:], y[1500:]), validation_frequency=50)
net, info = nbscale.train(nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10)), (x[:1500], y[:1500]), opts)
print("returned", info.stop_reason)""",
]


@pytest.fixture(params=["jupyterlab", "notebook"])
def lab(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Server]:
    """JupyterLab, then Notebook 7, serving the notebook."""
    with jupyter_server(tmp_path, {"figure.ipynb": CELLS}, app=request.param) as server:
        yield server


@needs_clicks_mid_cell  # the kernel learns that widgets draw from the Stop button's view, told mid-cell
def test_the_live_figure_is_a_canvas_that_moves_and_the_saved_notebook_keeps_its_png(lab: Server, tmp_path: Path):
    from playwright.sync_api import expect

    with notebook_page(lab, "figure.ipynb", f"live-figure-{lab.app}") as page:
        run_cell(page, 0, CELLS)
        cell = run_cell(page, 1, CELLS, wait=False)
        canvas = cell.locator("canvas.nbscale-live-figure")
        expect(canvas).to_be_visible(timeout=120_000)  # the Stop button's view told the kernel: widgets draw here
        expect(cell.locator(".jp-OutputArea-output img")).to_have_count(0)  # the canvas in the PNG's place
        if lab.app == "jupyterlab":  # the views' messages, handled mid-cell, leave the kernel's status Busy
            expect(page.locator(".jp-StatusBar-TextItem", has_text="Python 3")).to_contain_text("Busy")
        pictures = []
        for index in range(SCREENSHOTS):
            pictures.append(canvas.screenshot(path=str(tmp_path / f"live-figure-{index}.png")))
            time.sleep(1.0)  # the interval is what is tested: the figure moves at least every second
        assert all(a != b for a, b in zip(pictures, pictures[1:], strict=False)), "the canvas did not change"
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        canvas.screenshot(path=str(ARTIFACTS / f"live-figure-canvas-{lab.app}.png"))

        cell.locator("button", has_text="Stop").click()
        expect(cell.locator(".jp-OutputArea")).to_contain_text("returned Stopped by the Stop button", timeout=60_000)
        expect(canvas).to_have_count(0)
        expect(cell.locator(".jp-OutputArea-output img")).to_have_count(1)  # the final figure, a PNG
        page.keyboard.press("Control+s")
        saved = tmp_path / "notebooks" / "figure.ipynb"
        deadline = time.monotonic() + 30
        while not _saved_outputs(saved) and time.monotonic() < deadline:
            time.sleep(0.2)  # the save is written by the server, after the keypress
    outputs = _saved_outputs(saved)
    figures = [output["data"] for output in outputs if "image/png" in output.get("data", {})]
    assert len(figures) == 1 and WIDGET_VIEW not in figures[0], [sorted(o.get("data", {})) for o in outputs]
    assert not any(WIDGET_VIEW in output.get("data", {}) for output in outputs)  # the Stop button is gone too


def _saved_outputs(notebook: Path) -> list[dict]:
    """The second cell's outputs as saved, or none while the server has not yet written the whole file."""
    try:
        return json.loads(notebook.read_text())["cells"][1]["outputs"]
    except (OSError, ValueError, KeyError, IndexError):
        return []
