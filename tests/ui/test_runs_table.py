"""The runs table (a sweep's live table and its results): every row's columns, whichever row comes first."""

from __future__ import annotations

import pytest

from nbscale.training.run_table import RunsTable
from nbscale.training.runs import TrainingRun
from nbscale.ui.runs_table import runs_table_html, runs_table_text
from nbscale.ui.sweep_display import SweepDisplay
from tests.metric_events import metric_run

METRIC_COLUMNS = ("training accuracy", "validation accuracy", "training fscore", "validation fscore")


def training_run(name: str) -> TrainingRun:
    run = TrainingRun(name)
    for event in metric_run(("accuracy", "fscore"))[:3]:  # started, and two iterations in
        run.info.record(event)
    return run


@pytest.mark.parametrize("queued_first", [True, False])
def test_a_queued_runs_row_beside_a_training_one_keeps_every_metric_column(queued_first: bool) -> None:
    queued, training = TrainingRun("#3"), training_run("#1")
    runs = (queued, training) if queued_first else (training, queued)
    text = runs_table_text(RunsTable("Sweep", runs))
    header = text.splitlines()[1].split("  ")
    columns = [column.strip() for column in header if column.strip()]
    assert columns[: columns.index("validation loss") + 1] == [
        "run",
        "options",
        "state",
        "epoch",
        "iteration",
        "training loss",
        "validation loss",
    ]
    assert tuple(columns[7:11]) == METRIC_COLUMNS  # where a training row puts them, before "elapsed"
    assert columns[11] == "elapsed"
    html = runs_table_html(RunsTable("Sweep", runs))
    assert all(f">{column}</th>" in html for column in METRIC_COLUMNS)
    assert html.count("<tr>") == 3  # the header and both runs


def test_the_sweep_figure_has_a_panel_per_metric_of_any_run_with_a_queued_run_first() -> None:
    view = SweepDisplay([TrainingRun("#3"), training_run("#1")])
    assert view.panel_names() == ["accuracy", "fscore", "loss"]
    assert view.png().startswith(b"\x89PNG")
