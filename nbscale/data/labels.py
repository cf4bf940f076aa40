"""Class labels as the losses take them."""

from __future__ import annotations

import torch


def as_labels(labels: torch.Tensor) -> torch.Tensor:
    """Integer labels as an int64 vector (cross-entropy refuses int32 and friends, and a column of labels, N x 1,
    as numpy and pandas often give them); other labels unchanged."""
    if labels.dtype in (torch.int8, torch.int16, torch.int32, torch.uint8):
        labels = labels.long()
    if labels.dtype == torch.int64 and labels.ndim == 2 and labels.shape[1] == 1:
        labels = labels[:, 0]
    return labels
