"""A Dataset nbscale cannot prove deterministic (random transforms inside) is read afresh every epoch under
data_placement="auto", as under "stream"; "device" keeps it resident, warning once that its randomness is frozen.
Tensors stay resident under "auto"."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

import nbscale
from nbscale import TrainingOptions

ITEMS, EPOCHS = 256, 3


class RandomlyShifted(Dataset):
    """Items (x + noise, label) with fresh noise at each read (a random transform), counting its reads."""

    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(ITEMS, 8, generator=generator)
        self.y = (self.x[:, 0] > 0).long()
        self.reads = 0

    def __len__(self) -> int:
        return ITEMS

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.reads += 1
        return self.x[index] + 0.01 * torch.randn(8), self.y[index]


def trained(data: Dataset, placement: str) -> tuple[object, list[warnings.WarningMessage]]:
    options = TrainingOptions(
        "sgdm", max_epochs=EPOCHS, mini_batch_size=32, verbose=False, plots="none", data_placement=placement
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, info = nbscale.train(nn.Sequential(nn.Linear(8, 2)), data, options)
    return info, [w for w in caught if "data_placement" in str(w.message)]


@pytest.mark.parametrize("placement", ["auto", "stream"])
def test_a_dataset_with_random_transforms_is_read_every_epoch(placement: str) -> None:
    data = RandomlyShifted()
    info, said = trained(data, placement)
    assert data.reads >= EPOCHS * ITEMS
    assert "streamed" in str(info.data_placement)
    assert said == []


def test_explicit_device_placement_reads_it_once_and_warns_once_that_its_randomness_is_frozen() -> None:
    data = RandomlyShifted()
    info, said = trained(data, "device")
    assert data.reads <= ITEMS + 4  # the checks (classes, first-sample metrics) read the first items
    assert "device-resident" in str(info.data_placement)
    assert len(said) == 1
    assert "randomness in it (random transforms) is frozen for the whole run" in str(said[0].message)


def test_tensors_stay_resident_under_auto() -> None:
    x = torch.randn(ITEMS, 8)
    info, said = trained(TensorDataset(x, (x[:, 0] > 0).long()), "auto")
    assert "device-resident" in str(info.data_placement) and said == []
