"""Whether this kernel's front end draws widgets: a live browser (JupyterLab, Notebook 7) does; a headless run
(nbclient, `jupyter nbconvert --execute`, papermill), a test's kernel and a terminal IPython do not.

A kernel cannot ask its front end, so it is told: each Stop button counts its views (ipywidgets' `_view_count`,
which the front end raises when it draws one), and a live figure's view says "ready" when it opens
(nbscale.ui.live_figure). The first such report makes the front end known to this kernel for good; until then
the live figure is a PNG (nbscale.ui.live_clock). The reports arrive while a cell runs only where the widgets'
messages go to a subshell (nbscale.ui.click_routing); elsewhere (ipykernel < 7.4) the live figure stays a PNG, as a
browser's "ready" could not reach the kernel while the cell runs.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from nbscale.lab_extension import STATUS_KEPT_VARIABLE

SEEN = threading.Event()  # set once a widget view of this kernel was drawn; tests and benchmarks may set it
# Whether to be told: the Stop button's view count and the live figure's "ready" are comm messages a subshell handles
# while the cell runs, and JupyterLab took their "idle" as the kernel's state (its status bar read "Idle" while
# training ran) unless its server untracks them, as nbscale's server extension does and tells the kernels it starts
# (nbscale.server). Off elsewhere (another server, a headless run) unless `draw_live_figures()` turns it on.
ASKED = threading.Event()
if os.environ.get(STATUS_KEPT_VARIABLE) == "1":
    ASKED.set()


def draw_live_figures(on: bool = True) -> None:
    """Draw this kernel's live training figures in the browser (nbscale.ui.live_figure) once its front end is known
    to draw widgets (`on`), or always as PNGs (`on=False`). On by default under a Jupyter server running nbscale's
    server extension; under another server, JupyterLab's status bar may read Idle while a training cell runs."""
    if on:
        ASKED.set()
    else:
        ASKED.clear()
        SEEN.clear()  # nothing sets it again: no view is counted and no live figure shown


def known() -> bool:
    """True once a front end of this kernel drew a widget."""
    return SEEN.is_set()


def watch(widget: Any) -> None:
    """Be told when the front end draws a view of `widget`, whose `_view_count` starts at 0 (ipywidgets' default,
    None, means the front end does not count views) and is not echoed (see nbscale.ui.stop_button). Only where live
    figures are drawn in the browser (`ASKED`: the caller checks it, as it chose the widget's class by it)."""
    widget.observe(_on_views, names="_view_count")


def _on_views(change: dict[str, Any]) -> None:
    if change["new"]:
        SEEN.set()
