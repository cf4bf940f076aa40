"""`nbscale.TrainingMonitor`: nbscale.train's live figure, info panel and Stop for a user's own loop (MATLAB's
trainingProgressMonitor). training_monitor.py is the monitor, where it shows and a %%spmd cell's ranks shown as
one; records.py what it keeps until read; saved.py how it pickles."""

from nbscale.monitor.saved import SavedMonitor
from nbscale.monitor.training_monitor import TrainingMonitor

__all__ = ["SavedMonitor", "TrainingMonitor"]
