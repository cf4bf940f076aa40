"""`nbscale.show(future)`: watch a run on the pool while the notebook stays free (parfeval + afterEach).

For a training run from `nbscale.train_async` it shows the same training-progress display as `nbscale.train`
(figure, info panel, Stop), drawn by a background thread from the events the worker sends. For any other future
from `pool.submit` it shows one status line that changes when the task ends.
"""

from __future__ import annotations

import html
from collections.abc import Collection
from concurrent.futures import CancelledError, Future
from typing import Any

from nbscale.errors import NbscaleError
from nbscale.progress_bar import ProgressBar


def show(future: Future[Any] | Collection[Future[Any]]) -> Any:
    """Show the progress of `future` in the cell's output and return at once.

    `future` is a TrainingRun (from `nbscale.train_async` or a sweep's `runs`), any future from `pool.submit`, or
    a list of such futures (a done/total bar). Returns the display object (a RunProgress, a ProgressBar for a
    list, or None for a plain future).
    """
    from IPython.display import display

    from nbscale.training.runs import TrainingRun

    if isinstance(future, TrainingRun):
        from nbscale.ui.run_progress import show_run

        return show_run(future)
    if isinstance(future, Collection) and not isinstance(future, str | bytes):
        return _show_bar(future)
    if not isinstance(future, Future):
        raise NbscaleError(
            f"nbscale.show takes a future from nbscale.train_async(...) or pool.submit(...), not "
            f"{type(future).__name__}."
        )
    handle = display(_status_bundle(future), raw=True, display_id=True)
    if handle is not None:  # None outside IPython, which has no display to update
        future.add_done_callback(lambda done: handle.update(_status_bundle(done), raw=True))
    return None


def _show_bar(futures: Collection[Any]) -> ProgressBar:
    strangers = [type(item).__name__ for item in futures if not isinstance(item, Future)]
    if strangers:
        raise NbscaleError(
            f"nbscale.show takes a list of futures from pool.submit(...); this list also holds "
            f"{', '.join(sorted(set(strangers)))}. Pass only the futures."
        )
    bar = ProgressBar(len(futures), "tasks")
    for item in futures:
        bar.add(item)
    return bar


def _status_bundle(future: Future[Any]) -> dict[str, str]:
    if future.cancelled() or (future.done() and isinstance(future.exception(), CancelledError)):
        text = "Task cancelled."
    elif not future.done():
        text = "Task running on the pool..." if future.running() else "Task queued for a free worker..."
    elif future.exception() is not None:
        text = f"Task failed: {future.exception()}"
    else:
        text = f"Task done: {_short(future.result())}"
    return {"text/plain": text, "text/html": f"<pre>{html.escape(text)}</pre>"}


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."
