"""Learn-rate schedules: the learn rate as a pure function of the (0-based) iteration.

A pure function keeps resume exact: a run resumed at iteration k sees the same rates as one never stopped.
- "none": the initial rate throughout.
- "piecewise": multiplied by learn_rate_drop_factor every learn_rate_drop_period epochs (MATLAB's rule).
- "cosine": half a cosine from the initial rate down to 0 over all iterations.
- "warmup-cosine": a linear ramp over the first epoch (at most half the run), then the cosine.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from nbscale.train.options import TrainingOptions


def learn_rate_schedule(options: TrainingOptions, iterations_per_epoch: int) -> Callable[[int], float]:
    """`rate(iteration)` for these options; `iteration` counts from 0 over the whole run."""
    base = float(options.initial_learn_rate)
    total = iterations_per_epoch * int(options.max_epochs)
    kind = options.learn_rate_schedule
    if kind == "none":
        return lambda iteration: base
    if kind == "piecewise":
        period, factor = int(options.learn_rate_drop_period), float(options.learn_rate_drop_factor)
        return lambda iteration: base * factor ** ((iteration // iterations_per_epoch) // period)
    warmup = min(iterations_per_epoch, total // 2) if kind == "warmup-cosine" else 0

    def rate(iteration: int) -> float:
        if iteration < warmup:
            return base * (iteration + 1) / warmup
        progress = (iteration - warmup) / max(1, total - warmup)
        return base * 0.5 * (1.0 + math.cos(math.pi * progress))

    return rate
