"""nbscale.training.run_observers: what other packages add is entered around every real training run."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

import nbscale
from nbscale import TrainingOptions
from nbscale.training.events import EventChannel, IterationDone, StopSignal, TrainingDone, TrainingStarted
from nbscale.training.run_observers import add_run_observer, remove_run_observer
from tests.training.digits import digits, tiny_net

TRAIN, _ = digits()
OPTIONS = TrainingOptions("sgdm", initial_learn_rate=0.1, max_epochs=4, mini_batch_size=100, verbose=False)
ITERATIONS = 4 * (len(TRAIN[0]) // 100)


class StopAfter:
    """An observer that records the run's events and stops the run once it has seen `iterations` of them (they
    come in bunches: nbscale.training.figures); it counts how often it was left."""

    def __init__(self, iterations: int) -> None:
        self.iterations = iterations
        self.events: list[Any] = []
        self.left = 0

    @contextlib.contextmanager
    def __call__(self, channel: EventChannel, stop: StopSignal) -> Iterator[None]:
        def listen(event: Any) -> None:
            self.events.append(event)
            done = sum(isinstance(seen, IterationDone) for seen in self.events)
            if done >= self.iterations:
                stop.request("Stopped by the observer")

        channel.subscribe(listen)
        try:
            yield
        finally:
            self.left += 1


def test_an_added_observer_sees_every_event_of_a_run_and_can_stop_it() -> None:
    observer = StopAfter(iterations=1)
    add_run_observer(observer)
    add_run_observer(observer)  # added twice, entered once
    try:
        _, info = nbscale.train(tiny_net(), TRAIN, OPTIONS)
    finally:
        remove_run_observer(observer)
    assert info.stop_reason == "Stopped by the observer" and observer.left == 1
    assert isinstance(observer.events[0], TrainingStarted) and isinstance(observer.events[-1], TrainingDone)
    seen = [event.iteration for event in observer.events if isinstance(event, IterationDone)]
    assert seen == list(range(1, len(seen) + 1)) and len(seen) < ITERATIONS


def test_a_removed_observer_sees_no_later_run_and_a_failed_run_still_leaves_the_observer() -> None:
    observer = StopAfter(iterations=1000)
    calls = []

    def step_failing_at_iteration_5(model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        if len(calls) == 5:
            raise ValueError("the step failed")
        return nn.functional.cross_entropy(model(inputs), labels)

    add_run_observer(observer)
    try:
        with pytest.raises(ValueError, match="the step failed"):
            nbscale.train(tiny_net(), TRAIN, OPTIONS, step_fn=step_failing_at_iteration_5)
    finally:
        remove_run_observer(observer)
    assert observer.left == 1 and isinstance(observer.events[0], TrainingStarted)
    _, info = nbscale.train(tiny_net(), TRAIN, OPTIONS.replace(max_epochs=1))
    assert observer.left == 1 and info.stop_reason == "Max epochs completed"
