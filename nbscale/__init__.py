"""nbscale: train PyTorch networks from a notebook on a CPU, a GPU, every GPU of a machine, or a cluster.

`import nbscale` is cheap and starts nothing: no pool, no CUDA. What needs torch (inference, train_async, the data
and models packages) loads on first use, since importing torch takes seconds; so does the jobs package, which
only %%batch and nbscale.jobs need. Editors see every name (the TYPE_CHECKING imports below).
`%load_ext nbscale` registers the magics (`%pool`, `%%spmd`, `%%train`, `%gpu`, `%%batch`, `%jobs`).
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

from nbscale.errors import (
    DatastoreError,
    GpuError,
    JobError,
    ModelError,
    NbscaleError,
    OptionsError,
    PoolError,
    PoolInterrupted,
    UnsendableError,
    WorkerError,
)
from nbscale.gpu import gpus, select_gpu
from nbscale.notebook import sweep, train
from nbscale.pool.composite import Composite
from nbscale.pool.pool import Pool, current_pool
from nbscale.training.info import TrainingInfo
from nbscale.training.options import TrainingOptions
from nbscale.ui.future_progress import show
from nbscale.ui.options_form import options_form
from nbscale.ui.renderers import register_renderers
from nbscale.version import installed_version

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

    from nbscale import data, jobs, loggers, models
    from nbscale.confusion import confusion_chart
    from nbscale.inference import accuracy, activations, classify, predict
    from nbscale.monitor import TrainingMonitor
    from nbscale.training.runs import train_async


__version__ = installed_version()  # written only in pyproject.toml

__all__ = [
    "Composite",
    "DatastoreError",
    "GpuError",
    "JobError",
    "ModelError",
    "NbscaleError",
    "OptionsError",
    "Pool",
    "PoolError",
    "PoolInterrupted",
    "TrainingInfo",
    "TrainingMonitor",
    "TrainingOptions",
    "UnsendableError",
    "WorkerError",
    "accuracy",
    "activations",
    "classify",
    "confusion_chart",
    "current_pool",
    "data",
    "gpus",
    "jobs",
    "load_ipython_extension",
    "loggers",
    "models",
    "options_form",
    "predict",
    "select_gpu",
    "show",
    "sweep",
    "train",
    "train_async",
    "unload_ipython_extension",
]

register_renderers()
# nbscale's own messages (not the user's output) go to this logger; silent unless the application configures it
logging.getLogger("nbscale").addHandler(logging.NullHandler())


# loaded on first use (PEP 562): these modules import torch
_NEED_TORCH: dict[str, str] = {
    "classify": "nbscale.inference",
    "predict": "nbscale.inference",
    "activations": "nbscale.inference",
    "accuracy": "nbscale.inference",
    "confusion_chart": "nbscale.confusion",
    "train_async": "nbscale.training.runs",
    "TrainingMonitor": "nbscale.monitor",
}
_SUBPACKAGES_ON_FIRST_USE = {"data", "models", "jobs", "loggers"}


def __getattr__(name: str) -> Any:
    if name in _NEED_TORCH:
        return getattr(importlib.import_module(_NEED_TORCH[name]), name)
    if name in _SUBPACKAGES_ON_FIRST_USE:
        return importlib.import_module(f"nbscale.{name}")
    raise AttributeError(f"module 'nbscale' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def load_ipython_extension(ipython: InteractiveShell) -> None:
    """Register nbscale's magics and its short error display (called by `%load_ext nbscale`)."""
    from nbscale.magics import register

    register(ipython)


def unload_ipython_extension(ipython: InteractiveShell) -> None:
    """Undo `%load_ext nbscale` (called by `%unload_ext nbscale`): the magics and nbscale's error display go, the
    error handler that was there before comes back. A running pool keeps running until `%pool stop`."""
    from nbscale.magics import unregister

    unregister(ipython)


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    return [{"src": "labextension", "dest": "nbscale"}]


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "nbscale.server"}]
