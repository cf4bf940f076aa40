"""The differential suite on a CPU pool of 2: nbscale.train with execution_environment="parallel" against the
same plain PyTorch loop in one process (tests.reference.plain). Each rank trains on its share of every mini-batch
and the gradients are summed weighted by the shares, so the histories and weights agree to 1e-5 (the ranks sum
in another order than one process). 38 samples in batches of 8: the last batch, 6, splits 3 and 3, so no
sample is repeated to pad it (see docs/training.md)."""

from __future__ import annotations

import pytest

import nbscale
from tests.reference.plain import Row, accuracy, assert_same, classes
from tests.reference.rows import VALIDATION, rows

pytestmark = pytest.mark.slow

POOL_ROWS = [
    "cross-entropy",
    "mse, (N, 1) targets",
    # not "step_fn with validation": mixup mixes each worker's share of a batch, not the whole batch
    "step_fn of each sample, with validation",
    "callable metrics",
    "OneCycleLR per iteration",
    "ReduceLROnPlateau, min mode",
    "ReduceLROnPlateau, max mode on accuracy",
]


@pytest.mark.parametrize("name", POOL_ROWS)
def test_each_row_on_a_pool_of_two_trains_as_the_plain_pytorch_loop(pool: nbscale.Pool, name: str) -> None:
    row = rows()[name]
    assert_same(row.trained(execution_environment="parallel"), row.reference())


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("drop_last", [True, False])
def test_a_dataloaders_shuffle_and_drop_last_are_followed_on_a_pool_of_two(
    pool: nbscale.Pool, shuffle: bool, drop_last: bool
) -> None:
    row = Row(
        classes(), shuffle=shuffle, drop_last=drop_last, reference_metrics={"accuracy": accuracy}, validation=VALIDATION
    )
    assert_same(row.trained(execution_environment="parallel", data_placement="stream"), row.reference())
