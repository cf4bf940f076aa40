"""MATLAB's "Use parfeval to Train Multiple Deep Learning Networks", written in a notebook as docs/pool.md shows
it: a function defined in the notebook calls nbscale.train, and is sent to the pool and to a batch job."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

TRAIN_ONE = """
import torch, nbscale
from torch import nn
x = torch.randn(256, 8); y = (x[:, 0] > 0).long()
data = torch.utils.data.TensorDataset(x, y)

def train_one(rate):
    torch.manual_seed(0)
    opts = nbscale.TrainingOptions("sgdm", initial_learn_rate=rate, max_epochs=2, mini_batch_size=32,
                                   execution_environment="cpu", verbose=False)
    net, info = nbscale.train(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)), data, opts)
    return rate, info.stop_reason
"""


def test_a_notebook_function_calling_train_runs_on_the_pool_as_parfeval(kernel) -> None:
    assert kernel.run("%pool start 2 --cpu").ok
    assert kernel.run(TRAIN_ONE).ok
    result = kernel.run(
        "futures = [nbscale.current_pool().submit(train_one, r) for r in (0.01, 0.1)]\n"
        "print([f.result() for f in futures])",
        timeout=240,
    )
    assert result.ok, result.text
    assert "[(0.01, 'Max epochs completed'), (0.1, 'Max epochs completed')]" in result.stdout


def test_a_notebook_function_calling_train_runs_in_a_batch_job(kernel, tmp_path) -> None:
    assert kernel.run(f"import os; os.environ['NBSCALE_HOME'] = {str(tmp_path)!r}").ok
    assert kernel.run(TRAIN_ONE).ok
    submitted = kernel.run("%%batch --name parfeval\nresult = train_one(0.05)\n")
    assert submitted.ok, submitted.text
    waited = kernel.run(
        "job = nbscale.jobs.list()[-1]\njob.wait(timeout=240)\nprint(job.state, job.result('result'))", timeout=300
    )
    assert waited.ok, waited.text
    assert "finished (0.05, 'Max epochs completed')" in waited.stdout, waited.text + str(job_log(kernel))


def job_log(kernel) -> str:
    return kernel.run("print(nbscale.jobs.list()[-1].log())").stdout
