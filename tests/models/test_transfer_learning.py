"""Transfer learning pays: on digits 5-9, a new head on a frozen trunk pre-trained on digits 0-4 beats the same
head trained for the same epochs on the same (frozen) network with random weights."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

import nbscale
from nbscale.data import ImageDatastore
from nbscale.data.device_resident import DeviceResidentData
from nbscale.models import param_groups, transfer
from tests.datasets import write_digits_pngs


def small_cnn(num_classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 4 * 4, 64),
        nn.ReLU(),
        nn.Linear(64, num_classes),
    )


def train(model: nn.Module, data: ImageDatastore, epochs: int, lr: float = 3e-3) -> nn.Module:
    """A plain loop: Adam over nbscale's param groups (learn-rate factors, frozen layers), cross-entropy."""
    optimizer = torch.optim.Adam(param_groups(model, lr))
    resident = DeviceResidentData(data, torch.device("cpu"))
    generator = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(epochs):
        for images, labels in resident.batches(32, shuffle=True, generator=generator):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(images), labels).backward()
            optimizer.step()
    return model


def test_transfer_from_digits_0_to_4_beats_training_from_scratch_on_5_to_9(tmp_path: Path) -> None:
    first = ImageDatastore(write_digits_pngs(tmp_path / "first", classes=range(5)))
    second = ImageDatastore(write_digits_pngs(tmp_path / "second", classes=range(5, 10)))
    few, test = second.split_each_label(8, randomize=True, seed=0)  # 8 training images per digit

    torch.manual_seed(0)
    pretrained = train(small_cnn(5), first, epochs=4)
    assert nbscale.accuracy(pretrained, first) > 0.9
    transferred = transfer(pretrained, num_classes=5, learn_rate_factor=10.0, freeze="trunk")
    trunk_before = transferred[0].weight.clone()
    train(transferred, few, epochs=5, lr=1e-3)
    assert torch.equal(transferred[0].weight, trunk_before)  # the frozen trunk did not move

    torch.manual_seed(0)
    scratch = train(
        transfer(small_cnn(5), num_classes=5, learn_rate_factor=10.0, freeze="trunk"), few, epochs=5, lr=1e-3
    )
    transfer_accuracy, scratch_accuracy = nbscale.accuracy(transferred, test), nbscale.accuracy(scratch, test)
    assert transfer_accuracy > scratch_accuracy + 0.1, (transfer_accuracy, scratch_accuracy)
