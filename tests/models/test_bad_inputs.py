"""transfer() and pretrained() given absurd or unreadable inputs: a ModelError naming it, before any harm."""

from __future__ import annotations

import os
import threading

import pytest
from torch import nn

from nbscale.errors import ModelError
from nbscale.models import pretrained, transfer


def _small_net() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


def test_a_billion_classes_is_refused_naming_the_layer_size():
    net = _small_net()
    with pytest.raises(
        ModelError,
        match=r"num_classes=1,000,000,000 makes a new layer of 32 x 1,000,000,000 "
        r"weights, 122\.9 GiB \(at most 1 GiB\)",
    ):
        transfer(net, 10**9)
    assert net[3].out_features == 10  # unchanged


def test_a_large_but_sane_class_count_is_taken():
    assert transfer(_small_net(), 100_000)[3].out_features == 100_000


def test_weights_from_a_fifo_are_refused_at_once_not_called_missing(tmp_path):
    fifo = tmp_path / "weights.pt"
    os.mkfifo(fifo)
    outcome: list[BaseException] = []
    reader = threading.Thread(
        target=lambda: _record(outcome, lambda: pretrained("resnet18", weights=fifo)), daemon=True
    )
    reader.start()
    reader.join(30)
    assert not reader.is_alive(), "pretrained() blocked on the pipe"
    assert isinstance(outcome[0], ModelError) and "is not a regular file" in str(outcome[0])


def _record(outcome: list[BaseException], call) -> None:
    try:
        call()
    except BaseException as error:
        outcome.append(error)
