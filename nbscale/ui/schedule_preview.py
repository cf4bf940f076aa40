"""A small plot of the learn-rate schedule that TrainingOptions set, for the options form.

The rate comes from the training's own schedule function (nbscale.training.solver), so the preview and the
run cannot disagree. A form does not know the data, hence not the iterations per epoch: the curve is drawn
against epochs, with PREVIEW_ITERATIONS_PER_EPOCH steps each (piecewise drops happen at epoch ends whatever that
number; cosine curves keep their shape; the warm-up lasts one epoch, at most half the run).
"""

from __future__ import annotations

import io

from nbscale.training.options import TrainingOptions
from nbscale.training.solver import learn_rate_schedule

PREVIEW_ITERATIONS_PER_EPOCH = 50
_MAX_POINTS = 4000


def schedule_png(options: TrainingOptions) -> bytes:
    """The learn rate over `options.max_epochs` epochs as a small PNG (a log scale for a piecewise schedule)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    epochs = int(options.max_epochs)
    per_epoch = max(1, min(PREVIEW_ITERATIONS_PER_EPOCH, _MAX_POINTS // max(epochs, 1)))
    rate = learn_rate_schedule(options, per_epoch)
    iterations = range(epochs * per_epoch)
    x = [i / per_epoch for i in iterations] + [float(epochs)]
    y = [rate(i) for i in iterations]
    y.append(y[-1])  # the last iteration's rate holds to the end of the last epoch

    figure = Figure(figsize=(4.4, 1.9), dpi=80)
    figure.subplots_adjust(left=0.17, right=0.97, top=0.86, bottom=0.24)
    FigureCanvasAgg(figure)
    axes = figure.subplots()
    axes.plot(x, y, color="#0072bd", linewidth=1.6, drawstyle="steps-post")
    piecewise = options.learn_rate_schedule == "piecewise" and 0 < float(options.learn_rate_drop_factor) < 1
    if piecewise:
        axes.set_yscale("log")
    else:
        axes.set_ylim(0, max(y) * 1.1 if max(y) > 0 else 1)
    axes.set_xlim(0, epochs)
    axes.set_xlabel("Epoch", fontsize=8)
    axes.set_ylabel("Learn rate", fontsize=8)
    axes.tick_params(labelsize=7)
    axes.grid(alpha=0.3)
    axes.set_title(_describe(options), fontsize=8)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def _describe(options: TrainingOptions) -> str:
    rate, kind = float(options.initial_learn_rate), options.learn_rate_schedule
    if kind == "piecewise":
        period = int(options.learn_rate_drop_period)
        every = "every epoch" if period == 1 else f"every {period} epochs"
        return f"{rate:g}, ×{float(options.learn_rate_drop_factor):g} {every}"
    if kind == "none":
        return f"{rate:g} throughout"
    if kind == "cosine":
        return f"{rate:g}, cosine down to 0"
    return f"warm-up to {rate:g} over the first epoch, then cosine down to 0"
