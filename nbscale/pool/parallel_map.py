"""`pool.map` (parfor): results in order, from a window of tasks on the futures queue (tasks.py).

Items are submitted MAP_AHEAD_PER_WORKER per worker ahead of the result taken last (as Executor.map's `buffersize`
in Python 3.14): the first window at the call, the rest as results are taken, so an endless iterable works and a
long one costs no time up front. However the map ends (done, failed, interrupted, abandoned), the items submitted
and not done are cancelled, the running ones interrupted on their workers.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from typing import Any

from nbscale.errors import PoolInterrupted
from nbscale.progress_bar import ProgressBar, common_length

MAP_AHEAD_PER_WORKER = 2  # pool.map's items submitted per worker ahead of the result taken last

# submit(fn, args, what): a queued task's future, `what` naming it in its error; cancel(future): Pool.cancel
Submit = Callable[[Callable[..., Any], tuple[Any, ...], str], Future[Any]]
Cancel = Callable[[Future[Any]], bool]


def map_in_order(
    submit: Submit,
    cancel: Cancel,
    fn: Callable[..., Any],
    iterables: tuple[Iterable[Any], ...],
    *,
    workers: int,
    timeout: float | None,
    progress: bool,
) -> Iterator[Any]:
    """`fn` over `iterables` on a pool of `workers`, as `Pool.map` describes; submits the first window now."""
    deadline = None if timeout is None else time.monotonic() + timeout
    bar = ProgressBar(common_length(iterables), "pool.map", shown=progress)
    ordered = _OrderedMap(submit, cancel, fn, iterables, MAP_AHEAD_PER_WORKER * max(1, workers), bar)
    try:
        ordered.fill()
    except KeyboardInterrupt:
        raise ordered.interrupted() from None
    except BaseException:
        ordered.cancel_unfinished()
        raise
    return ordered.results(deadline)


class _OrderedMap:
    """One `pool.map`: its items not yet submitted, and its submitted futures in item order."""

    def __init__(
        self,
        submit: Submit,
        cancel: Cancel,
        fn: Callable[..., Any],
        iterables: tuple[Iterable[Any], ...],
        window: int,
        bar: ProgressBar,
    ) -> None:
        self._submit, self._cancel, self._fn = submit, cancel, fn
        self._name = getattr(fn, "__name__", "the function")
        self._items = enumerate(zip(*iterables, strict=False))
        self._window = window
        self._bar = bar
        self._pending: deque[Future[Any]] = deque()

    def fill(self) -> None:
        """Submit items until the window is full (or the items ran out)."""
        for index, args in itertools.islice(self._items, self._window - len(self._pending)):
            self._pending.append(self._submit(self._fn, args, f"{self._name}() of pool.map's item {index}"))
            self._bar.add(self._pending[-1])

    def results(self, deadline: float | None) -> Iterator[Any]:
        """Each item's result in order, the window refilled before each is yielded (the workers go on while the
        caller handles it); raises the first failing item's WorkerError, or TimeoutError past `deadline`."""
        try:
            while self._pending:
                future = self._pending[0]
                value = future.result(None if deadline is None else max(0.0, deadline - time.monotonic()))
                self._pending.popleft()
                self.fill()
                yield value
        except KeyboardInterrupt:
            raise self.interrupted() from None
        finally:  # failed or abandoned too: queued items never run, running ones are interrupted
            self.cancel_unfinished()
            self._bar.close()

    def interrupted(self) -> PoolInterrupted:
        """Cancel what was submitted and not done; the error that says what was stopped."""
        running = sum(future.running() for future in self._pending)
        queued = sum(not future.done() for future in self._pending) - running
        self.cancel_unfinished()
        return PoolInterrupted(
            f"Interrupted pool.map: {running} running call{'s' if running != 1 else ''} interrupted on the "
            f"workers and {queued} queued one{'s' if queued != 1 else ''} cancelled. The pool is ready for "
            "the next cell."
        )

    def cancel_unfinished(self) -> None:
        for future in self._pending:
            if not future.done():
                self._cancel(future)
