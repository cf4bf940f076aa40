"""The options form previews the learn-rate schedule as a small plot that follows the fields as they change."""

from __future__ import annotations

import io

from PIL import Image

import nbscale
from nbscale.training.options import TrainingOptions
from nbscale.ui.schedule_preview import schedule_png


def _size(png: bytes) -> tuple[int, int]:
    return Image.open(io.BytesIO(png)).size


def test_the_form_draws_the_schedule_against_epochs_and_redraws_it_as_the_fields_change() -> None:
    form = nbscale.options_form(show=False)
    first = form.schedule_image.value
    assert _size(first) == (352, 152)
    assert "drawn against epochs" in form.schedule_note.value
    widgets = form.widgets
    widgets["momentum"].value = 0.5  # not a schedule field: nothing redrawn
    assert form.schedule_image.value is first
    widgets["learn_rate_schedule"].value = "piecewise"
    piecewise = form.schedule_image.value
    assert piecewise != first
    widgets["learn_rate_drop_period"].value = 5
    assert form.schedule_image.value != piecewise
    widgets["max_epochs"].value = 4
    widgets["initial_learn_rate"].value = 0.2
    assert form.schedule_image.value == schedule_png(form.options)  # the same plot as the options' own


def test_a_wrong_schedule_field_hides_the_plot_and_says_which_to_fix() -> None:
    form = nbscale.options_form(show=False)
    form.widgets["initial_learn_rate"].value = -1.0
    assert form.schedule_image.layout.display == "none"
    assert "Fix initial_learn_rate to see the learn-rate schedule." in form.schedule_note.value
    form.widgets["initial_learn_rate"].value = 0.01
    assert form.schedule_image.layout.display == ""
    form.widgets["learn_rate_scaling"].value = "linear"
    assert "scales these rates by its global mini-batch / 128." in form.schedule_note.value
    form.widgets["learn_rate_reference_batch"].value = 256
    assert "scales these rates by its global mini-batch / 256." in form.schedule_note.value


def test_every_schedule_draws_even_for_long_runs() -> None:
    for schedule in ("none", "piecewise", "cosine", "warmup-cosine"):
        for epochs in (1, 3, 5000):
            png = schedule_png(TrainingOptions("sgdm", learn_rate_schedule=schedule, max_epochs=epochs))
            assert _size(png) == (352, 152)
