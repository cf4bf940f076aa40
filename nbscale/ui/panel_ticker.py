"""The info panel's clock between a run's events.

The panel is redrawn when an iteration ends (nbscale.ui.live_clock). An iteration that outlasts a second (a big
batch, a slow network, a pool's long step) would leave its Elapsed row still: a PanelTicker thread redraws the panel
whenever it is `stale_after` seconds old, so it never looks frozen. The thread runs in the cell's context (its
outputs reach the cell that shows the panel) and ends with the run.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable

STALE_AFTER_S = 0.5  # as the panel's own clock (live_clock.INFO_INTERVAL_S): its whole-second Elapsed moves each second
CHECK_EVERY_S = 0.1


class PanelTicker:
    """Calls `redraw` from a thread whenever `shown()` was last called `stale_after` seconds ago or more."""

    def __init__(self, redraw: Callable[[], None], stale_after: float = STALE_AFTER_S) -> None:
        self.redraw, self.stale_after = redraw, stale_after
        self.shown_at = time.perf_counter()
        self._ended = threading.Event()
        context = contextvars.copy_context()  # the cell's parent header (ipykernel keeps it in a context variable)
        self._thread = threading.Thread(target=context.run, args=(self._tick,), name="nbscale-panel", daemon=True)
        self._thread.start()

    def shown(self) -> None:
        """The panel was just drawn."""
        self.shown_at = time.perf_counter()

    def end(self) -> None:
        self._ended.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _tick(self) -> None:
        while not self._ended.wait(CHECK_EVERY_S):
            if time.perf_counter() - self.shown_at >= self.stale_after:
                try:
                    self.redraw()
                except Exception:  # a display gone (kernel shutting down): the panel stays as last drawn
                    return
