"""The listeners a TrainingMonitor's events reach, attached from where it runs, as nbscale.train attaches its own:

- always: the figure's points (nbscale.ui.figure_columns) and the loggers (nbscale.loggers.MonitorLogs);
- every process: the run observers (nbscale.training.run_observers), which a %%batch job's runner uses to record
  each run for `%jobs show` and to obey its Stop (observed.py tells them the monitor's own events);
- in the notebook: the display (nbscale.ui.monitor_display), the kernel interrupt as a Stop
  (nbscale.pool.interrupts.graceful_interrupt), and the cell's end closing the monitor;
- on a %%spmd rank: the forwarding of its events to the notebook's one view, and the notebook's Stop (spmd.py).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nbscale.loggers import MonitorLogs
from nbscale.ui.figure_columns import FigureColumns

if TYPE_CHECKING:
    from nbscale.monitor.producer import Producer

INTERRUPT_REASON = "Stopped by the kernel interrupt"
INTERRUPT_NOTICE = "monitor.stop is now True: the loop ends when it reads it (interrupt again to stop at once)."


@dataclass
class Listeners:
    """What a monitor's events reach; `close()` (after its MonitorDone) detaches what was attached."""

    figure: FigureColumns
    display: Any = None  # nbscale.ui.monitor_display.MonitorDisplay, in the notebook
    attached: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def close(self) -> None:
        self.attached.close()


def attach_listeners(monitor: Producer) -> Listeners:
    """Subscribe to `monitor.events` what its process has: see the module's docstring."""
    from nbscale.monitor.observed import observed_by_run_observers
    from nbscale.notebook import in_notebook
    from nbscale.pool.context import in_worker

    listeners = Listeners(FigureColumns(monitor.metrics))
    monitor.events.subscribe(listeners.figure)
    if monitor.loggers:
        monitor.events.subscribe(MonitorLogs(monitor.loggers))
    stack = listeners.attached
    try:
        if in_worker():
            from nbscale.monitor.rank_forwarding import forward_from_rank

            forward_from_rank(monitor, stack)
        elif in_notebook():
            listeners.display = _show_in_notebook(monitor, listeners.figure, stack)
        stack.enter_context(observed_by_run_observers(monitor))
    except BaseException:
        stack.close()
        raise
    return listeners


def _show_in_notebook(monitor: Producer, figure: FigureColumns, stack: contextlib.ExitStack) -> Any:
    """The display below the cell, its Stop button, the kernel interrupt as a Stop, and the cell's end closing
    the monitor (the last figure drawn, the button removed)."""
    from IPython import get_ipython

    from nbscale.pool.interrupts import graceful_interrupt
    from nbscale.ui.monitor_display import MonitorDisplay

    stop = monitor.stop_signal
    display = MonitorDisplay(stop, monitor.panels, monitor.x_label, figure.columns, budget=monitor.budget)
    stack.callback(display.close)
    monitor.events.subscribe(display)
    shell = get_ipython()

    def on_cell_end(_result: object = None) -> None:
        monitor.close()

    shell.events.register("post_run_cell", on_cell_end)
    stack.callback(_unregistered, shell, on_cell_end)
    if monitor.interrupt_stops:  # nothing is installed outside the main thread
        stack.enter_context(
            graceful_interrupt(lambda: stop.request(INTERRUPT_REASON), lambda: stop.requested, INTERRUPT_NOTICE)
        )
    return display


def _unregistered(shell: Any, callback: Any) -> None:
    with contextlib.suppress(ValueError):
        shell.events.unregister("post_run_cell", callback)
