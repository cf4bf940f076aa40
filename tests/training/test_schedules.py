"""Learn-rate schedules give the documented rate at every iteration."""

from __future__ import annotations

import math

import pytest

from nbscale import TrainingOptions
from nbscale.training.solver import learn_rate_schedule


def test_piecewise_drops_by_the_factor_every_period_of_epochs() -> None:
    options = TrainingOptions(
        "sgdm",
        initial_learn_rate=0.1,
        max_epochs=6,
        learn_rate_schedule="piecewise",
        learn_rate_drop_factor=0.5,
        learn_rate_drop_period=2,
    )
    rate = learn_rate_schedule(options, iterations_per_epoch=3)
    assert [rate(i) for i in range(18)] == pytest.approx([0.1] * 6 + [0.05] * 6 + [0.025] * 6)


def test_cosine_falls_from_the_initial_rate_to_zero() -> None:
    options = TrainingOptions("sgdm", initial_learn_rate=0.2, max_epochs=2, learn_rate_schedule="cosine")
    rate = learn_rate_schedule(options, iterations_per_epoch=5)
    assert [rate(i) for i in range(10)] == pytest.approx([0.1 * (1 + math.cos(math.pi * i / 10)) for i in range(10)])


def test_warmup_cosine_ramps_up_over_the_first_epoch_then_decays() -> None:
    options = TrainingOptions("adam", initial_learn_rate=0.01, max_epochs=4, learn_rate_schedule="warmup-cosine")
    rate = learn_rate_schedule(options, iterations_per_epoch=4)
    assert [rate(i) for i in range(4)] == pytest.approx([0.0025, 0.005, 0.0075, 0.01])
    later = [rate(i) for i in range(4, 16)]
    assert later[0] == pytest.approx(0.01) and all(a > b for a, b in zip(later, later[1:], strict=False))


def test_none_keeps_the_initial_rate() -> None:
    rate = learn_rate_schedule(TrainingOptions("sgdm", initial_learn_rate=0.3), iterations_per_epoch=7)
    assert {rate(i) for i in range(50)} == {0.3}
