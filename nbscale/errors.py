"""The nbscale error hierarchy: every message names the thing that went wrong and the fix."""

from __future__ import annotations


class NbscaleError(Exception):
    """Base of every error nbscale raises on purpose; notebooks show its message without a traceback."""


class PoolError(NbscaleError):
    """The worker pool cannot do what was asked (not started, already running, dead worker, bad flag)."""


class UnsendableError(PoolError):
    """A function or value cannot be sent to the workers (it cannot be pickled); the message names it."""


class WorkerError(NbscaleError):
    """Code failed on one or more workers; the message holds each failing rank's traceback."""

    def __init__(self, message: str, failures: dict[int, str] | None = None) -> None:
        super().__init__(message)
        self.failures = failures or {}


class PoolInterrupted(KeyboardInterrupt):
    """The kernel was interrupted while workers ran; they were interrupted too (a KeyboardInterrupt)."""


class OptionsError(NbscaleError, ValueError):
    """A training option has a wrong name or value; the message lists the allowed values."""


class DatastoreError(NbscaleError):
    """A datastore cannot read its files (missing folder, corrupt image, mismatched labels)."""


class GpuError(NbscaleError):
    """A GPU that does not exist was asked for, NVML failed while reading it, or the machine-wide GPU registry
    (nbscale.gpu_reservations) cannot be used."""


class JobError(NbscaleError):
    """A batch job cannot be found, started, or read."""


class ModelError(NbscaleError, ValueError):
    """A network cannot be built or changed as asked (unknown name, unreadable weights, no layer to replace), or does
    not fit its training data (the first mini-batch fails in it)."""
