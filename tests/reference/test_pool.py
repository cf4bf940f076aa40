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


def test_a_last_batch_the_workers_cannot_split_evenly_is_padded_from_the_epochs_start(pool: nbscale.Pool) -> None:
    # 39 samples: the last batch, 7, is padded to 8 (one sample of the epoch's first batch again), so each worker
    # takes 4; every other batch and the epoch count are the loader's, and nothing repeats with drop_last=True
    row = Row(classes(39), reference_metrics={"accuracy": accuracy})
    got, expected = row.trained(execution_environment="parallel"), row.reference()
    assert len(got.training_loss) == len(expected.training_loss) == 3 * 5
    assert got.training_loss[:4] == pytest.approx(expected.training_loss[:4], abs=1e-5)
    assert got.training_loss[4] != pytest.approx(expected.training_loss[4], abs=1e-5)
    dropped = Row(classes(39), drop_last=True, reference_metrics={"accuracy": accuracy})
    assert_same(dropped.trained(execution_environment="parallel"), dropped.reference())
