"""MATLAB's parfor over learn rates, literally: `pool.map` calling `nbscale.train` on each worker (docs/pool.md)."""

from __future__ import annotations

import pytest
import torch

import nbscale
from tests.training.digits import digits, tiny_net

TRAIN, VAL = digits()

pytestmark = pytest.mark.slow


def train_with(rate: float) -> tuple[float, float, str, int]:
    """One parfor iteration: a seeded network trained in the worker's own process ("cpu")."""
    import os

    torch.manual_seed(0)
    options = nbscale.TrainingOptions(
        "sgdm",
        initial_learn_rate=rate,
        max_epochs=3,
        mini_batch_size=100,
        execution_environment="cpu",
        verbose=False,
        validation_data=VAL,
    )
    net, info = nbscale.train(tiny_net(), TRAIN, options)
    return rate, info.final_validation_accuracy, info.stop_reason, os.getpid()


def test_pool_map_over_learn_rates_trains_one_network_per_rate_on_the_workers(pool: nbscale.Pool) -> None:
    rates = [0.001, 0.05, 0.3, 1.0]
    results = list(pool.map(train_with, rates))  # parfor i = 1:numel(rates)
    assert [rate for rate, *_ in results] == rates  # in order, as parfor's output
    assert all(reason == "Max epochs completed" for _, _, reason, _ in results)
    accuracy = {rate: value for rate, value, _, _ in results}
    assert accuracy[0.05] > 0.85 and accuracy[0.001] < accuracy[0.05]  # 0.001 is far too slow for 3 epochs
    pids = {pid for *_, pid in results}
    assert pids == {worker.pid for worker in pool.workers}  # both workers took iterations
    # a seeded iteration is reproducible: the same rate again gives the same figures
    assert pool.submit(train_with, 0.05).result(timeout=120)[1] == accuracy[0.05]
