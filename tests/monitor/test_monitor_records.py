"""What a TrainingMonitor keeps until it reads: tensors stacked in chunks (few objects for the garbage collector),
read exactly, whatever mix of numbers, shapes and dtypes a loop records."""

from __future__ import annotations

import gc

import pytest
import torch

import nbscale
from nbscale.errors import OptionsError
from nbscale.monitor.records import CHUNK


def test_a_long_loop_keeps_a_few_objects_per_chunk_not_three_per_record() -> None:
    monitor = nbscale.TrainingMonitor(metrics=["loss", "accuracy"], min_interval=3600)
    weight = torch.ones((), requires_grad=True)
    monitor.record(0, loss=weight * 1.0, accuracy=0.0)
    gc.collect()
    before = len(gc.get_objects())
    for step in range(1, 10_001):
        monitor.record(step, loss=weight * step, accuracy=torch.tensor(step / 10_000))
    gc.collect()
    assert len(gc.get_objects()) - before < 1_000  # was ~30,000: a row, a dict and a tensor per record
    monitor.flush()
    assert monitor.history["loss"][-1] == 10_000.0 and monitor.history["accuracy"][-1] == pytest.approx(1.0)


def test_numbers_tensors_of_one_element_and_mixed_dtypes_are_read_exactly_in_order() -> None:
    monitor = nbscale.TrainingMonitor(metrics=["loss"], min_interval=3600)
    values = []
    for step in range(3 * CHUNK + 7):
        kind = step % 4
        value = float(step)
        values.append(value)
        recorded = [value, torch.tensor(value), torch.tensor([value]), torch.tensor(step, dtype=torch.int64)][kind]
        monitor.record(step, loss=recorded)
    assert monitor.history["loss"] == values
    assert monitor._columns["loss_iteration"] == list(range(3 * CHUNK + 7))


def test_a_step_recorded_on_both_sides_of_a_read_is_one_row() -> None:
    monitor = nbscale.TrainingMonitor(metrics=["loss", "val_loss"], min_interval=3600)
    monitor.record(1, loss=torch.tensor(1.0))
    monitor.flush()
    monitor.record(1, val_loss=torch.tensor(2.0))
    monitor.record(2, loss=0.5)
    assert monitor.history == {"iteration": [1, 2], "loss": [1.0, 0.5], "val_loss": [2.0, None]}


def test_a_tensor_of_many_values_or_a_word_is_one_clear_error_naming_the_metric() -> None:
    monitor = nbscale.TrainingMonitor(metrics=["loss"], min_interval=3600)
    with pytest.raises(OptionsError, match=r"monitor.record\(..., loss='high'\): give a number or a one-element"):
        monitor.record(1, loss="high")
    with pytest.raises(OptionsError, match=r"loss=...\): got a tensor of shape \(3,\); give a number or a one"):
        monitor.record(1, loss=torch.ones(3))  # a CPU tensor is read at once (a GPU's at the next read)
    with pytest.raises(OptionsError, match=r"'acc' is not one of the monitor's metrics"):
        monitor.record(1, acc=0.5)
    monitor.record(2, loss=torch.tensor(0.5))  # the monitor goes on
    assert monitor.history == {"iteration": [2], "loss": [0.5]}  # no empty row where a record failed
