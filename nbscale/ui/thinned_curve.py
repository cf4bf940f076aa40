"""A long curve drawn with a few hundred points: min/max decimation kept up to date as the curve grows.

The points are cut into buckets of `size` consecutive points (a power of two); each whole bucket keeps its lowest
and its highest point, in their order, so spikes stay visible; the points after the last whole bucket are drawn as
they are, so the curve ends at its latest value. Each draw folds only the points added since the last one (a draw
of a 100,000-iteration run no longer converts and scans every point); when the buckets grow too many, pairs merge
into buckets twice the size, exactly (the lowest and highest of two buckets are among their kept points).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np


class ThinnedCurve:
    """One curve's thinned points: `points(x, y)` for the y values `y` (a list that grows between calls) at the x
    values ending `x`. At most `buckets` whole buckets are kept (two points each)."""

    def __init__(self, buckets: int) -> None:
        self.buckets = buckets
        self._follow(None)

    def _follow(self, source: Sequence[float] | None) -> None:
        self.source = source  # the y values folded so far: a new list (a new run) starts again
        self.seen = 0  # their length at the last call: a shorter list was thinned in place, and starts again
        self.size = 1  # points per bucket
        self.folded = 0  # the points folded into whole buckets
        self.kept_x: Any = ()  # two points a whole bucket, in order (numpy arrays once folded)
        self.kept_y: Any = ()

    def points(self, x: Sequence[float], y: Sequence[float]) -> tuple[Any, Any]:
        """The points to draw: all of them while they are at most twice `buckets`, else the thinned ones."""
        import numpy as np  # not imported with nbscale

        n, offset = len(y), len(x) - len(y)
        if n <= 2 * self.buckets:
            self._follow(None)
            return x[offset:], y
        if y is not self.source or n < self.seen:
            self._follow(y)
        self.seen = n
        while n // self.size > self.buckets:
            self._coarsen()
        whole = n // self.size * self.size
        if whole > self.folded:
            self._fold(x[offset + self.folded : offset + whole], y[self.folded : whole])
            self.folded = whole
        tail_x = np.asarray(x[offset + whole :], dtype=float)
        tail_y = np.asarray(y[whole:], dtype=float)
        return np.concatenate([self.kept_x, tail_x]), np.concatenate([self.kept_y, tail_y])

    def _fold(self, x: Sequence[float], y: Sequence[float]) -> None:
        """Whole buckets of new points: each keeps its lowest and its highest point."""
        import numpy as np

        xs = np.asarray(x, dtype=float).reshape(-1, self.size)
        ys = np.asarray(y, dtype=float).reshape(-1, self.size)
        kept_x, kept_y = _lowest_and_highest(xs, ys)
        self.kept_x = np.concatenate([self.kept_x, kept_x])
        self.kept_y = np.concatenate([self.kept_y, kept_y])

    def _coarsen(self) -> None:
        """Buckets twice the size: pairs of whole buckets merge (an odd last one is folded again from its points)."""
        pairs = len(self.kept_y) // 4
        self.size *= 2
        self.folded = pairs * self.size
        if pairs:
            self.kept_x, self.kept_y = _lowest_and_highest(
                self.kept_x[: 4 * pairs].reshape(pairs, 4), self.kept_y[: 4 * pairs].reshape(pairs, 4)
            )
        else:
            self.kept_x = self.kept_y = ()


def _lowest_and_highest(xs: np.ndarray, ys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Of each row, the lowest and the highest point, in their order along the row."""
    import numpy as np

    low, high = np.argmin(ys, axis=1), np.argmax(ys, axis=1)
    index = np.sort(np.stack([low, high], axis=1), axis=1)
    return np.take_along_axis(xs, index, axis=1).ravel(), np.take_along_axis(ys, index, axis=1).ravel()
