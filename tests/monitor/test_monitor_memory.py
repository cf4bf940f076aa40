"""A TrainingMonitor's memory is bounded (issue 43, item 7): a long history is thinned, its loggers get every step."""

from __future__ import annotations

import nbscale
from nbscale.ui.figure_columns import HISTORY_ROWS


class Counting:
    def __init__(self) -> None:
        self.steps = 0

    def log(self, metrics: dict, step: int) -> None:
        self.steps += 1

    def close(self) -> None:
        pass


def test_a_long_history_is_thinned_to_a_bound_spanning_the_whole_run_and_loggers_get_every_step() -> None:
    logger = Counting()
    monitor = nbscale.TrainingMonitor(metrics=["loss"], loggers=[logger])
    last = 2 * HISTORY_ROWS + HISTORY_ROWS // 2 + 1
    for step in range(1, last + 1):
        monitor.record(step, loss=step / 2)
    history = monitor.history
    steps = history["iteration"]
    assert HISTORY_ROWS // 2 <= len(steps) <= HISTORY_ROWS
    assert steps[-1] == last and steps[0] <= 4 and steps == sorted(steps)
    assert history["loss"] == [step / 2 for step in steps]  # each kept step with its own value
    monitor.close()
    assert logger.steps == last
