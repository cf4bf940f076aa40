"""What a TrainingMonitor keeps until it reads: CPU tensors read at once, a GPU's tensors stacked in chunks (few
objects for the garbage collector), read exactly, whatever mix of numbers, shapes and dtypes a loop records. The
GPU's path runs here on tensors that say they are not on the CPU (`_Elsewhere`)."""

from __future__ import annotations

import gc
import math

import pytest
import torch

import nbscale
from nbscale.errors import OptionsError
from nbscale.monitor.records import CHUNK


class _Elsewhere(torch.Tensor):
    """A CPU tensor that says it is elsewhere: recorded as a GPU's tensor is (kept unread, stacked, read later)."""

    @property
    def is_cpu(self) -> bool:
        return False


def _on_the_cpu(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def _elsewhere(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.as_subclass(_Elsewhere)


PLACES = pytest.mark.parametrize("place", [_on_the_cpu, _elsewhere], ids=["cpu", "another device"])


@PLACES
def test_a_long_loop_keeps_a_few_objects_per_chunk_not_three_per_record(place) -> None:
    monitor = nbscale.TrainingMonitor(metrics=["loss", "accuracy"], min_interval=3600)
    weight = place(torch.ones((), requires_grad=True))
    monitor.record(0, loss=weight * 1.0, accuracy=0.0)
    gc.collect()
    before = len(gc.get_objects())
    for step in range(1, 10_001):
        monitor.record(step, loss=weight * step, accuracy=place(torch.tensor(step / 10_000)))
    gc.collect()
    assert len(gc.get_objects()) - before < 1_000  # was ~30,000: a row, a dict and a tensor per record
    monitor.flush()
    assert monitor.history["loss"][-1] == 10_000.0 and monitor.history["accuracy"][-1] == pytest.approx(1.0)


@PLACES
def test_numbers_tensors_of_one_element_and_mixed_dtypes_are_read_exactly_in_order(place) -> None:
    monitor = nbscale.TrainingMonitor(metrics=["loss"], min_interval=3600)
    values = []
    for step in range(3 * CHUNK + 7):
        kind = step % 4
        value = float(step)
        values.append(value)
        tensors = [torch.tensor(value), torch.tensor([value]), torch.tensor(step, dtype=torch.int64)]
        recorded = [value, *map(place, tensors)][kind]
        monitor.record(step, loss=recorded)
    assert monitor.history["loss"] == values and all(type(value) is float for value in monitor.history["loss"])
    assert monitor._listeners.figure.columns["loss_iteration"] == list(range(3 * CHUNK + 7))


def test_a_step_recorded_on_both_sides_of_a_read_is_one_row() -> None:
    monitor = nbscale.TrainingMonitor(metrics=["loss", "val_loss"], min_interval=3600)
    monitor.record(1, loss=torch.tensor(1.0))
    monitor.flush()
    monitor.record(1, val_loss=torch.tensor(2.0))
    monitor.record(2, loss=0.5)
    assert monitor.history == {"iteration": [1, 2], "loss": [1.0, 0.5], "val_loss": [2.0, None]}


def test_a_metric_at_every_step_one_now_and_then_and_a_step_recorded_twice_are_drawn_as_recorded() -> None:
    """A read takes a metric recorded at every step in one go, others value by value: both give the same rows."""
    monitor = nbscale.TrainingMonitor(metrics=["loss", "val_loss"], min_interval=3600)
    recorded = []
    for step in range(1, 41):
        monitor.record(step, loss=1.0 / step)
        recorded.append((step, "loss", 1.0 / step))
        if step % 10 == 0:
            monitor.record(step, val_loss=2.0 / step)
            monitor.record(step, val_loss=3.0 / step)  # a second value at one step: drawn, and last in the history
            recorded += [(step, "val_loss", 2.0 / step), (step, "val_loss", 3.0 / step)]
        if step % 15 == 0:
            monitor.flush()
    monitor.flush()
    steps = list(range(1, 41))
    assert monitor.history["iteration"] == steps and monitor.history["loss"] == [1.0 / s for s in steps]
    assert monitor.history["val_loss"] == [3.0 / s if s % 10 == 0 else None for s in steps]
    for name in ("loss", "val_loss"):
        drawn = [(step, value) for step, metric, value in recorded if metric == name]
        assert monitor._listeners.figure.columns[f"{name}_iteration"] == [step for step, _ in drawn]
        assert monitor._listeners.figure.columns[name] == [value for _, value in drawn]
        smooth = monitor._listeners.figure.columns[f"{name}_smooth"]
        assert len(smooth) == len(drawn) and smooth[0] == drawn[0][1]
        assert smooth[1] == pytest.approx(0.6 * drawn[0][1] + 0.4 * drawn[1][1])


def test_a_tensor_of_many_values_or_a_word_is_one_clear_error_naming_the_metric() -> None:
    monitor = nbscale.TrainingMonitor(metrics=["loss"], min_interval=3600)
    with pytest.raises(OptionsError, match=r"monitor.record\(..., loss='high'\): give a number or a one-element"):
        monitor.record(1, loss="high")
    with pytest.raises(OptionsError, match=r"loss=...\): got a tensor of shape \(3,\); give a number or a one"):
        monitor.record(1, loss=torch.ones(3))  # a CPU tensor is read at once
    monitor.record(1, loss=_elsewhere(torch.ones(3)))  # a GPU's at the next read
    with pytest.raises(OptionsError, match=r"loss=...\): got a tensor of shape \(3,\); give a number or a one"):
        monitor.flush()
    with pytest.raises(OptionsError, match=r"'acc' is not one of the monitor's metrics"):
        monitor.record(1, acc=0.5)
    monitor.record(2, loss=torch.tensor(0.5))  # the monitor goes on
    history = monitor.history  # no row where a record failed; NaN where a kept tensor could not be read
    assert history["iteration"] == [1, 2] and math.isnan(history["loss"][0]) and history["loss"][1] == 0.5


@PLACES
def test_records_of_any_mix_of_names_steps_and_reads_are_kept_as_recorded(place) -> None:
    """Whatever a loop records (one name or several, in any order, none, a step twice), between reads at any
    point: the history and the drawn columns are what was recorded."""
    import random

    chooser = random.Random(0)
    monitor = nbscale.TrainingMonitor(metrics=["loss", "accuracy", "lr"], min_interval=3600)
    drawn: dict[str, list[tuple[int, float]]] = {"loss": [], "accuracy": [], "lr": []}
    rows: list[dict[str, float]] = []
    steps: list[int] = []
    step = 0
    for _ in range(3000):
        step += chooser.random() < 0.8  # a step recorded again now and then
        names = chooser.choice([["loss"], ["loss"], ["loss", "accuracy"], ["lr", "loss"], [], ["accuracy"]])
        values = {name: float(chooser.randrange(1000)) for name in names}
        monitor.record(step, **{name: place(torch.tensor(v)) if v % 2 else v for name, v in values.items()})
        if not steps or steps[-1] != step:
            steps.append(step)
            rows.append({})
        rows[-1].update(values)
        for name, value in values.items():
            drawn[name].append((step, value))
        if chooser.random() < 0.01:
            monitor.flush()
    history = monitor.history
    assert history["iteration"] == steps
    for name in drawn:
        assert history[name] == [row.get(name) for row in rows]
        assert monitor._listeners.figure.columns[name] == [value for _, value in drawn[name]]
        assert monitor._listeners.figure.columns[f"{name}_iteration"] == [at for at, _ in drawn[name]]


def test_a_loop_recording_faster_than_its_reads_are_budgeted_is_read_before_it_keeps_too_many() -> None:
    """Reads and draws get `budget` of the time; a loop recording a great many records a second is still read at
    a pace that keeps about MAX_ROWS steps unread at most (the bound is set at a read, not checked per record)."""
    from nbscale.monitor.records import MAX_ROWS

    monitor = nbscale.TrainingMonitor(metrics=["loss"], min_interval=0.001, budget=1e-9)
    for step in range(MAX_ROWS):  # the pace, over enough records that a pause of the machine does not upset it
        monitor.record(step, loss=0.5)
    monitor.flush()
    steps = monitor._history[monitor.x_label]
    read, most = steps[-1], 0  # the last step read (the history itself is thinned past HISTORY_ROWS steps)
    for step in range(MAX_ROWS, 9 * MAX_ROWS):
        monitor.record(step, loss=0.5)
        if step % 1024 == 0:
            most = max(most, monitor._records_kept)
    assert monitor._history[monitor.x_label][-1] > read and most <= 3 * MAX_ROWS
