"""Training on the pool that survives a lost worker: `TrainingOptions(on_worker_failure="restart")`.

When a worker is lost mid-training (killed, its node gone, or given up as frozen by the pool's heartbeat), the
pool restarts with the same settings and the training resumes from this run's newest checkpoint (from the
start when none was written yet), at most MAX_RESTARTS times. A failure of the code itself (an exception on a
worker that still runs) is raised as usual: restarting would only repeat it.

The listeners see one continuous run: the resumed attempt's replay of what they already saw (its TrainingStarted,
the checkpoint's history, and the iterations between the checkpoint and the loss, which resume recomputes
exactly) is not passed on again. What happened is said when it happens: a warning of the `nbscale.notices` logger
(on stderr by default) and a TrainingRestarted event (`info.restarts`, a mark in the progress figure), and in
`info.stop_reason` at the end.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nbscale.errors import OptionsError, WorkerError
from nbscale.notices import notices
from nbscale.training.checkpoint import checkpoint_file, load_checkpoint
from nbscale.training.events import EventChannel, IterationDone, StopSignal, TrainingRestarted, TrainingStarted
from nbscale.training.plan_rules import CheckpointRule

MAX_RESTARTS = 3
CLOCK_SLACK_S = 2.0  # a checkpoint's time may come from another machine's clock (a shared folder)


class _Continuation:
    """Passes each attempt's events on, leaving out what the listeners already saw from an earlier attempt."""

    def __init__(self, channel: EventChannel) -> None:
        self.channel = channel
        self.started = False
        self.last_iteration = 0

    def forward(self, event: Any) -> None:
        if isinstance(event, IterationDone):
            if event.iteration <= self.last_iteration:
                return
            self.last_iteration = event.iteration
        elif isinstance(event, TrainingStarted):
            if self.started:
                return
            self.started = True
        self.channel.publish(event)


def train_surviving_lost_workers(
    run: Callable[[dict[str, Any] | None, EventChannel], Any],
    resume: dict[str, Any] | None,
    seed: int,
    checkpoints: CheckpointRule,
    max_epochs: int,
    channel: EventChannel,
    stop: StopSignal,
) -> tuple[Any, list[str]]:
    """`run(resume, events)` (one training on the pool), again after each lost worker: (its result, one note per
    restart). Raises the last WorkerError when the failure was not a lost worker, when a stop was asked for, or
    after MAX_RESTARTS restarts."""
    from nbscale.pool.pool import current_pool

    began = time.time()
    continuation = _Continuation(channel)
    events = EventChannel()
    events.subscribe(continuation.forward)
    notes: list[str] = []
    while True:
        try:
            return run(resume, events), notes
        except WorkerError:
            pool = current_pool()
            lost = [worker for worker in pool.workers if worker.dead] if pool is not None else []
            if pool is None or not lost or stop.requested or len(notes) >= MAX_RESTARTS:
                raise
            checkpoint = _this_runs_checkpoint(checkpoints, max_epochs, seed, began)
            where = f"the checkpoint of epoch {checkpoint[1]}" if checkpoint else "the start (no checkpoint yet)"
            losses = "; ".join(worker.dead or f"worker {worker.rank}" for worker in lost)
            note = (
                f"restart {len(notes) + 1} after iteration {continuation.last_iteration}: {losses}; resumed from "
                f"{where}"
            )
            notices.warning(
                "Training lost a worker (%s). Restarting the pool and resuming from %s "
                "(on_worker_failure='restart', restart %d of at most %d).",
                losses,
                where,
                len(notes) + 1,
                MAX_RESTARTS,
            )
            pool.restart()
            resume = load_checkpoint(checkpoint[0]) if checkpoint else resume
            notes.append(note)
            resumed_after = int(resume["iteration"]) if resume is not None else 0
            channel.publish(TrainingRestarted(resumed_after, continuation.last_iteration, note))


def _this_runs_checkpoint(
    checkpoints: CheckpointRule, max_epochs: int, seed: int, began: float
) -> tuple[Path, int] | None:
    """This run's newest checkpoint (path, epoch): written since it began, with its seed (a folder may also hold
    checkpoints of earlier runs, even of later epochs). Looked for on disk, not from the events seen: the last
    ones before a loss may never have reached the notebook."""
    folder = checkpoints.path
    assert folder is not None
    frequency, last = checkpoints.frequency, max_epochs
    for epoch in range(last - last % frequency, 0, -frequency):
        path = checkpoint_file(folder, epoch)
        try:
            if os.stat(path).st_mtime < began - CLOCK_SLACK_S:
                continue
            if int(load_checkpoint(path)["seed"]) == seed:
                return path, epoch
        except (OSError, OptionsError, KeyError, ValueError):
            continue
    return None
