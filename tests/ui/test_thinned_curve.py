"""ThinnedCurve: a growing curve's min/max decimation, kept as it grows, is the one computed from all its points."""

from __future__ import annotations

import numpy as np

from nbscale.ui.thinned_curve import ThinnedCurve


def from_scratch(x: list[float], y: list[float], size: int) -> tuple[np.ndarray, np.ndarray]:
    """Each whole bucket of `size` points: its lowest and highest point in order; then the rest as they are."""
    kept: list[int] = []
    whole = len(y) // size * size
    for start in range(0, whole, size):
        bucket = y[start : start + size]
        kept += sorted([start + int(np.argmin(bucket)), start + int(np.argmax(bucket))])
    kept += range(whole, len(y))
    return np.asarray(x, dtype=float)[kept], np.asarray(y, dtype=float)[kept]


def test_points_added_between_draws_give_the_decimation_of_all_of_them() -> None:
    rng = np.random.default_rng(0)
    curve = ThinnedCurve(buckets=50)
    x: list[float] = [0.0, 0.5]  # two x values before the curve's first: its x values are the column's last ones
    y: list[float] = []
    for added in rng.integers(1, 400, size=60):
        new = rng.normal(size=added).tolist()
        y += new
        x += [float(len(x) + i) for i in range(added)]
        drawn_x, drawn_y = curve.points(x, y)
        if len(y) <= 100:
            assert list(drawn_y) == y and list(drawn_x) == x[2:]
            continue
        assert len(y) // curve.size <= 50 < len(y) // (curve.size // 2)  # the fewest buckets past 50
        expected_x, expected_y = from_scratch(x[2:], y, curve.size)
        assert np.array_equal(drawn_x, expected_x) and np.array_equal(drawn_y, expected_y)
        assert drawn_y[-1] == y[-1] and drawn_y.min() == min(y) and drawn_y.max() == max(y)
        assert len(drawn_y) <= 2 * 50 + curve.size


def test_a_new_list_or_one_thinned_in_place_is_folded_again() -> None:
    curve = ThinnedCurve(buckets=10)
    y = [float(v % 7) for v in range(500)]
    x = list(range(500))
    curve.points(x, y)
    y[:] = y[::2]  # thinned in place, as a monitor's long history is
    x[:] = x[::2]
    drawn_x, drawn_y = curve.points(x, y)
    assert np.array_equal(drawn_y, from_scratch(x, y, curve.size)[1])
    other = [float(-v) for v in range(300)]
    drawn_x, drawn_y = curve.points(list(range(300)), other)
    assert np.array_equal(drawn_y, from_scratch(list(range(300)), other, curve.size)[1])
