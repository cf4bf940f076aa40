"""The events of a run with metrics other than accuracy, as loop27's loop sends them: until nbscale.train computes
them, the displays' tests publish these into the real listeners."""

from __future__ import annotations

from typing import Any

from nbscale.training.events import IterationDone, TrainingDone, TrainingStarted


def metric_run(names: tuple[str, ...], iterations: int = 20, validate_every: int = 5) -> list[Any]:
    """TrainingStarted, IterationDone for `iterations` (metric i: 0.5 + 0.4 * iteration / iterations + i / 100,
    validation the same plus 0.05, every `validate_every`), TrainingDone returning the last iteration's network."""
    events: list[Any] = [
        TrainingStarted(
            2, iterations // 2, 8, "cpu", 0.0, metric_names=names, objective_metric=names[0], objective_goal="minimize"
        )
    ]
    for i in range(1, iterations + 1):
        training = {name: value(index, i, iterations) for index, name in enumerate(names)}
        validates = i % validate_every == 0
        validation = {name: value(index, i, iterations) + 0.05 for index, name in enumerate(names)}
        events.append(
            IterationDone(
                1 + (i - 1) // (iterations // 2),
                i,
                0.1 * i,
                1.0 / i,
                training.get("accuracy"),
                0.01,
                8 * i,
                validation_loss=1.5 / i if validates else None,
                validation_accuracy=validation.get("accuracy") if validates else None,
                training_metrics=training,
                validation_metrics=validation if validates else None,
            )
        )
    events.append(TrainingDone("Max epochs completed", 2, iterations, 0.1 * iterations, iterations, 80.0))
    return events


def value(index: int, iteration: int, iterations: int) -> float:
    return 0.5 + 0.4 * iteration / iterations + index / 100
