"""scikit-learn's digits (1797 8x8 images, 10 classes) as tensors, and a tiny network for them."""

from __future__ import annotations

import torch
from torch import nn


def digits() -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """(train, validation) pairs of (images N x 64 in [0, 1], labels): 1500 and 297 images, a fixed shuffle."""
    from sklearn.datasets import load_digits

    data = load_digits()
    inputs = torch.tensor(data.data, dtype=torch.float32) / 16.0
    labels = torch.tensor(data.target, dtype=torch.long)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    inputs, labels = inputs[order], labels[order]
    return (inputs[:1500], labels[:1500]), (inputs[1500:], labels[1500:])


def tiny_net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


class ViewsItsFeatures(nn.Module):
    """A conv net that flattens with .view, which a channels_last tensor refuses."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.out = nn.Linear(8 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.conv(x.view(-1, 1, 8, 8)).relu()
        return self.out(features.view(features.size(0), -1))
