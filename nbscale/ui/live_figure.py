"""The live training-progress figure drawn in the browser: an anywidget whose front end (live_figure.js) draws the
PNG figure's panels (nbscale.ui.progress_figure) on a canvas from the points the kernel sends.

Each `push` sends only the points added since the last one: a comm message with one binary buffer of float64 per
column that gained values (8 bytes a value: a few kB, however long the run), and no drawing in the kernel. A view
that opens (the first, a second tab, a reloaded page) says "ready", and the next push sends every point instead.
The widget shares its display with a PNG of the figure: a front end without the widget's state shows that image;
at the run's end the caller shows the final PNG alone in its place, so a saved notebook and nbconvert show the
figure without a kernel (docs/ui.md).
"""

from __future__ import annotations

from array import array
from pathlib import Path
from typing import Any

import anywidget
import traitlets

from nbscale.ui.click_routing import can_route_clicks, keep_routed, route_clicks_off_main_thread, routed_to
from nbscale.ui.progress_figure import ProgressFigure
from nbscale.ui.widget_front_end import SEEN

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
_MARKS = ("iteration", "val_iteration", "drop_iteration", "drop_rate", "restart_iteration")


class LiveFigure(anywidget.AnyWidget):
    """A figure's panels drawn in the browser; `push(columns)` sends what the columns gained."""

    _esm = Path(__file__).with_name("live_figure.js")
    spec = traitlets.Dict().tag(sync=True)  # the panels, their series and the axes (not `layout`: DOMWidget's CSS)

    def __init__(self, figure: ProgressFigure) -> None:
        super().__init__()
        self.sent: dict[str, int] = {}  # how many values of each column the views have
        self.reset_due = False  # a view opened: the next push sends every point
        self.progress: float | None = None
        self.unroute: Any = None
        self.subshell: str | None = None  # where the views' messages go while the cell runs
        self.follow(figure)
        self.on_msg(self._on_message)

    def follow(self, figure: ProgressFigure) -> None:
        """Draw `figure`'s panels from now on (a new run, or panels dropped): the next push sends every point."""
        total, per_epoch, _ = figure.layout
        self.spec = {
            "total": total,
            "per_epoch": per_epoch,
            "x_label": figure.loss_axes.get_xlabel(),
            "panels": [_panel(panel) for _, panel, _ in figure.panels],
        }
        keyed = (f"{s['key']}{end}" for p in self.spec["panels"] for s in p["series"] for end in _ENDS)
        self.column_keys = {*_MARKS, *keyed}
        self.reset_due = True
        keep_routed(self, self.subshell)  # sending the new spec from this thread reset the route

    def push(self, columns: dict[str, list[float]], progress: float | None = None) -> None:
        """Send the views the values `columns` gained since the last push (every value after a "ready")."""
        if self.reset_due or any(len(columns.get(key, ())) < count for key, count in self.sent.items()):
            self.reset_due, self.sent = False, {}
            kind = "reset"
        else:
            kind = "points"
        keys, buffers = [], []
        for key in self.column_keys:
            column = columns.get(key)
            start = self.sent.get(key, 0)
            if column is not None and len(column) > start:
                end = len(column)
                keys.append(key)
                buffers.append(array("d", column[start:end]).tobytes())  # 8 bytes a value, NaN kept (JSON has none)
                self.sent[key] = end
        if keys or kind == "reset" or progress != self.progress:
            self.progress = progress
            self.send({"type": kind, "keys": keys, "progress": progress}, buffers)
            keep_routed(self, self.subshell)  # sending from this thread reset the route

    def end(self) -> None:
        """Close the widget and its subshell route (the caller shows the final PNG in its place)."""
        if self.unroute is not None:
            self.unroute()
            self.unroute = None
        self.close()

    def _on_message(self, _widget: object, content: object, _buffers: object) -> None:
        if isinstance(content, dict) and content.get("type") == "ready":
            SEEN.set()
            self.reset_due = True  # read by the drawing thread's next push: it alone sends


_ENDS = ("", "_smooth", "_iteration")


def _panel(panel: Any) -> dict[str, Any]:
    return {
        "label": panel.label,
        "limits": list(panel.limits) if panel.limits is not None else None,
        "log": panel.log,
        "series": [{"key": s.key, "kind": s.kind, "label": s.label, "colours": list(s.colours)} for s in panel.series],
    }


def show_live(handle: Any, figure: ProgressFigure, png_bundle: dict[str, Any]) -> LiveFigure | None:
    """Replace the figure in `handle`'s display by a LiveFigure beside the PNG in `png_bundle` (shown by a front
    end without the widget's state). None where the views' "ready" could not reach the kernel while the cell runs
    (no subshells, nbscale.ui.click_routing): the PNG clock then goes on."""
    if not can_route_clicks():  # decided before a widget is made: the caller asks again at every draw
        return None
    widget = LiveFigure(figure)
    widget.unroute = route_clicks_off_main_thread(widget)
    if widget.unroute is None:
        widget.close()
        return None
    widget.subshell = routed_to(widget)
    view = {"version_major": 2, "version_minor": 1, "model_id": widget.model_id}
    handle.update({WIDGET_VIEW: view, **png_bundle}, raw=True)
    return widget
