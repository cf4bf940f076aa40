"""When the training loop reads its figures (nbscale.training.figures)."""

from __future__ import annotations

import time

from nbscale.training.figures import Figures


class ReadRule:
    """When the loop reads the figures (nbscale.training.figures): a bunch is full, this iteration needs its figures
    now (validation, the last iteration, a checkpoint, a stop asked), an epoch ends, or the interval passed."""

    def __init__(self, figures: Figures, validation_frequency: int, total_iterations: int, validating: bool) -> None:
        self.figures, self.frequency, self.total, self.validating = (
            figures,
            validation_frequency,
            total_iterations,
            validating,
        )
        self.last_read = time.perf_counter()

    def validation_due(self, iteration: int) -> bool:
        return iteration == 1 or iteration % self.frequency == 0 or iteration == self.total

    def needed(self, iteration: int, asked: bool, due: bool, checkpoint: bool) -> bool:
        """True when this iteration's own figures must be read now (the read waits for them)."""
        return asked or (self.validating and due) or iteration == self.total or checkpoint

    def now(self, unread: int, needed: bool, epoch_end: bool) -> bool:
        """True when the figures are read after this iteration (a read reports the bunch before)."""
        now = time.perf_counter()
        if not (
            unread >= self.figures.read_every or needed or epoch_end or now - self.last_read >= self.figures.interval
        ):
            return False
        self.last_read = now
        return True
