"""The differential suite in the notebook's process: nbscale.train against the plain PyTorch loop of
tests.reference.plain, row by row (tests.reference.rows), and the DataLoader's settings each way. Histories of
the loss, the learn rate and the metrics, and the final weights, agree to 1e-5."""

from __future__ import annotations

import pytest

from tests.reference.plain import Row, accuracy, assert_same, classes
from tests.reference.rows import VALIDATION, rows


@pytest.mark.parametrize("name", list(rows()))
def test_each_row_trains_as_the_plain_pytorch_loop(name: str) -> None:
    row = rows()[name]
    assert_same(row.trained(), row.reference())


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("drop_last", [True, False])
@pytest.mark.parametrize("placement", ["device", "stream"])
def test_a_dataloaders_shuffle_and_drop_last_are_followed_resident_and_streamed(
    shuffle: bool, drop_last: bool, placement: str
) -> None:
    row = Row(
        classes(), shuffle=shuffle, drop_last=drop_last, reference_metrics={"accuracy": accuracy}, validation=VALIDATION
    )
    assert_same(row.trained(data_placement=placement), row.reference())
