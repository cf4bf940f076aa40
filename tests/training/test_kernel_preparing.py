"""Reading the data before training, as a user sees it in a real kernel: the count of files read (in the info
panel, or in the verbose table's output when no plot shows), then where the data are held and how long reading
them took, apart from the training's Elapsed time."""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.slow

SETUP = """
import tempfile, torch
from pathlib import Path
from nbscale.data import AugmentedImageDatastore, ImageDatastore
from tests.datasets import write_digits_pngs
folder = write_digits_pngs(Path(tempfile.mkdtemp()) / "digits", limit_per_class=30)
train_ds, val_ds = ImageDatastore(folder).split_each_label(0.8, seed=0)
def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
"""

CELL = """%%train --epochs 2 --batch-size 40 --lr 0.1 {flags}
model = make_model()
train_data = AugmentedImageDatastore((8, 8), train_ds)
val_data = AugmentedImageDatastore((8, 8), val_ds)
"""


def _panels(displays: list[dict]) -> list[str]:
    """The info panel's text in every display and update, in order."""
    return [shown["text/plain"] for shown in displays if shown.get("text/plain", "").startswith("State:")]


def test_the_info_panel_counts_the_files_read_then_shows_where_the_data_are_and_the_time_apart(kernel) -> None:
    assert kernel.run(SETUP).ok
    result = kernel.run(CELL.format(flags="--quiet"))
    assert result.ok, result.text
    panels = _panels(result.displays)
    # the panel shows before training, counting each part's files up to its total
    assert panels[0].splitlines()[0] == "State: Preparing data"
    counts = [line for panel in panels for line in panel.splitlines() if line.startswith("Preparing data:")]
    assert counts[0] == "Preparing data: training data: 0 of 240 files"
    assert "Preparing data: training data: 240 of 240 files" in counts
    assert counts[-1] == "Preparing data: validation data: 60 of 60 files"
    last = panels[-1]
    assert "Data: device-resident (240 images, 0.0 MB on cpu)" in last
    assert re.search(r"^Preparation: \d+\.\d s, before training \(not in Elapsed\)$", last, re.MULTILINE)
    check = kernel.run("print(info.prepare_seconds > 0, info.data_placement.startswith('device-resident (240'))")
    assert check.stdout.split() == ["True", "True"]
    # training time starts after the data are read: the first iteration is timed from the start of training
    check = kernel.run("print(info.time[0] < info.prepare_seconds + info.time[-1])")
    assert check.stdout.strip() == "True"


def test_without_plots_the_verbose_output_counts_the_files_on_a_pool_and_says_the_time_apart(kernel) -> None:
    assert kernel.run(SETUP).ok
    result = kernel.run(CELL.format(flags="--no-plots --env parallel"), timeout=180)
    assert result.ok, result.text
    out = result.stdout
    assert not _panels(result.displays)
    # one line rewritten in place, worded as the info panel words it; the two workers' counts add up to the totals
    assert "\rPreparing data: training data: 0 of 240 files" in out
    assert "\rPreparing data: training data: 240 of 240 files" in out
    assert "\rPreparing data: validation data: 60 of 60 files" in out
    data_line = next(line for line in out.splitlines() if line.startswith("Data: "))
    assert re.fullmatch(
        r"Data: device-resident \(240 images, 0\.0 MB on cpu\) on each of 2 workers, which read 1/2 of "
        r"it each; read in \d+\.\d s before training \(not in Time Elapsed\)\.",
        data_line,
    )
    assert out.index(data_line) < out.index("Training on 2 workers")
