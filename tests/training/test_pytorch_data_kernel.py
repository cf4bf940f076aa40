"""PyTorch users' data written in a notebook (a Dataset of two inputs with a random transform, a DataLoader with a
collate_fn, a model returning two outputs): trained in a real kernel, in its own process and on a pool of 2."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

CELL = """
import torch, nbscale, warnings
from torch import nn
from torch.utils.data import DataLoader, Dataset, default_collate

class Pairs(Dataset):
    def __init__(self, n=128, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.x, self.extra = torch.randn(n, 4, generator=g), torch.randn(n, 2, generator=g)
        self.y = (self.x[:, 0] > self.extra[:, 0]).long()
        self.reads = 0
    def __len__(self):
        return len(self.y)
    def __getitem__(self, i):
        self.reads += 1
        return (self.x[i] + 0.01 * torch.randn(4), self.extra[i]), self.y[i]

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 2), nn.Linear(2, 2)
    def forward(self, x, extra):
        scores = self.a(x) + self.b(extra)
        return scores, scores.sum(dim=1)

def collate(items):
    (x, extra), y = default_collate(items)
    return [(x, extra), y]

def loss(outputs, y):
    return nn.functional.cross_entropy(outputs[0], y)

def run(env):
    torch.manual_seed(0)
    data = Pairs()
    opts = nbscale.TrainingOptions("adam", max_epochs=3, initial_learn_rate=0.05, verbose=False, plots="none",
                                   execution_environment=env, validation_data=DataLoader(Pairs(64, 1), batch_size=8))
    net, info = nbscale.train(Net(), DataLoader(data, batch_size=16, shuffle=True, collate_fn=collate), opts,
                              loss_fn=loss)
    return data.reads, info.mini_batch_size, info.stop_reason, nbscale.accuracy(net, Pairs(64, 1))
"""


def test_a_notebook_dataloader_with_collate_fn_trains_a_two_input_model_in_the_kernel(kernel) -> None:
    assert kernel.run(CELL).ok
    result = kernel.run(
        "reads, batch, reason, acc = run('cpu')\nprint(reads >= 3 * 128, batch, reason, acc > 0.6)", timeout=240
    )
    assert result.ok, result.text
    assert "True 16 Max epochs completed True" in result.stdout, result.text


def test_a_notebook_dataloader_with_collate_fn_trains_a_two_input_model_on_a_pool_of_two(kernel) -> None:
    assert kernel.run("%pool start 2 --cpu").ok
    assert kernel.run(CELL).ok
    result = kernel.run("_, batch, reason, acc = run('parallel')\nprint(batch, reason, acc > 0.6)", timeout=300)
    assert result.ok, result.text
    assert "16 Max epochs completed True" in result.stdout, result.text
