"""A TrainingMonitor watched by the run observers (nbscale.training.run_observers) as nbscale.train's runs are:
inside a %%batch job the runner's recorder writes the monitor's events for `%jobs show`, and its Stop sets
`monitor.stop`.

The observers get the monitor's own events, not training events made up for it: a MonitorStarted with its
layout first, then each read (MetricsRead), each panel scale and its MonitorDone, as the notebook's display gets
them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from nbscale.training.events import EventChannel, MonitorStarted
from nbscale.training.run_observers import ended_with_the_process, observed_run

if TYPE_CHECKING:
    from nbscale.monitor.producer import Producer


@contextlib.contextmanager
def observed_by_run_observers(monitor: Producer) -> Iterator[None]:
    """Every run observer entered around the monitor's life, with a channel of its own and the monitor's stop;
    when one listens, it is told the monitor's layout and then every event of the monitor, and the cell's end
    in a job (or the process's end) closes the monitor, so the job's record gets its end."""
    channel = EventChannel()
    with observed_run(channel, monitor.stop_signal):
        if not channel.listeners:  # nobody watches (outside a job): nothing to tell
            yield
            return
        channel.publish(started(monitor))
        monitor.events.subscribe(channel.publish)
        with ended_with_the_process(monitor.close):
            yield


def started(monitor: Producer) -> MonitorStarted:
    """The monitor's layout, as its first event to the observers."""
    panels = tuple((title, tuple(names)) for title, names in monitor.panels)
    return MonitorStarted(tuple(monitor.metrics), panels, monitor.x_label, tuple(monitor.info_names), time.time())
