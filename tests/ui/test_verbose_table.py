"""verbose=True's table as the user reads it: every row as wide as the header, whatever the losses."""

from __future__ import annotations

import pytest

import nbscale
from tests.training.digits import digits, tiny_net


def _table_lines(learn_rate: float, capsys: pytest.CaptureFixture[str]) -> list[str]:
    (train_x, train_y), val = digits()
    options = nbscale.TrainingOptions(
        "sgdm",
        initial_learn_rate=learn_rate,
        max_epochs=3,
        mini_batch_size=100,
        validation_data=val,
        validation_frequency=15,
        verbose_frequency=15,
    )
    nbscale.train(tiny_net(), (train_x, train_y), options)
    return [line for line in capsys.readouterr().out.splitlines() if line.startswith("|")]


def test_a_diverging_loss_is_printed_in_powers_of_ten_and_keeps_the_columns_aligned(capsys) -> None:
    lines = _table_lines(1000.0, capsys)  # the loss grows past 1e19 but stays finite
    assert len({len(line) for line in lines}) == 1, "\n".join(lines)
    last = [cell.strip() for cell in lines[-2].strip("|").split("|")]
    assert last[:2] == ["3", "45"] and "e+" in last[5] and "e+" in last[6]


def test_ordinary_losses_keep_four_decimals(capsys) -> None:
    lines = _table_lines(0.05, capsys)
    first = [cell.strip() for cell in lines[3].strip("|").split("|")]
    assert first[:2] == ["1", "1"] and len(first[5].split(".")[1]) == 4


def test_a_column_per_metric_and_a_regression_table_shows_rmse_never_a_blank_accuracy() -> None:
    import io

    from nbscale.ui.verbose_table import VerboseTable
    from tests.metric_events import metric_run

    for names, titles in (
        (("rmse",), ["Mini-batch RMSE", "Validation RMSE"]),
        (
            ("accuracy", "fscore"),
            ["Mini-batch Accuracy", "Validation Accuracy", "Mini-batch fscore", "Validation fscore"],
        ),
    ):
        stream = io.StringIO()
        table = VerboseTable(5, stream=stream)
        for event in metric_run(names):
            table(event)
        rows = [
            [c.strip() for c in line.strip("|").split("|")]
            for line in stream.getvalue().splitlines()
            if line.startswith("| ")
        ]
        assert rows[0][3 : 3 + len(titles)] == titles and "Accuracy" not in " ".join(rows[0]) or "accuracy" in names
        last = rows[-1]
        assert all(cell for cell in last[: 3 + len(titles)])  # every metric's cell filled on a validated row
        if names == ("rmse",):
            assert last[3] == "0.9000" and last[4] == "0.9500"
