"""A done/total bar for a group of futures, in the style of tqdm.auto: `pool.map(..., progress=True)` and
`nbscale.show([futures])`.

In a notebook the bar is one output updated through a display handle (HTML: a label, a bar, `7/10 [00:03<00:01,
2.33it/s]`; text: tqdm's line), so the last state stays in the saved notebook. It counts a future when it is done
(finished or failed, in any order; a cancelled one is
counted apart), from the thread that completes it, and redraws at most every
MIN_REDRAW_S seconds and once more at the end. Outside IPython (a script) it shows nothing.
"""

from __future__ import annotations

import html
import threading
import time
from collections.abc import Iterable, Sequence, Sized
from concurrent.futures import Future
from typing import Any

MIN_REDRAW_S = 0.2
_WIDTH = 10  # characters of the text bar, as tqdm's in a narrow terminal


class ProgressBar:
    """done/total of the futures added with `add` (total None: unknown, a count only), shown under the cell."""

    def __init__(self, total: int | None, description: str, shown: bool = True) -> None:
        """`shown=False`: a bar that neither counts nor shows (`pool.map` without `progress=True`)."""
        self.total, self.description = total, description
        self.done = self.failed = self.cancelled = 0  # done: finished, with a result or an error
        self._started = time.monotonic()
        self._drawn = 0.0
        self._closed = False
        self._lock = threading.Lock()
        self._shown = shown
        self._handle = _display(self._bundle()) if shown else None

    def add(self, future: Future[Any]) -> None:
        """Count `future` when it is done (at once if it is already)."""
        if self._shown:
            future.add_done_callback(self._count)

    def close(self) -> None:
        """Draw the final state (the count so far: a map left early shows how far it got)."""
        with self._lock:
            self._closed = True
        self._draw(final=True)

    def _count(self, future: Future[Any]) -> None:
        with self._lock:
            if future.cancelled():
                self.cancelled += 1
            else:
                self.done += 1
                self.failed += future.exception() is not None
            final = self.done + self.cancelled == self.total
        self._draw(final)

    def _draw(self, final: bool) -> None:
        with self._lock:
            now = time.monotonic()
            if self._handle is None or (not final and now - self._drawn < MIN_REDRAW_S):
                return
            self._drawn = now
            self._handle.update(self._bundle(), raw=True)

    def text(self) -> str:
        """tqdm's line: `pool.map:  70%|#######   | 7/10 [00:03<00:01, 2.33it/s]`."""
        elapsed = time.monotonic() - self._started
        rate = self.done / elapsed if elapsed > 0 else 0.0
        failed = "".join(f", {n} {what}" for n, what in ((self.failed, "failed"), (self.cancelled, "cancelled")) if n)
        if not self.total:
            return f"{self.description}: {self.done} done [{_clock(elapsed)}, {rate:.2f}it/s{failed}]"
        left = (self.total - self.done) / rate if rate > 0 else None
        filled = _WIDTH * self.done // self.total
        return (
            f"{self.description}: {100 * self.done // self.total:3d}%|{'#' * filled}{' ' * (_WIDTH - filled)}| "
            f"{self.done}/{self.total} [{_clock(elapsed)}<{_clock(left)}, {rate:.2f}it/s{failed}]"
        )

    def _bundle(self) -> dict[str, str]:
        text = self.text()
        counts = text.split("| ", 1)[-1] if self.total else text.split(": ", 1)[-1]
        bar = f'<progress value="{self.done}" max="{self.total}"></progress>' if self.total else ""
        unfinished = self._closed and self.total is not None and self.done != self.total
        colour = "#d9534f" if self.failed or self.cancelled or unfinished else "inherit"
        shown = (
            f'<div style="font-family: monospace; color: {colour}">{html.escape(self.description)} {bar} '
            f"{html.escape(counts)}</div>"
        )
        return {"text/plain": text, "text/html": shown}


def _display(bundle: dict[str, str]) -> Any:
    """A display handle to update, or None outside IPython (a script)."""
    from IPython.display import display

    return display(bundle, raw=True, display_id=True)


def common_length(iterables: Sequence[Iterable[Any]]) -> int | None:
    """How many items zip(*iterables) yields, when every iterable has a length; else None."""
    lengths = [len(iterable) for iterable in iterables if isinstance(iterable, Sized)]
    return min(lengths) if lengths and len(lengths) == len(iterables) else None


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    minutes, whole = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{whole:02d}" if hours else f"{minutes:02d}:{whole:02d}"
