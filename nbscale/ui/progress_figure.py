"""The training-progress figure, as MATLAB's: accuracy and loss panels with raw, smoothed and validation
curves, each panel with its legend, epochs as alternating shaded bands labelled along the top, and learn-rate
drops and restarts after a lost worker marked where they happen.

Drawn with matplotlib's Agg canvas (no pyplot, no GUI) and blitted: the axes, ticks, grid, epoch bands and
labels, learn-rate marks and legends are drawn once into a cached background, and an update only pastes that
background and draws the six curves onto it. The axes keep fixed limits (iterations 0..total, accuracy 0..100,
loss 0..a margin above the highest loss seen) so the background stays valid. The loss axis, fitted to the
first losses and refitted when a loss leaves it, is cached apart: a refit redraws only that axis onto the
background without it. A learn-rate drop (a few per run at most: the rate falls after staying put, as a
piecewise schedule does; smooth schedules change every iteration and are not marked) redraws the background
once. An update stays a paste and six curves, much cheaper than a full matplotlib draw.

Building the figure and its first full draw are most of the display's fixed cost a run: a finished figure is
kept (`release`), and the next run with the same iterations and epochs (a cell run again)
starts from it (`figure_for_run`), its static layout already drawn.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nbscale.ui.png import canvas_png
from nbscale.ui.thinned_curve import ThinnedCurve

if TYPE_CHECKING:
    from matplotlib.axes import Axes

_PLOT_BUCKETS = 300  # at most, about half the axes' width in pixels: each keeps its lowest and highest point
_MAX_EPOCH_BANDS = 100  # beyond: a light line every k-th epoch
_MAX_EPOCH_LABELS = 12
_MAX_DROP_LABELS = 12
_WIDTH = 10.5  # inches, at 72 dpi: 756 pixels
_LEGEND_ROOM = 1.7  # inches right of the axes for the legends ("Training (smoothed)")
_LOSS_MARGIN = 1.15  # the loss axis' top, as a factor of the highest loss seen
SMOOTHING = 0.6  # weight of the past in the exponential moving average drawn over the raw curves

# MATLAB's colours: a light raw curve (opaque, so it shows on a white or shaded background) under a darker
# smoothed one; validation in black. Metrics beyond accuracy and loss (and a monitor's series) take the next pair.
_COLOURS = {"accuracy": ("#80bfe6", "#0072bd"), "loss": ("#f4b183", "#d95319")}
_MORE_COLOURS = (
    ("#b3d89c", "#3a8a2a"),
    ("#c9b3e0", "#7e2f8e"),
    ("#f7d794", "#b8860b"),
    ("#a6dcd5", "#1b7f79"),
    ("#f2a6b8", "#a2142f"),
    ("#cccccc", "#555555"),
)
_BAND = "#f0f0f0"
_DROP = "#6a3d9a"
_RESTART = "#c00000"


@dataclass(frozen=True)
class Series:
    """One curve of a panel: column `key` of the columns rendered; "train" draws it raw and smoothed (column
    `key`_smooth), "validation" as dots. Its x values are column `key`_iteration when there is one, else
    "val_iteration" for validation, else the last iterations."""

    key: str
    kind: str = "train"  # "train" or "validation"
    label: str = "Training"
    colours: tuple[str, str] = _COLOURS["loss"]


@dataclass(frozen=True)
class Panel:
    """One subplot: its y label, fixed limits (None: fitted to the data, as the loss axis is), its curves."""

    label: str
    series: tuple[Series, ...]
    limits: tuple[float, float] | None = None
    rising: bool = False  # the values grow as training goes (accuracy)
    log: bool = False


def metric_panels(metric_names: tuple[str, ...] = ("accuracy",), rising: tuple[str, ...] = ()) -> tuple[Panel, ...]:
    """nbscale.train's panels: one per metric (in display order) then the loss, each with its training curve
    (raw and smoothed) and validation dots. Accuracy (in %) keeps 0..100; the other metrics are fitted."""
    panels = []
    for index, name in enumerate((*metric_names, "loss")):
        colours = _COLOURS.get(name) or _MORE_COLOURS[index % len(_MORE_COLOURS)]
        label = {"accuracy": "Accuracy (%)", "loss": "Loss"}.get(name, name)
        panels.append(
            Panel(
                label,
                (
                    Series(name, "train", "Training", colours),
                    Series(f"val_{name}", "validation", "Validation", colours),
                ),
                (0.0, 100.0) if name == "accuracy" else None,
                rising=name == "accuracy" or name in rising,
            )
        )
    return tuple(panels)


class _Spare:
    """The last released figure (one kept: its canvas holds a few MB), taken by the next run of its layout."""

    def __init__(self) -> None:
        self.figure: ProgressFigure | None = None
        self.lock = threading.Lock()  # job monitors draw from threads

    def take(self, layout: tuple[Any, ...]) -> ProgressFigure | None:
        with self.lock:
            figure, self.figure = self.figure, None
            if figure is not None and figure.layout != layout:
                self.figure, figure = figure, None
        return figure

    def keep(self, figure: ProgressFigure) -> None:
        with self.lock:
            self.figure = figure


_spare = _Spare()


def figure_for_run(
    total_iterations: int, iterations_per_epoch: int, panels: tuple[Panel, ...] | None = None
) -> ProgressFigure:
    """An empty figure for a run: the last released one when its layout is the same, else a new one."""
    panels = panels if panels is not None else metric_panels()
    figure = _spare.take((total_iterations, iterations_per_epoch, panels))
    if figure is None:
        return ProgressFigure(total_iterations, iterations_per_epoch, panels)
    figure.reset()
    return figure


def _series_lines(axes: Any, panel: Panel) -> list[tuple[Series, Any, Any]]:
    """Each series of `panel` as (series, its raw line, its smoothed line), drawn empty on `axes`: a validation
    series as dots (no smoothed line)."""
    lines = []
    for series in panel.series:
        light, dark = series.colours
        if series.kind == "validation":
            (dots,) = axes.plot(
                [], [], "o--", color="black", markersize=4, linewidth=1, label=series.label, animated=True
            )
            lines.append((series, dots, None))
        else:
            (raw,) = axes.plot([], [], color=light, linewidth=1.0, label=series.label, animated=True)
            (smooth,) = axes.plot([], [], color=dark, linewidth=1.8, label=f"{series.label} (smoothed)", animated=True)
            lines.append((series, raw, smooth))
    return lines


class ProgressFigure:
    """Panels stacked over a shared iteration axis (nbscale.train's: accuracy and loss, or one per metric and
    the loss; a TrainingMonitor's: one per metric or group), with epoch bands and learn-rate marks.

    `total_iterations` 0: the length is unknown (a user's own loop): the x axis ends at a round number past where
    the run's progress expects its end, or, without progress, at least doubles when passed."""

    def __init__(
        self,
        total_iterations: int,
        iterations_per_epoch: int,
        panels: tuple[Panel, ...] | None = None,
        x_label: str = "Iteration",
    ) -> None:
        panels = panels if panels is not None else metric_panels()
        self.spec = panels
        self.figure, self.canvas, axes_list = _new_figure(len(panels))
        self.panels: list[tuple[Any, Panel, list[tuple[Series, Any, Any]]]] = []
        self.fitted_axes: list[tuple[Any, Panel]] = []  # axes whose y limits follow the data
        for axes, panel in zip(axes_list, panels, strict=True):
            lines = _series_lines(axes, panel)
            axes.set_ylabel(panel.label)
            axes.grid(alpha=0.3)
            if panel.log:
                axes.set_yscale("log")
            if total_iterations:
                _mark_epochs(axes, total_iterations, iterations_per_epoch)
            # in the background (text is the costly part to draw), beside the panel: off its curves
            axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7.5, frameon=False, borderaxespad=0)
            if panel.limits is not None:
                axes.set_ylim(*panel.limits)
            else:
                axes.set_ylim(*((0.1, 1.0) if panel.log else (0.0, 1.0)))
                axes.yaxis.set_animated(True)  # left out of the full draw: see `render`
                self.fitted_axes.append((axes, panel))
            if not total_iterations:  # the iteration axis widens as the loop goes: redrawn alone, as a fitted y axis
                axes.xaxis.set_animated(True)
            self.panels.append((axes, panel, lines))
        if total_iterations:
            _label_epochs(axes_list[0], total_iterations, iterations_per_epoch)
        self.loss_axes = axes_list[-1]
        self.loss_axes.set_xlabel(x_label)
        self.loss_axes.set_xlim(0, max(total_iterations, 1))
        self.fitted: set[int] = set()  # ids of the fitted axes whose (0, 1) guess the data replaced
        self.layout = (total_iterations, iterations_per_epoch, panels)
        self.drops_marked = 0
        self.restarts_marked = 0
        self.background_without_loss_axis: Any = None  # without the fitted axes' y axes
        self.background: Any = None  # the one above with the fitted y axes drawn at their current limits
        self.empty_png: bytes | None = None  # the figure before the first iteration, as a run opens with it
        self.curves: dict[str, ThinnedCurve] = {}  # each raw and smoothed column's thinned points, kept as it grows

    def release(self) -> None:
        """Offer this figure to the next run of the same layout (`figure_for_run`); the caller draws it no more.
        A figure with learn-rate or restart marks, or a widened iteration axis, is not kept."""
        if self.drops_marked or self.restarts_marked or self.loss_axes.get_xlim() != (0, max(self.layout[0], 1)):
            return
        _spare.keep(self)

    def end_at(self, iteration: int) -> None:
        """A run that stopped early: the iteration axis ends at its last iteration, not the planned end."""
        if 0 < iteration < self.loss_axes.get_xlim()[1]:
            self.loss_axes.set_xlim(0, iteration)
            self.background_without_loss_axis = self.background = None

    def reset(self) -> None:
        """Back to the figure of a new run before its first values: the fitted axes' guess (their background
        redrawn); `render` sets the curves from the run's columns."""
        self.fitted.clear()
        for axes, panel in self.fitted_axes:
            axes.set_ylim(*((0.1, 1.0) if panel.log else (0.0, 1.0)))
        self.background = None

    def set_log(self, index: int, log: bool) -> None:
        """Panel `index` on a log (or linear) y scale; the backgrounds are redrawn once."""
        axes, panel, lines = self.panels[index]
        axes.set_yscale("log" if log else "linear")
        panel = Panel(panel.label, panel.series, panel.limits, panel.rising, log)
        self.panels[index] = (axes, panel, lines)
        self.fitted_axes = [(a, panel if a is axes else p) for a, p in self.fitted_axes]
        self.fitted.discard(id(axes))
        self.background_without_loss_axis = self.background = None

    def render(self, c: dict[str, list[float]], progress: float | None = None) -> bytes:
        """The figure with the curves in `c` (the columns TrainingProgress keeps), as PNG. `progress`: how far
        a run of unknown length is (percent), to end the iteration axis where 100% is expected."""
        empty = True
        for _, _, lines in self.panels:
            for series, line, smooth_line in lines:
                y = c.get(series.key, [])
                x = _x_column(c, series)
                empty = empty and not y
                if smooth_line is None:
                    line.set_data(x[len(x) - len(y) :], y)
                else:
                    line.set_data(*self._curve(series.key).points(x, y))
                    smoothed = f"{series.key}_smooth"
                    smooth_line.set_data(*self._curve(smoothed).points(x, c.get(smoothed, [])))
        if empty and self.empty_png is not None:
            return self.empty_png
        self._fit_limits(c, progress)
        self._mark_drops(c.get("drop_iteration", []), c.get("drop_rate", []))
        self._mark_restarts(c.get("restart_iteration", []))
        if self.background is None:
            self._draw_background()
        self.canvas.restore_region(self.background)
        for axes, _, lines in self.panels:
            for _, *drawn in lines:
                for line in drawn:
                    if line is not None:
                        axes.draw_artist(line)
        png = canvas_png(self.canvas)
        if empty and not self.fitted:
            self.empty_png = png
        return png

    def _curve(self, key: str) -> ThinnedCurve:
        curve = self.curves.get(key)
        if curve is None:
            curve = self.curves[key] = ThinnedCurve(_PLOT_BUCKETS)
        return curve

    def _draw_background(self) -> None:
        """The cached backgrounds: everything but the curves, then the fitted y axes (and an unknown length's
        iteration axes) at their current limits."""
        if self._widen_left_margin():
            self.background_without_loss_axis = None  # the axes moved right: everything is drawn again
        if self.background_without_loss_axis is None:
            self.canvas.draw()  # everything but the animated curves and fitted y axes
            self.background_without_loss_axis = self.canvas.copy_from_bbox(self.figure.bbox)
        self.canvas.restore_region(self.background_without_loss_axis)
        for axes, _ in self.fitted_axes:
            axes.draw_artist(axes.yaxis)
        if not self.layout[0]:
            for axes, *_ in self.panels:
                axes.draw_artist(axes.xaxis)
        self.background = self.canvas.copy_from_bbox(self.figure.bbox)

    def _widen_left_margin(self) -> bool:
        """Move the axes right when a y label or its tick labels (a long metric name, ticks such as 0.00025) would
        be cut at the figure's left edge; True when they moved. Margins only grow, so the figure does not jitter."""
        renderer = self.canvas.get_renderer()
        left = min(axes.yaxis.get_tightbbox(renderer).x0 for axes, *_ in self.panels)
        if left >= 2:
            return False
        width = self.figure.bbox.width
        self.figure.subplots_adjust(left=self.figure.subplotpars.left + (2 - left) / width)
        return True

    def _fit_limits(self, c: dict[str, list[float]], progress: float | None = None) -> None:
        """Widen the fitted y axes and the iteration axis when the data left them (the cached backgrounds are
        then stale)."""
        for axes, panel in self.fitted_axes:
            columns = [c.get(series.key, []) for series in panel.series]
            recent: list[float] = []
            for series, column in zip(panel.series, columns, strict=True):
                recent += column[-_PLOT_BUCKETS:] if series.kind == "train" else column
            values = [v for v in recent if math.isfinite(v) and (v > 0 or not panel.log)]
            if not values:
                continue
            low, high = axes.get_ylim()
            if id(axes) not in self.fitted or min(values) < low or max(values) > high:
                self.fitted.add(id(axes))
                every = (v for column in columns for v in column if math.isfinite(v))  # scanned only to refit
                top = max(max(values), max(every, default=0.0))
                if panel.log:
                    axes.set_ylim(min(values) / 1.5, top * 1.5)
                else:
                    bottom = min(0.0, min(values) * _LOSS_MARGIN)
                    axes.set_ylim(bottom, max(top * _LOSS_MARGIN, bottom + 1e-6))
                self.background = None
        last = max((column[-1] for key, column in c.items() if key.endswith("iteration") and column), default=0)
        right = self.loss_axes.get_xlim()[1]
        if self.layout[0]:
            end = last
        elif progress is not None and 1 <= progress < 100:  # unknown length: a round number past where 100% is
            end = _round_up(max(last * 100 / progress, last))  # expected, so later updates keep the axis
        else:
            end = _round_up(max(2 * right, last * 1.25)) if last > right else right
        if end > right:
            self.loss_axes.set_xlim(0, end)
            self.background = None  # an unknown length's iteration axes, left out of the full draw, are redrawn alone
            if self.layout[0] or self.drops_marked or self.restarts_marked:  # else in the full draw, or marks move
                self.background_without_loss_axis = None

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
                self.loss_axes.annotate(
                    f"learn rate {rates[index]:.3g}",
                    (where, 1.0),
                    xycoords=("data", "axes fraction"),
                    xytext=(3, -3),
                    textcoords="offset points",
                    ha="left",
                    va="top",
                    fontsize=7.5,
                    color=_DROP,
                    rotation=90,
                )
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
            self.panels[0][0].annotate(
                f"restart {index + 1}",
                (where, 0.0),
                xycoords=("data", "axes fraction"),
                xytext=(3, 3),
                textcoords="offset points",
                ha="left",
                va="bottom",
                fontsize=7.5,
                color=_RESTART,
                rotation=90,
            )
        self.restarts_marked = len(iterations)
        self.background_without_loss_axis = self.background = None


def _new_figure(panels: int) -> tuple[Any, Any, Any]:
    """(figure, its Agg canvas, its axes top to bottom) for `panels` panels over a shared iteration axis."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    height = 1.2 + 2.0 * panels if panels > 2 else 5.2
    figure = Figure(figsize=(_WIDTH, height), dpi=72)
    # the same room in inches above and below, whatever the number of panels; no layout engine; the legends
    # in a column of their own on the right, as MATLAB's window has them: never over the last points
    figure.subplots_adjust(
        left=0.72 / _WIDTH, right=1 - _LEGEND_ROOM / _WIDTH, top=1 - 0.42 / height, bottom=0.47 / height, hspace=0.1
    )
    canvas = FigureCanvasAgg(figure)
    return figure, canvas, figure.subplots(panels, 1, sharex=True, squeeze=False)[:, 0]


def is_drop(rates: list[float], rate: float) -> bool:
    """Whether `rate`, coming after `rates`, confirms a learn-rate drop at the previous iteration: the rate
    stayed put, fell, and stays put again (piecewise schedules). Smooth schedules, which change every iteration,
    are not marked, nor is the end of a warm-up (its peak held an iteration, then a smooth decay)."""
    return len(rates) >= 3 and rate == rates[-1] and rates[-1] < rates[-2] and rates[-2] == rates[-3]


def extend_smoothed(smooth: list[float], values: Iterable[float]) -> None:
    """Append to the smoothed curve `smooth` its next point for each of `values` in turn (an exponential moving
    average that restarts after a NaN, e.g. an iteration without accuracy); one loop for a monitor's whole read."""
    previous = smooth[-1] if smooth else None
    keep = SMOOTHING
    append = smooth.append
    for value in values:
        previous = value if previous is None or previous != previous else keep * previous + (1 - keep) * value
        append(previous)


def _mark_epochs(axes: Axes, total_iterations: int, iterations_per_epoch: int) -> None:
    """Every other epoch shaded, as MATLAB marks epochs (a light line every k-th epoch when there are more than
    _MAX_EPOCH_BANDS)."""
    epochs = total_iterations // max(iterations_per_epoch, 1)
    if 1 < epochs <= _MAX_EPOCH_BANDS:
        for epoch in range(1, epochs, 2):  # the 2nd, 4th, ... epoch
            axes.axvspan(
                epoch * iterations_per_epoch + 0.5,
                min(epoch + 1, epochs) * iterations_per_epoch + 0.5,
                color=_BAND,
                linewidth=0,
                zorder=0,
            )
        return
    step = max(1, math.ceil(epochs / _MAX_EPOCH_BANDS))
    marks = [epoch * iterations_per_epoch + 0.5 for epoch in range(step, epochs, step)]
    if marks:  # one collection for every mark, not one artist each
        axes.vlines(marks, 0, 1, transform=axes.get_xaxis_transform(), color="0.85", linewidth=0.8, zorder=0)


def _label_epochs(axes: Axes, total_iterations: int, iterations_per_epoch: int) -> None:
    """Epoch numbers along the top of the figure, at each epoch's middle (every k-th when there are many)."""
    epochs = total_iterations // max(iterations_per_epoch, 1)
    if epochs < 1:
        return
    step = max(1, math.ceil(epochs / _MAX_EPOCH_LABELS))
    shown = list(range(1, epochs + 1, step))
    top = axes.secondary_xaxis("top")
    top.set_xticks([(epoch - 0.5) * iterations_per_epoch + 0.5 for epoch in shown], [str(e) for e in shown], fontsize=8)
    top.tick_params(length=0, pad=2)
    top.set_xlabel("Epoch", fontsize=9, labelpad=2)


def _round_up(value: float) -> float:
    """The smallest of 1, 2, 2.5 and 5 times a power of ten that is at least `value`."""
    if value <= 0:
        return 0.0
    power = 10.0 ** math.floor(math.log10(value))
    return next(power * step for step in (1, 2, 2.5, 5, 10) if power * step >= value * (1 - 1e-12))


def _x_column(c: dict[str, list[float]], series: Series) -> list[float]:
    """The column whose last values are the x values of `series`' points: see Series."""
    x = c.get(f"{series.key}_iteration")
    if x is None:
        x = c.get("val_iteration", []) if series.kind == "validation" else c.get("iteration", [])
    return x
