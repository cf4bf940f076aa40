"""`nbscale.TrainingMonitor`: nbscale.train's live figure, info panel and Stop for a user's own loop (MATLAB's
trainingProgressMonitor). training_monitor.py is the monitor, a producer of events; layout.py what it shows;
records.py what it keeps until read; listeners.py who hears its events, from where it runs: the figure's points
(nbscale.ui.figure_columns), observed.py the run observers (a job's record), rank_forwarding.py and spmd.py a %%spmd
cell's ranks shown as one (producer.py: what the listeners know of a monitor); saved.py how it pickles."""

from nbscale.monitor import spmd as _spmd  # noqa: F401  # adds the pool's listener for %%spmd ranks' monitors
from nbscale.monitor.saved import SavedMonitor
from nbscale.monitor.training_monitor import TrainingMonitor

__all__ = ["SavedMonitor", "TrainingMonitor"]
