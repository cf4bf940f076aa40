"""The training-progress figure, as MATLAB's: a panel per metric (accuracy by default; rmse, fscore, ... as
TrainingOptions.metrics asks) and the loss panel, with raw, smoothed and validation curves, each panel with its
legend, epochs as alternating shaded bands labelled along the top, and learn-rate
drops and restarts after a lost worker marked where they happen.

Drawn with matplotlib's Agg canvas (no pyplot, no GUI) and blitted: the axes, ticks, grid, epoch bands and
labels, learn-rate marks and legends are drawn once into a cached background, and an update only pastes that
background and draws the curves onto it. The axes keep fixed limits (iterations 0..total, percentages
(accuracy, precision, recall, F-score) 0..100, loss and other metrics 0..a margin above the highest value seen) so
the background stays valid. Those fitted axes, fitted to the first values and refitted when a value leaves them,
are cached apart: a refit redraws only them onto the background without them. A learn-rate drop (a few per run at most: the rate falls after staying put, as a
piecewise schedule does; smooth schedules change every iteration and are not marked) redraws the background
once. An update stays a paste and six curves, much cheaper than a full matplotlib draw.

Building the figure and its first full draw are most of the display's fixed cost a run: a finished figure is
kept (`release`), and the next run with the same iterations and epochs (a cell run again)
starts from it (`figure_for_run`), its static layout already drawn.
"""

from __future__ import annotations

import io
import math
import threading
from typing import Any

_PLOT_BUCKETS = 300  # about half the axes' width in pixels: each bucket keeps its lowest and highest point
_MAX_EPOCH_BANDS = 100  # beyond: a light line every k-th epoch
_MAX_EPOCH_LABELS = 12
_MAX_DROP_LABELS = 12
_LOSS_MARGIN = 1.15  # the loss axis' top, as a factor of the highest loss seen
SMOOTHING = 0.6  # weight of the past in the exponential moving average drawn over the raw curves

# MATLAB's colours: a light raw curve (opaque, so it shows on a white or shaded background) under a darker
# smoothed one; validation in black
_COLOURS = {"accuracy": ("#80bfe6", "#0072bd"), "loss": ("#f4b183", "#d95319")}
_OTHER_COLOURS = (("#a9d18e", "#3b7d23"), ("#c9a0dc", "#7030a0"), ("#ffd966", "#bf9000"), ("#9dc3e6", "#2e75b6"))
PANEL_HEIGHT = 2.6  # inches per panel


def is_percentage(name: str) -> bool:
    """Metrics drawn (and shown) as percentages: fractions of samples or classes."""
    return name in ("accuracy", "precision", "recall", "fscore") or name.endswith("-accuracy")


def panel_label(name: str) -> str:
    from nbscale.ui.verbose_table import metric_title

    return f"{metric_title(name)} (%)" if is_percentage(name) else metric_title(name)
_BAND = "#f0f0f0"
_DROP = "#6a3d9a"
_RESTART = "#c00000"


_spare: ProgressFigure | None = None  # the last released figure (one kept: its canvas holds a few MB)
_spare_lock = threading.Lock()  # job monitors draw from threads


def figure_for_run(total_iterations: int, iterations_per_epoch: int,
                   metrics: tuple[str, ...] = ("accuracy",)) -> ProgressFigure:
    """An empty figure for a run: the last released one when its layout is the same, else a new one."""
    global _spare
    layout = (total_iterations, iterations_per_epoch, tuple(metrics))
    with _spare_lock:
        figure = _spare if _spare is not None and _spare.layout == layout else None
        if figure is not None:
            _spare = None
    if figure is None:
        return ProgressFigure(total_iterations, iterations_per_epoch, metrics)
    figure.reset()
    return figure


class ProgressFigure:
    """A panel per metric, then the loss panel, over the whole run's iterations, with epoch bands and learn-rate
    marks. `metrics` names the metric panels (the columns `name`, `name_smooth`, `val_name` of `render`)."""

    def __init__(self, total_iterations: int, iterations_per_epoch: int,
                 metrics: tuple[str, ...] = ("accuracy",)) -> None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        keys = (*metrics, "loss")
        height = PANEL_HEIGHT * len(keys)
        self.figure = Figure(figsize=(9, height), dpi=72)
        # no layout engine: margins in inches, as the two-panel figure had them
        self.figure.subplots_adjust(left=0.08, right=0.98, top=1 - 0.42 / height, bottom=0.47 / height, hspace=0.1)
        self.canvas = FigureCanvasAgg(self.figure)
        all_axes = self.figure.subplots(len(keys), 1, sharex=True, squeeze=False)[:, 0]
        self.panels: list[tuple[Any, str, Any, Any, Any]] = []
        self.fitted: dict[str, Any] = {}  # axes whose y limits follow the values: the loss, and non-percentages
        others = iter(_OTHER_COLOURS * 4)
        for axes, key in zip(all_axes, keys, strict=True):
            light, dark = _COLOURS.get(key) or next(others)
            raw, = axes.plot([], [], color=light, linewidth=1.0, label="Training", animated=True)
            smooth, = axes.plot([], [], color=dark, linewidth=1.8, label="Training (smoothed)", animated=True)
            validation, = axes.plot([], [], "o--", color="black", markersize=4, linewidth=1, label="Validation",
                                    animated=True)
            axes.set_ylabel("Loss" if key == "loss" else panel_label(key))
            axes.grid(alpha=0.3)
            _mark_epochs(axes, total_iterations, iterations_per_epoch)
            # in the background: text is the costly part to draw. Rising curves end top right, falling ones bottom
            # right: the legend sits in the other corner, off the last points
            percentage = key != "loss" and is_percentage(key)
            axes.legend(loc="lower right" if percentage else "upper right", fontsize=8, framealpha=0.9)
            if percentage:
                axes.set_ylim(0, 100)
            else:
                axes.set_ylim(0.0, 1.0)  # a guess until the first values set the scale
                axes.yaxis.set_animated(True)  # left out of the full draw: see `render`
                self.fitted[key] = axes
            self.panels.append((axes, key, raw, smooth, validation))
        _label_epochs(all_axes[0], total_iterations, iterations_per_epoch)
        loss_axes = all_axes[-1]
        loss_axes.set_xlabel("Iteration")
        loss_axes.set_xlim(0, max(total_iterations, 1))
        self.loss_axes = loss_axes
        self.fitted_keys: set[str] = set()  # the fitted axes whose limits the values have set
        self.layout = (total_iterations, iterations_per_epoch, tuple(metrics))
        self.drops_marked = 0
        self.restarts_marked = 0
        self.background_without_loss_axis: Any = None
        self.background: Any = None  # the one above with the loss axis drawn at its current limits
        self.empty_png: bytes | None = None  # the figure before the first iteration, as a run opens with it

    def release(self) -> None:
        """Offer this figure to the next run of the same layout (`figure_for_run`); the caller draws it no more.
        A figure with learn-rate or restart marks, or a widened iteration axis, is not kept."""
        global _spare
        if self.drops_marked or self.restarts_marked or self.loss_axes.get_xlim() != (0, max(self.layout[0], 1)):
            return
        with _spare_lock:
            _spare = self

    def reset(self) -> None:
        """Back to the figure of a new run before its first loss: the loss axis' guess (its background redrawn);
        `render` sets the curves from the run's columns."""
        self.fitted_keys = set()
        for axes in self.fitted.values():
            axes.set_ylim(0.0, 1.0)
        self.background = None

    def render(self, c: dict[str, list[float]]) -> bytes:
        """The figure with the curves in `c` (the columns TrainingProgress keeps), as PNG."""
        for _, key, raw_line, smooth_line, validation_line in self.panels:
            raw = c.get(key, [])
            x = c.get(f"{key}_iteration", c["iteration"])[-len(raw):] if raw else []
            raw_line.set_data(*_thinned(x, raw))
            smooth_line.set_data(*_thinned(x, c.get(f"{key}_smooth", [])))
            validation_line.set_data(c["val_iteration"], c.get(f"val_{key}", [math.nan] * len(c["val_iteration"])))
        empty = not c["iteration"] and not c["val_iteration"]
        if empty and self.empty_png is not None:
            return self.empty_png
        self._fit_limits(c)
        self._mark_drops(c.get("drop_iteration", []), c.get("drop_rate", []))
        self._mark_restarts(c.get("restart_iteration", []))
        if self.background_without_loss_axis is None:
            self.canvas.draw()  # everything but the animated curves and loss axis
            self.background_without_loss_axis = self.canvas.copy_from_bbox(self.figure.bbox)
        if self.background is None:
            self.canvas.restore_region(self.background_without_loss_axis)
            for axes in self.fitted.values():
                axes.draw_artist(axes.yaxis)
            self.background = self.canvas.copy_from_bbox(self.figure.bbox)
        self.canvas.restore_region(self.background)
        for axes, _, *lines in self.panels:
            for line in lines:
                axes.draw_artist(line)
        png = _png(self.canvas)
        if empty and not self.fitted_keys:
            self.empty_png = png
        return png

    def _fit_limits(self, c: dict[str, list[float]]) -> None:
        """Widen the fitted axes (loss, other metrics) and the iteration axis when the data left them (the cached
        backgrounds are then stale)."""
        for key, axes in self.fitted.items():
            column = c.get(key, [])
            values = [v for v in (*column[-_PLOT_BUCKETS:], *c.get(f"val_{key}", [])) if math.isfinite(v)]
            if not values:
                continue
            low, high = axes.get_ylim()
            if key not in self.fitted_keys or min(values) < low or max(values) > high:
                self.fitted_keys.add(key)
                top = max(max(values), max((v for v in column if math.isfinite(v)), default=0.0))
                bottom = min(0.0, min(values) * _LOSS_MARGIN)
                axes.set_ylim(bottom, max(top * _LOSS_MARGIN, bottom + 1e-6))
                self.background = None
        last = c["iteration"][-1] if c["iteration"] else 0
        if last > self.loss_axes.get_xlim()[1]:
            self.loss_axes.set_xlim(0, last)
            self.background_without_loss_axis = self.background = None


    def _mark_drops(self, iterations: list[float], rates: list[float]) -> None:
        """A dashed line across both panels where the learn rate dropped, labelled with the new rate (the first
        _MAX_DROP_LABELS); new marks go into the background, which is then redrawn once."""
        if len(iterations) <= self.drops_marked:
            return
        for index in range(self.drops_marked, len(iterations)):
            where = iterations[index] - 0.5  # between the last iteration at the old rate and the first at the new
            for axes, *_ in self.panels:
                axes.axvline(where, color=_DROP, linestyle="--", linewidth=1.0, zorder=1)
            if index < _MAX_DROP_LABELS:
                self.loss_axes.annotate(f"learn rate {rates[index]:.3g}", (where, 1.0), xycoords=("data", "axes fraction"),
                                        xytext=(3, -3), textcoords="offset points", ha="left", va="top",
                                        fontsize=7.5, color=_DROP, rotation=90)
        self.drops_marked = len(iterations)
        self.background_without_loss_axis = self.background = None


    def _mark_restarts(self, iterations: list[float]) -> None:
        """A dash-dot line across both panels where training resumed after a lost worker (on_worker_failure=
        "restart"), labelled "restart N": the iterations after it were trained again from that checkpoint."""
        if len(iterations) <= self.restarts_marked:
            return
        for index in range(self.restarts_marked, len(iterations)):
            where = iterations[index] + 0.5  # after the checkpoint's last iteration
            for axes, *_ in self.panels:
                axes.axvline(where, color=_RESTART, linestyle="-.", linewidth=1.2, zorder=1)
            self.panels[0][0].annotate(f"restart {index + 1}", (where, 0.0), xycoords=("data", "axes fraction"),
                                       xytext=(3, 3), textcoords="offset points", ha="left", va="bottom",
                                       fontsize=7.5, color=_RESTART, rotation=90)
        self.restarts_marked = len(iterations)
        self.background_without_loss_axis = self.background = None


def is_drop(rates: list[float], rate: float) -> bool:
    """Whether `rate`, coming after `rates`, is a learn-rate drop worth a mark: clearly lower (by more than
    DROP_AT_LEAST) than the rate before, which had stayed put (piecewise schedules); smooth schedules, which change
    every iteration, and the end of a warm-up (where the cosine begins a hair below the peak) are not marked."""
    return len(rates) >= 2 and rate < rates[-1] * (1 - DROP_AT_LEAST) and rates[-1] == rates[-2]


DROP_AT_LEAST = 0.02  # a piecewise drop_factor of 0.98 or lower is marked


def smoothed(previous: float | None, value: float) -> float:
    """The next point of a smoothed curve (it restarts after a NaN, e.g. an iteration without accuracy)."""
    if previous is None or previous != previous:
        return value
    return SMOOTHING * previous + (1 - SMOOTHING) * value


def _mark_epochs(axes: Any, total_iterations: int, iterations_per_epoch: int) -> None:
    """Every other epoch shaded, as MATLAB marks epochs (a light line every k-th epoch when there are more than
    _MAX_EPOCH_BANDS)."""
    epochs = total_iterations // max(iterations_per_epoch, 1)
    if 1 < epochs <= _MAX_EPOCH_BANDS:
        for epoch in range(1, epochs, 2):  # the 2nd, 4th, ... epoch
            axes.axvspan(epoch * iterations_per_epoch + 0.5, min(epoch + 1, epochs) * iterations_per_epoch + 0.5,
                         color=_BAND, linewidth=0, zorder=0)
        return
    step = max(1, math.ceil(epochs / _MAX_EPOCH_BANDS))
    marks = [epoch * iterations_per_epoch + 0.5 for epoch in range(step, epochs, step)]
    if marks:  # one collection for every mark, not one artist each
        axes.vlines(marks, 0, 1, transform=axes.get_xaxis_transform(), color="0.85", linewidth=0.8, zorder=0)


def _label_epochs(axes: Any, total_iterations: int, iterations_per_epoch: int) -> None:
    """Epoch numbers along the top of the figure, at each epoch's middle (every k-th when there are many)."""
    epochs = total_iterations // max(iterations_per_epoch, 1)
    if epochs < 1:
        return
    step = max(1, math.ceil(epochs / _MAX_EPOCH_LABELS))
    shown = list(range(1, epochs + 1, step))
    top = axes.secondary_xaxis("top")
    top.set_xticks([(epoch - 0.5) * iterations_per_epoch + 0.5 for epoch in shown], [str(e) for e in shown],
                   fontsize=8)
    top.tick_params(length=0, pad=2)
    top.set_xlabel("Epoch", fontsize=9, labelpad=2)


def _png(canvas: Any) -> bytes:
    """The canvas as an RGB PNG, compressed lightly (faster than the default level, a little larger)."""
    from PIL import Image

    width, height = canvas.get_width_height()
    image = Image.frombuffer("RGBA", (width, height), canvas.buffer_rgba(), "raw", "RGBA", 0, 1).convert("RGB")
    buffer = io.BytesIO()
    image.save(buffer, format="png", compress_level=1)
    return buffer.getvalue()


def _thinned(x: list[float], y: list[float], buckets: int = _PLOT_BUCKETS) -> tuple[Any, Any]:
    """At most two points per bucket: each keeps its lowest and highest point, so spikes stay visible."""
    if len(y) <= 2 * buckets:
        return x, y
    import numpy as np

    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    size = -(-len(ys) // buckets)
    whole = len(ys) // size * size
    grouped = ys[:whole].reshape(-1, size)
    low, high = np.argmin(grouped, axis=1), np.argmax(grouped, axis=1)
    starts = np.arange(0, whole, size)
    index = np.concatenate([(starts[:, None] + np.sort(np.stack([low, high], 1), axis=1)).ravel(),
                            np.arange(whole, len(ys))])
    return xs[index], ys[index]
