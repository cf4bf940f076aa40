"""Training given what it cannot use: a clear OptionsError naming it, before anything trains or blocks."""

from __future__ import annotations

import os
import threading

import pytest
import torch
from torch.utils.data import TensorDataset

import nbscale
from nbscale import OptionsError, TrainingOptions
from tests.training.digits import digits, tiny_net

TRAIN, _ = digits()


def quiet(**fields: object) -> TrainingOptions:
    base = {"initial_learn_rate": 0.1, "max_epochs": 1, "mini_batch_size": 100, "verbose": False, "plots": "none"}
    return TrainingOptions("sgdm", **{**base, **fields})


def test_empty_validation_data_is_refused_before_training():
    empty = TensorDataset(torch.zeros(0, 64), torch.zeros(0, dtype=torch.long))
    with pytest.raises(OptionsError, match="validation_data is empty: give it at least one sample, or leave"):
        nbscale.train(tiny_net(), TRAIN, quiet(validation_data=empty))


def test_resuming_from_a_fifo_is_refused_at_once_instead_of_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "checkpoint.pt"
    os.mkfifo(fifo)
    outcome: list[BaseException] = []

    def resume() -> None:
        try:
            nbscale.train(tiny_net(), TRAIN, quiet(), resume_from=fifo)
        except BaseException as error:
            outcome.append(error)

    trainer = threading.Thread(target=resume, daemon=True)
    trainer.start()
    trainer.join(60)
    if trainer.is_alive():  # let the blocked open return, so the thread ends
        with open(fifo, "wb"):
            pass
        pytest.fail("train(resume_from=<a FIFO>) blocked")
    assert isinstance(outcome[0], OptionsError) and "is not a regular file (a pipe" in str(outcome[0])


@pytest.mark.slow
def test_train_magic_refuses_a_result_name_bound_to_a_module_before_the_cell_runs(kernel):
    assert kernel.run("import torch").ok
    cell = kernel.run(
        "%%train --net torch\nmodel = torch.nn.Linear(4, 2)\n"
        "train_data = (torch.zeros(8, 4), torch.zeros(8, dtype=torch.long))\n"
    )
    assert cell.error_name == "OptionsError"
    assert "--net torch: 'torch' is the notebook's torch module, which the result would replace" in cell.traceback
    assert kernel.run("print(type(torch).__name__, 'model' in dir())").stdout.split() == ["module", "False"]
