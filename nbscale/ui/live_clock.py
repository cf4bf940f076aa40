"""When a live display redraws: its info panel and its figure on two clocks of their own.

The info panel (elapsed, iteration, epoch, throughput) is an HTML update costing well under a millisecond: it is
redrawn every INFO_INTERVAL_S, so it is never more than a second behind. The figure (a PNG: 5-15 ms to draw and
encode on a busy 2-core machine, 30-85 ms seen under heavy load) is redrawn at most every FIGURE_MIN_S and at
least every FIGURE_MAX_S (1.5 s): between the two, as often as `budget` of the time allows (a slow draw pushes the next
one back, up to FIGURE_MAX_S and no further). A draw that cost 85 ms once used to put the next one 17 s away
(`draw time / budget`); the figure is now never more than 2 s behind, and costs at most `budget` of the time
whenever a draw takes at most `budget * FIGURE_MAX_S` (15 ms at the default 1%).
"""

from __future__ import annotations

INFO_INTERVAL_S = 0.5
FIGURE_MIN_S = 1.0
FIGURE_MAX_S = 1.5  # the figure is never more than 2 s behind: a margin for the draw and a slow iteration
FIGURE_BUDGET = 0.01  # the share of the time the figure's draws may take, between FIGURE_MIN_S and FIGURE_MAX_S


class FigureClock:
    """The figure's next draw time (a perf_counter time): `due(now)`, then `drew(now, spent)` after a draw."""

    def __init__(self, start: float, budget: float = FIGURE_BUDGET) -> None:
        self.budget = budget
        self.next = start + FIGURE_MIN_S  # the first iterations are not worth a figure
        self.last_spent = 0.0

    def due(self, now: float) -> bool:
        return now >= self.next

    def drew(self, now: float, spent: float) -> None:
        """A draw that began at `now` took `spent` seconds: the next begins FIGURE_MIN_S to FIGURE_MAX_S after it."""
        self.last_spent = spent
        self.next = now + figure_interval(spent, self.budget)


def figure_interval(spent: float, budget: float = FIGURE_BUDGET) -> float:
    """Seconds from the start of a draw that took `spent` to the next: `spent / budget`, kept within
    FIGURE_MIN_S .. FIGURE_MAX_S."""
    return min(FIGURE_MAX_S, max(FIGURE_MIN_S, spent / budget))
