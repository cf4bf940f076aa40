"""A worker that runs out of GPU memory raises torch.OutOfMemoryError in the notebook (a WorkerError too), as
training there does, naming the worker and its share of the mini-batch (a loss function raises it on the CPU
workers of a real pool)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import nbscale
from tests.training.test_out_of_memory import OutOfMemoryOnSecondStep


@pytest.mark.slow
def test_out_of_memory_on_a_worker_is_torchs_type_in_the_notebook_and_the_pool_trains_on():
    data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
    options = nbscale.TrainingOptions(
        "sgdm", mini_batch_size=16, max_epochs=1, plots="none", verbose=False, execution_environment="parallel"
    )
    with nbscale.Pool(2, cpu=True) as pool:
        with pytest.raises(torch.OutOfMemoryError) as caught:
            nbscale.train(nn.Linear(4, 2), data, options, loss_fn=OutOfMemoryOnSecondStep())
        assert isinstance(caught.value, nbscale.WorkerError)  # and still what a failed pool run raises
        message = str(caught.value)
        assert (
            "Out of GPU memory on worker" in message
            and "samples per iteration: lower mini_batch_size (now 16)" in message
        )
        assert caught.value.__context__ is None and caught.value.__cause__ is None
        _, info = nbscale.train(nn.Linear(4, 2), data, options)  # the pool is fine afterwards
        assert info.iteration[-1] == 4
        assert [w.state for w in pool.workers] == ["idle", "idle"]
