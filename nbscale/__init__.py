"""nbscale: train PyTorch networks from a notebook on a CPU, a GPU, every GPU of a machine, or a cluster.

`import nbscale` is cheap and starts nothing: the heavy parts (torch, the pool) load on first use.
`%load_ext nbscale` registers the magics (`%pool`, `%%spmd`, `%%train`, `%gpu`, `%%batch`, `%jobs`).
"""

from __future__ import annotations

import importlib
from typing import Any

from nbscale.errors import (
    DatastoreError,
    JobError,
    NbscaleError,
    OptionsError,
    PoolError,
    PoolInterrupted,
    WorkerError,
)

__version__ = "0.1.0"

# public name -> module that defines it; loaded on first attribute access (PEP 562)
_LAZY: dict[str, str] = {
    "Pool": "nbscale.pool.pool",
    "current_pool": "nbscale.pool.pool",
    "Composite": "nbscale.pool.composite",
    "TrainingOptions": "nbscale.train.options",
    "train": "nbscale.train.trainer",
    "TrainingInfo": "nbscale.train.info",
    "classify": "nbscale.inference",
    "predict": "nbscale.inference",
    "activations": "nbscale.inference",
    "accuracy": "nbscale.inference",
    "confusion_chart": "nbscale.inference",
    "options_form": "nbscale.ui.options_form",
    "gpus": "nbscale.gpu",
    "select_gpu": "nbscale.gpu",
    "sweep": "nbscale.train.sweep",
    "train_async": "nbscale.train.runs",
    "show": "nbscale.ui.future_progress",
}
_SUBMODULES = {"data", "models", "jobs", "pool", "train", "ui"}

__all__ = [
    "NbscaleError",
    "PoolError",
    "WorkerError",
    "PoolInterrupted",
    "OptionsError",
    "DatastoreError",
    "JobError",
    "load_ipython_extension",
    "unload_ipython_extension",
    *_LAZY,
    *sorted(_SUBMODULES),
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _SUBMODULES:
        return importlib.import_module(f"nbscale.{name}")
    raise AttributeError(f"module 'nbscale' has no attribute {name!r}")


def load_ipython_extension(ipython: Any) -> None:
    """Register nbscale's magics and its short error display (called by `%load_ext nbscale`)."""
    from nbscale.magics import register

    register(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    """Nothing to undo beyond what IPython does; the pool keeps running until `%pool stop`."""


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    return [{"src": "labextension", "dest": "nbscale"}]


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "nbscale.server"}]

