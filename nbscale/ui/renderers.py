"""How the core's plain-data results show: registered with nbscale.rendering when nbscale is imported.

Text for `repr()` (terminals, logs) and HTML for notebooks. Registered by type name, and the renderers of types
whose modules import torch are imported only when something is shown, so registering stays cheap.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from nbscale.rendering import register, register_viewer


def _lazy(module: str, function: str) -> Callable[..., Any]:
    def render(value: object, **options: object) -> Any:
        return getattr(importlib.import_module(module), function)(value, **options)

    render.__name__ = function
    return render


def register_renderers() -> None:
    """Register the renderer of every result type the core returns."""
    register(
        "nbscale.pool.status.PoolStatus",
        _lazy("nbscale.ui.pool_status", "pool_status_text"),
        _lazy("nbscale.ui.pool_status", "pool_status_html"),
    )
    register(
        "nbscale.gpu.GpuList", _lazy("nbscale.ui.gpu_table", "gpu_text"), _lazy("nbscale.ui.gpu_table", "gpu_html")
    )
    register(
        "nbscale.training.run_table.RunsTable",
        _lazy("nbscale.ui.runs_table", "runs_table_text"),
        _lazy("nbscale.ui.runs_table", "runs_table_html"),
    )
    register(
        "nbscale.training.sweep.SweepResult",
        _lazy("nbscale.ui.runs_table", "sweep_result_text"),
        _lazy("nbscale.ui.runs_table", "sweep_result_html"),
    )
    register_viewer("nbscale.jobs.job.Job", _lazy("nbscale.ui.job_monitor", "show_job"))
